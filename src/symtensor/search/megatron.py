"""Megatron-LM configurations as layouts: (tp, pp, dp, cp, ep, etp, sp, zero, recompute, micro batch, vpp).

A Megatron configuration is one point of SymTensor's space: every op gets the cuts Megatron's
modules apply (``megatron_layouts``). Its type is the engine-neutral
``plan.parallelism.Parallelism``; inside the search it is a dict of its keys (``DEFAULTS``), the
grid's working record and the keywords of ``megatron_plan``, the Megatron constructor of a Plan,
checked by ``check_config`` (the one configuration rule, ``plan.parallelism.refusal``);
``Plan.parallelism`` reads it back from a plan, ``grid_points`` enumerates the space. Mesh axes
are assigned in Megatron's rank order (tp fastest, then cp, then dp; pp slowest), which puts
tensor parallelism inside a node.

The expert layers have their own grid over the same ranks (Megatron's MoE parallel folding,
``--expert-tensor-parallel-size`` and ``--expert-model-parallel-size``): the tp x cp x dp ranks of
a pipeline stage are regrouped as etp x ep x edp, etp fastest, then ep, then the expert data
parallel rest (``assign_axes``). EP may exceed DP: it folds over the tensor- and context-parallel
ranks too.

    op family                         cut by tp axes                   by dp / cp axes
    q/k/v, gate/up (column parallel)  output features (n, g, f)        b / s
    o_proj, down (row parallel)       reduction (n, f): partial out    b / s
    attention core, Q/K norms         heads n (kv heads g follow)      b / s (query only)
    norms, residual, dropout          s if sequence parallel           b / s
    router, top-k, dispatch, combine  s (c) if sequence parallel       b / s (c)
    embedding, LM head, loss          vocabulary v                     b / s
    MoE experts (their own grid)      f by etp axes, e by ep axes, the tokens (b, c) by the edp axes

Context parallelism run as all-to-alls (``cost.train.TrainConfig.context``: DeepSpeed-Ulysses, the deepspeed
engine's own, or Megatron-LM's --cp-comm-type a2a, ``Stack.cp_comm``) cuts the attention core's heads by the cp axes
too (after the tp axes), not its query sequence: the all-to-alls into and out of it are the redistributions between
it and the sequence-cut projections around it.
"""

from __future__ import annotations

from types import MappingProxyType

from symtensor.cost import Evaluator, TrainConfig
from symtensor.cost.engine import context_of
from symtensor.cost.params import shard_axes
from symtensor.cost.pipeline import balanced_split
from symtensor.errors import PlanError
from symtensor.graph import Graph
from symtensor.hardware import Cluster, divisors
from symtensor.layout import REPLICATED, OpLayout, refusal
from symtensor.models import ModelConfig, build_graph
from symtensor.plan.parallelism import Parallelism, has_dense_mlp, refusal as config_refusal
from symtensor.plan.plan import Plan
from symtensor.plan.summary import MEGATRON_KEYS

MICRO_BATCHES = (1, 2, 4, 8)  # the micro-batch sizes the Megatron grid tries


# A Megatron-LM configuration is the engine-neutral ``plan.parallelism.Parallelism`` as a dict of
# its keys: the keywords of ``megatron_plan`` (the Megatron constructor of a Plan) and the grid's
# working record (a dict: the grid builds and merges hundreds of thousands). These are Megatron's
# defaults for the keys a configuration leaves out (``Parallelism``'s: ep and etp are the expert
# layers' grid, folded over the tp x cp x dp ranks of a stage; ``framework``: the engine whose
# semantics the costs follow, cost/engine.py).
_DEFAULTS = Parallelism().as_dict()
DEFAULTS = MappingProxyType(_DEFAULTS)  # read-only (configuration() merges the dict: twice as fast)
_KEYS = frozenset(_DEFAULTS)
assert tuple(DEFAULTS) == MEGATRON_KEYS  # one list of Megatron's arguments


