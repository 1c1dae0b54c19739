"""One record of named cost terms per op and layout: what the search and ``explain`` charge an op.

The evaluator (``cost.model``) composes a step from the same pieces (``Evaluator.op_time``,
``Evaluator.edge``, ``param_cost``); this module is the op-local view of them that the search's
decomposed objective (``search.partition.Problem``) and ``symtensor explain``
(``analysis.terms``) both read, so the rule for an op's compute, its in-op communication, its
parameters, its saved activations and its redistributions is written once:

    compute_s      forward + backward (+ the forward again when recomputed), per micro-batch
    intra_s        collectives inside the op (vocab-parallel loss statistics), per micro-batch
    params         ParamTerms: exposed synchronisation, optimizer step, resident bytes, per step
    saved_bytes    activations kept for backward, per micro-batch (the search's estimate)
    edge_terms     a redistribution's forward and backward collectives, per micro-batch
"""

from __future__ import annotations

from dataclasses import dataclass

from symtensor.cost import moe
from symtensor.cost.engine import Exposure, Unit, engine_of, exposure
from symtensor.cost.opcost import collectives_time, extra_saved_bytes, intra_collectives, local_sizes
from symtensor.cost.params import data_axes, weight_axes
from symtensor.cost.precision import RECIPES, fp8_gemm
from symtensor.cost.segment import forward_runs, recomputed
from symtensor.cost.train import TrainConfig
from symtensor.graph import op_saved_activations
from symtensor.layout import OpLayout


@dataclass(frozen=True, slots=True)
class ParamTerms:
    """The parameters of one op under one layout, per step: the op-local estimate of their
    exposed synchronisation (the engine's overlap rules with the op's own compute to hide behind,
    without the unit-level ends: the first gather and the last bucket), the optimizer step, the
    resident bytes, and the collectives as (kind, bytes, axes, calls per step, tensor)."""

    sync_s: float
    opt_s: float
    static_bytes: float
    transfers: tuple


_NO_SYNC = Exposure(0.0, {})


def param_terms(ev, op, layout: OpLayout, train: TrainConfig) -> ParamTerms:
    """What the search and ``explain`` charge an op for its parameters (see ``ParamTerms``)."""
    sync = opt = static = 0.0
    transfers = []
    slots = [slot for slot, tname in enumerate(op.inputs) if ev.tensors[tname].param]
    if not slots:
        return ParamTerms(0.0, 0.0, 0.0, ())
    t = ev.op_time(op, layout, train.fp8, train.stack)
    bwd = t.bwd_s + t.fwd_s * (forward_runs(op, train.recompute, ev.graph.meta["layers"],
                                            ev.recompute_regions(train.recompute)) - 1)
    data = data_axes(layout, weight_axes((op,), {op.name: layout}))
    for slot in slots:
        tname = op.inputs[slot]
        pc = ev.param_cost(ev.tensors[tname], ev.param_layout(op, layout, slot), train, data)
        if pc.reduce is None and pc.gather is None:  # no data-parallel replicas: nothing to overlap
            ex = _NO_SYNC
        else:
            unit = Unit(1, t.fwd_s, bwd, pc.gather_s, pc.reduce_s, pc.reduce[1] if pc.reduce else 0.0,
                        replicate_s=ev.coll_time("all_reduce", *pc.replicate) if pc.replicate else 0.0)
            ex = exposure([unit], train, ends=False, share=ev.eff.end_to_end.comm_sm_fraction)
        sync += ex.seconds + pc.other_s
        opt += pc.opt_time
        static += pc.params + pc.grads + pc.optimizer
        if pc.reduce:
            transfers.append((pc.reduce[0], pc.reduce[1], pc.reduce[2], ex.calls.get(pc.reduce[0], 0), tname))
        if pc.gather:
            transfers.append(("all_gather", pc.gather[0], pc.gather[1], ex.calls.get("all_gather", 0), tname))
        if pc.replicate:  # hybrid sharding: the shard all-reduced across replicas, after each reduce-scatter (or once)
            transfers.append(("all_reduce", pc.replicate[0], pc.replicate[1],
                              ex.calls.get("replicate", ex.calls.get("reduce_scatter", 0)), tname))
        if pc.other_bytes:
            other = tuple(sorted(a for a in ev.param_layout(op, layout, slot).partial if a not in data))
            transfers.append(("all_reduce", pc.other_bytes, other, 1, tname))
    return ParamTerms(sync, opt, static, tuple(transfers))


@dataclass(frozen=True, slots=True)
class OpCost:
    """The op-local terms of one op under one layout (see the module docstring)."""

    compute_s: float
    intra_s: float
    intra: tuple  # the in-op collectives (``opcost.Collective``), run ``intra_calls`` times per micro-batch
    intra_calls: float
    params: ParamTerms

    @property
    def per_microbatch_s(self) -> float:
        return self.compute_s + self.intra_s

    @property
    def per_step_s(self) -> float:
        return self.params.sync_s + self.params.opt_s


