"""Baselines through the same cost model: the Megatron-LM recipe, the Megatron grid best, FSDP.

- ``megatron_recipe``: NVIDIA's sizing rules. Dense: tensor parallelism inside a node, growing
  with the model (1 below 3B parameters, 2 up to 13B, 4 up to 30B, 8 above); pipeline
  parallelism only when the model does not fit otherwise (the smallest pp that fits, across
  nodes); data parallelism for the rest; sequence parallelism with tensor parallelism; the
  distributed optimizer (ZeRO-1); selective recomputation, full recomputation if that does not
  fit. MoE: tensor parallelism by the active size, expert parallelism by the expert count
  (ep = min(experts, dp)).
- ``megatron_grid``: every valid (tp, pp, dp, cp, ep, micro batch, recompute, vpp), pipeline
  depths that do not divide the layers included (uneven stages), with sequence parallelism
  whenever tp > 1 and the distributed optimizer. Dominated choices are not enumerated, which
  cannot change the best: sp=False (same communication time in this model, more memory and norm
  compute) and zero=0 (ZeRO-1's time, more memory); points whose time bound is no better than the
  best plan found are skipped (exact branch and bound).
- ``fsdp``: pure data parallelism with ZeRO-3 (PyTorch FSDP), the best micro batch and recompute.
"""

from __future__ import annotations

from dataclasses import dataclass

from symtensor.cost import RECOMPUTE, CostReport, Evaluator, TrainConfig
from symtensor.cost.model import MEMORY_HEADROOM
from symtensor.errors import PlanError
from symtensor.hardware import Cluster
from symtensor.layout import OpLayout
from symtensor.models import ModelConfig, build_graph
from symtensor.search.megatron import ParallelConfig, megatron_layouts, op_roles
from symtensor.search.partition import Problem

MICRO_BATCHES = (1, 2, 4, 8)


@dataclass
class Candidate:
    """A costed configuration."""

    config: ParallelConfig
    report: CostReport
    layouts: dict

    @property
    def key(self):
        """Sort key: plans that fit first, then the fastest."""
        return (not self.report.fits, self.report.step_time_s if self.report.fits else self.report.memory_peak)


