"""Megatron-expressible seeds of the search (step 0 of ``search.planner``): SymTensor's space
contains Megatron's, so the search starts from the best Megatron configurations and cannot lose
to the grid.

    seed_plan        whether the seeds are the whole grid (small grids and clusters) or a scan
    structured_seeds the grid with exact branch and bound, or the scan (``_Chain`` stops a chain)
    grid_descent     hill-climbing on the grid from the best seed
    seed_phase       the best and the least-memory seed of a (part of the) scan, its count, and the
                     fastest seeds that fit only with recomputation (their ZeRO stages are tried)
"""

from __future__ import annotations

from symtensor.hardware import divisors
from symtensor.search.grid import fastest_fitting, megatron_grid, virtual_stages
from symtensor.search.megatron import expert_grids
from symtensor.search.pool import EvaluatorPool

SMALL_GRID = 64  # grids with at most this many points are seeded exhaustively,
SMALL_CLUSTER = 16  # and so are clusters of at most this many devices


def seed_plan(pool: EvaluatorPool, global_batch: int) -> tuple[bool, list[int], list[dict]]:
    """Whether the seeds are the exhaustive grid, the tensor-parallel degrees of the scan and the
    grid's points."""
    points = pool.grid(global_batch)
    exhaustive = len(points) <= SMALL_GRID or pool.cluster.n_devices <= SMALL_CLUSTER
    return exhaustive, sorted({p["tp"] for p in points}), points


