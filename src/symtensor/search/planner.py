"""The outer search: pipeline depth, micro-batches, recomputation, ZeRO stage and the memory weight
around the recursive partitioner.

    0. Megatron-expressible seeds (``structured_seeds``: the exhaustive grid with exact branch and
       bound on small clusters, a scan of it elsewhere, then hill-climbing): SymTensor's space
       contains Megatron's, so the search does not lose to the grid;
    1. partition the whole mesh (pp = 1) at a nominal number of micro-batches, lambda = 0; on
       more than FULL_MESH devices, the best seed's stage mesh at its micro-batches instead;
    2. pipeline depths p > 1 reuse the whole-mesh partition by rolling back the cuts of the
       outermost axes that become pipeline stages (MindSpore SAPP's pipeline rollback, spec 3.3-7);
    3. every (p, micro-batches, virtual stages, recomputation, ZeRO) variant of those layouts is
       costed with the full model; the fastest that fits wins;
    4. if nothing fits (or only with recomputation), the memory weight lambda grows (seconds per
       byte) and the partition is redone, until a plan fits or the least-memory plan is reported
       with the reason;
    5. the best plans are refined op by op (``partition.refine``): each op may move one mesh axis
       to another dim given all its neighbours, which is where per-op heterogeneous plans come from.

Steps 0 and 1-3 are independent up to FULL_MESH devices and run in two processes (a forked child
computes the seeds while this process partitions and rolls back; the best of all is refined
after); beyond, the two processes split the seeds' scan, then the child refines the best seed
while this process partitions its stage mesh. The result does not depend on whether the halves
ran in parallel.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from symtensor.cost import CostReport, Evaluator, TrainConfig
from symtensor.cost.model import MEMORY_HEADROOM
from symtensor.errors import PlanError
from symtensor.hardware import Cluster
from symtensor.layout import OpLayout, check_layout
from symtensor.models import ModelConfig
from symtensor.search.baselines import EvaluatorPool, _divisors, megatron_grid
from symtensor.search.parallel import Background
from symtensor.search.partition import Problem, partition, polish, refine, refine_blocks, solve


@dataclass
class Plan:
    """A searched plan: layouts of the skeleton graph's ops on the stage mesh, and its outer choices."""

    cfg: ModelConfig
    cluster: Cluster
    train: TrainConfig
    seq: int
    layouts: dict[str, OpLayout]
    report: CostReport
    evaluator: Evaluator
    search_time_s: float = 0.0
    search_phases_s: dict = field(default_factory=dict)  # seconds per phase of the search
    refined: bool = False  # the per-op local search has run from (or produced) these layouts
    evaluations: int = 0
    partitions: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def graph(self):
        return self.evaluator.graph

    @property
    def mesh(self):
        return self.evaluator.mesh