class EvaluatorPool:
    """Evaluators (skeleton graph + cluster + pp) shared by all configurations of one search."""

    def __init__(self, cfg: ModelConfig, cluster: Cluster, seq: int, graph_factory=None, framework: str = "megatron"):
        """``graph_factory(graph_batch)`` supplies the graphs (a captured model); default: the
        builders' skeleton graphs of ``cfg``. ``framework``: the engine every configuration of
        this search is costed under (``cost.engine``)."""
        self.cfg, self.cluster, self.seq = cfg, cluster, seq
        self.framework = framework
        self.graph_factory = graph_factory
        self._evs: dict = {}
        self._shared: dict = {}  # pp -> the caches its evaluators share (see Evaluator)
        self._graphs: dict = {}
        self._layouts: dict = {}
        self._param_sums = None
        self._recomputations = None
        self._grids: dict = {}  # global batch -> grid_points
        self._roles: dict = {}  # graph batch -> megatron.op_roles of its graph
        self._memos: dict = {}  # (graph batch, pp) -> the tables its problems share (see Problem)
        # the search's layouts are one family (see OpLayout): equal layouts are one object, and
        # what is derived from them is memoised once for every evaluator
        self.family = OpLayout.family()

    def get(self, graph_batch: int, pp: int) -> Evaluator:
        key = (graph_batch, pp)
        if key not in self._evs:
            graph = self._graphs.get(graph_batch)
            if graph is None:  # pipeline depths share the graph of one micro-step batch
                # the builders' graphs differ only in the batch size: validate the first one
                graph = self._graphs[graph_batch] = (
                    self.graph_factory(graph_batch) if self.graph_factory is not None
                    else build_graph(self.cfg, micro_batch=graph_batch, seq=self.seq, skeleton=True,
                                     validate=not self._graphs))
            # the evaluators of one pipeline depth share one mesh, and their batch-free caches
            self._evs[key] = Evaluator(graph, self.cluster, pp=pp, shared=self._shared.setdefault(pp, {}),
                                       framework=self.framework)
        return self._evs[key]

    def problem(self, train: TrainConfig, lam: float = 0.0) -> Problem:
        """The per-op problem of ``train`` (its graph batch and pipeline depth) with memory weight
        ``lam``; the problems of one evaluator share the tables that do not depend on ``lam``."""
        key = (train.graph_batch, train.pp)
        return Problem(self.get(*key), train, lam, memo=self._memos.setdefault(key, {("root",): self.family}))

    def grid(self, global_batch: int) -> list[dict]:
        """``grid_points`` of this model and cluster, enumerated once per search (the seeds, their
        split between two processes and the exhaustive grid all read it)."""
        hit = self._grids.get(global_batch)
        if hit is None:
            n = self.cluster.n_devices
            node = self.cluster.levels[0].fanout or n
            hit = self._grids[global_batch] = list(grid_points(self.cfg, n, node, global_batch, self.seq))
        return hit

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

    def layouts(self, pc: ParallelConfig) -> tuple[Evaluator, dict]:
        """The evaluator and Megatron layouts of ``pc`` (validated); the last few are kept, as the
        variants of one point (recomputation, ZeRO, virtual stages) share them."""
        pc.validate(self.cfg, self.cluster.n_devices)
        key = (pc.micro_batch * pc.dp, pc.pp, pc.tp, pc.cp, pc.dp, pc.ep, pc.sp)
        hit = self._layouts.get(key)
        if hit is None:
            ev = self.get(pc.micro_batch * pc.dp, pc.pp)
            if len(self._layouts) > 64:
                self._layouts.clear()
            roles = self._roles.get(pc.micro_batch * pc.dp)
            if roles is None:
                roles = self._roles[pc.micro_batch * pc.dp] = op_roles(ev.graph)
            hit = self._layouts[key] = (ev, megatron_layouts(ev.graph, ev.mesh, pc, roles, self.family))
        return hit

    def evaluate(self, pc: ParallelConfig) -> Candidate:
        ev, layouts = self.layouts(pc)
        return Candidate(pc, ev.evaluate(layouts, pc.train_config(), check=False), layouts)

    def static_fits(self, pc: ParallelConfig) -> bool:
        """False only when parameters, gradients and optimizer state alone overflow a device (so
        no variant of ``pc`` fits): an arithmetic lower bound refuses most such points before
        any graph is built, the exact sum (``Evaluator.static_fits``) the rest. True means "may
        fit": the evaluation decides."""
        usable = self.cluster.device.memory * MEMORY_HEADROOM
        bound = self.static_lower_bound(pc)
        if bound > usable:
            return False
        if bound < usable / 2:
            return True  # far from the capacity the exact sum rarely refuses: leave it to the evaluation
        ev, layouts = self.layouts(pc)
        return ev.static_fits(layouts, pc.train_config())

    def static_lower_bound(self, pc: ParallelConfig) -> float:
        """Bytes of parameters, gradients and optimizer state on the most loaded device, from
        below: every weight divided by tp (norms are not, in fact), expert weights by ep too,
        the total spread evenly over the pp stages (the most loaded stage holds at least that),
        ZeRO sharding over dp x cp (Megatron's distributed optimizer; the cost model shards
        over dp only)."""
        if self._param_sums is None:
            self._param_sums = _param_sums(self.get(1, 1).graph)
        train = pc.train_config()
        total = 0.0
        z = train.zero
        for (expert, trainable), numel in self._param_sums.items():
            shard = pc.dp * pc.cp // (pc.ep if expert else 1) or 1
            per = train.param_bytes / (shard if z >= 3 else 1)
            if trainable:
                per += train.grad_bytes / (shard if z >= 2 else 1) + train.optim_bytes / (shard if z >= 1 else 1)
            total += numel * per / (pc.tp * (pc.ep if expert else 1))
        return total / pc.pp


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
            expert = any(d and d[0] == "e" for d in op.in_dims[slot])
            key = (expert, t.trainable)
            sums[key] = sums.get(key, 0) + t.numel * layer_repeat(graph, op.layer)
    return sums


def _divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending (pairs up to the square root: device counts reach 10^5)."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _try(pool: EvaluatorPool, **kw) -> Candidate | None:
    try:
        return pool.evaluate(ParallelConfig(**{**kw, "framework": pool.framework}))
    except PlanError:
        return None


def _static_fits(pool: EvaluatorPool, base: dict) -> bool:
    try:
        return pool.static_fits(ParallelConfig(**{**base, "framework": pool.framework}))
    except PlanError:
        return False


def _best_over_recompute(pool: EvaluatorPool, base: dict) -> Candidate | None:
    """The cheapest recomputation that fits; if none fits, the least memory."""
    best = None
    for rc in pool.recomputations():
        cand = _try(pool, **base, recompute=rc)
        if cand is None:
            continue
        if cand.report.fits:
            return cand if best is None or not best.report.fits or cand.key < best.key else best
        if best is None or cand.report.memory_peak < best.report.memory_peak:
            best = cand
    return best


