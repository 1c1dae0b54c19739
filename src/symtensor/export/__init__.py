"""Export plans to the engines people run: Megatron-LM arguments (``export.megatron``), a
torchtitan config (``export.torchtitan``), a DTensor plan (``export.dtensor``) and a Megatron-DeepSpeed
launch (``export.megatron_deepspeed``), each lowered
from the plan's configuration (``Plan.parallelism``) by its own module, which keeps the engine's
capability table; what they share is ``export.common``. The runtime's RunSpec is
``symtensor.runtime.lower``."""

from symtensor.errors import PlanError
from symtensor.export import dtensor, megatron, megatron_deepspeed, torchtitan
from symtensor.export.common import engine_note as _engine_note
from symtensor.export.dtensor import dtensor_plan
from symtensor.export.megatron import megatron_args
from symtensor.export.megatron_deepspeed import megatron_deepspeed_config
from symtensor.export.torchtitan import torchtitan_config

# each format: its lowering module and function (megatron writes argument lines, the others dicts)
LOWERINGS = {"megatron": (megatron, megatron_args), "torchtitan": (torchtitan, torchtitan_config),
             "dtensor": (dtensor, dtensor_plan)}
FORMATS = tuple(LOWERINGS)
# formats lowered only when asked for (``export(plan, to)``, ``symtensor export --to``): an engine whose search the
# planner does not run, so no plan of the search is checked against it (the fuzz harness, reference outputs)
LOWERINGS["megatron-deepspeed"] = (megatron_deepspeed, megatron_deepspeed_config)


def engine_note(plan, to: str) -> str | None:
    """A note when the plan was costed under another engine than the one format ``to`` runs."""
    return _engine_note(plan, LOWERINGS[to][0].CAPABILITIES, to)


def export(plan, to: str):
    """The plan in format ``to`` (one of ``FORMATS``): a list of argument lines or a dict, which
    carries ``_engine_note`` when the plan was costed under another engine than the format runs."""
    if to not in LOWERINGS:
        raise PlanError(f"unknown export format {to!r}; use one of {', '.join(LOWERINGS)}")
    out = LOWERINGS[to][1](plan)
    note = engine_note(plan, to)
    if note and isinstance(out, dict):
        out["_engine_note"] = note
    return out


__all__ = ["FORMATS", "dtensor_plan", "engine_note", "export", "megatron_args", "megatron_deepspeed_config",
           "torchtitan_config"]
