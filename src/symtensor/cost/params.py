"""Parameters, gradients and optimizer state, and their data-parallel synchronisation: one tensor's
(``ParamCost``, ``param_cost``) and one segment's (``Params``), sharded by ZeRO / FSDP over the
data-parallel axes (``weight_axes``, ``data_axes``), or, under hybrid sharding
(``TrainConfig.dp_replicate``), over their innermost ranks and replicated across the outermost
(``shard_axes``). Read by the evaluator (``cost.model``) and by the op-local terms (``cost.terms``).

Hybrid sharding (HSDP: FSDP2's ``fully_shard`` on a 2-D mesh, Megatron's distributed optimizer
with ``--num-distributed-optimizer-instances``) runs, per gradient bucket or FSDP unit, a
reduce-scatter inside the shard group, then an all-reduce of the shard across the replicas
(Megatron: param_and_grad_buffer.py ``start_grad_sync``, "RS" then "AR" on one stream; FSDP2:
``foreach_reduce`` reduce-scatters, then all-reduces over the replicate mesh dim), and gathers
the parameters inside the shard group only. Its groups are smaller and, on the innermost levels,
faster: a ring inside one node pays NVLink's latency per step, not InfiniBand's, and the
replicas' all-reduce across nodes is a tree (``cost.collectives``); in exchange the state is
sharded over fewer ranks and the all-reduce moves 2x the shard over the network."""

from __future__ import annotations

from dataclasses import dataclass

from symtensor.cost import precision as _precision
from symtensor.cost.engine import GRADIENTS, OPTIMIZER, WEIGHTS, Unit, engine_of
from symtensor.cost.moe import expert_op
from symtensor.cost.opcost import stream_fraction
from symtensor.cost.precision import fp8_gemm
from symtensor.cost.train import TrainConfig
from symtensor.graph import DTYPE_BYTES
from symtensor.layout import REPLICATED, OpLayout

# the dims that hold tokens: batch, sequence, and an expert op's token slots (capacity)
_TOKEN_DIMS = frozenset(("b", "s", "c"))
# the experts dim: expert parallelism, folded over the dense data-parallel and context-parallel ranks (and the
# tensor-parallel ones under expert TP 1), is not a tensor-parallel cut of the dense weights
_EXPERTS_DIM = "e"


def weight_axes(ops, layouts) -> frozenset:
    """Mesh axes that cut a dim of ``ops`` (the ops with parameters, ``Evaluator.param_ops``) other than
    their tokens and experts, the expert ops' own left out: the plan's tensor-parallel (and vocabulary) axes
    for the dense weights. The expert grid (EP x expert TP) folds over the dense data- and context-parallel
    ranks (Megatron's MoE parallel folding: expert TP 2 over two context-parallel ranks), which stay data-parallel
    for the dense weights."""
    out: set = set()
    for op in ops:
        lay = layouts.get(op.name)
        if lay is None or expert_op(op):
            continue
        for d, axes in lay.cuts:
            if d not in _TOKEN_DIMS and d != _EXPERTS_DIM:
                out.update(axes)
    return frozenset(out)


def ops_with_parameters(graph) -> tuple:
    """The ops of ``graph`` that read a parameter (``Evaluator.param_ops``)."""
    return tuple(op for op in graph.ops if any(graph.tensors[t].param for t in op.inputs))


def dense_group(graph, layouts: dict, param_ops: tuple | None = None) -> frozenset:
    """The mesh axes of the dense data-parallel group (dp x cp) of ``layouts`` (by mesh position): those over which
    the attention core's parameters are data-parallel (``data_axes``); none without attention. ``param_ops``:
    ``ops_with_parameters(graph)``, where the caller holds them. The group hybrid sharding splits
    (``TrainConfig.dp_replicate`` replicas of ``dp_shard`` ranks each): the search's, the summary's and explain's."""
    core = next((op for op in graph.ops if op.kind == "attention"), None)
    if core is None:
        return frozenset()
    ops = ops_with_parameters(graph) if param_ops is None else param_ops
    return data_axes(layouts.get(core.name, REPLICATED), weight_axes(ops, layouts))