def grid_points(cfg: ModelConfig, n: int, node: int, global_batch: int, seq: int):
    """Every (tp, pp, cp, dp, ep, micro batch) point of the Megatron space on n devices."""
    for tp in [t for t in _divisors(min(node, n)) if not (cfg.heads % t or cfg.kv_heads % t or cfg.ffn % t)]:
        for pp in [p for p in _divisors(n // tp) if p <= cfg.layers]:
            for cp in [c for c in _divisors(n // (tp * pp)) if seq % (c * tp) == 0 and c <= 32]:
                dp = n // (tp * pp * cp)
                eps = [e for e in _divisors(dp) if cfg.experts % e == 0] if cfg.is_moe else [1]
                for ep in eps:
                    for mb in [m for m in MICRO_BATCHES if global_batch % (m * dp) == 0]:
                        yield dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, sp=tp > 1, zero=1 if dp > 1 else 0,
                                   micro_batch=mb, global_batch=global_batch, seq=seq)


def megatron_grid(pool: EvaluatorPool, global_batch: int, micro_batch: int | None = None
                  ) -> tuple[Candidate | None, int]:
    """The best Megatron configuration, exhaustively with exact branch and bound; returns it and how
    many configurations were costed.

    Per point, recomputation only adds time and virtual stages only remove bubble, so
    (recompute none, most virtual stages) bounds the point's time from below: a point whose bound
    is no faster than the best plan that fits is skipped without losing the optimum.
    """
    cfg = pool.cfg
    best, count = None, 0
    for base in pool.grid(global_batch):
        if micro_batch is not None and base["micro_batch"] != micro_batch:
            continue
        pp = base["pp"]
        vpps = [1] + [v for v in (2, 3, 4) if pp > 1 and cfg.layers % (pp * v) == 0]
        if pp > 1 and cfg.layers % pp:
            vpps = [1]
        if best is not None and best.report.fits and not _static_fits(pool, base):
            continue  # parameters and optimizer state alone overflow: no variant fits
        bound = _try(pool, **base, recompute="none", vpp=vpps[-1])
        count += 1
        if bound is None:
            continue
        if best is not None and best.report.fits and bound.report.step_time_s >= best.report.step_time_s:
            continue
        for rc in pool.recomputations():
            for vpp in reversed(vpps):
                cand = bound if (rc, vpp) == ("none", vpps[-1]) else _try(pool, **base, recompute=rc, vpp=vpp)
                count += cand is not bound
                if cand is not None and (best is None or cand.key < best.key):
                    best = cand
    return best, count


def _recipe_tp(cfg: ModelConfig, active_params: float, node: int) -> int:
    tp = 1 if active_params < 3e9 else 2 if active_params < 13.5e9 else 4 if active_params < 30e9 else 8
    tp = min(tp, node)
    while tp > 1 and (cfg.heads % tp or cfg.kv_heads % tp or cfg.ffn % tp):
        tp //= 2
    return tp


def megatron_recipe(pool: EvaluatorPool, global_batch: int, active_params: float) -> Candidate | None:
    """NVIDIA's published sizing rules (see the module docstring)."""
    cfg, n, seq = pool.cfg, pool.cluster.n_devices, pool.seq
    node = pool.cluster.levels[0].fanout or n
    tp = _recipe_tp(cfg, active_params, min(node, n))
    fallback = None
    for pp in [p for p in _divisors(n // tp) if p <= cfg.layers and cfg.layers % p == 0]:
        dp = n // (tp * pp)
        ep = max((e for e in _divisors(dp) if cfg.experts % e == 0), default=1) if cfg.is_moe else 1
        mb = 1
        if global_batch % dp:
            continue
        for rc in ("selective", "full"):
            cand = _try(pool, tp=tp, pp=pp, dp=dp, ep=ep, sp=tp > 1, zero=1 if dp > 1 else 0, recompute=rc,
                        micro_batch=mb, global_batch=global_batch, seq=seq)
            if cand is None:
                continue
            if cand.report.fits:
                return cand
            if fallback is None or cand.report.memory_peak < fallback.report.memory_peak:
                fallback = cand
    return fallback


def fsdp(pool: EvaluatorPool, global_batch: int) -> Candidate | None:
    """Pure data parallelism with ZeRO-3 (FSDP)."""
    n, seq = pool.cluster.n_devices, pool.seq
    best = None
    for mb in [m for m in MICRO_BATCHES if global_batch % (m * n) == 0]:
        cand = _best_over_recompute(pool, dict(dp=n, zero=3, micro_batch=mb, global_batch=global_batch, seq=seq))
        if cand is not None and (best is None or cand.key < best.key):
            best = cand
    return best
