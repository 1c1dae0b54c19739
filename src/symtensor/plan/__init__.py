"""The plan: the one plan value (``Plan``), its configuration (``Parallelism``), the facts of the user's stack
(``Stack``) and summaries in Megatron's words, plan files (JSON)."""

from symtensor.plan.io import load_plan, plan_to_dict, save_plan
from symtensor.plan.parallelism import Heterogeneous, Parallelism
from symtensor.plan.plan import Plan
from symtensor.plan.stack import Stack
from symtensor.plan.summary import config_summary, degrees, layer_types

__all__ = ["Heterogeneous", "Parallelism", "Plan", "Stack", "config_summary", "degrees", "layer_types", "load_plan",
           "plan_to_dict", "save_plan"]
