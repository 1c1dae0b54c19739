"""The search's shared state and its working record of a costed point.

``EvaluatorPool`` owns every cache of one search (see its docstring); nothing is cached at module
level. ``Costed`` is how the search holds a point it has costed: a training configuration,
layouts by mesh position on the stage mesh of its evaluator, and the cost report. A point leaves
the search as a ``plan.Plan`` (``EvaluatorPool.plan``), which names mesh axes instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from symtensor.cost import RECOMPUTE, CostReport, Evaluator, TrainConfig
from symtensor.cost.efficiency import efficiency_for
from symtensor.cost.engine import (
    GRADIENTS,
    OPTIMIZER,
    WEIGHTS,
    cpu_offload_refusal,
    engine_named,
    engine_of,
    grad_reduce_refusal,
    host_link_refusal,
    offload_count_refusal,
    overlap_refusal,
    refusal as engine_refusal,
    ulysses_sp_refusal,
)
from symtensor.cost.moe import overlap_refusal as moe_overlap_refusal
from symtensor.cost.offload import engine_refusal as offload_engine_refusal
from symtensor.cost.pipeline import balanced_split, rank_seconds
from symtensor.cost.precision import (
    QUANTIZED,
    RECIPES,
    has_fp8,
    lowp_refusal,
    named_recipe,
    quantized_params,
    refusal as precision_refusal,
)
from symtensor.cost.stack import Stack
from symtensor.cost.stack_kernels import stack_refusal
from symtensor.cost.train import rule_split
from symtensor.errors import PlanError
from symtensor.hardware import MEMORY_HEADROOM, Cluster
from symtensor.layout import OpLayout
from symtensor.memo import Memo
from symtensor.models import ModelConfig, build_graph
from symtensor.plan.parallelism import Parallelism
from symtensor.plan.plan import Plan
from symtensor.search.megatron import (
    check_config,
    configuration,
    expert_op,
    grid_points,
    inner_grid,
    megatron_layouts,
    op_roles,
    train_config,
)
from symtensor.search.partition import Problem

# a search costs one pipeline schedule per step, as the exports launch its plans (``Stack.pp_schedules``)
SCHEDULES_SEARCHED = ("--pp-schedules states how a given pipeline configuration accumulates gradients: evaluate it "
                      "with --pp and --pp-schedules; plan and sweep search one schedule per step, as their exports "
                      "launch")


def lowp_search_refusal(stack: Stack, framework: str, recipe: str | None) -> str | None:
    """Why a search under ``framework`` whose FP8 or FP4 points run ``recipe`` (None: it has none) cannot hold the
    stack's low-precision facts at all, or None: an engine without them, or BF16 layers under delayed scaling
    (``cost.precision.lowp_refusal``); the rest hold where they apply (``EvaluatorPool.lowp``)."""
    if not stack.low_precision:
        return None
    why = engine_refusal(engine_named(framework), lowp=True)
    if why is None and recipe is not None:
        why = lowp_refusal(RECIPES[recipe].precision, recipe, 1, False, stack.bf16_layers)
    return why


@dataclass(frozen=True, slots=True)
class Costed:
    """A point the search costed: ``layouts`` by mesh position on the stage mesh of the pool's
    evaluator for ``train`` (graph batch, pipeline depth); ``megatron``: the Megatron
    configuration it was built from (``megatron.configuration``), if any. Crosses process
    boundaries (no evaluator in it)."""

    train: TrainConfig
    layouts: dict[str, OpLayout]
    report: CostReport
    megatron: dict | None = None

    @property
    def key(self):
        """Sort key: plans that fit first, then the fastest (the least memory when none fits)."""
        return (not self.report.fits, self.report.step_time_s if self.report.fits else self.report.memory_reserved)


class EvaluatorPool:
    """What one search shares: its evaluators (a skeleton graph per micro-step batch, one per
    pipeline depth) and every cache of the search (the evaluators' own, the per-op problems'
    tables, the layout family, the Megatron grid and layouts). It lives as long as the search."""

    def __init__(self, cfg: ModelConfig, cluster: Cluster, seq: int, graph_factory=None, framework: str = "megatron",
                 precision: str | None = None, fp8_recipe: str | None = None, stack: Stack | None = None):
        """``graph_factory(graph_batch)`` supplies the graphs (a captured model); default: the
        builders' skeleton graphs of ``cfg``. ``framework``: the engine every configuration of
        this search is costed under (``cost.engine``). ``precision``: ``bf16`` or ``fp8`` (under
        ``fp8_recipe``, default the device's) or ``fp4`` (NVFP4) for every configuration; None: BF16, and the
        search may choose FP8 under ``fp8_variant`` as a variant of its best point (``outer.finish``; never FP4,
        which changes the numerics more and is only costed where asked for).
        ``stack``: the stated facts of the user's stack (``cost.stack.Stack``: how the MoE layers run, the
        gradient reduction's dtype, the allocator) that every configuration carries; only the facts that differ
        from the defaults, so a search without them is today's."""
        self.cfg, self.cluster, self.seq = cfg, cluster, seq
        self.framework = framework
        why = precision_refusal(precision or "bf16", fp8_recipe if precision else None, cluster.device, framework)
        if why is not None:
            raise PlanError(why)
        # (an empty name names none; FP4, opt-in: never a variant the search chooses itself)
        recipe = named_recipe(fp8_recipe or None, cluster.device, framework, precision or "fp8")
        self.precision = precision or "bf16"
        self.fp8_recipe = recipe if precision in QUANTIZED else None
        self.fp8_variant = recipe if precision is None and has_fp8(cluster.device) else None
        self.stack = stack or Stack()  # the stack facts this search holds
        if self.stack.cpu_offload_layers:  # (the points with pipeline stages or recomputation run without it)
            why = cpu_offload_refusal(framework, 1, "none") or \
                offload_count_refusal(self.stack.cpu_offload_layers, cfg.layers) or host_link_refusal(cluster.device)
            if why is not None:
                raise PlanError(why)
        if self.stack.offload_modules:  # (the points recomputing module moe run without it: ``TrainConfig``)
            why = offload_engine_refusal(framework) or host_link_refusal(cluster.device)
            if why is not None:
                raise PlanError(why)
        why = lowp_search_refusal(self.stack, framework, self.fp8_recipe or self.fp8_variant) or \
            stack_refusal(self.stack, framework, cluster.device) or overlap_refusal(framework, self.stack) or \
            (SCHEDULES_SEARCHED if self.stack.pp_schedules != 1 else None)
        if why is not None:
            raise PlanError(why)
        # what every configuration and training configuration of this search carries besides its degrees: as a
        # Megatron configuration's keys (``held``) and as the training configuration's keywords
        carried = {"framework": framework, "precision": self.precision, "fp8_recipe": self.fp8_recipe}
        self.config_keys = {**carried, **self.stack.differing()}
        self.train_keys = {**carried, "stack": self.stack}
        # whether the engine pipelines (``Engine.refuses`` ``pp``: the deepspeed engine is DeepSpeed ZeRO; its
        # pipeline engine is megatron-deepspeed's): every pipeline depth of the search is read through ``depths``
        self.pipelines = not engine_named(framework).refuses_feature("pp")
        self.graph_factory = graph_factory
        self._param_sums = None
        self._recomputations = None
        self.costed = 0  # Megatron configurations costed in full (``evaluate``)
        # the search's layouts are one family (see OpLayout): equal layouts are one object, and
        # what is derived from them is memoised once for every evaluator
        self.family = OpLayout.family()
        self._graphs = Memo(self._graph)  # graph batch -> the graph of one micro-step
        self._shared = Memo(lambda pp: {})  # pp -> the caches its evaluators share (see Evaluator)
        self._evs = Memo(self._evaluator)  # (graph batch, pp) -> Evaluator
        self._memos = Memo(lambda key: {("root",): self.family})  # (graph batch, pp) -> Problem tables
        self._grids = Memo(self._grid)  # global batch -> grid_points
        self._roles = Memo(lambda batch: op_roles(self._graphs[batch]))  # graph batch -> megatron.op_roles
        # (graph batch, pp, tp, cp, dp, ep, etp, sp) -> Megatron layouts: the last 2,048 (the grid's
        # bounds cost each inner grid's layouts twice, its compute then its layer costs, and the
        # variants of one point (recomputation, ZeRO, virtual stages) share them; a few MB)
        self._layouts = Memo(self._megatron_layouts, limit=2048)
        self._legal = Memo(lambda key: {})  # (graph batch, pp) -> megatron_layouts' legality checks
        # Megatron inner grid (tp, cp, ep, etp, sp, micro batch) -> Evaluator.layer_seconds
        self._layer_seconds: dict = {}
        self._splits: dict = {}  # (inner grid, pp, vpp) -> split_of
        self._op_runs: dict = {}  # graph batch -> op_runs

    def release(self) -> None:
        """Drop every cache of this search (the evaluators' too) once its plans are made (``Costed`` and
        ``Plan`` hold none of them): the tables hold reference cycles (a memo names its pool's method, a
        costed segment its evaluator) that only Python's cyclic collector would free, and it is paused
        over a plan (``planner.collector_paused``); released, reference counting frees them at once
        (DeepSeek-V3 on 1,024 H100: 0.2 s of the collector's walk at the end of the plan)."""
        for ev in self._evs.values():
            ev.release()
        for shared in self._shared.values():
            for cache in shared.values():
                cache.clear()
        for memo in (self._graphs, self._shared, self._evs, self._memos, self._grids, self._roles, self._layouts,
                     self._legal, self._layer_seconds, self._splits, self._op_runs):
            memo.clear()

    def same(self, other: EvaluatorPool) -> bool:
        """Whether ``other`` costs every configuration as this pool does."""
        return (self.cfg, self.cluster, self.seq, self.graph_factory, self.framework, self.precision, self.fp8_recipe,
                self.fp8_variant, self.train_keys) == (other.cfg, other.cluster, other.seq, other.graph_factory,
                                                       other.framework, other.precision, other.fp8_recipe,
                                                       other.fp8_variant, other.train_keys)

    def _graph(self, graph_batch: int):
        # the builders' graphs differ only in the batch size: validate the first one
        if self.graph_factory is not None:
            return self.graph_factory(graph_batch)
        return build_graph(self.cfg, micro_batch=graph_batch, seq=self.seq, skeleton=True, validate=not self._graphs)

    def _evaluator(self, key) -> Evaluator:
        graph_batch, pp = key
        # pipeline depths share the graph of one micro-step batch; the evaluators of one pipeline
        # depth share one mesh, and their batch-free caches
        return Evaluator(self._graphs[graph_batch], self.cluster, pp=pp, shared=self._shared[pp],
                         framework=self.framework)

    def held(self, config: dict) -> dict:
        """Megatron configuration ``config`` with what this search carries besides its degrees
        (``config_keys``); the expert all-to-all overlap only where Megatron runs it on ``config``
        (``cost.moe.overlap_refusal``): a stack fact holds where it applies, not a refusal of the point."""
        out = {**config, **self.config_keys}
        if out.get("moe_ep_overlap") and moe_overlap_refusal(Parallelism.from_dict(configuration(out))) is not None:
            del out["moe_ep_overlap"]
        if out.get("grad_reduce_bf16") and grad_reduce_refusal(out.get("framework", "megatron"), out.get("zero", 0)):
            del out["grad_reduce_bf16"]  # (FSDP2's ZeRO 0, DDP, reduces as before)
        return self.lowp(out)

    def lowp(self, config: dict) -> dict:
        """Megatron configuration ``config`` with the stack's low-precision facts (``Stack.fp8_param_gather``,
        ``Stack.bf16_layers``) where they hold on it (``TrainConfig.lowp_params``, ``TrainConfig.bf16_span``): FP8
        or FP4 GEMMs, quantized parameters at ZeRO >= 1 (NVFP4's at ZeRO 1); left out elsewhere (a BF16 point of a
        search, which an FP8 variant re-costs with them: ``outer.precision_variant``, ``guarantee.in_fp8``)."""
        out = {k: v for k, v in config.items() if k not in ("fp8_param_gather", "bf16_layers")}
        precision = out.get("precision")
        if self.stack.fp8_param_gather and quantized_params(precision, out.get("zero", 0)):
            out["fp8_param_gather"] = True
        if precision in QUANTIZED and self.stack.bf16_layers != (0, 0):
            out["bf16_layers"] = self.stack.bf16_layers
        return out

    @property
    def floor_keys(self) -> dict:
        """``train_keys`` for a step floor that bounds every plan this search may return: in FP8
        when it may choose FP8 (FP8 GEMMs only lower the floor)."""
        if self.fp8_variant is None:
            return self.train_keys
        return {**self.train_keys, "precision": "fp8", "fp8_recipe": self.fp8_variant}

    def depths(self, candidates) -> list[int]:
        """The pipeline depths of ``candidates`` this search may take: 1 alone under an engine without pipelines."""
        return [pp for pp in candidates if self.pipelines or pp == 1]

    def _grid(self, global_batch: int) -> list[dict]:
        n = self.cluster.n_devices
        node = self.cluster.levels[0].fanout or n
        return [{**c, "sp": self.sequence_parallel(c["tp"], c["cp"])}
                for c in grid_points(self.cfg, n, node, global_batch, self.seq) if self.depths([c["pp"]])]

    def sequence_parallel(self, tp: int, cp: int) -> bool:
        """Whether a grid point of this search runs Megatron's sequence parallelism: wherever tp > 1, except beside
        DeepSpeed-Ulysses (``cost.engine.ulysses_sp_refusal``)."""
        return tp > 1 and ulysses_sp_refusal(engine_named(self.framework), cp, True) is None

    def _megatron_layouts(self, key) -> dict:
        graph_batch, pp, tp, cp, dp, ep, etp, sp = key
        ev = self.get(graph_batch, pp)
        # all the layouts read (the kind of context parallelism is the stack's: the search holds it)
        degrees = dict(tp=tp, dp=dp, cp=cp, ep=ep, etp=etp, sp=sp, framework=ev.framework, cp_comm=self.stack.cp_comm)
        return megatron_layouts(ev.graph, ev.mesh, degrees, self._roles[graph_batch], self.family,
                                self._legal[(graph_batch, pp)])

    def op_runs(self, ev: Evaluator) -> list[tuple[int, object, tuple]]:
        """The ops of ``ev``'s graph as the layers hold them (``Evaluator.segments``, a skeleton's repeated
        layer as often as it stands for), equal ops of one role once: [(how many, op, its role)], in graph
        order of their first; equal is ``Evaluator.op_sig``'s (which the op times are memoised by), the role
        ``megatron.op_roles``'. (``grid._compute`` sums the ops' times, each once, times how many.)"""
        graph_batch = ev.graph.meta["micro_batch"]
        hit = self._op_runs.get(graph_batch)
        if hit is None:
            roles, counts = self._roles[graph_batch], {}
            for _, ops, _, _, _ in ev.segments:
                for op in ops:
                    role = roles[op.name][0]
                    counts.setdefault((ev.op_sig(op), role), [0, op, role])[0] += 1
            hit = self._op_runs[graph_batch] = [tuple(v) for v in counts.values()]
        return hit

    @cached_property
    def end_to_end(self):
        """The end-to-end constants (``EndToEnd``) every evaluator of this pool costs with (``Evaluator.eff``'s),
        without building one."""
        return efficiency_for(self.cluster, self.framework).end_to_end

    def get(self, graph_batch: int, pp: int) -> Evaluator:
        """The evaluator of one micro-step batch and pipeline depth."""
        return self._evs[(graph_batch, pp)]

    def problem(self, train: TrainConfig, lam: float = 0.0) -> Problem:
        """The per-op problem of ``train`` (its graph batch and pipeline depth) with memory weight
        ``lam``; the problems of one evaluator share the tables that do not depend on ``lam``."""
        key = (train.graph_batch, train.pp)
        return Problem(self.get(*key), train, lam, memo=self._memos[key])

    def grid(self, global_batch: int) -> list[dict]:
        """``grid_points`` of this model and cluster, enumerated once per search (the seeds, their
        split between two processes and the exhaustive grid all read it)."""
        return self._grids[global_batch]

    def recomputations(self) -> tuple[str, ...]:
        """The recomputation modes worth costing. Selective recomputation re-runs the attention
        core's unfused ops (marked ``core``); with a fused attention kernel there are none, and a
        selective plan costs and holds exactly what the same plan without recomputation does, so
        it is left out (the fastest plan is unchanged: equal plans keep the first)."""
        if self._recomputations is None:
            if not self._graphs:
                return RECOMPUTE  # (no graph yet: nothing known, nothing left out)
            graph = next(iter(self._graphs.values()))
            core = any(op.attr("core") for op in graph.ops)
            self._recomputations = RECOMPUTE if core else tuple(rc for rc in RECOMPUTE if rc != "selective")
        return self._recomputations

    def layouts(self, c: dict) -> tuple[Evaluator, dict]:
        """The evaluator and Megatron layouts of configuration ``c`` (complete; checked)."""
        check_config(self.cfg, self.cluster.n_devices, c, self.cluster.device)
        batch = c["micro_batch"] * c["dp"]
        key = (batch, c["pp"], c["tp"], c["cp"], c["dp"], c["ep"], c["etp"], c["sp"])
        return self.get(batch, c["pp"]), self._layouts[key]

    def evaluate(self, c: dict, check: bool = False, balance: bool = True) -> Costed:
        """Cost a Megatron configuration (complete: ``megatron.configuration``; its layouts are
        legal by construction; ``check`` checks them anyway, for a configuration a user gave).
        A pipelined one without a stated split takes, with ``balance``, the balanced split where
        that is the faster by its layers' costs (``split_of``) and fits, or where the rule's does not fit
        either: the balance is by time, and a stage given more layers holds more, so a balanced split that
        overflows is costed again with the rule's (as ``api.evaluate`` chooses between the two); the rule's
        otherwise (the seeds' scan, which the per-op search refines with the rule's split, and the Megatron
        recipe)."""
        ev, layouts = self.layouts(c)

        def costed(config: dict) -> Costed:
            self.costed += 1
            train = train_config(config)
            return Costed(train, layouts, ev.evaluate(layouts, train, check=check), config)

        split = self.split_of(c)[0] if balance and c["pp"] > 1 and c["layer_split"] is None else None
        if split is None:
            return costed(c)
        balanced = costed({**c, "layer_split": split})
        if balanced.report.fits:
            return balanced
        rule = costed(c)
        return rule if rule.report.fits else balanced

    def split_of(self, point: dict) -> tuple[tuple[int, ...] | None, float, float]:
        """The layer split a pipelined Megatron grid point runs with, by its inner grid's layer
        costs (``layer_seconds``): the balanced one (``cost.pipeline.balanced_split``) where its
        slowest rank is faster than under the rule's split (``cost.train.rule_split``), else None
        (the rule's: plans stay as they were); the seconds per micro-batch of that slowest rank
        and of all ranks together (the rule's sum), which bound the point's step from below
        (``search.grid``). The balance is by time: memory is the evaluation's to check, as for
        any point. Memoised per inner grid, depth and vpp."""
        key = (inner_grid(point), point["pp"], point.get("vpp", 1))
        hit = self._splits.get(key)
        if hit is None:
            seconds, layers, pp, vpp = self.layer_seconds(point), self.cfg.layers, point["pp"], point.get("vpp", 1)
            ranks = rank_seconds(seconds, rule_split(layers, pp, vpp), pp)
            rule, total = max(ranks), sum(ranks)
            split = None
            if rule > total / pp * (1 + 1e-9):  # (else no split has a faster slowest rank)
                split = balanced_split(seconds, layers, pp, vpp)
                slowest = max(rank_seconds(seconds, split, pp))
            hit = (split, slowest, total) if split is not None and slowest < rule * (1 - 1e-9) else (None, rule, total)
            self._splits[key] = hit
        return hit

    def layer_seconds(self, point: dict) -> dict[int, float]:
        """``Evaluator.layer_seconds`` of a Megatron grid point without recomputation, shared by
        the points of its inner grid (tp, cp, ep, etp, sp, micro batch): a layer's costs do not
        depend on the pipeline depth or the data-parallel degree around it (``search.grid``),
        so they are computed once, on whichever point of the inner grid asks first."""
        key = inner_grid(point)
        hit = self._layer_seconds.get(key)
        if hit is None:
            c = configuration(self.held({**point, "recompute": "none", "vpp": 1}))
            ev, layouts = self.layouts(c)
            hit = self._layer_seconds[key] = ev.layer_seconds(layouts, train_config(c))
        return hit

    def try_config(self, balance: bool = True, **config) -> Costed | None:
        """``evaluate`` of the Megatron configuration ``config`` under this pool's engine; None
        when it is not a valid configuration."""
        try:
            return self.evaluate(configuration(self.held(config)), balance=balance)
        except PlanError:
            return None

    def may_fit(self, **config) -> bool:
        """``static_fits`` of the Megatron configuration ``config``; False when it is invalid."""
        try:
            return self.static_fits(configuration(self.held(config)))
        except PlanError:
            return False

    def plan(self, costed: Costed, **search) -> Plan:
        """The Plan of a point costed in this search (the one place a search's working record
        becomes a Plan: layouts by position become layouts by axis name); ``search``: the
        search's notes and account (``Plan``)."""
        ev = self.get(costed.train.graph_batch, costed.train.pp)
        return Plan.of(self.cfg, self.cluster, costed.train, self.seq, ev.graph, ev.mesh, ev.pp_axes, costed.layouts,
                       costed.report, **search)

    def static_fits(self, c: dict) -> bool:
        """False only when parameters, gradients and optimizer state alone overflow a device (so
        no variant of configuration ``c`` fits): an arithmetic lower bound refuses most such points before
        any graph is built, the exact sum (``Evaluator.static_fits``) the rest, under each layer split the
        point may run with: the rule's, and the balanced one ``evaluate`` takes where it is faster
        (``split_of``), which may hold fewer parameters on the fullest stage (DeepSeek-V3's dense first
        layers). True means "may fit": the evaluation decides."""
        usable = self.cluster.device.memory * MEMORY_HEADROOM
        bound = self.static_lower_bound(c)
        if bound > usable:
            return False
        if bound < usable / 2:
            return True  # far from the capacity the exact sum rarely refuses: leave it to the evaluation
        ev, layouts = self.layouts(c)
        if ev.static_fits(layouts, train_config(c)):
            return True
        split = self.split_of(c)[0] if c["pp"] > 1 and c["layer_split"] is None else None
        return split is not None and ev.static_fits(layouts, train_config({**c, "layer_split": split}))

    def static_lower_bound(self, c: dict) -> float:
        """Bytes of parameters, gradients and optimizer state on the most loaded device, from
        below: every weight divided by tp (norms are not, in fact), expert weights by ep x etp
        instead, the total spread evenly over the pp stages (the most loaded stage holds at least
        that), ZeRO sharding over dp x cp (Megatron's distributed optimizer; the cost model shards
        over dp only), expert state over the stage's ranks / (ep x etp). What the ZeRO stage shards
        is the engine's rule (``Engine.sharded_from``: FSDP2 shards the weights from ZeRO 1)."""
        if self._param_sums is None:
            self._param_sums = _param_sums(self.get(1, 1).graph)
        train = train_config(c)
        eng, z = engine_of(train), train.zero
        total = 0.0
        for (expert, trainable), numel in self._param_sums.items():
            model = c["ep"] * c["etp"] if expert else c["tp"]  # the devices that split the weight
            shard = max(1, c["tp"] * c["dp"] * c["cp"] // model) if expert else c["dp"] * c["cp"]
            per = train.param_bytes / (shard if eng.shards(WEIGHTS, z) else 1)
            if trainable:
                per += (train.grad_bytes / (shard if eng.shards(GRADIENTS, z) else 1)
                        + train.optim_bytes / (shard if eng.shards(OPTIMIZER, z) else 1))
            total += numel * per / model
        return total / c["pp"]


def _param_sums(graph) -> dict:
    """Parameter elements of the whole model by (expert weight, trainable); tied weights once,
    skeleton layers times the layers they stand for."""
    from symtensor.graph import layer_repeat

    sums: dict = {}
    seen = set()
    for op in graph.ops:
        for slot, tname in enumerate(op.inputs):
            t = graph.tensors[tname]
            if not t.param or (t.tie or t.name) in seen:
                continue
            seen.add(t.tie or t.name)
            expert = expert_op(op) and op.in_dims[slot][:1] == ("e",)
            key = (expert, t.trainable)
            sums[key] = sums.get(key, 0) + t.numel * layer_repeat(graph, op.layer)
    return sums

