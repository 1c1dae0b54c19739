"""The Megatron grid, exhaustively, with exact branch and bound: the best Megatron-expressible
configuration under the cost model, at any scale.

Every point of ``megatron.grid_points`` (tp, pp, dp, cp, ep, etp, micro batch), each with the
recomputation modes and virtual-stage counts Megatron offers, with sequence parallelism whenever
tp > 1 and the distributed optimizer. Dominated choices are not enumerated, which cannot change the
best: sp=False (the same communication time in this model, more memory and norm compute) and zero=0
(ZeRO-1's time, more memory).

Costs are shared across the points that differ only in outer choices. What a layer adds to its
stage per micro-batch depends on the stage's inner grid (tp, cp, ep, etp, sequence parallelism and
the micro batch), not on the pipeline depth or the data-parallel degree around it, so one costing
per inner grid (``Evaluator.layer_seconds``) bounds every point of it from below:

    step >= m * max_stage T_mb + (p - 1) / v_max * mean_stage T_mb + H

with m micro-batches, p stages and v_max the most virtual stages the point allows, and H the host's
work the step is known to hold whatever the layers cost (``EndToEnd``: per step, and per micro-batch
on every stage, m + (p - 1) / v_max times: ``_host_share``); every other term of the step
(data-parallel and pipeline communication, the optimizer) is at least zero, and recomputation only
adds. Every tier below adds H too. Points are visited in the order of that bound: a point whose bound is no
faster than the best plan that fits is skipped, and once the bound reaches it the rest of the grid
is. A point that survives is costed at (no recomputation, most virtual stages), its exact bound,
then at its other variants.

The bounds are themselves computed lazily, in tiers that never exceed the exact bound (A*'s lazy
expansion: a point's next tier is computed only when its current one is the lowest left, so the
points are visited in exactly the order of their exact bounds, and a point whose cheap bound is
no faster than the best is never bounded exactly):

    0. the step floor (``Evaluator.step_floor``: every op at the best rates its kernels allow, spread
       over all devices) plus the bubble's share of it: no layer costs at all, only where the caller
       needs a time beaten (``beat``);
    1. tier 2 with the layers' compute only (their ops' times under the inner grid's layouts, no
       communication: a third of the cost of the layer costs, which most inner grids then skip);
    2. the stages' mean: m * mean_stage T_mb + (p - 1) / v_max * mean_stage T_mb, from the inner
       grid's layer costs, without the split that balances them (``EvaluatorPool.split_of``);
    3. the exact bound above.
"""

from __future__ import annotations

import heapq
import math

from symtensor.cost import TrainConfig
from symtensor.cost.params import dense_group
from symtensor.errors import PlanError
from symtensor.hardware import GIB
from symtensor.search.megatron import check_config, configuration, inner_grid, role_layouts, train_config
from symtensor.search.parallel import Background
from symtensor.search.pool import Costed, EvaluatorPool

FORK_POINTS = 64  # grids smaller than this are not worth a second process
# relative margins that keep a cheaper tier of the bound below the exact one whatever the rounding of
# its sums (a few hundred floating-point additions: relative errors below 1e-13)
MEAN_MARGIN, FLOOR_MARGIN = 1e-9, 1e-6


def megatron_grid(pool: EvaluatorPool, global_batch: int, micro_batch: int | None = None, fork: bool = False,
                  beat: float = math.inf) -> tuple[Costed | None, int]:
    """The best Megatron configuration (the one that fits fastest; the least memory when none
    fits) and how many configurations it costed in full.

    ``fork``: a forked child (``parallel.Background``) takes every other inner grid (with all its
    points, which share its layer costs) and this process the rest; each bounds and searches its
    own points. The best is the same either way: each process finds the best of its points, and
    of two equal ones the one the serial order visits first is kept; more configurations may be
    costed (each process prunes with its own best only).

    ``beat``: a step time only a faster plan matters against (the guarantee's plan on more
    devices, ``search.guarantee``): points whose bound reaches it are not costed, so the best is
    exact when it fits faster than ``beat``, and otherwise it is some slower point, one that does
    not fit, or None."""
    start = pool.costed
    bases = [b for b in pool.grid(global_batch) if micro_batch is None or b["micro_batch"] == micro_batch]
    if not (fork and len(bases) >= FORK_POINTS):
        return _bound_and_search(pool, bases, beat=beat)[0], pool.costed - start
    inner = list(dict.fromkeys(inner_grid(b) for b in bases))
    theirs = set(inner[1::2])
    with Background(lambda: (*_bound_and_search(pool, bases, lambda b: inner_grid(b) in theirs, beat),
                             pool.costed - start)) as child:
        ours = _bound_and_search(pool, bases, lambda b: inner_grid(b) not in theirs, beat)
        *found, costed = child.result()
    pool.costed += costed  # (the child's configurations, costed on this pool's behalf)
    best = min([f for f in (ours, tuple(found)) if f[0] is not None], key=lambda f: (f[0].key, f[1]),
               default=(None,))[0]
    return best, pool.costed - start


