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
       to another dim given all its neighbours, which is where per-op heterogeneous plans come from;
    6. where no precision was given and the device has FP8 Tensor Cores, the best point's FP8
       variants (``outer.precision_variant``): FP8 is the plan when it wins, and its note says by how much.

Step 0 is ``search.seeds``, steps 1-5 ``search.outer``; this module runs them. Steps 0 and 1-3
are independent up to FULL_MESH devices and run in two processes (a forked child
computes the seeds while this process partitions and rolls back; the best of all is refined
after, by a child that started on the likely best as soon as it was known: ``_speculate``);
beyond, the two processes split the seeds' scan, then the child refines the best seed while this
process partitions its stage mesh. The result does not depend on whether the halves ran in
parallel.
"""

from __future__ import annotations

import gc
import time
from contextlib import ExitStack, contextmanager

from symtensor.cost.stack import Stack
from symtensor.hardware import Cluster
from symtensor.models import ModelConfig
from symtensor.plan.plan import Plan
from symtensor.search.grid import megatron_grid
from symtensor.search.outer import (
    FULL_MESH,
    OuterSearch,
    finish,
    nominal_steps,
    partitions,
    refine_best,
    refine_plan,
    rollbacks,
)
from symtensor.search.parallel import Background
from symtensor.search.partition import partition, polish
from symtensor.search.pool import Costed, EvaluatorPool
from symtensor.search.seeds import grid_descent, seed_phase, seed_plan


def search(cfg: ModelConfig, cluster: Cluster, global_batch: int, seq: int, micro_batch: int | None = None,
           order: str = "topological", space: str = "symtensor", graph_factory=None,
           framework: str = "megatron", precision: str | None = None, fp8_recipe: str | None = None,
           stack: Stack | None = None, pool: EvaluatorPool | None = None) -> Plan:
    """The SymTensor plan: the fastest predicted step that fits in memory, costed under
    ``framework``'s engine semantics (``cost.engine``).

    Args:
        space: ``symtensor`` (per-op layouts) or ``megatron`` (Megatron-expressible plans only,
            exhaustively with branch and bound).
        graph_factory: graphs per micro-step batch for a captured model (``frontends``).
        precision: ``bf16`` or ``fp8`` (under ``fp8_recipe``) for every point; None: BF16, and FP8
            where it wins as a variant of the best point (step 6, ``outer.precision_variant``).
        stack: the facts of the user's stack every point runs with (``cost.stack.Stack``: the MoE options,
            the gradient reduction's dtype, the allocator); default: today's costing.
        pool: a pool of this model, cluster, sequence and engine to search in (``search.guarantee``
            shares its evaluators with the grid), when it costs as this search's would
            (``EvaluatorPool.same``); it should hold nothing yet, or the search may differ
            (its layout cache is bounded, and a point's layouts are known by identity).
    """
    with collector_paused():
        return _search(cfg, cluster, global_batch, seq, micro_batch, order, space, graph_factory, framework,
                       precision, fp8_recipe, stack, pool)


@contextmanager
def collector_paused():
    """The search (and the guarantees around it, ``search.guarantee``) allocates millions of
    short-lived objects (memo keys, layouts, costs) and no reference cycles of note; Python's cyclic
    collector would walk the growing memo tables again and again (10-30% of a search; about 0.3 s
    of DeepSeek-V3's whole plan on 1,024 H100). Reference counting frees them; collection resumes
    after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _search(cfg, cluster, global_batch, seq, micro_batch, order, space, graph_factory, framework, precision=None,
            fp8_recipe=None, stack=None, shared=None) -> Plan:
    t0 = time.perf_counter()
    pool = EvaluatorPool(cfg, cluster, seq, graph_factory, framework, precision, fp8_recipe, stack)
    if shared is not None and shared.same(pool):
        pool = shared  # (the guarantee's, whose grid and baselines then reuse this search's evaluators)
    s = OuterSearch(pool, global_batch, micro_batch, order)
    if space == "megatron":
        seed, points = megatron_grid(pool, global_batch, micro_batch)
        s.evaluations += points
        if seed is not None:
            s.offer(seed)
        return finish(s, t0, zero_variants=False)  # (the grid's ZeRO stage is Megatron's distributed optimizer)
    # the Megatron seeds and the partition are computed in two processes (parallel.py)
    exhaustive, tps, _ = seed_plan(pool, global_batch)
    fork = graph_factory is None  # captured graphs come from torch.export: not in a fork
    with ExitStack() as children:  # (a speculative refinement outlives the phase that starts it)
        speculated = None
        if exhaustive or cluster.n_devices <= FULL_MESH:
            base, speculated = _seeds_beside_partition(s, fork, children)
        else:
            base = None
            _split_seeds(s, tps, fork)
        t1 = time.perf_counter()
        if base is None and s.best is not None:
            # the child refines the best seed while this process partitions its stage mesh
            seed = s.best
            with Background(lambda: refine_plan(s.pool, seed), fork=fork) as job:
                partitions(s, base)
                _adopt(s, job.result())
            s.refined.add(id(seed))
        else:
            partitions(s, base)
        t2 = time.perf_counter()
        # the best plan refined op by op (the least-memory plan when nothing fits), unless it was
        refine_best(s, s.best or s.least_memory, speculated)
    # (up to FULL_MESH devices the whole-mesh partition runs alongside the seeds, in their phase)
    s.phases = {"seeds_s": t1 - t0, "partition_s": t2 - t1, "refine_s": time.perf_counter() - t2}
    return finish(s, t0)


def _seeds_beside_partition(s: OuterSearch, fork: bool, children: ExitStack) -> tuple[dict, tuple | None]:
    """Up to FULL_MESH devices: a forked child computes the Megatron seeds while this process
    partitions the whole mesh and rolls it back to every pipeline depth; returns the whole-mesh
    partition and the speculative refinement (``_speculate``). Only the better of the two best
    plans is refined, afterwards: refining the best seed as well was a third of the child's work
    (which slows this process down while both run on the two cores), and on the plan-quality
    scenarios it never changed the winner."""
    pool, gb, mb = s.pool, s.global_batch, s.micro_batch
    m0 = nominal_steps(s)
    # the partition's graph is built before the fork: the seeds' data-parallel points with one
    # sequence per device share it, and then neither process builds it on a shared core
    s.evaluator(gb // m0, 1)
    with Background(lambda: seed_phase(pool, gb, mb, None, descend=True), fork=fork) as job:
        base, speculated = _partition_rolled_back(s, m0, fork, job, children)  # (may read the seeds early)
        found = job.result()
    _offer_seeds(s, *found)
    return base, speculated


def _partition_rolled_back(s: OuterSearch, m0: int, fork: bool, seeds: Background,
                           children: ExitStack) -> tuple[dict, tuple | None]:
    """The whole-mesh partition at ``m0`` micro-batches rolled back to every pipeline depth
    (``outer.rollbacks``), pipelined over two processes: once the recursion is done, a forked child
    polishes its layouts (the op and block moves of ``solve``) while this process rolls the
    unpolished layouts back in a search of its own. When polishing changed nothing (most
    scenarios) those are the rollbacks of the polished layouts and their plans are kept; otherwise
    they are dropped and the child rolls its layouts back and sends its plans, so the result is
    ``rollbacks(s, solve(...))``'s either way. Returns the polished layouts and the speculative
    refinement started after the unpipelined rollback (``_speculate``)."""
    problem = s.problem(1, m0, 0.0)
    raw = partition(problem, order=s.order)

    def polished_rollbacks():
        base = polish(problem, raw)
        if base == raw:
            return None
        t = OuterSearch(s.pool, s.global_batch, s.micro_batch, s.order)
        rollbacks(t, base)
        return base, [p for p in (t.best, t.least_memory) if p is not None], t.evaluations

    with Background(polished_rollbacks, fork=fork) as job:
        guess = OuterSearch(s.pool, s.global_batch, s.micro_batch, s.order)
        depths = guess.pipeline_depths()
        rollbacks(guess, raw, depths[:1])
        speculated = _speculate(s.pool, guess, seeds, children, fork)
        rollbacks(guess, raw, depths[1:])
        polished = job.result()
    if polished is None:
        s.absorb(guess)
        return raw, speculated
    base, plans, count = polished
    s.evaluations += count - len(plans)
    _adopt(s, plans, refined=False)
    return base, speculated


def _speculate(pool: EvaluatorPool, guess: OuterSearch, seeds: Background, children: ExitStack,
               fork: bool) -> tuple[Costed, Background] | None:
    """The point the search will most likely refine at its end, refined now in a forked child
    while this process rolls the partition back to deeper pipelines: the better of the whole-mesh
    partition's unpipelined plans and the seeds (when their child is done). On every plan-quality
    scenario up to FULL_MESH devices it is the point refined at the end. ``refine_best`` takes the
    child's refinement only when it refines this very point, and refines the point itself
    otherwise, so the plan does not depend on the guess. Returns (the point, its refinement)."""
    points = [p for p in (guess.best, guess.least_memory) if p is not None]
    if seeds.ready():
        best, least = seeds.result()[:2]
        points += [p for p in (best, least) if p is not None]
    if not points:
        return None
    point = min(points, key=lambda p: p.key)  # (the first of equals, as OuterSearch.offer keeps)
    return point, children.enter_context(Background(lambda: refine_plan(pool, point), fork=fork))


def _split_seeds(s: OuterSearch, tps: list[int], fork: bool) -> None:
    """Larger clusters: the seeds' scan split by tensor-parallel degree between a forked child
    and this process, then the best seed hill-climbed on the grid."""
    pool, gb, mb = s.pool, s.global_batch, s.micro_batch
    with Background(lambda: seed_phase(pool, gb, mb, tps[1::2], descend=False), fork=fork) as job:
        found = [seed_phase(pool, gb, mb, tps[0::2], descend=False), job.result()]
    for phase in found:
        _offer_seeds(s, *phase)
    fitting = [phase[0] for phase in found if phase[0] is not None]
    if fitting:
        start = min(fitting, key=lambda c: c.report.step_time_s)
        for cand in grid_descent(pool, start, mb):
            s.offer(cand)


def _offer_seeds(s: OuterSearch, best, least, count: int, recomputed=()) -> None:
    """Offer what a seed phase (``seeds.seed_phase``) found, counting its configurations, and cost the ZeRO stages
    of the seeds that fit only with recomputation (``OuterSearch.consider``: every recomputation and ZeRO
    stage of their layouts, cheapest first, against the best so far)."""
    s.evaluations += count
    for cand in (best, least):
        if cand is not None:
            s.offer(cand)
    for cand in recomputed:
        s.consider(cand.layouts, cand.train.pp, cand.train.micro_steps)


def _adopt(s: OuterSearch, points: list[Costed], refined: bool = True) -> None:
    """Offer points costed in another process (refined ones by default)."""
    for point in points:
        s.offer(point)
        if refined:
            s.refined.add(id(point))