def data_axes(layout: OpLayout, waxes: frozenset) -> frozenset:
    """The axes over which a parameter of an op with ``layout`` is data-parallel: those cutting
    the batch or an expert op's token slots, and those cutting the sequence that are not tensor-parallel
    axes. Context parallelism: Megatron reduces gradients and shards the distributed optimizer over DP x CP
    (``intra_dp_cp_group``, megatron/core/optimizer/__init__.py), while a sequence-parallel norm weight is
    all-reduced over the TP axes apart. Experts: their data-parallel group is what the expert-parallel ranks
    leave of the stage (Megatron's expert data-parallel group, ETP x EP x EDP = TP x CP x DP), the axes that
    cut their tokens, whether those axes cut the batch or the sequence in the dense layers; an axis that
    carries expert parallelism is not thereby tensor-parallel for the dense weights (``weight_axes``)."""
    return frozenset(layout.axes_of("b")) | frozenset(layout.axes_of("c")) | (frozenset(layout.axes_of("s")) - waxes)


def shard_axes(replicas: tuple, mesh, dp_replicate: int | None) -> tuple[tuple, tuple]:
    """ZeRO's shard group of a parameter whose data-parallel group spans ``replicas`` (mesh
    positions), and the axes it is replicated over: with ``dp_replicate`` (hybrid sharding), the
    outermost of its axes (the lowest positions) whose sizes multiply to a divisor of
    ``dp_replicate`` replicate, and the rest, the ranks nearest each other (inside a node first),
    shard, as Megatron's contiguous optimizer instances (parallel_state.py: the dp-cp ranks cut into
    num_distributed_optimizer_instances consecutive slices) and torchtitan's mesh (dp_replicate
    outside dp_shard x cp) take them. None: the whole group shards, nothing is replicated.

    >>> from symtensor.hardware import load_cluster
    >>> mesh = load_cluster("dgx-a100-80g", devices=32).mesh()  # 2 x 2 (ib) x 2 x 2 x 2 (nvlink)
    >>> shard_axes((0, 1, 2, 3, 4), mesh, 4)
    ((2, 3, 4), (0, 1))
    """
    if dp_replicate is None:
        return replicas, ()
    across, size = [], 1
    for a in sorted(replicas):
        if dp_replicate % (size * mesh[a].size):
            break
        across.append(a)
        size *= mesh[a].size
    return tuple(a for a in replicas if a not in across), tuple(across)


@dataclass(frozen=True, slots=True)
class ParamCost:
    """One parameter on one device: resident bytes, optimizer-step seconds, and one occurrence of
    each collective its data-parallel synchronisation runs (the engine decides how often and what
    it hides behind: ``symtensor.cost.engine``).

    ``reduce``: (kind, bytes, axes) of one gradient reduction over the replicas (all-reduce at
    ZeRO 0, reduce-scatter above); ``gather``: (bytes, axes) of one all-gather of the parameter
    (ZeRO >= 1), or None; ``replicate``: (bytes, axes) of the all-reduce of the reduced shard
    across the replicas that follows each reduction under hybrid sharding, or None; ``other``:
    seconds and bytes per step of all-reducing the gradient over partial axes outside the
    data-parallel group (a norm weight under sequence parallelism)."""

    params: float
    grads: float
    optimizer: float
    opt_time: float
    reduce: tuple | None
    gather: tuple | None
    other_s: float
    other_bytes: float
    unsharded: float  # bytes of the gathered parameter (ZeRO 3 and FSDP units in flight)
    gather_s: float = 0.0  # seconds of ``gather`` alone (this tensor's own collective)
    reduce_s: float = 0.0  # seconds of ``reduce`` alone (and of ``replicate`` after it)
    replicate: tuple | None = None
    # under quantized parameters (``TrainConfig.lowp_params``; 0 otherwise): bytes of Transformer Engine's quantized
    # copies this tensor holds resident, and beside one gathered copy of it (``cost.memory``'s ``fp8_weights``)
    copies: float = 0.0
    gathered_copies: float = 0.0


