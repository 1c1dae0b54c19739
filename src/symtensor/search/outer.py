"""The outer search (steps 1-5 of ``search.planner``): pipeline depth, micro-batches,
recomputation, ZeRO stage and the memory weight around the recursive partitioner.

    OuterSearch.consider_batches  the micro-batch counts worth costing for some layouts
    OuterSearch.consider          their recomputation / ZeRO / virtual-stage variants, cheapest
                                  first, with branch and bound on the best step time
    partitions                    the partitions and their memory-weight rounds (steps 1-4)
    rollbacks, rollback           pipeline depths from a whole-mesh partition (spec 3.3-7)
    refine_plan, refine_best      the per-op local search around a point (step 5)
    split_variant                 the best point's pipeline split balanced by time
    finish                        the result as a Plan, with the search's notes
"""

from __future__ import annotations

import time

from symtensor.cost import Evaluator, TrainConfig
from symtensor.cost.opcost import local_sizes
from symtensor.cost.pipeline import balanced_split, layout_string
from symtensor.cost.precision import RECIPES, STAYS_BF16, fp8_gain, fp8_gemm, gemm_refusal, numerics_note
from symtensor.errors import PlanError
from symtensor.hardware import GIB, MEMORY_HEADROOM, divisors
from symtensor.layout import REPLICATED, OpLayout, refusal
from symtensor.plan.plan import Plan
from symtensor.search.grid import hybrid_variant, virtual_stages
from symtensor.search.partition import Problem, refine, refine_blocks, solve
from symtensor.search.pool import Costed, EvaluatorPool