def structured_seeds(pool: EvaluatorPool, global_batch: int, micro_batch: int | None, tps=None):
    """Megatron-expressible starting points: the whole grid (exact branch and bound) on small
    clusters. Elsewhere a scan that treats the step time as unimodal along each axis of the grid:
    tensor-parallel degrees ascending, per degree context-parallel degrees ascending, per degree
    pipeline depths ascending and (MoE) per expert TP (1, then tp) the expert-parallel degrees
    ascending, folded over the stage's ranks (EP may exceed DP), each chain stopped once a
    point that fits without recomputation is no faster than the one before (``_Chain``). Points
    already slower than the fastest seed of their tp are only costed once (recomputation only adds
    time). ``tps``: the degrees to scan; a call depends on nothing else, so the scan can be
    split between two processes, which give the same seeds as one. The scan's points keep the
    rule's layer split (the per-op search refines a seed with it); the grid takes the balanced
    one where it is faster (``EvaluatorPool.split_of``)."""
    cfg, n = pool.cfg, pool.cluster.n_devices
    exhaustive, all_tps, points = seed_plan(pool, global_batch)
    if exhaustive:
        best, _ = megatron_grid(pool, global_batch, micro_batch)
        if best is not None:
            yield best
        return
    mb = micro_batch or 1
    tp_chain = _Chain()
    for tp in all_tps if tps is None else tps:
        bound = float("inf")  # the fastest seed of this tp that fits so far
        cp_chain = _Chain()
        for cp in sorted({p["cp"] for p in points if p["tp"] == tp}):
            pp_chain = _Chain()
            for pp in pool.depths([p for p in divisors(n // (tp * cp)) if p <= cfg.layers]):
                dp = n // (tp * cp * pp)
                if global_batch % (mb * dp):
                    continue
                vpp = virtual_stages(cfg.layers, pp)[-1]
                found, grid_best = None, None
                for etp, ep, ep_chain in _expert_chains(cfg, tp, tp * cp * dp):
                    if ep_chain.stopped:
                        continue
                    base = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, sp=pool.sequence_parallel(tp, cp),
                                zero=1 if dp > 1 else 0, micro_batch=mb, global_batch=global_batch, seq=pool.seq)
                    cand, score = fastest_fitting(pool, dict(base, vpp=vpp), bound, balance=False)
                    if vpp > 1 and (cand is None or cand.megatron["recompute"] != "none"):
                        # interleaving holds more micro-batches in flight: without it, recomputation
                        # may be unnecessary
                        plain, pscore = fastest_fitting(pool, dict(base, vpp=1), min(bound, score or bound),
                                                        balance=False)
                        if plain is not None:
                            cand, score = plain, pscore
                    if cand is not None:
                        bound = min(bound, score)
                        if found is None or score < found.report.step_time_s:
                            found = cand
                    ep_chain.stopped = ep_chain.stops(None if cand is None else
                                                      (score, cand.megatron["recompute"] == "none"))
                    if ep_chain.best is not None and (grid_best is None or ep_chain.best[0] < grid_best[0]):
                        grid_best = ep_chain.best
                if found is not None:
                    yield found
                if pp_chain.stops(grid_best):
                    break  # deeper pipelines stopped helping this (tp, cp)
            if cp_chain.stops(pp_chain.best):
                break  # more context parallelism stopped helping this tp
        if tp_chain.stops(cp_chain.best):
            break  # more tensor parallelism stopped helping


def _expert_chains(cfg, tp: int, stage: int):
    """The expert grids of a stage in scan order, (etp, ep, the chain of that etp): per expert
    TP its expert-parallel degrees ascending (``megatron.expert_grids``)."""
    chains: dict = {}
    for etp, ep in expert_grids(cfg, tp, stage):
        yield etp, ep, chains.setdefault(etp, _Chain())


class _Chain:
    """Step times along one axis of the grid; ``stops`` once a point that fits without
    recomputation is no faster than the one before it. A point that needs recomputation does
    not stop the chain (further along, the memory it relieves may make recomputation
    unnecessary); one without a time (it does not fit, or cannot beat the best seed) breaks
    the comparison. ``stopped``: whether the scan along it has ended."""

    def __init__(self):
        self.last = None
        self.best = None  # (step time, fits without recomputation) of the fastest point
        self.stopped = False

    def stops(self, point: tuple | None) -> bool:
        if point is None:
            self.last = None
            return False
        if self.best is None or point[0] < self.best[0]:
            self.best = point
        stop = point[1] and self.last is not None and point[0] >= self.last
        self.last = point[0]
        return stop


def grid_descent(pool: EvaluatorPool, start, micro_batch: int | None, max_steps: int = 12):
    """Hill-climb the Megatron grid from ``start``: move one of tp, pp, cp, ep, etp, micro batch
    or virtual stages by a factor of two while the step gets faster; yields each improvement."""
    cfg, n = pool.cfg, pool.cluster.n_devices
    cur = start
    for _ in range(max_steps):
        pc = dict(cur.megatron)
        pc.pop("recompute")
        best = None
        for key in ("tp", "pp", "cp", "ep", "etp", "micro_batch", "vpp"):
            if key == "micro_batch" and micro_batch is not None:
                continue
            for f in (2, 0.5):
                trial = dict(pc)
                trial[key] = int(pc[key] * f) if pc[key] * f >= 1 else 0
                if not trial[key] or (key == "vpp" and trial["pp"] == 1 and trial[key] > 1):
                    continue
                if key == "pp" and trial["vpp"] > 1 and (trial["pp"] == 1 or cfg.layers % (trial["pp"] * trial["vpp"])):
                    trial["vpp"] = 1  # (virtual stages need a pipeline: halving pp to 1 leaves none)
                rest = trial["tp"] * trial["pp"] * trial["cp"]
                if n % rest:
                    continue
                trial["dp"] = n // rest
                trial["sp"] = pool.sequence_parallel(trial["tp"], trial["cp"])
                trial["zero"] = 1 if trial["dp"] > 1 else 0
                if (rest // trial["pp"] * trial["dp"]) % (trial["ep"] * trial["etp"]):
                    continue  # the expert grid does not fold over the stage's ranks
                cand, _ = fastest_fitting(pool, trial, (best or cur).report.step_time_s, balance=False)
                if cand is not None and (best is None or cand.report.step_time_s < best.report.step_time_s):
                    best = cand
        if best is None or best.report.step_time_s >= cur.report.step_time_s:
            return
        cur = best
        yield cur


RECOMPUTED_SEEDS = 2  # the fastest seeds that fit only with recomputation, whose ZeRO stages the search tries


def seed_phase(pool: EvaluatorPool, global_batch: int, micro_batch, tps, descend: bool):
    """The fastest seed that fits (hill-climbed on the grid when ``descend``), the seed with the
    least memory when none fits, how many seeds (and hill-climbing steps) it offered, and the
    ``RECOMPUTED_SEEDS`` fastest seeds that fit only with recomputation: the grid runs ZeRO-1
    (Megatron's distributed optimizer), where a deeper ZeRO stage may free the memory that
    recomputation buys back more slowly (``OuterSearch.consider`` tries them: DeepSpeed-Ulysses
    at its full degree with ZeRO-3, say)."""
    best = least = None
    recomputed: list = []
    count = 0
    for cand in structured_seeds(pool, global_batch, micro_batch, tps):
        count += 1
        rep = cand.report
        if rep.fits:
            if best is None or rep.step_time_s < best.report.step_time_s:
                best = cand
            if cand.train.recompute != "none":
                recomputed = sorted(recomputed + [cand], key=lambda c: c.report.step_time_s)[:RECOMPUTED_SEEDS]
        elif least is None or rep.memory_reserved < least.report.memory_reserved:
            least = cand
    if descend and best is not None:
        for cand in grid_descent(pool, best, micro_batch):
            best = cand
            count += 1
    return best, least, count, recomputed