def _bound_and_search(pool: EvaluatorPool, bases: list[dict], mine=None, beat: float = math.inf
                      ) -> tuple[Costed | None, tuple]:
    """The best of the grid points ``bases`` (those that ``mine`` accepts), by exact branch and
    bound over lazily tightened bounds (the module docstring), and when the serial order over all
    of ``bases`` visits it: (0, its bound, its index) or, for a point whose state alone overflows
    (costed only when nothing fits, after every other point), (1, ...). ``beat``:
    ``megatron_grid``'s."""
    floor = _floor_share(pool, bases[0]["global_batch"]) if bases and beat < math.inf else 0.0
    heap = []  # (bound, index, tier, base, vpps, host): the index breaks ties as the serial order does
    for index, base in enumerate(bases):
        if mine is not None and not mine(base):
            continue
        vpps = virtual_stages(pool.cfg.layers, base["pp"])
        m = base["global_batch"] // (base["micro_batch"] * base["dp"])
        host = _host_share(pool.end_to_end, base, vpps)
        heap.append((floor * (1 + (base["pp"] - 1) / (vpps[-1] * m)) + host, index, 0, base, vpps, host))
    heapq.heapify(heap)
    totals: dict = {}  # inner grid -> (the point that costs it, its compute, the sum of its layer costs)
    best, visit = None, None
    overflowing = []
    while heap:
        lower, index, tier, base, vpps, host = heap[0]
        fitting = best is not None and best.report.fits
        if lower >= beat or (fitting and lower >= best.report.step_time_s):
            break  # no point left can beat it (every point's exact bound is at least its bound here)
        heapq.heappop(heap)
        if tier < 3:
            try:
                lower = host + (point_bound(pool, base, vpps) if tier == 2
                                else _mean_bound(pool, base, vpps, totals, tier))
            except PlanError:  # its layouts break the one legality rule (megatron_layouts): not a point
                continue
            heapq.heappush(heap, (lower, index, tier + 1, base, vpps, host))
            continue
        if not pool.may_fit(**base):
            overflowing.append((lower, index, base, vpps))  # parameters and optimizer state alone overflow
            continue
        if fitting:
            # per virtual-stage count, the cheapest recomputation that fits, if it beats the best
            for vpp in reversed(vpps):
                cand, _ = fastest_fitting(pool, dict(base, vpp=vpp), best.report.step_time_s)
                if cand is not None and cand.key < best.key:
                    best, visit = cand, (0, lower, index)
            continue
        found = _every_variant(pool, base, vpps, best)
        if found is not best:
            best, visit = found, (0, lower, index)
    if beat == math.inf and (best is None or not best.report.fits):
        # nothing fits: the least memory may be among the points whose state alone overflows (with
        # ``beat``, a plan that does not fit does not matter: none of these fits)
        for lower, index, base, vpps in overflowing:
            found = _every_variant(pool, base, vpps, best)
            if found is not best:
                best, visit = found, (1, lower, index)
    return best, visit


def _host_share(e2e, base: dict, vpps: list[int]) -> float:
    """What every tier adds to a point's bound for the host (``EndToEnd``, a little under): its work per step,
    and per micro-batch on every stage (``cost.model``'s ``overhead`` adds it m times on the critical stage,
    whose seconds per micro-batch it is part of, and the bubble (p - 1) / v times on the mean stage)."""
    m = base["global_batch"] // (base["micro_batch"] * base["dp"])
    return (e2e.step_s + e2e.microbatch_s * (m + (base["pp"] - 1) / vpps[-1])) * (1 - MEAN_MARGIN)


