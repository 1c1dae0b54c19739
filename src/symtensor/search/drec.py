"""The D-Rec baseline: the original unitless costs (``symtensor.cost.drec``) through the same
double recursion (reverse topological order, no refinement, no level templates, MindSpore's
defaults), then costed with the full SymTensor model, pipeline depths by rollback."""

from __future__ import annotations

import time

from symtensor.cost import TrainConfig, drec
from symtensor.cost.stack import Stack
from symtensor.cost.stack_kernels import runnable
from symtensor.hardware import Cluster
from symtensor.models import ModelConfig
from symtensor.plan.plan import Plan
from symtensor.search.outer import OuterSearch, finish, rollback
from symtensor.search.partition import Problem, partition
from symtensor.search.pool import EvaluatorPool


class DrecProblem(Problem):
    """D-Rec's element-count costs in place of seconds."""

    SYMMETRIC_COSTS = False  # D-Rec's costs read the positions of mesh axes (outermost first)

    def _op_cost(self, op, layout):
        return self.weight[op.name] * drec.op_cost(op, layout, self.ev.mesh)

    def _edge_cost(self, e, lu, lv):
        ev = self.ev
        src = ev.out_layout(e.src, lu, e.src_slot, partial=False)
        dst = ev.in_layout(e.dst, lv, e.dst_slot)
        return drec.edge_cost(src.axes, dst.axes, ev.tensors[e.tensor].numel, ev.mesh)

    def _edge_weight(self, e):
        return e.weight  # D-Rec's costs count one micro-batch


def drec_layouts(ev, train):
    """Layouts D-Rec chooses for one graph and mesh."""
    return partition(DrecProblem(ev, train), order="reverse", refine=False, templates=False)


def drec_plan(cfg: ModelConfig, cluster: Cluster, global_batch: int, seq: int, precision: str = "bf16",
              fp8_recipe: str | None = None, stack: Stack | None = None) -> Plan:
    """The D-Rec baseline: D-Rec's layouts (unitless costs, same recursion), pipeline depths by
    rollback, micro-batches / recomputation / ZeRO costed by the full model, in ``precision``
    (a baseline does not choose FP8 by itself: BF16 unless stated) and with the stack facts ``stack``
    (``cost.stack.Stack``: the MoE options, the gradient reduction's dtype, ...) the plan is costed with, less the
    kernel facts Megatron does not run (``stack_kernels.runnable``: its own kernels then); D-Rec's own unitless
    costs, which choose its layouts, have no notion of them."""
    t0 = time.perf_counter()
    pool = EvaluatorPool(cfg, cluster, seq, precision=precision, fp8_recipe=fp8_recipe,
                         stack=runnable(stack, "megatron"))
    s = OuterSearch(pool, global_batch)
    steps1 = s.micro_steps(1)
    m0 = max([m for m in steps1 if global_batch // m >= cluster.n_devices] or [steps1[0]])
    ev = pool.get(global_batch // m0, 1)
    base = drec_layouts(ev, TrainConfig(global_batch=global_batch, micro_steps=m0))
    for pp in s.pipeline_depths():
        k = cluster.mesh().outer_axes_for(pp)
        if k is not None:
            s.consider_batches(rollback(base, k), pp)
    return finish(s, t0)