class OuterSearch:
    """The outer enumeration of one search: it costs variants of layouts with the full model and
    keeps the fastest point that fits (``best``) and, while nothing fits, the smallest
    (``least_memory``); ``refined`` holds the ids of points the per-op local search has run from
    or produced."""

    def __init__(self, pool: EvaluatorPool, global_batch: int, micro_batch=None, order: str = "topological"):
        self.pool, self.cfg, self.cluster, self.seq = pool, pool.cfg, pool.cluster, pool.seq
        self.global_batch, self.micro_batch, self.order = global_batch, micro_batch, order
        self.best: Costed | None = None
        self.least_memory: Costed | None = None
        self.leaders: list[Costed] = []  # the fastest fitting points of distinct layouts, at most LEADERS
        self.refined: set[int] = set()
        self.evaluations = self.partitions = 0
        self.phases: dict = {}
        self._floors: dict = {}  # recomputation -> Evaluator.step_floor (the same for every evaluator)

    def evaluator(self, graph_batch: int, pp: int) -> Evaluator:
        return self.pool.get(graph_batch, pp)

    def pipeline_depths(self) -> list[int]:
        n, layers = self.cluster.n_devices, self.cfg.layers
        return self.pool.depths([p for p in divisors(n) if p <= layers])

    def micro_steps(self, pp: int) -> list[int]:
        """Micro-batches per step: at least pp (to fill the pipeline), dividing the global batch."""
        gb = self.global_batch
        out = [m for m in divisors(gb) if m >= pp]
        if self.micro_batch is not None:
            out = [m for m in out if (gb // m) % self.micro_batch == 0]
        return out

    def partition(self, pp: int, m: int, lam: float, recompute: str = "none", zero: int = 1) -> dict:
        return solve(self.problem(pp, m, lam, recompute, zero), order=self.order)

    def problem(self, pp: int, m: int, lam: float, recompute: str = "none", zero: int = 1) -> Problem:
        """The per-op problem of one partition (counted)."""
        train = TrainConfig(global_batch=self.global_batch, micro_steps=m, pp=pp, recompute=recompute, zero=zero,
                            **self.pool.train_keys)
        self.partitions += 1
        return self.pool.problem(train, lam)

    def absorb(self, other: OuterSearch) -> None:
        """Take the plans of a search run beside this one (its fastest, its leaders and its smallest) and
        its count of evaluations."""
        offered = list({id(p): p for p in (other.best, *other.leaders, other.least_memory) if p is not None}.values())
        self.evaluations += other.evaluations - len(offered)
        for plan in offered:
            self.offer(plan)

    def consider_batches(self, layouts: dict, pp: int) -> None:
        """Micro-batches for these layouts: every cut of the batch must divide the micro-step batch.
        Without pipelining, the fewest micro-batches that fit (large micro-batches amortise
        latencies); with it, the most (the bubble shrinks as (p-1)/m)."""
        # The cut is sized on the cluster's whole mesh, also for layouts whose positions index a
        # pipeline's stage mesh: on meshes with axes of different sizes (24, 48, 96 devices) this
        # skips some valid micro-batch counts. Sizing it on the stage mesh costs 1-14 more
        # variants there and changed no plan on six such scenarios; kept until that is decided.
        ms = self.batch_steps(layouts, pp)
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

    def batch_steps(self, layouts: dict, pp: int) -> list[int]:
        """``micro_steps`` at which every cut of the batch in ``layouts`` divides the micro-step batch (the cut
        sized on the cluster's whole mesh: ``consider_batches``)."""
        mesh = self.cluster.mesh()
        bcut = max((mesh.size(a for a in lay.axes_of("b") if a < len(mesh)) for lay in layouts.values()), default=1)
        return [m for m in self.micro_steps(pp) if (self.global_batch // m) % bcut == 0]

    def consider(self, layouts: dict, pp: int, m: int, seen: dict | None = None) -> bool:
        """Cost the recomputation / ZeRO / virtual-stage variants of ``layouts`` at (pp, m);
        True when one fits.

        ``seen`` (no pipeline only): per (recomputation, ZeRO stage) costed at another micro-step
        batch, that batch, the part of its reserved peak that does not grow with the batch and the
        part that grows linearly (``cost.memory``: ``fixed`` and ``scaled``, whose sum is at most
        the peak); updated. With one micro-batch in flight the growing part is activations and
        transients, which scale with the batch (tested), so a variant whose peak at this batch
        follows to be over the capacity is not costed, and when no variant is left no graph is
        built for this batch."""
        gbatch = self.global_batch // m
        bound = self.best.report.step_time_s if self.best is not None else float("inf")
        usable = self.cluster.device.memory * MEMORY_HEADROOM * (1 + 1e-9)
        variants = [v for v in self._variants(bound) if seen is None or v not in seen
                    or seen[v][1] + gbatch / seen[v][0] * seen[v][2] <= usable]
        if not variants:
            return False
        ev = self.evaluator(gbatch, pp)
        if not cuts_divide(ev, layouts):
            return False  # a cut no longer divides at this micro-batch size
        vpps = virtual_stages(self.cfg.layers, pp)[1:]
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
            if seen is not None:  # what does not grow with the batch, and what grows linearly (cost.memory)
                mem = plan.report.memory
                seen[(rc, zero)] = (gbatch, mem["fixed"], mem["scaled"])
            if plan.report.fits:
                for vpp in vpps:
                    self._cost(ev, layouts, pp, m, vpp, rc, zero)
                return True
            if plan.report.step_time_s >= bound:
                return False
        return False

    def _variants(self, bound: float) -> list[tuple[str, int]]:
        """(recomputation, ZeRO stage) pairs in the order ``consider`` costs them, up to the first
        recomputation whose step floor (``Evaluator.step_floor``: every op's roofline at the best
        rates over all devices, the same for every layout, micro-batch count and pipeline) cannot
        beat ``bound``; a floor not yet known (no evaluator of this search has computed it) does
        not stop."""
        out = []
        for rc in self.pool.recomputations():
            floor = self._floors.get(rc)
            if floor is not None and floor * (1 - 1e-9) >= bound:
                break
            out += [(rc, zero) for zero in (1, 2, 3)]
        return out

    def _train(self, pp, m, vpp, rc, zero) -> TrainConfig:
        return TrainConfig(global_batch=self.global_batch, micro_steps=m, pp=pp, vpp=vpp, recompute=rc, zero=zero,
                           **self.pool.train_keys)

    def _cost(self, ev, layouts, pp, m, vpp, rc, zero) -> Costed:
        train = self._train(pp, m, vpp, rc, zero)
        return self.offer(Costed(train, layouts, ev.evaluate(layouts, train, check=False)))

    def offer(self, plan: Costed) -> Costed:
        """Keep ``plan`` if it is the fastest that fits (or, while nothing fits, the smallest)."""
        self.evaluations += 1
        rep = plan.report
        if rep.fits:
            if self.best is None or rep.step_time_s < self.best.report.step_time_s:
                self.best = plan
            self._lead(plan)
        elif self.least_memory is None or rep.memory_reserved < self.least_memory.report.memory_reserved:
            self.least_memory = plan
        return plan


    def _lead(self, plan: Costed) -> None:
        """Keep ``leaders``: the fastest fitting point per (layouts, pipeline depth), the LEADERS fastest."""
        key = (id(plan.layouts), plan.train.pp)
        same = next((p for p in self.leaders if (id(p.layouts), p.train.pp) == key), None)
        if same is not None:
            if same.report.step_time_s <= plan.report.step_time_s:
                return
            self.leaders.remove(same)
        self.leaders.append(plan)
        self.leaders.sort(key=lambda p: p.report.step_time_s)
        del self.leaders[LEADERS:]


LEADERS = 4  # BF16 points precision_variant may re-cost in FP8 (the next while its BF16 step could still win)


def rollback(layouts: dict[str, OpLayout], k: int) -> dict[str, OpLayout]:
    """Drop the cuts on the first ``k`` mesh axes (they become pipeline stages) and re-index."""
    return {name: lay.without_outer(k) for name, lay in layouts.items()}


def nominal_steps(s: OuterSearch) -> int:
    """Micro-batches of the whole-mesh partition: one sequence per device per micro-step when the
    batch allows it."""
    steps1 = s.micro_steps(1)
    if not steps1:
        raise PlanError(f"global batch {s.global_batch} has no micro-batch split compatible with --micro-batch "
                        f"{s.micro_batch}")
    return max([m for m in steps1 if s.global_batch // m >= s.cluster.n_devices] or [steps1[0]])


FULL_MESH = 128  # clusters up to this size partition the whole mesh and roll pipelines back


def partitions(s: OuterSearch, base: dict | None = None) -> None:
    """Steps 1-4 of ``search.planner`` (``base``: the whole-mesh partition at lambda 0, when
    already computed and rolled back). On clusters larger than ``FULL_MESH`` whose best
    Megatron seed pipelines, the partition runs on that seed's stage mesh at its micro-batches
    instead: the outer axes would become pipeline stages anyway, and deciding them first costs
    more than half of the search there."""
    n = s.cluster.n_devices
    m0 = nominal_steps(s)
    seed = s.best
    staged = seed is not None and seed.train.pp > 1 and n > FULL_MESH
    lam, attempt = 0.0, 0
    while attempt < 6:
        if staged:
            s.consider_batches(s.partition(seed.train.pp, seed.train.micro_steps, lam), seed.train.pp)
        elif attempt > 0 or base is None:  # (``base`` was rolled back already)
            rollbacks(s, s.partition(1, m0, lam))
        attempt += 1
        # memory pressure (nothing fits, or only with recomputation): weigh memory in the
        # partition, in seconds per byte, more each round; one round when something fits
        if not pressed(s.best) or attempt >= (6 if s.best is None else 2):
            break
        ref = (s.best or s.least_memory).report
        lam = (ref.step_time_s / ref.capacity) * (4.0 ** attempt)


def rollbacks(s: OuterSearch, base: dict, depths: list[int] | None = None) -> None:
    """Pipeline depths from a whole-mesh partition: the outermost axes become stages. ``depths``:
    a part of ``s.pipeline_depths()`` (default all of it), ascending; the rest of it, called
    next, continues where that part stopped."""
    for pp in s.pipeline_depths() if depths is None else depths:
        if s.best is not None and pp > 2 and s.best.train.pp < pp // 2:
            break  # the last depth did not help: deeper pipelines will not either
        k = s.cluster.mesh().outer_axes_for(pp)
        if k is None:
            continue
        s.consider_batches(rollback(base, k), pp)


def pressed(plan: Costed | None) -> bool:
    """Nothing fits, or only with recomputation: memory is worth trading time for. (ZeRO-3
    alone does not count: its gathers often cost less than the larger micro-batches it allows
    save, and on the plan-quality scenarios a memory-weighted round never improved such plans.)"""
    return plan is None or plan.train.recompute != "none"


def refine_plan(pool: EvaluatorPool, plan: Costed) -> list[Costed]:
    """Per-op local search around ``plan`` (with a memory weight too when it needs recomputation
    or does not fit): the plans it leads to, costed by the full model."""
    rep, out = plan.report, []
    for lam in (0.0, rep.step_time_s / rep.capacity) if pressed(plan) or not rep.fits else (0.0,):
        problem = pool.problem(plan.train, lam)
        layouts = refine(problem, refine_blocks(problem, plan.layouts))
        if layouts != plan.layouts:
            out.append(Costed(plan.train, layouts, problem.ev.evaluate(layouts, plan.train, check=False)))
    return out


def refine_best(s: OuterSearch, plan: Costed | None, speculated: tuple | None = None) -> None:
    """Refine ``plan`` unless it is None or was refined (or came from a refinement) already.
    ``speculated``: (a point, the ``parallel.Background`` refining it, started before the search
    knew its best), whose result is taken when that point is ``plan`` itself."""
    if plan is None or id(plan) in s.refined:
        return
    s.refined.add(id(plan))
    found = speculated[1].result() if speculated is not None and speculated[0] is plan else refine_plan(s.pool, plan)
    for better in found:
        s.refined.add(id(s.offer(better)))


def precision_variant(s: OuterSearch, zero_variants: bool = True) -> str | None:
    """Step 6 of ``search.planner``, where no precision was given and the device has FP8 Tensor
    Cores (``EvaluatorPool.fp8_variant``): the best point's layouts costed with FP8 GEMMs where
    ``fp8_trials`` says (its recomputation and each lighter one, deeper ZeRO stages while FP8's weight
    copies overflow); the fastest that fits becomes the best point. Where none of them fits (FP8's
    weight copies on a point that barely fits in BF16) or a GEMM's local shape is not one FP8 kernels
    take (``precision.gemm_refusal``), and wherever FP8 buys one layout more than another (Qwen3-30B-A3B on
    64 H100: ZeRO 3 over 64 ranks 1.08x at a larger micro-batch, a TP 2 x PP 4 layout less), the next of the
    search's ``leaders`` (the fastest BF16 points of other layouts) is tried the same way, until a leader's BF16
    step is at least the FP8 best's times the most FP8 can buy (the FP8-to-BF16 peak ratio times 4/3 for a
    lighter recomputation: no FP8 variant of it at its own micro-batch can win; the larger micro-batches
    ``_fp8_variants`` also tries buy GEMM efficiency this bound does not count, so there it stops the leaders by
    judgement, not by proof). At most twelve evaluations per leader at its own micro-batch, and without a
    pipeline as many per larger micro-batch as fit: variants of costed points, not an axis of the search
    (``zero_variants`` False: the Megatron space keeps its stage); a grid or recipe plan the guarantee adopts
    instead is re-costed the same way (``guarantee.in_fp8``).
    Returns what FP8 bought (a plan note), or None when it did not win."""
    recipe = s.pool.fp8_variant
    if recipe is None or s.best is None:
        return None
    first = s.best
    bases = [first] + [p for p in s.leaders if p is not first]  # (in BF16 order; offers below may reorder leaders)
    device = s.pool.cluster.device
    # what FP8 can buy a step at most: its GEMMs at most the peaks' ratio faster (its casts only add time), and a
    # lighter recomputation than the BF16 point's (fp8_trials) saves at most the re-run forward, a quarter of a
    # step that re-runs every forward (4/3 of the step without it)
    most = device.flops(RECIPES[recipe].precision) / device.flops("bf16") * 4 / 3
    for base in bases:
        if s.best.train.fp8 is not None and base.report.step_time_s >= most * s.best.report.step_time_s:
            break  # (no slower BF16 point can beat the FP8 best)
        _fp8_variants(s, base, recipe, zero_variants)
    if s.best is first or s.best.train.fp8 is None:
        return None
    base = next(p for p in bases if p.layouts is s.best.layouts and p.train.pp == s.best.train.pp)
    was, now = base.report.step_time_s, s.best.report.step_time_s
    rc = "" if s.best.train.recompute == base.train.recompute else \
        f", recomputation {base.train.recompute} -> {s.best.train.recompute}"
    if s.best.train.micro_steps != base.train.micro_steps:  # (a larger micro-batch: fp8_micro_steps)
        rc += f", {base.train.micro_steps} -> {s.best.train.micro_steps} micro-batches per step"
    other = "" if base is first else \
        f"; the fastest BF16 layouts ({first.report.step_time_s:.4g} s) gain less from FP8 or do not take it"
    return (f"FP8 GEMMs ({recipe} scaling) bought {fp8_gain(was, now)}: {now:.4g} s per step against {was:.4g} s for "
            f"the same layouts in BF16{rc}{other} ({STAYS_BF16})")


def fp8_refused(ev: Evaluator, layouts: dict) -> bool:
    """Whether a GEMM of ``layouts`` has a local shape FP8 kernels do not take (``precision.gemm_refusal``:
    Transformer Engine would refuse it at launch)."""
    return any(fp8_gemm(op) and gemm_refusal(op, local_sizes(op, layouts.get(op.name, REPLICATED), ev.mesh))
               for op in ev.graph.ops)


def fp8_trials(modes: tuple[str, ...], recompute: str, zero: int, zero_variants: bool = True) -> list:
    """Where a point's FP8 variants are tried, in order (``precision_variant``, ``guarantee.in_fp8``): its
    recomputation and each lighter one of ``modes`` (FP8 saves the GEMM inputs in 8 bits, which may let less
    recomputation fit), then the next heavier one (FP8's cached weight copies may overflow a point that fits in
    BF16, and the recomputed forward costs less than FP8 saves: Mixtral-8x22B on 1,024 H100, the search's tp 2
    pp 4 vpp 8 point, 4.00 s in BF16, 2.71 s in FP8 at 77.7 of 76 usable GiB without recomputation), each at
    the point's ZeRO stage first and, while FP8's weight copies overflow the device, at each deeper one
    (``zero_variants`` False: its stage only); per recomputation, the first stage that fits ends the stages
    (deeper ones only add time); the fastest that fits wins. [(recomputation, ZeRO stages)]."""
    zeros = range(zero, 4) if zero > 0 and zero_variants else (zero,)
    return [(rc, zeros) for rc in modes[:modes.index(recompute) + 2]]


def _fp8_variants(s: OuterSearch, base: Costed, recipe: str, zero_variants: bool) -> None:
    """``base``'s layouts costed with FP8 GEMMs and offered to the search (``precision_variant``): at its
    micro-batch count the trials of ``fp8_trials``, then, without a pipeline, at each fewer count the BF16 search
    weighs (``fp8_micro_steps``) every recomputation and stage that may fit there. FP8 moves the trade between
    micro-batch size and recomputation: its saved GEMM inputs are 8-bit and its cached weight copies add to
    what does not grow with the batch, so a larger micro-batch under full recomputation can win where BF16's
    best had none (Qwen3-30B-A3B on 64 H100: ZeRO 3 at micro-batch 4 with full recomputation, 5.12 s in FP8,
    against 5.52 s for its layouts' BF16 point at micro-batch 1 and 5.34 s for the BF16 best). A count whose
    (recomputation, stage) variant is known to overflow from a smaller batch (``cost.memory``'s ``fixed`` and
    ``scaled`` parts, as ``OuterSearch.consider`` reads them) is not costed."""
    t = base.train
    # (with the stack's low-precision facts, which a BF16 grid point leaves out: ``EvaluatorPool.lowp``)
    stack = t.stack.replace(fp8_param_gather=s.pool.stack.fp8_param_gather, bf16_layers=s.pool.stack.bf16_layers)
    modes = s.pool.recomputations()
    usable = s.cluster.device.memory * MEMORY_HEADROOM * (1 + 1e-9)
    seen: dict = {}  # (recomputation, stage) -> (graph batch, fixed, scaled) of the last FP8 variant costed
    for m in fp8_micro_steps(s, base):
        ev = s.evaluator(s.global_batch // m, t.pp)
        if fp8_refused(ev, base.layouts):
            continue
        if m != t.micro_steps and not cuts_divide(ev, base.layouts):
            continue  # (a cut no longer divides at this micro-batch size)
        trials = fp8_trials(modes, t.recompute, t.zero, zero_variants) if m == t.micro_steps else \
            fp8_trials(modes, modes[-1], t.zero, zero_variants)
        for rc, zeros in trials:
            for zero in zeros:
                if (rc, zero) in seen:
                    g, fixed, scaled = seen[(rc, zero)]
                    if fixed + s.global_batch // m / g * scaled > usable:
                        continue  # (over the device at this batch: its growing part follows the batch)
                train = t.replace(micro_steps=m, precision="fp8", fp8_recipe=recipe, recompute=rc, zero=zero,
                                  stack=stack)
                variant = Costed(train, base.layouts, ev.evaluate(base.layouts, train, check=False))
                s.offer(variant)
                mem = variant.report.memory
                seen[(rc, zero)] = (train.graph_batch, mem["fixed"], mem["scaled"])
                if variant.report.fits:
                    break  # (a deeper ZeRO stage only adds time)


def cuts_divide(ev: Evaluator, layouts: dict) -> bool:
    """Whether every cut of ``layouts`` divides its op's dims in ``ev``'s graph (``layout.refusal``): layouts
    searched at one micro-step batch, re-costed at another."""
    return not any(refusal(op, layouts.get(op.name, REPLICATED), ev.mesh) for op in ev.graph.ops)


def hybrid_plan(s: OuterSearch, best: Costed, steps: int = 2) -> tuple[Costed, str | None]:
    """``best`` with hybrid sharding where it is faster (``search.grid.hybrid_variant``) and its note; where a faster
    hybrid variant overflowed the device at ``best``'s micro-batch, also ``best``'s layouts at the next ``steps``
    larger micro-batch counts the search weighs for them (``OuterSearch.batch_steps``: smaller micro-batches, less
    activation memory beside the larger optimizer shard), the first whose hybrid variant fits and beats ``best``
    (Llama 2 7B on 128 H100 under DeepSpeed, global batch 512: the flat ZeRO-1 plan at micro-batch 2 takes 1.770 s,
    ZeRO-1 over each node's 8 ranks 1.652 s at micro-batch 1; at 2 it does not fit)."""
    t = best.train
    hybrid, note, overflowed = hybrid_variant(s.pool.get(t.graph_batch, t.pp), best)
    if note is not None or not overflowed:
        return hybrid, note
    for m in [m for m in s.batch_steps(best.layouts, t.pp) if m > t.micro_steps][:steps]:
        ev = s.evaluator(s.global_batch // m, t.pp)
        if not cuts_divide(ev, best.layouts):
            continue  # (a cut no longer divides at this micro-batch size)
        train = t.replace(micro_steps=m)
        point = Costed(train, best.layouts, ev.evaluate(best.layouts, train, check=False))
        hybrid, note, _ = hybrid_variant(ev, point, flat=best)
        if note is not None:
            return hybrid, f"{note}, at {m} micro-batches per step where the plan's {t.micro_steps} left no room " \
                           "for the larger shard"
    return best, None


def split_variant(s: OuterSearch, best: Costed) -> tuple[Costed, str | None]:
    """``best`` with the layer split that balances its pipeline ranks' time per micro-batch
    (``cost.pipeline.balanced_split`` of its layers' seconds, ``Evaluator.layer_seconds``; the embedding and
    the head and loss as work on their stages), where that is faster than the rule's split it was searched with
    and fits (a stage that takes more layers holds more): the per-op search's pipelined points are costed with
    the rule's split, as the Megatron grid's are before ``EvaluatorPool.split_of`` balances them (Kimi K2 on 512
    H100, pp 32: 11.29 -> 10.91 s; Qwen3-235B-A22B on 256, pp 8 x vpp 8: 7.61 -> 7.38 s). One more
    evaluation; its note, or None where the rule's split stays."""
    t = best.train
    if t.pp == 1 or t.layer_split is not None:
        return best, None
    ev = s.evaluator(t.graph_batch, t.pp)
    layers = s.cfg.layers
    rule = t.chunk_layers(layers)
    split = balanced_split(ev.layer_seconds(best.layouts, t), layers, t.pp, t.vpp)
    if split == rule:
        return best, None
    train = t.replace(layer_split=split)
    point = s.offer(Costed(train, best.layouts, ev.evaluate(best.layouts, train, check=False)))
    if not point.report.fits or point.report.step_time_s >= best.report.step_time_s:
        return best, None
    was, now = best.report.step_time_s, point.report.step_time_s
    return point, (f"pipeline layers split by time, {layout_string(split)}, instead of Megatron's rule "
                   f"{layout_string(rule)}: {now:.4g} s per step against {was:.4g} s ({was / now:.2f}x; Megatron-LM "
                   "runs it as --pipeline-model-parallel-layout; explain shows each rank's seconds)")


def fp8_micro_steps(s: OuterSearch, base: Costed) -> list[int]:
    """Micro-batch counts ``_fp8_variants`` costs ``base``'s layouts at: its own first, then (without a
    pipeline, where ``OuterSearch.consider_batches`` weighs the fewest counts) each fewer count that search
    considers for them, the most first (a larger micro-batch's memory follows from a smaller one's)."""
    t = base.train
    if t.pp > 1:
        return [t.micro_steps]
    fewer = [m for m in s.batch_steps(base.layouts, 1)[:5] if m < t.micro_steps]
    return [t.micro_steps] + sorted(fewer, reverse=True)


def finish(s: OuterSearch, t0: float, zero_variants: bool = True) -> Plan:
    """The search's result as a Plan: its best point (the least memory when nothing fits), with
    the search's account and notes (``zero_variants``: ``precision_variant``'s)."""
    fp8_bought = precision_variant(s, zero_variants)
    best = s.best or s.least_memory
    if best is None:
        raise PlanError(f"no valid plan for {s.cfg.name} on {s.cluster.n_devices} devices; check the batch and the "
                        "device count")
    # (devices that repeat work: plan.summary.repeated_work_note, in the plan's JSON notes)
    notes = [fp8_bought] if fp8_bought else []
    if best.train.fp8 is not None:
        notes.append(numerics_note(best.train.fp8))
    if s.best is not None:  # the pipeline split balanced by time, then hybrid sharding: variants of the best point
        for variant in (split_variant, hybrid_plan):
            best, note = variant(s, best)
            notes += [note] if note else []
    if s.best is None:
        rep = best.report
        notes.append(
            f"nothing fits: the least memory any plan reached is {rep.memory_reserved / GIB:.1f} GiB per device "
            f"(reserved) against {MEMORY_HEADROOM * rep.capacity / GIB:.1f} GiB usable; use more devices, a smaller "
            "micro-batch or sequence, or a device with more memory")
    return s.pool.plan(best, notes=notes, search_time_s=time.perf_counter() - t0, search_phases_s=dict(s.phases),
                       evaluations=s.evaluations, partitions=s.partitions)