def param_cost(ev, t, tl, train: TrainConfig, data_axes: frozenset = None, quantized: bool = False) -> ParamCost:
    """Memory and per-step time of parameter ``t`` placed as ``tl``.

    Its gradient is partial over ``tl.partial``. The axes among them that cut the batch
    (``data_axes``) form the data-parallel group: all-reduce, or ZeRO's reduce-scatter and
    all-gather, which also shard the state over it. Other partial axes (a norm weight under
    sequence parallelism is partial over the tensor-parallel axes) are all-reduced on their own,
    as Megatron-LM and DTensor both do. ``data_axes`` None: every partial axis is data-parallel.
    Under hybrid sharding (``train.dp_replicate``) ZeRO takes the shard group of ``shard_axes`` for
    the data-parallel group, and the reduced shard is all-reduced across the replicas. ``quantized``: a GEMM
    weight held as Transformer Engine's quantized tensor (``TrainConfig.lowp_params`` on a low-precision layer):
    ``lowp`` gives its bytes.
    """
    local = t.numel / tl.factor(ev.mesh)
    sync_axes = tuple(sorted(tl.partial))
    data = set(sync_axes) if data_axes is None else set(sync_axes) & set(data_axes)
    other = tuple(a for a in sync_axes if a not in data)
    replicas, across = shard_axes(tuple(sorted(data)), ev.mesh, train.dp_replicate)
    shard = ev.mesh.size(replicas)
    eng, z = engine_of(train), train.zero
    params = local * train.param_bytes / (shard if eng.shards(WEIGHTS, z) else 1)
    # parameters are gathered in the compute dtype (FSDP2 keeps fp32 shards, gathers bf16)
    gathered = local * min(train.param_bytes, DTYPE_BYTES[ev.dtype])
    lp = lowp(params, gathered, local, shard, train, quantized) if train.lowp_params else None
    if lp is not None:
        params, gathered = lp["params"], lp["gathered"]
    copies = (lp["copies"], lp["gathered_copies"]) if lp is not None else (0.0, 0.0)
    if not t.trainable:  # frozen (LoRA's base weights): gathered for compute wherever they are sharded
        gather = (gathered, replicas) if eng.shards(WEIGHTS, z) and replicas else None
        gather_s = ev.coll_time("all_gather", *gather) if gather else 0.0
        return ParamCost(params, 0.0, 0.0, 0.0, None, gather, 0.0, 0.0, gathered, gather_s, 0.0, None, *copies)
    grads = local * train.grad_bytes / (shard if eng.shards(GRADIENTS, z) else 1)
    owned = shard if eng.shards(OPTIMIZER, z) else 1  # the optimizer step updates its own shard
    optimizer = local * train.optim_bytes / owned
    moved = local / owned * (2 * train.optim_bytes + train.grad_bytes + train.param_bytes)
    scan = eng.overflow_scan_bytes[z > 0]  # the loss-scale check's inf/nan scan of the gradients (FP16: Engine)
    if scan:
        moved += local / owned * scan
    if lp is not None:  # the optimizer step's cast of its shard into the quantized weights (cost.precision)
        moved += local / owned * lp["cast"]
    # a fused Adam streams its loads and stores: a triad
    opt_time = moved / (ev.cluster.device.hbm_bandwidth * stream_fraction(ev.eff, "triad"))
    gbytes = local * train.reduced_bytes  # (an engine, or --grad-reduce-in-bf16, may reduce another dtype)
    reduce = gather = replicate = None
    if replicas:
        zero = eng.zero_sharded(z)  # reduce-scatter to the shards' owners, all-gather the weights back
        reduce = ("reduce_scatter" if zero and not eng.zero_all_reduce else "all_reduce", gbytes, replicas)
        gather = (gathered, replicas) if zero else None
    if across:  # hybrid sharding: the reduced shard, all-reduced across the replicas
        replicate = (gbytes / shard, across)
    other_s = ev.coll_time("all_reduce", gbytes, other) if other else 0.0
    gather_s = ev.coll_time("all_gather", *gather) if gather else 0.0
    reduce_s = ev.coll_time(*reduce) if reduce else 0.0
    reduce_s += ev.coll_time("all_reduce", *replicate) if replicate else 0.0
    return ParamCost(params, grads, optimizer, opt_time, reduce, gather, other_s, gbytes if other else 0.0, gathered,
                     gather_s, reduce_s, replicate, *copies)


