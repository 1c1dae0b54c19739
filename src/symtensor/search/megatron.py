"""Megatron-LM configurations as layouts: (tp, pp, dp, cp, ep, sp, zero, recompute, micro batch, vpp).

A Megatron configuration is one point of SymTensor's space: every op gets the cuts Megatron's
modules apply (``megatron_layouts``; ``megatron_plan`` makes it a Plan, ``grid_points`` enumerates
the space). Mesh axes are assigned in Megatron's rank order (tp fastest, then cp, then dp with
ep carved from its innermost part; pp slowest), which puts tensor parallelism inside a node.

    op family                         cut by tp axes                   by dp / cp axes
    q/k/v, gate/up (column parallel)  output features (n, g, f)        b / s
    o_proj, down (row parallel)       reduction (n, f): partial out    b / s
    attention core                    heads n (kv heads g follow)      b / s (query only)
    norms, residual, dropout          s if sequence parallel           b / s
    embedding, LM head, loss          vocabulary v                     b / s
    MoE experts                       f (expert TP = TP)               e by ep, b by the rest of dp
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from symtensor.cost import Evaluator, TrainConfig
from symtensor.cost.train import chunks_fit
from symtensor.errors import PlanError
from symtensor.graph import Graph
from symtensor.hardware import Cluster, divisors
from symtensor.layout import REPLICATED, OpLayout
from symtensor.models import ModelConfig, build_graph
from symtensor.plan.plan import Plan
from symtensor.plan.summary import MEGATRON_KEYS

MICRO_BATCHES = (1, 2, 4, 8)  # the micro-batch sizes the Megatron grid tries


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelConfig:
    """A Megatron-LM configuration: the engine's own arguments (``megatron_plan`` builds the Plan
    of one, ``megatron_config`` reads one back from a plan; the runtime runs one)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    sp: bool = False
    zero: int = 0
    recompute: str = "none"
    micro_batch: int = 1
    global_batch: int = 1
    seq: int = 2048
    vpp: int = 1
    framework: str = "megatron"  # the engine whose semantics the costs follow (cost/engine.py)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def micro_steps(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    def validate(self, cfg: ModelConfig, n_devices: int) -> None:
        """Refuse an impossible configuration with one line naming the rule and the fix."""
        for key in ("tp", "pp", "dp", "cp", "ep", "micro_batch", "global_batch", "seq", "vpp"):
            v = getattr(self, key)
            if not isinstance(v, int) or v <= 0:
                raise PlanError(f"{key} must be a positive integer, got {v!r}")
        if self.devices != n_devices:
            raise PlanError(f"tp*pp*dp*cp = {self.tp}*{self.pp}*{self.dp}*{self.cp} = {self.devices} but the "
                            f"cluster has {n_devices} devices; make the product equal the device count")
        if cfg.heads % self.tp or cfg.kv_heads % self.tp:
            raise PlanError(f"tp={self.tp} must divide heads={cfg.heads} and kv_heads={cfg.kv_heads}; "
                            "choose a tp that divides both")
        if cfg.ffn % self.tp or cfg.moe_ffn % self.tp:
            raise PlanError(f"tp={self.tp} must divide the MLP width {cfg.ffn}")
        if self.global_batch % (self.micro_batch * self.dp):
            raise PlanError(f"global batch {self.global_batch} is not divisible by micro_batch*dp = "
                            f"{self.micro_batch}*{self.dp}; change --global-batch or --micro-batch")
        seq_cut = self.cp * (self.tp if self.sp else 1)
        if self.seq % seq_cut:
            raise PlanError(f"seq={self.seq} is not divisible by cp*tp(sp) = {seq_cut}")
        if self.ep > 1 and (not cfg.is_moe or cfg.experts % self.ep):
            raise PlanError(f"ep={self.ep} must divide the number of experts ({cfg.experts})")
        if self.dp % self.ep:
            raise PlanError(f"ep={self.ep} must divide dp={self.dp} (expert parallelism is carved from data parallelism)")
        if self.pp > cfg.layers:
            raise PlanError(f"pp={self.pp} exceeds the {cfg.layers} layers")
        if self.vpp > 1 and not chunks_fit(cfg.layers, self.pp, self.vpp):
            raise PlanError(f"{cfg.layers} layers do not split into pp*vpp = {self.pp * self.vpp} chunks")
        if self.tp == 1 and self.sp:
            raise PlanError("sequence parallelism (--sp) needs tp > 1")

    def train_config(self) -> TrainConfig:
        """The training configuration the cost model reads."""
        return TrainConfig(global_batch=self.global_batch, micro_steps=self.micro_steps(), pp=self.pp,
                           vpp=self.vpp, recompute=self.recompute, zero=self.zero, framework=self.framework)


assert tuple(f.name for f in fields(ParallelConfig)) == MEGATRON_KEYS  # one list of Megatron's arguments


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


def assign_axes(mesh, pc: ParallelConfig) -> dict[str, tuple[int, ...]]:
    free = list(range(len(mesh)))
    tp = _take(mesh, free, pc.tp, "tp")
    cp = _take(mesh, free, pc.cp, "cp")
    dp = _take(mesh, free, pc.dp, "dp")
    ep = _take(mesh, list(dp), pc.ep, "ep")
    return {"tp": tp, "cp": cp, "dp": dp, "ep": ep, "edp": tuple(a for a in dp if a not in ep)}


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
    if op.kind == "elementwise":
        # activations follow their neighbours' cut: the MLP width, or heads (rotary embeddings)
        for d in ("f", "n", "g"):
            if d in sizes:
                return d
    return None