def _floor_share(pool: EvaluatorPool, global_batch: int) -> float:
    """Tier 0 per step: the step floor of the whole global batch in one micro-step without the
    host's work per step (``Evaluator.step_floor``; a grid point's bound adds the host's work as ``_host_share``), a
    little under. Every layer of a point adds to its stage per micro-batch at least its ops'
    floor over the stage's devices (``layer_seconds`` of the point: compute, then communication
    and the rest, at rates no better than the floor's), so m micro-batches of the mean stage take
    at least this, and the bubble (p - 1) / v_max of a mean stage at least its 1 / m part."""
    ev = pool.get(global_batch, 1)
    floor = ev.step_floor(TrainConfig(global_batch=global_batch, micro_steps=1, **pool.train_keys))
    return (floor - ev.eff.end_to_end.step_s) * (1 - FLOOR_MARGIN)


def _mean_bound(pool: EvaluatorPool, base: dict, vpps: list[int], totals: dict, tier: int = 1) -> float:
    """Tiers 1 and 2 (the module docstring): ``point_bound`` with the mean stage in place of the
    slowest rank (the slowest rank under any split holds at least the mean), of the layers'
    compute (tier 0 -> 1) or of their whole costs (tier 1 -> 2), a little under. Both are costed on
    the first point of the inner grid that asks (``EvaluatorPool.layer_seconds``)."""
    key = inner_grid(base)
    hit = totals.get(key)
    if hit is None:
        hit = totals[key] = [base, _compute(pool, base), None]
    if tier == 1 and hit[2] is None:
        hit[2] = sum(pool.layer_seconds(hit[0]).values())
    m = base["global_batch"] // (base["micro_batch"] * base["dp"])
    return hit[tier + 1] / base["pp"] * (m + (base["pp"] - 1) / vpps[-1]) * (1 - MEAN_MARGIN)


def _compute(pool: EvaluatorPool, base: dict) -> float:
    """Seconds per micro-batch of every layer's ops (forward and backward, no recomputation) under
    the layouts of ``base``'s inner grid: what ``Evaluator.layer_seconds`` charges besides
    communication, which only adds (``cost.segment.Segment.seconds``). From the layouts of the ops'
    roles (``megatron.role_layouts``: a few layouts, not every op's, and no legality check: a point
    whose layouts are refused is dropped at its next tier, ``EvaluatorPool.layouts``), each
    op of one role and signature once, times how many the layers hold (``EvaluatorPool.op_runs``)."""
    c = configuration(pool.held({**base, "recompute": "none", "vpp": 1}))
    check_config(pool.cfg, pool.cluster.n_devices, c, pool.cluster.device)
    batch = c["micro_batch"] * c["dp"]
    ev = pool.get(batch, c["pp"])
    of_role = role_layouts(ev.mesh, c, pool.family)
    train, total = train_config(c), 0.0
    fp8, stack = train.fp8, train.stack
    for times, op, role in pool.op_runs(ev):
        t = ev.op_time(op, of_role(role), fp8, stack)
        total += times * (t.fwd_s + t.bwd_s)
    return total


def _every_variant(pool: EvaluatorPool, base: dict, vpps: list[int], best: Costed | None) -> Costed | None:
    """While nothing fits: every variant of a point, for one that fits or holds the least memory."""
    for rc in pool.recomputations():
        for vpp in reversed(vpps):
            cand = pool.try_config(**base, recompute=rc, vpp=vpp)
            if cand is not None and (best is None or cand.key < best.key):
                best = cand
    return best


def fastest_fitting(pool: EvaluatorPool, base: dict, bound: float = float("inf"), balance: bool = True):
    """The cheapest recomputation with which ``base`` fits and its step time; (None, None) when
    nothing fits (parameters and optimizer state alone overflowing the memory are checked before
    any evaluation) or when it cannot beat ``bound`` (a variant that does not fit is already no
    faster, and recomputation only adds time: exact branch and bound). ``balance``:
    ``EvaluatorPool.evaluate``'s."""
    if not pool.may_fit(**base):
        return None, None
    for rc in pool.recomputations():
        cand = pool.try_config(**base, recompute=rc, balance=balance)
        if cand is None:
            return None, None
        rep = cand.report
        if rep.fits:
            return cand, rep.step_time_s
        if rep.step_time_s >= bound:
            return None, None
    return None, None


def virtual_stages(layers: int, pp: int) -> list[int]:
    """The virtual-stage counts of a pipeline depth, ascending: where the layers divide by pp,
    those that give every stage the same whole number of chunks; elsewhere (DeepSeek-V3's 61
    layers) any of 2 to 4 that leaves every virtual stage a layer, its split stated
    (``EvaluatorPool.split_of``: Megatron's --pipeline-model-parallel-layout)."""
    if pp == 1 or layers % pp:
        return [1]
    return [1] + [v for v in (2, 3, 4) if layers % (pp * v) == 0]