def configuration(given: dict) -> dict:
    """The Megatron configuration ``given`` with the defaults for the keys it leaves out. A key
    that is not one of Megatron's is a TypeError, as an unexpected keyword argument is (a typo
    cannot fall back to a default, nor pass for an invalid configuration: PlanError)."""
    if not given.keys() <= _KEYS:
        raise TypeError(f"{', '.join(sorted(given.keys() - _KEYS))}: not a Megatron configuration key; use "
                        f"{', '.join(DEFAULTS)}")
    return {**_DEFAULTS, **given}


def train_config(c: dict) -> TrainConfig:
    """The training configuration the cost model reads, of the (complete) configuration ``c``."""
    return Parallelism.from_dict(c).train


def check_config(cfg: ModelConfig, n_devices: int, c: dict, device=None) -> None:
    """Refuse a configuration ``c`` (complete: ``configuration``) that does not run on model
    ``cfg`` and ``n_devices`` devices (of kind ``device``, when given), with one line naming the
    rule and the fix: the one configuration rule, ``plan.parallelism.refusal``."""
    why = config_refusal(Parallelism.from_dict(c), cfg, n_devices, device)
    if why is not None:
        raise PlanError(why)


def _take(mesh, free: list[int], degree: int, what: str) -> tuple[int, ...]:
    """Take axes (innermost first) from ``free`` whose sizes multiply to ``degree``."""
    taken, rest = [], degree
    for a in sorted(free, reverse=True):
        if rest > 1 and rest % mesh[a].size == 0:
            taken.append(a)
            rest //= mesh[a].size
    if rest != 1:
        raise PlanError(f"{what}={degree} cannot be laid on the mesh axes {[mesh[a].size for a in free]}")
    for a in taken:
        free.remove(a)
    return tuple(sorted(taken))


def assign_axes(mesh, c: dict) -> dict[str, tuple[int, ...]]:
    """The stage-mesh axes of each parallelism, in Megatron's rank order: tp, cp, dp for the
    attention grid; etp, ep and the expert data parallel rest (edp) for the expert grid, over the
    same axes (MoE parallel folding: Megatron's expert ranks are ordered etp fastest, then ep)."""
    free = list(range(len(mesh)))
    tp = _take(mesh, free, c["tp"], "tp")
    cp = _take(mesh, free, c["cp"], "cp")
    dp = _take(mesh, free, c["dp"], "dp")
    stage = list(tp + cp + dp)
    etp = _take(mesh, stage, c["etp"], "etp")
    ep = _take(mesh, stage, c["ep"], "ep")
    return {"tp": tp, "cp": cp, "dp": dp, "etp": etp, "ep": ep, "edp": tuple(sorted(stage))}