def expert_op(op) -> bool:
    """An MoE expert's matmul or activation: an input runs over the expert dim ``e`` first."""
    return op.kind in ("linear", "elementwise") and any(d and d[0] == "e" for d in op.in_dims)


def op_roles(graph: Graph) -> dict[str, tuple]:
    """Per op, what ``megatron_layouts`` reads of it: (expert op, its sequence dim, the
    tensor-parallel dim, whether sequence parallelism cuts it, whether it has a batch dim).
    Fixed by the graph: ``EvaluatorPool`` keeps one per graph, as every grid point asks."""
    roles = {}
    for op in graph.ops:
        sizes = op.dim_sizes
        expert = expert_op(op)
        seq_dim = "c" if op.kind == "moe_combine" or expert else "s"
        tdim = tp_dim(op)
        tdim = tdim if tdim in sizes else None
        sp = "s" in sizes and op.kind in ("norm", "elementwise") and not expert
        roles[op.name] = (expert, seq_dim if seq_dim in sizes else None, tdim, sp, "b" in sizes)
    return roles


def megatron_layouts(graph: Graph, mesh, pc: ParallelConfig, roles: dict | None = None,
                     family: OpLayout = REPLICATED) -> dict[str, OpLayout]:
    """Per-op layouts of a Megatron configuration on the stage mesh.

    Args:
        roles: ``op_roles(graph)``, when the caller keeps it.
        family: a layout whose family the layouts join (``OpLayout.family``; a search's).
    """
    ax = assign_axes(mesh, pc)
    roles = op_roles(graph) if roles is None else roles
    layouts = {}
    for op in graph.ops:
        expert, seq_dim, tdim, sp, batch = roles[op.name]
        cuts: dict[str, tuple[int, ...]] = {}
        if batch:
            cuts["b"] = ax["edp"] if expert else ax["dp"]
        if expert:
            cuts["e"] = ax["ep"]
        if seq_dim and ax["cp"]:
            cuts[seq_dim] = ax["cp"]
        if ax["tp"] and tdim:
            cuts[tdim] = ax["tp"]
        elif ax["tp"] and pc.sp and sp:
            cuts["s"] = cuts.get("s", ()) + ax["tp"]
        layouts[op.name] = family.relative(cuts)
    return layouts


def megatron_plan(model: ModelConfig, cluster: Cluster, config: ParallelConfig | None = None,
                  graph: Graph | None = None, **fields) -> Plan:
    """The plan of a Megatron-style configuration, costed by the SymTensor model: the Megatron
    constructor of a Plan.

    Args:
        config: the configuration; or give its fields as keywords (``tp=2, dp=4, ...``).
        graph: the graph of one micro-step (default: the builders' skeleton graph).

    A configuration that Megatron cannot run on this model and cluster is a PlanError naming the
    rule (``ParallelConfig.validate``, then the layout check).
    """
    pc = config if config is not None else ParallelConfig(**fields)
    pc.validate(model, cluster.n_devices)
    graph = graph or build_graph(model, micro_batch=pc.micro_batch * pc.dp, seq=pc.seq, skeleton=True)
    ev = Evaluator(graph, cluster, pp=pc.pp, framework=pc.framework)
    layouts = megatron_layouts(graph, ev.mesh, pc)
    train = pc.train_config()
    return Plan.of(model, cluster, train, pc.seq, graph, ev.mesh, ev.pp_axes, layouts, ev.evaluate(layouts, train))


def megatron_config(plan: Plan) -> ParallelConfig:
    """The Megatron configuration of a plan whose ops agree on one (``plan.config``); a PlanError
    names the rule when they do not."""
    c = plan.config
    if c["heterogeneous"]:
        raise PlanError("this plan gives different ops different cuts; a Megatron configuration cuts every layer "
                        "alike (plan with --space megatron)")
    return ParallelConfig(**{k: c[k] for k in MEGATRON_KEYS})


def grid_points(cfg: ModelConfig, n: int, node: int, global_batch: int, seq: int):
    """Every (tp, pp, cp, dp, ep, micro batch) point of the Megatron space on n devices (``node``
    devices per node: tensor parallelism stays inside one)."""
    for tp in [t for t in divisors(min(node, n)) if not (cfg.heads % t or cfg.kv_heads % t or cfg.ffn % t)]:
        for pp in [p for p in divisors(n // tp) if p <= cfg.layers]:
            for cp in [c for c in divisors(n // (tp * pp)) if seq % (c * tp) == 0 and c <= 32]:
                dp = n // (tp * pp * cp)
                eps = [e for e in divisors(dp) if cfg.experts % e == 0] if cfg.is_moe else [1]
                for ep in eps:
                    for mb in [m for m in MICRO_BATCHES if global_batch % (m * dp) == 0]:
                        yield dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, sp=tp > 1, zero=1 if dp > 1 else 0,
                                   micro_batch=mb, global_batch=global_batch, seq=seq)
