"""Plans as data: summaries in Megatron's words, JSON plan files."""

from symtensor.plan.io import load_plan, plan_to_dict, save_plan
from symtensor.plan.summary import config_summary, degrees, layer_types

__all__ = ["config_summary", "degrees", "layer_types", "load_plan", "plan_to_dict", "save_plan"]
