"""The search: the adaptive recursive partitioner, the outer search around it, the Megatron
seeds and the baselines; everything it returns is a ``symtensor.plan.Plan``.

    planner    search(): the entry point and the orchestration of its two processes
    seeds      Megatron-expressible seeds (step 0)
    outer      pipeline depth, micro-batches, recomputation, ZeRO, memory weight (steps 1-5)
    partition  the per-op problem and the double recursion
    pool       EvaluatorPool (every cache of one search) and Costed (its working record)
    megatron   Megatron configurations as layouts; the Megatron constructor of a Plan
    baselines  the Megatron recipe, the Megatron grid best, FSDP, and all baselines as plans
    drec       the D-Rec baseline (the original unitless costs through the same recursion)
    exact      an exact solver for small graphs (the search's oracle in tests)
    parallel   a forked child for one half of the search
"""

from symtensor.search.baselines import BASELINES, baseline_plans
from symtensor.search.drec import drec_plan
from symtensor.search.megatron import megatron_plan
from symtensor.search.planner import search

__all__ = ["BASELINES", "baseline_plans", "drec_plan", "megatron_plan", "search"]