def lowp(params: float, gathered: float, local: float, shard: int, train: TrainConfig, quantized: bool) -> dict:
    """``params`` (resident) and ``gathered`` (per gather) bytes of a parameter of ``local`` elements per device
    (sharded over ``shard`` ranks where the engine shards weights) under quantized parameters
    (``TrainConfig.lowp_params``, ``cost.precision``), with ``cast``, the bytes per owned element the optimizer
    step moves beyond the default's, and the quantized copies Transformer Engine holds, ``copies`` resident and
    ``gathered_copies`` beside one gathered copy. A ``quantized`` weight (a GEMM weight of a low-precision layer)
    keeps no BF16 weight: replicated (ZeRO 1, 2), its quantized copies are the weight; sharded (ZeRO 3),
    Megatron-FSDP keeps the quantized shard and gathers it, and the copies beyond the gathered bytes (the
    transposes) exist per gathered unit. Any other parameter keeps its bytes, its copies charged on its weight
    elements as without the fact (``memory.fp8_copies``: an upper bound by the share of the norms, embedding and
    head)."""
    eng = engine_of(train)
    recipe = _precision.RECIPES[train.fp8]
    per = _precision.weight_copy_bytes(recipe, not eng.pytorch_kernels)
    sharded = eng.shards(WEIGHTS, train.zero)
    held = local / (shard if sharded else 1)  # weight elements resident
    if not quantized:
        return {"params": params, "gathered": gathered, "cast": 0.0, "copies": held * per,
                "gathered_copies": local * per if sharded else 0.0}
    g = _precision.param_gather_bytes(recipe)
    return {"params": held * _precision.lowp_weight_bytes(recipe, sharded), "gathered": local * g,
            "cast": _precision.param_cast_bytes(recipe, fsdp=train.zero >= 2),
            "copies": 0.0 if sharded else held * per, "gathered_copies": local * (per - g) if sharded else 0.0}