def op_cost(ev, op, layout: OpLayout, train) -> OpCost:
    """The op's terms under ``train`` (its recomputation, engine and ZeRO stage; an expert op at the most-loaded
    rank's pace under the MoE options, ``load``, as the evaluator charges it)."""
    # (the in-op collectives run as often)
    calls = forward_runs(op, train.recompute, ev.graph.meta["layers"], ev.recompute_regions(train.recompute))
    t = ev.op_time(op, layout, train.fp8, train.stack)
    compute = (t.fwd_s + t.bwd_s + t.fwd_s * (calls - 1)) * load(ev, op, layout, train)
    intra = intra_collectives(op, layout, ev.mesh)
    intra_s = collectives_time(intra, ev.mesh, ev.levels, ev.eff) * calls if intra else 0.0
    return OpCost(compute, intra_s, intra, calls, param_terms(ev, op, layout, train))


def saved_bytes(ev, op, layout: OpLayout, train) -> float:
    """Activation bytes one micro-batch of this op keeps for backward on one device (the search's
    estimate: recomputed ops keep nothing; tensors saved by several ops count for each)."""
    regions = ev.recompute_regions(train.recompute)
    if recomputed(op, train.recompute, ev.graph.meta["layers"], regions) and \
            (train.recompute == "full" or op.attr("core") or regions):  # (a module's region: its inputs estimated)
        return 0.0
    saved = 0.0
    for io, idx, tname in op_saved_activations(op, ev.tensors):
        view = ev.in_layout(op, layout, idx) if io == "in" else ev.out_layout(op, layout, idx, False)
        fp8 = train.fp8 is not None and io == "in" and fp8_gemm(op)  # its FP8 (FP4) copy (cost.precision)
        keeps = moe.saved_scale(op, io, idx, engine_of(train))  # the MoE combine's, per engine (cost.moe)
        kept = RECIPES[train.fp8].saved_fraction if fp8 else 1.0
        saved += ev.tensors[tname].nbytes / view.factor(ev.mesh) * kept * keeps
    return saved + extra_saved_bytes(op, layout, ev.mesh, train.stack.loss)


def edge_terms(ev, tensor: str, src, dst, gsrc=None, gdst=None) -> tuple:
    """One micro-batch of a redistribution of ``tensor``: the producer's placement ``src`` into
    the consumer's ``dst`` forward, and the gradient's ``gsrc`` into ``gdst`` backward (None: no
    gradient). Returns (forward seconds, its collectives, backward seconds, its collectives); a
    recomputed consumer pays the forward as often as it runs (``edge_seconds``)."""
    fwd_s, fwd_c = ev.edge(src, dst, tensor)
    bwd_s, bwd_c = ev.edge(gsrc, gdst, tensor) if gsrc is not None else (0.0, ())
    return fwd_s, fwd_c, bwd_s, bwd_c


def load(ev, op, layout: OpLayout, train) -> float:
    """The MoE load factor of ``op`` placed as ``layout`` (``cost.moe.op_load_factor``: the most-loaded expert
    rank over the mean), as ``cost.segment`` charges it; 1 for other ops and without MoE options."""
    if not moe.active(train) or not moe.expert_op(op):
        return 1.0
    return moe.op_load_factor(train, op, local_sizes(op, layout, ev.mesh), ev.graph.meta["config"].experts)


def ep_edge_seconds(ev, train, src_op, dst_op, lu: OpLayout, lv: OpLayout, seconds: float, colls) -> float:
    """An edge's ``seconds`` (its collectives ``colls``) from ``src_op`` placed as ``lu`` into ``dst_op`` placed
    as ``lv`` under the MoE options, as ``cost.segment`` charges it: a dispatch or combine edge (into a
    moe_dispatch or moe_combine op, or out of a moe_dispatch) at the dispatcher's time and the expert end's
    load (``cost.moe.edge_seconds``); any other edge, or without MoE options, as it is."""
    if not colls or not moe.active(train) or not (src_op.kind == "moe_dispatch"
                                                  or dst_op.kind in ("moe_dispatch", "moe_combine")):
        return seconds
    expert, layout = (dst_op, lv) if moe.expert_op(dst_op) else (src_op, lu)
    return moe.edge_seconds(seconds, colls, ev, train, load(ev, expert, layout, train))


def edge_seconds(fwd_s: float, bwd_s: float, runs: float) -> float:
    """Seconds of an edge per micro-batch: its forward as often as the consumer's forward runs
    (``segment.forward_runs``) and its backward."""
    return fwd_s * runs + bwd_s