class _Search:
    def __init__(self, pool: EvaluatorPool, global_batch: int, micro_batch=None, order: str = "topological"):
        self.pool, self.cfg, self.cluster, self.seq = pool, pool.cfg, pool.cluster, pool.seq
        self.global_batch, self.micro_batch, self.order = global_batch, micro_batch, order
        self.best: Plan | None = None
        self.least_memory: Plan | None = None
        self.evaluations = self.partitions = 0
        self.phases: dict = {}
        self._floors: dict = {}  # recomputation -> Evaluator.step_floor (the same for every evaluator)

    def evaluator(self, graph_batch: int, pp: int) -> Evaluator:
        return self.pool.get(graph_batch, pp)

    def pipeline_depths(self) -> list[int]:
        n, layers = self.cluster.n_devices, self.cfg.layers
        return [p for p in _divisors(n) if p <= layers]

    def micro_steps(self, pp: int) -> list[int]:
        """Micro-batches per step: at least pp (to fill the pipeline), dividing the global batch."""
        gb = self.global_batch
        out = [m for m in _divisors(gb) if m >= pp]
        if self.micro_batch is not None:
            out = [m for m in out if (gb // m) % self.micro_batch == 0]
        return out

    def partition(self, pp: int, m: int, lam: float, recompute: str = "none", zero: int = 1) -> dict:
        return solve(self.problem(pp, m, lam, recompute, zero), order=self.order)

    def problem(self, pp: int, m: int, lam: float, recompute: str = "none", zero: int = 1) -> Problem:
        """The per-op problem of one partition (counted)."""
        train = TrainConfig(global_batch=self.global_batch, micro_steps=m, pp=pp, recompute=recompute, zero=zero,
                            framework=self.pool.framework)
        self.partitions += 1
        return self.pool.problem(train, lam)

    def absorb(self, other: "_Search") -> None:
        """Take the plans of a search run beside this one (its fastest and its smallest) and its
        count of evaluations."""
        offered = [p for p in (other.best, other.least_memory) if p is not None]
        self.evaluations += other.evaluations - len(offered)
        for plan in offered:
            self.offer(plan)

    def consider_batches(self, layouts: dict, pp: int) -> None:
        """Micro-batches for these layouts: every cut of the batch must divide the micro-step batch.
        Without pipelining, the fewest micro-batches that fit (large micro-batches amortise
        latencies); with it, the most (the bubble shrinks as (p-1)/m)."""
        mesh = self.cluster.mesh()
        bcut = max((_factor(lay, "b", mesh) for lay in layouts.values()), default=1)
        ms = [m for m in self.micro_steps(pp) if (self.global_batch // m) % bcut == 0]
        if pp > 1:
            for m in ms[::-1][:2]:
                self.consider(layouts, pp, m)
            return
        # the five fewest micro-batch counts (large micro-batches amortise latencies) and the most
        # (the least memory), the most first: a variant's memory at a larger micro-batch follows
        # from a smaller one (see consider)
        seen: dict = {}
        for m in sorted(dict.fromkeys(ms[:5] + ms[-1:]), reverse=True):
            self.consider(layouts, pp, m, seen)

    def consider(self, layouts: dict, pp: int, m: int, seen: dict | None = None) -> bool:
        """Cost the recomputation / ZeRO / virtual-stage variants of ``layouts`` at (pp, m);
        True when one fits.

        ``seen`` (no pipeline only): per (recomputation, ZeRO stage) costed at another micro-step
        batch, that batch, its parameters + gradients + optimizer state and the rest of its peak;
        updated. With one micro-batch in flight the rest is activations, which scale with the
        batch (tested), so a variant whose peak at this batch follows to be over the capacity is
        not costed, and when no variant is left no graph is built for this batch."""
        gbatch = self.global_batch // m
        bound = self.best.report.step_time_s if self.best is not None else float("inf")
        usable = self.cluster.device.memory * MEMORY_HEADROOM * (1 + 1e-9)
        variants = [v for v in self._variants(bound) if seen is None or v not in seen
                    or seen[v][1] + gbatch / seen[v][0] * seen[v][2] <= usable]
        if not variants:
            return False
        ev = self.evaluator(gbatch, pp)
        try:
            for op in ev.graph.ops:
                check_layout(op, layouts.get(op.name, OpLayout()), ev.mesh)
        except PlanError:
            return False  # a cut no longer divides at this micro-batch size
        vpps = [v for v in (2, 3, 4) if pp > 1 and self.cfg.layers % (pp * v) == 0]
        # cheapest first: recomputation and deeper ZeRO stages only cost time, so the first variant
        # that fits is the fastest of its row (ZeRO-1 has ZeRO-0's time and less memory), and once
        # a variant is no faster than the best plan, none after it can be (branch and bound);
        # a ZeRO stage whose parameters and optimizer state alone overflow is not tried
        statics: dict = {}  # ZeRO stage -> whether its parameters and optimizer state fit
        for rc, zero in variants:
            if rc not in self._floors:
                self._floors[rc] = ev.step_floor(self._train(pp, m, 1, rc, zero))
            if self._floors[rc] * (1 - 1e-9) >= bound:
                return False  # no plan with this recomputation (or a heavier one) can be faster
            if self.best is not None:  # (while nothing fits, the least memory is wanted too)
                if zero not in statics:
                    statics[zero] = ev.static_fits(layouts, self._train(pp, m, 1, "none", zero))
                if not statics[zero]:
                    continue
            plan = self._cost(ev, layouts, pp, m, 1, rc, zero)
            if seen is not None:
                mem = plan.report.memory
                state = mem["static"]
                seen[(rc, zero)] = (gbatch, state, plan.report.memory_peak - state)
            if plan.report.fits:
                for vpp in vpps:
                    self._cost(ev, layouts, pp, m, vpp, rc, zero)
                return True
            if plan.report.step_time_s >= bound:
                return False
        return False

    def _variants(self, bound: float) -> list[tuple[str, int]]:
        """(recomputation, ZeRO stage) pairs in the order ``consider`` costs them, up to the first
        recomputation whose step floor (``Evaluator.step_floor``: FLOPs at the best rate over all
        devices, the same for every layout, micro-batch count and pipeline) cannot beat ``bound``;
        a floor not yet known (no evaluator of this search has computed it) does not stop."""
        out = []
        for rc in self.pool.recomputations():
            floor = self._floors.get(rc)
            if floor is not None and floor * (1 - 1e-9) >= bound:
                break
            out += [(rc, zero) for zero in (1, 2, 3)]
        return out

    def _train(self, pp, m, vpp, rc, zero) -> TrainConfig:
        return TrainConfig(global_batch=self.global_batch, micro_steps=m, pp=pp, vpp=vpp, recompute=rc, zero=zero,
                           framework=self.pool.framework)

    def _cost(self, ev, layouts, pp, m, vpp, rc, zero) -> Plan:
        train = self._train(pp, m, vpp, rc, zero)
        return self.offer(Plan(self.cfg, self.cluster, train, self.seq, layouts,
                               ev.evaluate(layouts, train, check=False), ev))

    def offer(self, plan: Plan) -> Plan:
        """Keep ``plan`` if it is the fastest that fits (or, while nothing fits, the smallest)."""
        self.evaluations += 1
        rep = plan.report
        if rep.fits:
            if self.best is None or rep.step_time_s < self.best.report.step_time_s:
                self.best = plan
        elif self.least_memory is None or rep.memory_peak < self.least_memory.report.memory_peak:
            self.least_memory = plan
        return plan


def _factor(layout: OpLayout, dim: str, mesh) -> int:
    f = 1
    for a in layout.axes_of(dim):
        f *= mesh[a].size if a < len(mesh) else 1
    return f


def rollback(layouts: dict[str, OpLayout], k: int) -> dict[str, OpLayout]:
    """Drop the cuts on the first ``k`` mesh axes (they become pipeline stages) and re-index."""
    return {name: lay.without_outer(k) for name, lay in layouts.items()}


def _rollback_axes(cluster: Cluster, pp: int) -> int | None:
    """How many outermost axes form the pipeline when they multiply to pp exactly, else None."""
    mesh, prod = cluster.mesh(), 1
    for i, ax in enumerate(mesh):
        if prod == pp:
            return i
        prod *= ax.size
    return len(mesh) if prod == pp else None


SMALL_GRID = 64  # grids with at most this many points are seeded exhaustively,
SMALL_CLUSTER = 16  # and so are clusters of at most this many devices


def search(cfg: ModelConfig, cluster: Cluster, global_batch: int, seq: int, micro_batch: int | None = None,
           order: str = "topological", space: str = "symtensor", graph_factory=None,
           framework: str = "megatron") -> Plan:
    """The SymTensor plan: the fastest predicted step that fits in memory, costed under
    ``framework``'s engine semantics (``cost.engine``).

    Args:
        space: ``symtensor`` (per-op layouts) or ``megatron`` (Megatron-expressible plans only,
            exhaustively with branch and bound).
        graph_factory: graphs per micro-step batch for a captured model (``frontends``).
    """
    with _collector_paused():
        return _search(cfg, cluster, global_batch, seq, micro_batch, order, space, graph_factory, framework)


@contextmanager
def _collector_paused():
    """The search allocates millions of short-lived objects (memo keys, layouts, costs) and no
    reference cycles of note; Python's cyclic collector would walk the growing memo tables again
    and again (10-30% of a search). Reference counting frees them; collection resumes after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _search(cfg, cluster, global_batch, seq, micro_batch, order, space, graph_factory, framework) -> Plan:
    t0 = time.perf_counter()
    pool = EvaluatorPool(cfg, cluster, seq, graph_factory, framework)
    s = _Search(pool, global_batch, micro_batch, order)
    if space == "megatron":
        seed, points = megatron_grid(pool, global_batch, micro_batch)
        s.evaluations += points
        if seed is not None:
            s.offer(_plan_of(s, seed))
        return _finish(s, t0)
    # the Megatron seeds and the partition are computed in two processes (parallel.py)
    exhaustive, tps, _ = _seed_plan(pool, global_batch)
    fork = graph_factory is None  # captured graphs come from torch.export: not in a fork
    if exhaustive or cluster.n_devices <= FULL_MESH:
        base = _seeds_beside_partition(s, fork)
    else:
        base = None
        _split_seeds(s, tps, fork)
    t1 = time.perf_counter()
    if base is None and s.best is not None:
        # the child refines the best seed while this process partitions its stage mesh
        seed = s.best
        with Background(lambda: _portable(_refine_plan(s.pool, seed)), fork=fork) as job:
            _partitions(s, base)
            _adopt(s, job.result())
        seed.refined = True
    else:
        _partitions(s, base)
    t2 = time.perf_counter()
    # the best plan refined op by op (the least-memory plan when nothing fits), unless it was
    _refine(s, s.best or s.least_memory)
    # (up to FULL_MESH devices the whole-mesh partition runs alongside the seeds, in their phase)
    s.phases = {"seeds_s": t1 - t0, "partition_s": t2 - t1, "refine_s": time.perf_counter() - t2}
    return _finish(s, t0)


def _seeds_beside_partition(s: "_Search", fork: bool) -> dict:
    """Up to FULL_MESH devices: a forked child computes the Megatron seeds while this process
    partitions the whole mesh and rolls it back to every pipeline depth; returns the whole-mesh
    partition. Only the better of the two best plans is refined, afterwards: refining the best
    seed as well was a third of the child's work (which slows this process down while both run
    on the two cores), and on the plan-quality scenarios it never changed the winner."""
    pool, gb, mb = s.pool, s.global_batch, s.micro_batch
    m0 = _nominal_steps(s)
    # the partition's graph is built before the fork: the seeds' data-parallel points with one
    # sequence per device share it, and then neither process builds it on a shared core
    s.evaluator(gb // m0, 1)
    with Background(lambda: _seed_phase(pool, gb, mb, None, descend=True), fork=fork) as job:
        base = _partition_rolled_back(s, m0, fork)
        best, least, count = job.result()
    _offer_seeds(s, best, least, count)
    return base


def _partition_rolled_back(s: "_Search", m0: int, fork: bool) -> dict:
    """The whole-mesh partition at ``m0`` micro-batches rolled back to every pipeline depth
    (``_rollbacks``), pipelined over two processes: once the recursion is done, a forked child
    polishes its layouts (the op and block moves of ``solve``) while this process rolls the
    unpolished layouts back in a search of its own. When polishing changed nothing (most
    scenarios) those are the rollbacks of the polished layouts and their plans are kept; otherwise
    they are dropped and the child rolls its layouts back and sends its plans, so the result is
    ``_rollbacks(s, solve(...))``'s either way. Returns the polished layouts."""
    problem = s.problem(1, m0, 0.0)
    raw = partition(problem, order=s.order)

    def polished_rollbacks():
        base = polish(problem, raw)
        if base == raw:
            return None
        t = _Search(s.pool, s.global_batch, s.micro_batch, s.order)
        _rollbacks(t, base)
        return base, _portable([p for p in (t.best, t.least_memory) if p is not None]), t.evaluations

    with Background(polished_rollbacks, fork=fork) as job:
        guess = _Search(s.pool, s.global_batch, s.micro_batch, s.order)
        _rollbacks(guess, raw)
        polished = job.result()
    if polished is None:
        s.absorb(guess)
        return raw
    base, plans, count = polished
    s.evaluations += count - len(plans)
    _adopt(s, plans, refined=False)
    return base


def _split_seeds(s: "_Search", tps: list[int], fork: bool) -> None:
    """Larger clusters: the seeds' scan split by tensor-parallel degree between a forked child
    and this process, then the best seed hill-climbed on the grid."""
    pool, gb, mb = s.pool, s.global_batch, s.micro_batch
    with Background(lambda: _seed_phase(pool, gb, mb, tps[1::2], descend=False), fork=fork) as job:
        found = [_seed_phase(pool, gb, mb, tps[0::2], descend=False), job.result()]
    for best, least, count in found:
        _offer_seeds(s, best, least, count)
    fitting = [best for best, _, _ in found if best is not None]
    if fitting:
        start = min(fitting, key=lambda c: c.report.step_time_s)
        for cand in grid_descent(pool, start, mb):
            s.offer(_plan_of(s, cand))


def _offer_seeds(s: "_Search", best, least, count: int) -> None:
    """Offer what a seed phase (``_seed_phase``) found, counting its configurations."""
    s.evaluations += count
    for cand in (best, least):
        if cand is not None:
            s.offer(_plan_of(s, cand))


def _portable(plans: list) -> list[tuple]:
    """Plans as (train, layouts, report), which cross a process boundary (evaluators do not)."""
    return [(p.train, p.layouts, p.report) for p in plans]


def _adopt(s: "_Search", portable: list[tuple], refined: bool = True) -> None:
    """Offer plans computed in another process (refined ones by default), with this process's
    evaluators."""
    for train, layouts, report in portable:
        s.offer(Plan(s.cfg, s.cluster, train, s.seq, layouts, report, s.pool.get(train.graph_batch, train.pp),
                     refined=refined))


def _seed_phase(pool: EvaluatorPool, global_batch: int, micro_batch, tps, descend: bool):
    """The fastest seed that fits (hill-climbed on the grid when ``descend``), the seed with the
    least memory when none fits, and how many seeds (and hill-climbing steps) it offered."""
    best = least = None
    count = 0
    for cand in structured_seeds(pool, global_batch, micro_batch, tps):
        count += 1
        rep = cand.report
        if rep.fits:
            if best is None or rep.step_time_s < best.report.step_time_s:
                best = cand
        elif least is None or rep.memory_peak < least.report.memory_peak:
            least = cand
    if descend and best is not None:
        for cand in grid_descent(pool, best, micro_batch):
            best = cand
            count += 1
    return best, least, count


def _nominal_steps(s: "_Search") -> int:
    """Micro-batches of the whole-mesh partition: one sequence per device per micro-step when the
    batch allows it."""
    steps1 = s.micro_steps(1)
    if not steps1:
        raise PlanError(f"global batch {s.global_batch} has no micro-batch split compatible with --micro-batch "
                        f"{s.micro_batch}")
    return max([m for m in steps1 if s.global_batch // m >= s.cluster.n_devices] or [steps1[0]])


def _plan_of(s: "_Search", cand) -> Plan:
    pc = cand.config
    return Plan(s.cfg, s.cluster, pc.train_config(), s.seq, cand.layouts, cand.report,
                s.pool.get(pc.micro_batch * pc.dp, pc.pp))


def _seed_plan(pool: EvaluatorPool, global_batch: int) -> tuple[bool, list[int], list[dict]]:
    """Whether the seeds are the exhaustive grid, the tensor-parallel degrees of the scan and the
    grid's points."""
    points = pool.grid(global_batch)
    exhaustive = len(points) <= SMALL_GRID or pool.cluster.n_devices <= SMALL_CLUSTER
    return exhaustive, sorted({p["tp"] for p in points}), points


def structured_seeds(pool: EvaluatorPool, global_batch: int, micro_batch: int | None, tps=None):
    """Megatron-expressible starting points: the whole grid (exact branch and bound) on small
    clusters. Elsewhere a scan that treats the step time as unimodal along each axis of the grid:
    tensor-parallel degrees ascending, per degree context-parallel degrees ascending, per degree
    pipeline depths ascending and (MoE) expert-parallel degrees ascending, each chain stopped once a
    point that fits without recomputation is no faster than the one before (``_Chain``). Points
    already slower than the fastest seed of their tp are only costed once (recomputation only adds
    time). ``tps``: the degrees to scan; a call depends on nothing else, so the scan can be
    split between two processes, which give the same seeds as one."""
    cfg, n = pool.cfg, pool.cluster.n_devices
    exhaustive, all_tps, points = _seed_plan(pool, global_batch)
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
            for pp in [p for p in _divisors(n // (tp * cp)) if p <= cfg.layers]:
                dp = n // (tp * cp * pp)
                if global_batch % (mb * dp):
                    continue
                eps = [e for e in _divisors(dp) if cfg.experts % e == 0] if cfg.is_moe else [1]
                vpp = max([v for v in (1, 2, 3, 4) if cfg.layers % (pp * v) == 0] or [1]) if pp > 1 else 1
                found, ep_chain = None, _Chain()
                for ep in eps:
                    base = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, sp=tp > 1, zero=1 if dp > 1 else 0,
                                micro_batch=mb, global_batch=global_batch, seq=pool.seq)
                    cand, score = _fastest_fitting(pool, dict(base, vpp=vpp), bound)
                    if vpp > 1 and (cand is None or cand.config.recompute != "none"):
                        # interleaving holds more micro-batches in flight: without it, recomputation
                        # may be unnecessary
                        plain, pscore = _fastest_fitting(pool, dict(base, vpp=1), min(bound, score or bound))
                        if plain is not None:
                            cand, score = plain, pscore
                    if cand is not None:
                        bound = min(bound, score)
                        if found is None or score < found.report.step_time_s:
                            found = cand
                    if ep_chain.stops(None if cand is None else (score, cand.config.recompute == "none")):
                        break
                if found is not None:
                    yield found
                if pp_chain.stops(ep_chain.best):
                    break  # deeper pipelines stopped helping this (tp, cp)
            if cp_chain.stops(pp_chain.best):
                break  # more context parallelism stopped helping this tp
        if tp_chain.stops(cp_chain.best):
            break  # more tensor parallelism stopped helping


class _Chain:
    """Step times along one axis of the grid; ``stops`` once a point that fits without
    recomputation is no faster than the one before it. A point that needs recomputation does
    not stop the chain (further along, the memory it relieves may make recomputation
    unnecessary); one without a time (it does not fit, or cannot beat the best seed) breaks
    the comparison."""

    def __init__(self):
        self.last = None
        self.best = None  # (step time, fits without recomputation) of the fastest point

    def stops(self, point: tuple | None) -> bool:
        if point is None:
            self.last = None
            return False
        if self.best is None or point[0] < self.best[0]:
            self.best = point
        stop = point[1] and self.last is not None and point[0] >= self.last
        self.last = point[0]
        return stop


def _fastest_fitting(pool: EvaluatorPool, base: dict, bound: float = float("inf")):
    """The cheapest recomputation with which ``base`` fits and its step time; (None, None) when
    nothing fits (parameters and optimizer state alone overflowing the memory are checked before
    any evaluation) or when it cannot beat ``bound`` (a variant that does not fit is already no
    faster, and recomputation only adds time: exact branch and bound)."""
    from symtensor.search.baselines import _static_fits, _try

    if not _static_fits(pool, base):
        return None, None
    for rc in pool.recomputations():
        cand = _try(pool, **base, recompute=rc)
        if cand is None:
            return None, None
        rep = cand.report
        if rep.fits:
            return cand, rep.step_time_s
        if rep.step_time_s >= bound:
            return None, None
    return None, None


def grid_descent(pool: EvaluatorPool, start, micro_batch: int | None, max_steps: int = 12):
    """Hill-climb the Megatron grid from ``start``: move one of tp, pp, cp, ep, micro batch or
    virtual stages by a factor of two while the step gets faster; yields each improvement."""
    cfg, n = pool.cfg, pool.cluster.n_devices
    cur = start
    for _ in range(max_steps):
        pc = cur.config.as_dict()
        pc.pop("recompute")
        best = None
        for key in ("tp", "pp", "cp", "ep", "micro_batch", "vpp"):
            if key == "micro_batch" and micro_batch is not None:
                continue
            for f in (2, 0.5):
                trial = dict(pc)
                trial[key] = int(pc[key] * f) if pc[key] * f >= 1 else 0
                if not trial[key] or (key == "vpp" and trial["pp"] == 1 and trial[key] > 1):
                    continue
                if key == "pp" and trial["vpp"] > 1 and cfg.layers % (trial["pp"] * trial["vpp"]):
                    trial["vpp"] = 1
                rest = trial["tp"] * trial["pp"] * trial["cp"]
                if n % rest:
                    continue
                trial["dp"] = n // rest
                trial["sp"] = trial["tp"] > 1
                trial["zero"] = 1 if trial["dp"] > 1 else 0
                if trial["dp"] % trial["ep"]:
                    continue
                cand, _ = _fastest_fitting(pool, trial, (best or cur).report.step_time_s)
                if cand is not None and (best is None or cand.report.step_time_s < best.report.step_time_s):
                    best = cand
        if best is None or best.report.step_time_s >= cur.report.step_time_s:
            return
        cur = best
        yield cur


FULL_MESH = 128  # clusters up to this size partition the whole mesh and roll pipelines back


def _partitions(s: "_Search", base: dict | None = None) -> None:
    """Steps 1-4 of the module docstring (``base``: the whole-mesh partition at lambda 0, when
    already computed and rolled back). On clusters larger than ``FULL_MESH`` whose best
    Megatron seed pipelines, the partition runs on that seed's stage mesh at its micro-batches
    instead: the outer axes would become pipeline stages anyway, and deciding them first costs
    more than half of the search there."""
    n = s.cluster.n_devices
    m0 = _nominal_steps(s)
    seed = s.best
    staged = seed is not None and seed.train.pp > 1 and n > FULL_MESH
    lam, attempt = 0.0, 0
    while attempt < 6:
        if staged:
            s.consider_batches(s.partition(seed.train.pp, seed.train.micro_steps, lam), seed.train.pp)
        elif attempt > 0 or base is None:  # (``base`` was rolled back already)
            _rollbacks(s, s.partition(1, m0, lam))
        attempt += 1
        # memory pressure (nothing fits, or only with recomputation): weigh memory in the
        # partition, in seconds per byte, more each round; one round when something fits
        if not _pressed(s.best) or attempt >= (6 if s.best is None else 2):
            break
        ref = (s.best or s.least_memory).report
        lam = (ref.step_time_s / ref.capacity) * (4.0 ** attempt)


def _rollbacks(s: "_Search", base: dict) -> None:
    """Pipeline depths from a whole-mesh partition: the outermost axes become stages."""
    for pp in s.pipeline_depths():
        if s.best is not None and pp > 2 and s.best.train.pp < pp // 2:
            break  # the last depth did not help: deeper pipelines will not either
        k = _rollback_axes(s.cluster, pp)
        if k is None:
            continue
        s.consider_batches(rollback(base, k), pp)


def _pressed(plan: Plan | None) -> bool:
    """Nothing fits, or only with recomputation: memory is worth trading time for. (ZeRO-3
    alone does not count: its gathers often cost less than the larger micro-batches it allows
    save, and on the plan-quality scenarios a memory-weighted round never improved such plans.)"""
    return plan is None or plan.train.recompute != "none"


def _refine_plan(pool: EvaluatorPool, plan: Plan) -> list[Plan]:
    """Per-op local search around ``plan`` (with a memory weight too when it needs recomputation
    or does not fit): the plans it leads to, costed by the full model."""
    rep, out = plan.report, []
    for lam in (0.0, rep.step_time_s / rep.capacity) if _pressed(plan) or not rep.fits else (0.0,):
        problem = pool.problem(plan.train, lam)
        layouts = refine(problem, refine_blocks(problem, plan.layouts))
        if layouts != plan.layouts:
            out.append(Plan(plan.cfg, plan.cluster, plan.train, plan.seq, layouts,
                            plan.evaluator.evaluate(layouts, plan.train, check=False), plan.evaluator,
                            refined=True))
    return out


def _refine(s: "_Search", plan: Plan | None) -> None:
    """Refine ``plan`` unless it is None or was refined (or came from a refinement) already."""
    if plan is None or plan.refined:
        return
    plan.refined = True
    for better in _refine_plan(s.pool, plan):
        s.offer(better)


def _finish(s: "_Search", t0: float) -> Plan:
    plan = s.best or s.least_memory
    cfg, n = s.cfg, s.cluster.n_devices
    if plan is None:
        raise PlanError(f"no valid plan for {cfg.name} on {n} devices; check the batch and the device count")
    plan.search_time_s = time.perf_counter() - t0
    plan.search_phases_s = dict(s.phases)
    plan.evaluations, plan.partitions = s.evaluations, s.partitions
    idle = _idle_axes(plan)
    if idle:
        plan.notes.append(
            f"mesh axes {', '.join(a.name for a in idle)} (x{_size(idle)}) cut no matmul: those devices repeat "
            f"work; a global batch or sequence divisible by {_size(idle)} more would let the plan use them")
    if s.best is None:
        rep = plan.report
        plan.notes.append(
            f"nothing fits: the least memory any plan reached is {rep.memory_peak / 2**30:.1f} GiB per device "
            f"against {0.9 * rep.capacity / 2**30:.1f} GiB usable; use more devices, a smaller micro-batch or "
            "sequence, or a device with more memory")
    return plan


def _idle_axes(plan: Plan) -> list:
    """Stage-mesh axes that no linear or attention op cuts (replicated compute)."""
    used = set()
    for op in plan.graph.ops:
        if op.kind in ("linear", "attention", "bmm"):
            used |= plan.layouts[op.name].used_axes()
    return [a for i, a in enumerate(plan.mesh) if i not in used]


def _size(axes) -> int:
    n = 1
    for a in axes:
        n *= a.size
    return n


def drec_plan(cfg: ModelConfig, cluster: Cluster, global_batch: int, seq: int) -> Plan:
    """The D-Rec baseline: D-Rec's layouts (unitless costs, same recursion), pipeline depths by
    rollback, micro-batches / recomputation / ZeRO costed by the full model."""
    from symtensor.search.drec import drec_layouts

    t0 = time.perf_counter()
    pool = EvaluatorPool(cfg, cluster, seq)
    s = _Search(pool, global_batch)
    steps1 = s.micro_steps(1)
    m0 = max([m for m in steps1 if global_batch // m >= cluster.n_devices] or [steps1[0]])
    ev = pool.get(global_batch // m0, 1)
    base = drec_layouts(ev, TrainConfig(global_batch=global_batch, micro_steps=m0))
    for pp in s.pipeline_depths():
        k = _rollback_axes(cluster, pp)
        if k is not None:
            s.consider_batches(rollback(base, k), pp)
    return _finish(s, t0)
