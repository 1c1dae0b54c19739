"""The D-Rec baseline: the original unitless costs (``symtensor.cost.drec``) through the same
double recursion (reverse topological order, no refinement, no level templates, MindSpore's
defaults), then costed with the full SymTensor model, pipeline depths by rollback."""

from __future__ import annotations

from symtensor.cost import drec
from symtensor.search.partition import Problem, partition


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
