"""Export plans to Megatron-LM arguments, torchtitan configs and DTensor plans."""

from symtensor.export.formats import FORMATS, dtensor_plan, export, megatron_args, torchtitan_config

__all__ = ["FORMATS", "dtensor_plan", "export", "megatron_args", "torchtitan_config"]