class Params:
    """Parameters, gradients and optimizer state of one segment, their optimizer step and one
    occurrence of their data-parallel collectives: what depends on the ZeRO stage and the
    micro-batch count, not on recomputation or pipeline boundaries (so those variants reuse it).
    Tied parameters (shared embedding and LM head) are kept apart and counted once per stage.

    A unit's parameters are gathered and its gradients reduced together (FSDP units, Megatron's
    buckets): one collective per group of replica axes, so latency is paid per unit; an engine
    that gathers each tensor apart (DeepSpeed ZeRO 3) pays it per tensor. ``ev``: the evaluator
    whose memoised placements and parameter costs it reads. ``quantized``: its GEMM weights are held quantized
    (``TrainConfig.lowp_params`` on a layer outside ``TrainConfig.bf16_span``; ``param_cost``); ``bf16``: a layer
    kept in BF16 (``TrainConfig.bf16_span``), whose weights have no quantized copies (``bf16_bytes``)."""

    def __init__(self, ev, layouts, train: TrainConfig, ops=(), waxes: frozenset = frozenset(),
                 quantized: bool = False, bf16: bool = False):
        self.waxes = waxes  # the plan's tensor-parallel axes (see data_axes)
        self.quantized, self.bf16 = quantized, bf16
        self.opt_time = self.other_s = self.grad_bytes = self.unsharded = 0.0
        self.unsharded_grads = 0.0  # the trainable parameters' gathered bytes: their unsharded gradients' size
        self.copies = self.gathered_copies = 0.0  # quantized weight copies (``ParamCost.copies``)
        self.step_bytes: dict[str, float] = {}  # per step, outside the data-parallel group
        self.static = dict(params=0.0, grads=0.0, optimizer=0.0)
        self.tied: dict[str, Params] = {}
        self.reduces: dict = {}  # (kind, axes) -> bytes of one reduction
        self.gathers: dict = {}  # axes -> bytes of one gather
        self.replicas: dict = {}  # axes -> bytes of one all-reduce across replicas (hybrid sharding)
        self.tensor_gather_s = self.tensor_reduce_s = 0.0  # the same, one collective per tensor
        self.groups: set = set()  # the mesh axes of each group its collectives run over (NCCL communicators)
        for op in ops:
            self._add(ev, train, op, layouts.get(op.name, REPLICATED))
        self.close(ev, train)

    def close(self, ev, train):
        """Totals and the time of one gather and one reduction of the unit."""
        self.total = sum(self.static.values())
        self.bf16_bytes = self.static["params"] if self.bf16 else 0.0  # (resident weights without quantized copies)
        if engine_of(train).per_tensor_gathers:
            self.gather_s, self.reduce_s = self.tensor_gather_s, self.tensor_reduce_s
        else:
            self.gather_s = sum(ev.coll_time("all_gather", b, axes) for axes, b in self.gathers.items())
            self.reduce_s = sum(ev.coll_time(kind, b, axes) for (kind, axes), b in self.reduces.items())
            self.reduce_s += sum(ev.coll_time("all_reduce", b, axes) for axes, b in self.replicas.items())
        # the replicas' all-reduce alone (an engine may run it once per step: ``Engine.replicate_once``)
        self.replicate_s = sum(ev.coll_time("all_reduce", b, axes) for axes, b in self.replicas.items())
        # an engine that copies a gathered unit out of its buffer reads and writes its bytes (engine.py)
        hbm = ev.cluster.device.hbm_bandwidth * stream_fraction(ev.eff, "scale")
        self.copy_s = 2 * sum(self.gathers.values()) / hbm

    def _add(self, ev, train, op, layout):
        for slot, tname in enumerate(op.inputs):
            t = ev.tensors[tname]
            if not t.param:
                continue
            target = self
            if t.tie:
                if t.tie in self.tied:
                    continue
                target = self.tied[t.tie] = Params(ev, {}, train, waxes=self.waxes)
            quantized = self.quantized and fp8_gemm(op)  # (a GEMM weight that runs quantized)
            pc = ev.param_cost(t, ev.param_layout(op, layout, slot), train, data_axes(layout, self.waxes), quantized)
            target.add(ev, pc)
            if target is not self:
                target.close(ev, train)

    def add(self, ev, pc: ParamCost):
        st = self.static
        st["params"] += pc.params
        st["grads"] += pc.grads
        st["optimizer"] += pc.optimizer
        self.opt_time += pc.opt_time
        self.other_s += pc.other_s
        self.unsharded += pc.unsharded
        if pc.grads:  # (a frozen weight, LoRA's base, has no gradient)
            self.unsharded_grads += pc.unsharded
        if not self.bf16:  # (a layer kept in BF16 has no quantized copies)
            self.copies += pc.copies
            self.gathered_copies += pc.gathered_copies
        if pc.other_bytes:
            self.step_bytes["all_reduce"] = self.step_bytes.get("all_reduce", 0.0) + pc.other_bytes
        if pc.reduce is not None:
            kind, nbytes, axes = pc.reduce
            self.reduces[(kind, axes)] = self.reduces.get((kind, axes), 0.0) + nbytes
            self.grad_bytes += nbytes
            self.tensor_reduce_s += pc.reduce_s
            self.groups.add(axes)
        if pc.gather is not None:
            nbytes, axes = pc.gather
            self.gathers[axes] = self.gathers.get(axes, 0.0) + nbytes
            self.tensor_gather_s += pc.gather_s
            self.groups.add(axes)
        if pc.replicate is not None:
            nbytes, axes = pc.replicate
            self.replicas[axes] = self.replicas.get(axes, 0.0) + nbytes
            self.groups.add(axes)  # (its own communicator, as the shard group's)

    def unit(self, times: int, fwd: float = 0.0, bwd: float = 0.0) -> Unit:
        """``times`` identical units whose compute (forward, backward) the engine overlaps with."""
        return Unit(times, fwd, bwd, self.gather_s, self.reduce_s, self.grad_bytes, self.copy_s, self.replicate_s)

    def dp_bytes(self, calls: dict) -> dict:
        """Bytes per step of this segment's data-parallel collectives, ``calls`` times each (the
        replicas' all-reduce of hybrid sharding as often as the reduce-scatter it follows, or ``calls["replicate"]``
        times where the engine runs it apart: ``Engine.replicate_once``)."""
        out = dict(self.step_bytes)
        for (kind, _), b in self.reduces.items():
            out[kind] = out.get(kind, 0.0) + b * calls.get(kind, 0)
        for _, b in self.replicas.items():
            out["all_reduce"] = out.get("all_reduce", 0.0) + b * calls.get("replicate", calls.get("reduce_scatter", 0))
        for _, b in self.gathers.items():
            out["all_gather"] = out.get("all_gather", 0.0) + b * calls.get("all_gather", 0)
        return out