def point_bound(pool: EvaluatorPool, base: dict, vpps: list[int]) -> float:
    """A lower bound of the step time of every variant of the grid point ``base`` (see the module
    docstring), from its inner grid's layer costs: the slowest rank under the split each of its
    virtual-stage counts runs with (``EvaluatorPool.split_of``; another count's where it is lower
    by more than rounding), and the bubble at the most virtual stages."""
    m = base["global_batch"] // (base["micro_batch"] * base["dp"])
    _, slowest, total = pool.split_of({**base, "vpp": 1})
    for v in vpps[1:]:
        other = pool.split_of({**base, "vpp": v})[1]
        slowest = other if other < slowest * (1 - 1e-9) else slowest
    return m * slowest + (base["pp"] - 1) / vpps[-1] * total / base["pp"]


# -- hybrid sharding: a variant of a costed point ---------------------------------------------------
def shard_sizes(ev, layouts: dict, zero: int) -> list[int]:
    """The hybrid-sharding degrees (``Parallelism.dp_shard``) worth costing for ``layouts``: the
    ranks of the dense data-parallel group on a whole number of inner cluster levels, short of the
    whole group (one node's ranks on a two-level cluster); none at ZeRO 0 or when the group lies
    on one level."""
    group = dense_group(ev.graph, layouts, ev.param_ops)
    if zero == 0 or not group:
        return []
    total = ev.mesh.size(tuple(group))
    sizes = []
    for level in sorted({ev.mesh[a].level for a in group})[:-1]:
        n = ev.mesh.size(tuple(a for a in group if ev.mesh[a].level <= level))
        if 1 < n < total:
            sizes.append(n)
    return sizes


def hybrid_variant(ev, point: Costed, flat: Costed | None = None) -> tuple[Costed, str | None, bool]:
    """``point`` with hybrid sharding (``shard_sizes``: ZeRO within the inner levels, replicated
    across the rest) when that fits and is faster than ``flat`` (default ``point``: the plan it would replace), and
    the plan's note saying what it bought; ``flat`` and None otherwise; and whether a faster one did not fit (the
    larger shard of the optimizer state needs room a smaller micro-batch may leave: ``search.outer.hybrid_plan``).
    One evaluation per candidate (usually one): a cheap variant of a costed point, never a dimension of the grid or
    of the partition."""
    flat = point if flat is None else flat
    if not point.report.fits or point.train.dp_replicate is not None:
        return flat, None, False
    best, note, overflowed = flat, None, False
    group = ev.mesh.size(tuple(dense_group(ev.graph, point.layouts, ev.param_ops)))
    for n in shard_sizes(ev, point.layouts, point.train.zero):
        train = point.train.replace(dp_replicate=group // n)
        rep = ev.evaluate(point.layouts, train, check=False)
        overflowed |= not rep.fits and rep.step_time_s < best.report.step_time_s
        if rep.fits and rep.step_time_s < best.report.step_time_s:
            megatron = None if point.megatron is None else {**point.megatron, "dp_shard": n}
            best = Costed(train, point.layouts, rep, megatron)
            note = hybrid_note(flat.report, rep, n, group, train.zero)
    return best, note, overflowed


def hybrid_note(flat, hybrid, dp_shard: int, group: int, zero: int) -> str:
    """What hybrid sharding bought, from the reports of a plan with ZeRO over the whole
    data-parallel group of ``group`` ranks (``flat``) and over ``dp_shard`` of them (``hybrid``)."""
    return (f"hybrid sharding (HSDP): ZeRO-{zero} shards over the {dp_shard} innermost data-parallel ranks and "
            f"replicates across {group // dp_shard}: {flat.step_time_s:.4g} s -> {hybrid.step_time_s:.4g} s per step "
            f"(data-parallel communication {flat.breakdown['dp_comm']:.3g} s -> {hybrid.breakdown['dp_comm']:.3g} s: "
            f"rings inside the inner levels, an all-reduce of the shard across them; optimizer "
            f"{flat.breakdown['optimizer']:.3g} s -> {hybrid.breakdown['optimizer']:.3g} s; memory "
            f"{flat.memory_peak / GIB:.1f} -> {hybrid.memory_peak / GIB:.1f} GiB per device)")
