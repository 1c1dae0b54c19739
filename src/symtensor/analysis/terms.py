"""The cost terms of one op under one layout, in the search's own decomposition.

``search.partition.Problem`` scores an op's layout by one number; this module splits that number
into named terms so a user can see why one cut wins:

    compute_s         m * (T_fwd + T_bwd [+ T_fwd again when recomputed]) of the op's local piece
    intra_s           collectives inside the op (vocab-parallel cross-entropy statistics)
    grad_sync_s       exposed gradient synchronisation of its parameters, once per step
    optimizer_s       the optimizer step over its parameter shard
    redistribution_s  collectives that turn a neighbour's layout into this op's (forward and
                      backward), the op's share where sibling consumers share one
    memory_bytes      parameters + gradients + optimizer state + saved activations of the
                      in-flight micro-batches, per device

Every term is per training step, summed over the layers the (skeleton) op stands for on one
pipeline stage (``Problem.weight``), with ``m`` micro-batches: the same units as the step-time
breakdown. With a memory weight of zero, ``time_s`` is exactly ``Problem.op_cost`` plus the op's
``Problem.edge_cost`` terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from symtensor.cost import terms as cost_terms
from symtensor.layout import REPLICATED, OpLayout

TIME_TERMS = ("compute_s", "intra_s", "grad_sync_s", "optimizer_s", "redistribution_s")


@dataclass(frozen=True, slots=True)
class Transfer:
    """One collective an op pays: ``calls`` times per step, ``nbytes`` each (collectives.py sizes)."""

    kind: str
    nbytes: float
    axes: tuple[int, ...]
    calls: float
    why: str  # "redistribution with <op> (<tensor>, forward|backward)", "gradient sync of <param>", ...


@dataclass(frozen=True, slots=True)
class OpTerms:
    """Seconds per step and bytes per device of one op's layout (see the module docstring)."""

    compute_s: float
    intra_s: float
    grad_sync_s: float
    optimizer_s: float
    redistribution_s: float
    memory_bytes: float
    transfers: tuple[Transfer, ...] = field(default=())

    @property
    def communication_s(self) -> float:
        return self.intra_s + self.grad_sync_s

    @property
    def time_s(self) -> float:
        return sum(getattr(self, k) for k in TIME_TERMS)

    @property
    def comm_bytes(self) -> dict[str, float]:
        """Bytes per step by collective kind (message sizes as collectives.py defines them)."""
        out: dict[str, float] = {}
        for t in self.transfers:
            out[t.kind] = out.get(t.kind, 0.0) + t.nbytes * t.calls
        return out

    def as_dict(self) -> dict:
        return {"compute_s": self.compute_s, "communication_s": self.communication_s, "intra_s": self.intra_s,
                "grad_sync_s": self.grad_sync_s, "optimizer_s": self.optimizer_s,
                "redistribution_s": self.redistribution_s, "time_s": self.time_s,
                "memory_bytes": self.memory_bytes, "comm_bytes": self.comm_bytes}


def problem_of(plan):
    """The search's decomposed objective for a plan's outer point (memory weight 0)."""
    from symtensor.search.partition import Problem

    return Problem(plan.evaluator(), plan.train, 0.0)


def op_terms(problem, op, layout: OpLayout, neighbours: dict[str, OpLayout]) -> OpTerms:
    """Terms of ``op`` placed as ``layout`` while every other op ``o`` is placed as ``neighbours[o]``.

    Args:
        problem: a ``search.partition.Problem`` (``problem_of(plan)``).
        op: an op of ``problem.ev.graph``.
        layout: the op's layout on ``problem.ev.mesh``.
        neighbours: layouts of the other ops (missing ones are replicated).
    """
    ev, train = problem.ev, problem.train
    w, m = problem.weight[op.name], train.micro_steps
    terms = cost_terms.op_cost(ev, op, layout, train)
    compute = w * m * terms.compute_s
    calls = w * m * terms.intra_calls
    intra_s = w * m * terms.intra_s
    transfers: list[Transfer] = [Transfer(c.kind, c.nbytes, c.axes, calls, "inside the op (loss statistics)")
                                 for c in terms.intra]
    params = terms.params
    sync, opt, static = w * params.sync_s, w * params.opt_s, params.static_bytes
    transfers += [Transfer(kind, nbytes, axes, w * calls_, f"gradient sync of {tname}")
                  for kind, nbytes, axes, calls_, tname in params.transfers]
    redis = 0.0
    for e, other, is_src in problem.links[op.name]:
        nb = neighbours.get(other, REPLICATED)
        seconds, moved = edge_terms(problem, e, layout if is_src else nb, nb if is_src else layout, other)
        redis += seconds
        transfers += moved
    memory = w * (static + problem.inflight * saved_bytes(problem, op, layout))
    return OpTerms(compute, intra_s, sync, opt, redis, memory, tuple(transfers))


def edge_terms(problem, e, lu: OpLayout, lv: OpLayout, other: str) -> tuple[float, list[Transfer]]:
    """Seconds per step of edge ``e`` (producer layout ``lu``, consumer ``lv``) and its collectives;
    the seconds equal ``Problem.edge_cost``."""
    ev = problem.ev
    k = e.weight * problem.train.micro_steps
    runs = problem.redo(e.dst)  # the consumer's forward runs (again where recomputed)
    src = ev.out_layout(e.src, lu, e.src_slot, partial=True)
    dst = ev.in_layout(e.dst, lv, e.dst_slot)
    grad = ev.needs_grad(e.tensor)
    gsrc = ev.in_layout(e.dst, lv, e.dst_slot, grad=True) if grad else None
    gdst = ev.out_layout(e.src, lu, e.src_slot, partial=False) if grad else None
    fwd_s, fwd_c, bwd_s, bwd_c = cost_terms.edge_terms(ev, e.tensor, src, dst, gsrc, gdst)
    moved = [Transfer(c.kind, c.nbytes, c.axes, k * runs, f"with {other} ({e.tensor}, forward)") for c in fwd_c]
    moved += [Transfer(c.kind, c.nbytes, c.axes, k, f"with {other} ({e.tensor}, backward)") for c in bwd_c]
    return k * cost_terms.edge_seconds(fwd_s, bwd_s, runs), moved


def saved_bytes(problem, op, layout: OpLayout) -> float:
    """Activation bytes one micro-batch of this op keeps for backward on one device (the search's
    estimate, ``cost.terms.saved_bytes``)."""
    return cost_terms.saved_bytes(problem.ev, op, layout, problem.train)