def check_shard_group(mesh, c: dict, dp_shard: int) -> None:
    """Hybrid sharding takes the innermost data-parallel axes (the cp axes, then the dp axes:
    Megatron's rank order) whose sizes multiply to ``dp_shard``, the outer ones replicating
    (``cost.params.shard_axes``); a PlanError naming the sizes that do when no such axes exist on
    this mesh."""
    ax = assign_axes(mesh, c)
    group = tuple(sorted(ax["cp"] + ax["dp"]))
    shard, _ = shard_axes(group, mesh, mesh.size(group) // dp_shard)
    if mesh.size(shard) != dp_shard:
        sizes, size = [], 1
        for a in sorted(group, reverse=True)[:-1]:
            size *= mesh[a].size
            sizes.append(size)
        raise PlanError(f"dp_shard={dp_shard} is not the size of the innermost data-parallel ranks on this cluster; "
                        f"use one of {', '.join(map(str, sizes)) or 'none'} (ranks nearest each other first)")


_COLUMN = {"q_proj": "n", "k_proj": "g", "v_proj": "g", "gate_proj": "f", "up_proj": "f", "router": None}
_ROW = {"o_proj": ("n", "d"), "down_proj": ("f",)}


def tp_dim(op) -> str | None:
    """The dim Megatron's tensor parallelism cuts in this op, or None (replicated / sequence)."""
    block = op.block.split(".")
    leaf = block[-1]
    base = block[-2] if leaf in ("lora_a", "lora_b", "lora_add") else leaf
    sizes = op.dim_sizes
    if op.kind == "attention" or op.kind in ("bmm", "softmax") or leaf == "attn_dropout":
        return "n"
    if op.kind in ("embedding", "cross_entropy") and "v" in sizes:
        return "v"
    if leaf == "lm_head":
        return "v"
    if base in _COLUMN:
        col = _COLUMN[base]
        if col is None or leaf == "lora_a":
            return None
        return col if col in sizes else None
    if base in _ROW:
        if leaf == "lora_b":
            return None
        return "n" if base == "o_proj" else "f"
    if op.kind == "norm":
        # Q/K norms over the head dim (Qwen3) follow the heads' cut
        return next((d for d in ("n", "g") if d in sizes), None)
    if op.kind == "elementwise":
        # activations follow their neighbours' cut: the MLP width, or heads (rotary embeddings)
        for d in ("f", "n", "g"):
            if d in sizes:
                return d
    return None


# MoE ops that run per token beside the experts: under sequence parallelism they keep the
# sequence shard (Megatron routes and permutes the tokens of each rank's shard)
_TOKEN_BLOCKS = ("router", "topk", "shared_expert_gate")


def sp_dim(op) -> str | None:
    """The dim sequence parallelism cuts in this op, where tensor parallelism cuts none: the
    sequence ``s`` of norms, elementwise ops and the MoE token ops (router, top-k, dispatch), the
    slots ``c`` of the combine (they carry to its output's sequence); None elsewhere."""
    sizes = op.dim_sizes
    if expert_op(op):
        return None
    if op.kind == "moe_combine":
        return "c"
    token_op = op.kind in ("norm", "elementwise", "moe_dispatch") or op.block.split(".")[-1] in _TOKEN_BLOCKS
    return "s" if token_op and "s" in sizes else None


def expert_op(op) -> bool:
    """An MoE expert's matmul or activation: its first input runs over the expert dim ``e`` first
    (a router's bias over ``e`` does not make it one)."""
    return op.kind in ("linear", "elementwise") and bool(op.in_dims) and op.in_dims[0][:1] == ("e",)


def op_roles(graph: Graph) -> dict[str, tuple]:
    """Per op, what ``megatron_layouts`` reads of it: its role (expert op, its sequence dim, the
    tensor-parallel dim, the dim sequence parallelism cuts, whether it has a batch dim, whether it is an
    attention core: all-to-all context parallelism cuts its heads) and the
    class of its signature (ops of one class are equal to the legality rule: one check serves
    them all). Fixed by the graph: ``EvaluatorPool`` keeps one per graph, as every grid point asks."""
    roles, classes = {}, {}
    for op in graph.ops:
        sizes = op.dim_sizes
        expert = expert_op(op)
        seq_dim = "c" if op.kind == "moe_combine" or expert else "s"
        tdim = tp_dim(op)
        tdim = tdim if tdim in sizes else None
        role = (expert, seq_dim if seq_dim in sizes else None, tdim, sp_dim(op), "b" in sizes, op.kind == "attention")
        roles[op.name] = (role, classes.setdefault(op.signature, len(classes)))
    return roles


def megatron_layouts(graph: Graph, mesh, c: dict, roles: dict | None = None,
                     family: OpLayout = REPLICATED, legal: dict | None = None) -> dict[str, OpLayout]:
    """Per-op layouts of a Megatron configuration on the stage mesh; a PlanError when one of
    them is illegal (``layout.refusal``, the one rule: e.g. sequence or context parallelism
    cutting an MoE capacity ``c`` it does not divide), so no search costs such a configuration.

    Args:
        roles: ``op_roles(graph)``, when the caller keeps it.
        family: a layout whose family the layouts join (``OpLayout.family``; a search's).
        legal: the caller's memo of the legality checks of this graph (``roles``) on this mesh,
            (signature class, layout) -> ``layout.refusal`` (a search keeps one per graph and mesh).
    """
    roles = op_roles(graph) if roles is None else roles
    of_role = role_layouts(mesh, c, family)  # (the ops of one role share a layout: it is built once)
    layouts = {op.name: of_role(roles[op.name][0]) for op in graph.ops}
    legal = {} if legal is None else legal  # (signature class, layout) -> refusal: once per pair
    for op in graph.ops:
        key = (roles[op.name][1], layouts[op.name])
        why = legal.get(key, _UNCHECKED)
        if why is _UNCHECKED:
            why = legal[key] = refusal(op, layouts[op.name], mesh)
        if why is not None:  # (in graph order: the first op refused is the one reported)
            sp = " with sequence parallelism" if c["sp"] else ""
            ulysses = " (all-to-all context parallelism cuts the attention heads by tp x cp)" if \
                op.kind == "attention" and c["cp"] > 1 and _ulysses(c) else ""
            raise PlanError(f"tp={c['tp']} cp={c['cp']} ep={c['ep']} etp={c['etp']}{sp}: op {op.name}: {why}; "
                            f"choose degrees whose cuts divide it{ulysses}")
    return layouts


_UNCHECKED = object()  # a legality check not done yet (None is an answer: legal)


def _ulysses(c: dict) -> bool:
    """Whether configuration ``c`` runs context parallelism as all-to-alls (``cost.engine.context_of``: its stack's
    ``cp_comm``, else its engine's)."""
    return context_of(c.get("framework", DEFAULTS["framework"]), c.get("cp_comm")) == "a2a"


def role_layouts(mesh, c: dict, family: OpLayout = REPLICATED):
    """``role -> layout``: the layout ``megatron_layouts`` gives the ops of a role (``op_roles``) under the
    Megatron configuration ``c`` on ``mesh``, each built once, with no legality check (the Megatron grid's
    cheapest bound reads the layouts of a few roles, not every op's: ``grid._compute``)."""
    ax = assign_axes(mesh, c)
    # the expert grid: e by ep, f by etp; on the edp axes the tokens keep the cut they have where
    # they are dispatched (the batch on dp axes, the slots on cp and, sequence parallel, tp axes)
    token_cut = {a: "b" for a in ax["dp"]} | {a: "c" for a in ax["cp"] + ax["tp"]}
    experts = {"e": ax["ep"], "b": tuple(a for a in ax["edp"] if token_cut[a] == "b"),
               "c": tuple(a for a in ax["edp"] if token_cut[a] == "c")}
    ulysses = _ulysses(c)
    built: dict = {}

    def of(role: tuple) -> OpLayout:
        layout = built.get(role)
        if layout is None:
            layout = built[role] = _role_layout(role, ax, experts, c["sp"], family, ulysses)
        return layout
    return of


def _role_layout(role: tuple, ax: dict, experts: dict, sp_on: bool, family: OpLayout, ulysses: bool) -> OpLayout:
    """The layout of the ops of one role (``op_roles``) under the axes ``ax`` (``assign_axes``); ``ulysses``: context
    parallelism runs as all-to-alls, cutting an attention core's heads, not its query sequence (``_ulysses``)."""
    expert, seq_dim, tdim, sp, batch, core = role
    if expert:
        return family.relative(experts | ({tdim: ax["etp"]} if tdim else {}))
    cuts: dict[str, tuple[int, ...]] = {}
    if batch:
        cuts["b"] = ax["dp"]
    heads_by_cp = ulysses and core and tdim
    if seq_dim and ax["cp"] and not heads_by_cp:
        cuts[seq_dim] = ax["cp"]
    if ax["tp"] and tdim:
        cuts[tdim] = ax["tp"]
    elif ax["tp"] and sp_on and sp:
        cuts[sp] = cuts.get(sp, ()) + ax["tp"]
    if heads_by_cp and ax["cp"]:
        cuts[tdim] = cuts.get(tdim, ()) + ax["cp"]
    return family.relative(cuts)


def megatron_plan(model: ModelConfig, cluster: Cluster, graph: Graph | None = None, **config) -> Plan:
    """The plan of a Megatron-style configuration, costed by the SymTensor model: the Megatron
    constructor of a Plan.

    Args:
        config: the configuration's keys (``tp=2, dp=4, ...``; the rest are ``DEFAULTS``).
        graph: the graph of one micro-step (default: the builders' skeleton graph).

    A configuration that Megatron cannot run on this model and cluster is a PlanError naming the
    rule (``check_config``, then the layout check).
    """
    c = configuration(config)
    check_config(model, cluster.n_devices, c, cluster.device)
    graph = graph or build_graph(model, micro_batch=c["micro_batch"] * c["dp"], seq=c["seq"], skeleton=True)
    ev = Evaluator(graph, cluster, pp=c["pp"], framework=c["framework"])
    layouts = megatron_layouts(graph, ev.mesh, c)
    train = train_config(c)
    if train.dp_replicate is not None:
        check_shard_group(ev.mesh, c, c["dp_shard"])
    return Plan.of(model, cluster, train, c["seq"], graph, ev.mesh, ev.pp_axes, layouts, ev.evaluate(layouts, train))


def balanced_layer_split(model: ModelConfig, cluster: Cluster, graph: Graph | None = None, **config) -> tuple[int, ...]:
    """The layer split (layers per virtual stage) that balances the pipeline ranks of a Megatron
    configuration (``cost.pipeline.balanced_split`` of its layers' seconds, ``Evaluator.layer_seconds``,
    with its recomputation; the embedding and the head and loss as work on the first and last
    stage); the configuration's own ``layer_split`` is ignored."""
    c = configuration({**config, "layer_split": None})
    check_config(model, cluster.n_devices, c)
    graph = graph or build_graph(model, micro_batch=c["micro_batch"] * c["dp"], seq=c["seq"], skeleton=True)
    ev = Evaluator(graph, cluster, pp=c["pp"], framework=c["framework"])
    seconds = ev.layer_seconds(megatron_layouts(graph, ev.mesh, c), train_config(c))
    return balanced_split(seconds, model.layers, c["pp"], c["vpp"])


def expert_grids(cfg: ModelConfig, tp: int, stage: int) -> list[tuple[int, int]]:
    """The (etp, ep) expert grids of a stage of ``stage`` ranks with attention tp ``tp``: expert
    TP 1 or tp, and every expert-parallel degree that divides the experts and stage / etp (EP
    folds over tp, cp and dp); ((1, 1),) for a dense model."""
    if not cfg.is_moe:
        return [(1, 1)]
    etps = [1] + ([tp] if tp > 1 and cfg.moe_ffn % tp == 0 else [])
    return [(etp, ep) for etp in etps for ep in divisors(stage // etp) if cfg.experts % ep == 0]


def inner_grid(point: dict) -> tuple:
    """A grid point's inner grid (tp, cp, ep, etp, sp, micro batch): what its layers' costs
    depend on, not the pipeline depth or the data-parallel degree around them (``search.grid``)."""
    return point["tp"], point["cp"], point["ep"], point["etp"], point["sp"], point["micro_batch"]


def grid_points(cfg: ModelConfig, n: int, node: int, global_batch: int, seq: int):
    """Every (tp, pp, cp, dp, ep, etp, micro batch) point of the Megatron space on n devices
    (``node`` devices per node: tensor parallelism stays inside one)."""
    dense = has_dense_mlp(cfg)
    for tp in [t for t in divisors(min(node, n)) if not (cfg.heads % t or cfg.kv_heads % t or
                                                          (dense and cfg.ffn % t) or cfg.shared_ffn % t)]:
        for pp in [p for p in divisors(n // tp) if p <= cfg.layers]:
            for cp in [c for c in divisors(n // (tp * pp)) if seq % (c * tp) == 0 and c <= 32]:
                dp = n // (tp * pp * cp)
                for etp, ep in expert_grids(cfg, tp, tp * cp * dp):
                    for mb in [m for m in MICRO_BATCHES if global_batch % (m * dp) == 0]:
                        yield dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, sp=tp > 1, zero=1 if dp > 1 else 0,
                                   micro_batch=mb, global_batch=global_batch, seq=seq)
