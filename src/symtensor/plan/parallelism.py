"""The engine-neutral parallel configuration of a plan: degrees, and the rules derived from them.

A plan whose ops agree on one Megatron-style configuration (``plan.summary.config_summary``: not
heterogeneous) has a ``Parallelism``: its degrees (tp, pp, dp, cp, ep, etp), sequence
parallelism, ZeRO stage, recomputation, batch sizes, sequence and virtual stages, and the engine
whose semantics its costs follow. It is read from a plan once (``parallelism(plan)``,
``Plan.parallelism``) and everything that lowers a plan to an engine (``export/``,
``runtime/lower.py``), or re-costs it as a configuration (``calibration``, ``analysis.sweep``,
``api.evaluate``), reads its attributes. Like torchtitan's ``ParallelDims``
(torchtitan/distributed/parallel_dims.py), what is derived from the degrees is written here once:

    world           tp x pp x dp x cp devices
    stage           tp x cp x dp ranks of one pipeline stage (the expert grid regroups them)
    edp             the expert grid's data-parallel rest: stage / (ep x etp) (MoE parallel folding)
    micro_steps     micro-batches per step of each data-parallel replica
    seq_cut         cp x tp (sequence parallel): what the sequence must divide into
    hsdp            whether ZeRO shards over part of the dp x cp group (``dp_shard``) and
                    replicates across the rest: hybrid sharding; ``dp_replicate`` the replicas
    sharded_parameters, reshards_after_forward: the engine's rule (``cost.engine``)

Whether a configuration runs on a model and a cluster is one function, ``refusal`` (the reason,
or None; ``search.megatron.check_config`` raises on it): the Megatron grid, ``evaluate``, the
exports and the runtime all apply it. What an engine can run beyond it is the engine's own
capability table, in its lowering module. The Megatron configuration dict of ``search.megatron``
is this value's keys (``as_dict``), the grid's working record.

    >>> from symtensor.models import load_model_config
    >>> p = Parallelism(tp=2, dp=4, sp=True, global_batch=16, seq=64)
    >>> p.world, p.micro_steps, p.seq_cut
    (8, 4, 2)
    >>> p.refusal(load_model_config("tiny-llama"), 16)
    'tp*pp*dp*cp = 2*1*4*1 = 8 but the cluster has 16 devices; make the product equal the device count'
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace

from symtensor.cost import (
    engine as _engine,
    moe as _moe,
    offload as _offload,
    precision as _precision,
    recompute as _modules,
    stack_kernels as _kernels,
)
from symtensor.cost.stack import KEYS as STACK_KEYS, Stack
from symtensor.cost.train import RECOMPUTE, TrainConfig
from symtensor.errors import PlanError
from symtensor.plan.summary import config_summary

_COUNTS = ("tp", "pp", "dp", "cp", "ep", "etp", "micro_batch", "global_batch", "seq", "vpp")
TOKENS_PER_STEP = 2**22  # default global batch: about 4M tokens per step, as LLaMA-scale pretraining uses


def default_seq(cfg) -> int:
    """The sequence a command takes when none is given: the model's context, at most 8,192."""
    return min(cfg.max_context, 8192)


def default_global_batch(seq: int) -> int:
    """The global batch a command takes when none is given: ``TOKENS_PER_STEP`` tokens."""
    return max(1, TOKENS_PER_STEP // seq)


def evaluate_defaults(cfg, n_devices: int, *, tp: int = 1, pp: int = 1, cp: int = 1, dp: int | None = None,
                      sp: bool | None = None, seq: int | None = None, global_batch: int | None = None,
                      framework: str = "megatron") -> dict:
    """The keys ``evaluate`` (and a runs file's row) fills when they are left out: dp the devices
    over tp x pp x cp, sequence parallelism where tp > 1 (and the engine runs it beside cp:
    ``cost.engine.ulysses_sp_refusal``), ``default_seq`` and ``default_global_batch``; a PlanError
    where tp x pp x cp does not divide the devices."""
    if dp is None:
        if n_devices % (tp * pp * cp):
            raise PlanError(f"tp*pp*cp = {tp * pp * cp} does not divide the {n_devices} devices; give dp or "
                            "degrees that divide them")
        dp = n_devices // (tp * pp * cp)
    seq = seq or default_seq(cfg)
    if sp is None:
        eng = _engine.ENGINES.get(_engine.ALIASES.get(framework, framework))
        sp = tp > 1 and (eng is None or _engine.ulysses_sp_refusal(eng, cp, True) is None)
    return {"dp": dp, "sp": sp, "seq": seq,
            "global_batch": global_batch or default_global_batch(seq)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Parallelism:
    """A Megatron-expressible parallel configuration (see the module docstring). The defaults are
    Megatron-LM's for the arguments a configuration leaves out.

    Attributes:
        tp, pp, dp, cp: tensor, pipeline, data and context parallel degrees.
        ep, etp: the expert layers' grid (``--expert-model-parallel-size``,
            ``--expert-tensor-parallel-size``), folded over the tp x cp x dp ranks of a stage.
            etp defaults to 1, as Megatron's MoE model zoo runs experts; dense models keep 1, 1.
        sp: sequence parallelism (norms and the residual stream cut on the sequence over tp).
        zero: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters sharded over dp x cp.
        dp_shard: hybrid sharding: ZeRO shards over the innermost dp_shard ranks of the dp x cp
            group and replicates across the rest (``cost.params.shard_axes``); None (or dp x cp
            itself): over the whole group.
        recompute: ``none``, ``selective`` or ``full``, or torchtitan's ``selective-op`` and ``layer:N``, or
            Megatron's ``modules:M,M`` (--recompute-modules, ``cost.recompute``) (``cost.train.recompute_refusal``;
            stated only: the search does not try them).
        micro_batch: sequences per micro-batch of one data-parallel replica.
        global_batch: sequences per optimizer step; seq: tokens per sequence.
        vpp: virtual pipeline stages (interleaved chunks) per device.
        framework: the engine whose semantics the costs follow (``cost.engine``).
        precision: ``bf16`` or ``fp8`` (the layers' linear GEMMs, ``cost.precision``), or ``fp16`` (the
            model in FP16 with dynamic loss scaling, where the engine models it: ``cost.engine.Engine.fp16``);
            fp8_recipe: its scaling recipe (``--fp8-recipe``), None in BF16; or ``fp4`` (the same GEMMs in
            NVFP4 on Blackwell), fp8_recipe then ``nvfp4``.
        layer_split: layers per virtual pipeline stage (``cost.train.TrainConfig.layer_split``:
            Megatron's --pipeline-model-parallel-layout order); None: the rule's split.
        stack: the facts of the user's stack the configuration runs with (``cost.stack.Stack``, which says what
            each is; its defaults are today's costing): ``Parallelism(..., stack=stack)``. A flat record (``as_dict``,
            ``from_dict``: the plan file's ``config``, the Megatron grid's dicts) holds them beside the degrees.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sp: bool = False
    zero: int = 0
    dp_shard: int | None = None
    recompute: str = "none"
    micro_batch: int = 1
    global_batch: int = 1
    seq: int = 2048
    vpp: int = 1
    framework: str = "megatron"
    precision: str = "bf16"
    fp8_recipe: str | None = None
    layer_split: tuple[int, ...] | None = None
    stack: Stack = Stack()

    @classmethod
    def from_dict(cls, data) -> Parallelism:
        """The configuration of a flat dict with (some of) its keys (``KEYS``: the stack's facts among them), e.g.
        a plan's JSON ``config`` (the summary's other keys, ``micro_steps``, ``heterogeneous``, ``differs``, are
        left out) or a Megatron configuration of the grid."""
        given = {k: data[k] for k in KEYS if k in data}
        for key in ("layer_split", "bf16_layers", "offload_modules"):  # (JSON lists)
            if given.get(key) is not None:
                given[key] = tuple(given[key])
        stack = _stack(tuple((k, given.pop(k)) for k in STACK_KEYS if k in given))
        return cls(**given, stack=stack)

    def as_dict(self) -> dict:
        """The keys and values (``KEYS`` order), the stack's facts (``Stack.as_dict``) in place of ``stack``: a
        Megatron configuration, as the grid and the JSON's ``config`` write it."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "stack"}
        return {**own, **self.stack.as_dict()}

    def replace(self, **changed) -> Parallelism:
        return replace(self, **changed)

    @property
    def world(self) -> int:
        """Devices: tp x pp x dp x cp."""
        return self.tp * self.pp * self.dp * self.cp

    @property
    def stage(self) -> int:
        """Ranks of one pipeline stage: tp x cp x dp (the expert grid regroups them)."""
        return self.tp * self.cp * self.dp

    @property
    def edp(self) -> int:
        """The expert grid's data-parallel degree: a stage's ranks over ep x etp."""
        return self.stage // (self.ep * self.etp)

    @property
    def micro_steps(self) -> int:
        """Micro-batches per step of each data-parallel replica."""
        return self.global_batch // (self.micro_batch * self.dp)

    @property
    def seq_cut(self) -> int:
        """What the sequence is cut into: cp, times tp under sequence parallelism."""
        return self.cp * (self.tp if self.sp else 1)

    @property
    def hsdp(self) -> bool:
        """Whether ZeRO shards over part of the dp x cp group only (hybrid sharding)."""
        return self.dp_shard is not None and self.dp_shard != self.dp * self.cp

    @property
    def dp_replicate(self) -> int:
        """Replicas of the ZeRO shard group: dp x cp / dp_shard (1 without hybrid sharding)."""
        return self.dp * self.cp // self.dp_shard if self.hsdp else 1

    @property
    def sharded_parameters(self) -> bool:
        """Whether parameters are sharded over their replicas and gathered for compute (the
        engine's rule, ``cost.engine.sharded_parameters``)."""
        return _engine.sharded_parameters(self.zero, self.framework)

    @property
    def reshards_after_forward(self) -> bool:
        """Whether sharded parameters are freed after forward and gathered again for backward
        (``cost.engine.reshards_after_forward``)."""
        return _engine.reshards_after_forward(self.zero, self.framework)

    @property
    def train(self) -> TrainConfig:
        """The training configuration the cost model reads. Tensor-parallel communication overlaps the GEMMs only
        beside sequence parallelism (Transformer Engine's userbuffers: Megatron-LM's arguments.py asserts
        ``--tp-comm-overlap`` with ``--sequence-parallel``), where the engine overlaps it at all."""
        return TrainConfig(global_batch=self.global_batch, micro_steps=self.micro_steps, pp=self.pp, vpp=self.vpp,
                           recompute=self.recompute, zero=self.zero, framework=self.framework,
                           precision=self.precision, fp8_recipe=self.fp8_recipe,
                           dp_replicate=self.dp_replicate if self.hsdp else None, layer_split=self.layer_split,
                           tp_overlap=False if self.tp > 1 and not self.sp else None, stack=self.stack)

    def refusal(self, model, n_devices: int, device=None) -> str | None:
        """``refusal(self, model, n_devices, device)``."""
        return refusal(self, model, n_devices, device)


# a flat configuration's keys: the degrees and the rest, then the stack's facts (``as_dict``)
@functools.cache
def _stack(facts: tuple) -> Stack:
    """The Stack of (key, value) facts, built (and validated) once per distinct set: the Megatron grid makes
    thousands of configurations of one stack (``Parallelism.from_dict``)."""
    return Stack(**dict(facts))


KEYS = tuple(f.name for f in fields(Parallelism) if f.name != "stack") + STACK_KEYS
DEFAULT_FRAMEWORK = Parallelism().framework  # the engine a configuration that names none runs


def refusal(p: Parallelism, model, n_devices: int, device=None) -> str | None:
    """The first rule that configuration ``p`` breaks on ``model`` and ``n_devices`` devices (of
    kind ``device``, when given: FP8 needs a device with FP8 Tensor Cores, MXFP8 Blackwell's), in
    one line naming the rule and the fix; None when it runs. The one configuration rule: the
    grid, ``evaluate``, the exports and the runtime apply it (engines refuse more, each in its
    lowering module). The sequence splits into 2cp chunks under context parallelism: Megatron-LM
    (get_batch_on_this_cp_rank) and torch's context-parallel load balancer, which torchtitan
    uses, cut it so."""
    for key in _COUNTS:
        v = getattr(p, key)
        if not isinstance(v, int) or v <= 0:
            return f"{key} must be a positive integer, got {v!r}"
    why = _precision.refusal(p.precision, p.fp8_recipe, device, p.framework)
    if why is not None:
        return why
    stack = p.stack
    why = _modules.refusal(p.recompute, framework=p.framework, model=model, shared_overlap=stack.moe_shared_overlap,
                           fp8_recipe=p.fp8_recipe if p.precision == "fp8" else None, ep_overlap=stack.moe_ep_overlap)
    if why is not None:
        return why
    why = engine_refusal(p) or (_engine.grad_reduce_refusal(p.framework, p.zero) if stack.grad_reduce_bf16 else None)
    why = why or _precision.lowp_refusal(p.precision, p.fp8_recipe, p.zero, stack.fp8_param_gather, stack.bf16_layers,
                                         model.layers, p.pp)
    why = why or _kernels.stack_refusal(stack, p.framework, device) or _engine.overlap_refusal(p.framework, stack) \
        or _engine.context_refusal(p.framework, stack.cp_comm)
    if why is None and stack.cpu_offload_layers:
        why = _engine.cpu_offload_refusal(p.framework, p.pp, p.recompute)
    if why is None and stack.offload_modules:
        why = _offload.engine_refusal(p.framework) or _offload.combination_refusal(stack.offload_modules, p.recompute)
        moe = any(model.is_moe_layer(i) for i in range(model.layers))
        dense_only = [m for m in stack.offload_modules if m in ("expert_fc1", "moe_act")] if not moe else []
        if why is None and dense_only:
            why = (f"offload modules {','.join(dense_only)}: model {model.name} has no MoE layer (Megatron: MoE "
                   "models only); drop them from --offload-modules")
    if why is not None:
        return why
    tp, pp, dp, cp = p.tp, p.pp, p.dp, p.cp
    if p.world != n_devices:
        return (f"tp*pp*dp*cp = {tp}*{pp}*{dp}*{cp} = {p.world} but the cluster has {n_devices} devices; make the "
                "product equal the device count")
    if model.heads % tp or model.kv_heads % tp:
        return f"tp={tp} must divide heads={model.heads} and kv_heads={model.kv_heads}; choose a tp that divides both"
    for width, what in ((model.ffn if has_dense_mlp(model) else 0, "MLP width"),
                        (model.shared_ffn, "shared expert width")):
        if width % tp:
            return f"tp={tp} must divide the {what} {width}"
    why = _expert_refusal(p, model) or _moe.overlap_refusal(p) or \
        _moe.engine_refusal(stack.moe_dispatcher, p.framework)
    if why is not None:
        return why
    why = _hybrid_refusal(p)
    if why is not None:
        return why
    if p.global_batch % (p.micro_batch * dp):
        return (f"global batch {p.global_batch} is not divisible by micro_batch*dp = {p.micro_batch}*{dp}; change "
                "--global-batch or --micro-batch")
    if p.seq % p.seq_cut:
        return f"seq={p.seq} is not divisible by cp*tp(sp) = {p.seq_cut}"
    if cp > 1 and p.seq % (2 * cp):
        return f"seq={p.seq} does not split into 2cp = {2 * cp} load-balanced chunks"
    if pp > model.layers:
        return f"pp={pp} exceeds the {model.layers} layers"
    why = _engine.offload_count_refusal(stack.cpu_offload_layers, model.layers)
    if why is not None:
        return why
    if pp > 1 or p.layer_split is not None:
        try:  # (a stated split of the wrong length or sum, or more virtual stages than layers)
            p.train.chunk_layers(model.layers)
        except PlanError as exc:
            return str(exc)
    if tp == 1 and p.sp:
        return "sequence parallelism (--sp) needs tp > 1"
    return None


def engine_refusal(p: Parallelism) -> str | None:
    """What ``p``'s engine does not run of it (``cost.engine.Engine.refuses``: the DeepSpeed pipeline engine's
    ZeRO 2/3, interleaving, stated splits, ...; torchtitan's checkpointing outside fsdp2), or None (an unknown
    engine is TrainConfig's to name)."""
    eng = _engine.ENGINES.get(_engine.ALIASES.get(p.framework, p.framework))
    modules = str(p.recompute).startswith(_modules.MODULES_PREFIX)
    if eng is not None and modules and not eng.recompute_modules:  # Megatron-core's option
        return _modules.refusal(p.recompute, framework=eng.name)
    why = None if eng is None else _engine.ulysses_sp_refusal(eng, p.cp, p.sp)
    if why is not None:
        return why
    if eng is None or not (eng.refuses or p.precision == "fp16"):
        return None
    return _engine.refusal(eng, pp=p.pp, zero=p.zero, vpp=p.vpp, cp=p.cp, ep=p.ep, fp8=p.precision == "fp8",
                           hsdp=p.hsdp, layout=p.layer_split is not None,
                           sac=p.recompute not in RECOMPUTE and not modules, fp16=p.precision == "fp16",
                           fp4=p.precision == "fp4", lowp=p.stack.low_precision)


def _expert_refusal(p: Parallelism, model) -> str | None:
    """The expert grid: ep divides the experts, etp their MLP width, and ep x etp the ranks of a
    pipeline stage it folds over."""
    ep, etp = p.ep, p.etp
    if not model.is_moe and (ep > 1 or etp > 1):
        return f"ep={ep}, etp={etp}: model {model.name} has no experts; leave ep and etp at 1"
    if model.experts % ep:
        return f"ep={ep} must divide the number of experts ({model.experts})"
    if model.moe_ffn % etp:
        return f"etp={etp} must divide the expert MLP width {model.moe_ffn}"
    if p.stage % (ep * etp):
        return (f"ep*etp = {ep}*{etp} must divide tp*cp*dp = {p.stage}: the expert layers regroup the ranks of a "
                f"pipeline stage (MoE parallel folding); choose ep and etp whose product divides {p.stage}")
    return None


def _hybrid_refusal(p: Parallelism) -> str | None:
    """Hybrid sharding: dp_shard ranks of the dp x cp group shard ZeRO's state, so it divides the
    group (Megatron asserts dp x cp % num_distributed_optimizer_instances == 0, parallel_state.py;
    torchtitan that the degrees multiply to the world size) and needs a ZeRO stage that shards."""
    if p.dp_shard is None:
        return None
    group = p.dp * p.cp
    if not isinstance(p.dp_shard, int) or isinstance(p.dp_shard, bool) or p.dp_shard < 1:
        return f"dp_shard must be a positive integer, got {p.dp_shard!r}"
    if group % p.dp_shard:
        return f"dp_shard={p.dp_shard} must divide dp*cp = {group}; choose a divisor of {group}"
    if p.hsdp and p.zero == 0:
        return f"dp_shard={p.dp_shard} shards ZeRO's state, which ZeRO 0 does not shard; use --zero 1, 2 or 3"
    if p.hsdp and p.dp_shard == 1:
        return "dp_shard=1 shards nothing (every rank a replica); use --zero 0 for plain data parallelism"
    if p.hsdp and p.edp % p.dp_replicate:
        return (f"the experts' data-parallel rest {p.edp} must split into the {p.dp_replicate} replicas of hybrid "
                f"sharding (Megatron asserts expert dp % num_distributed_optimizer_instances == 0); choose a "
                "larger dp_shard or smaller ep x etp")
    return None


def pipeline_split(layers: int, pp: int, vpp: int, split: tuple[int, ...], stated: bool = False) -> tuple:
    """How Megatron-LM takes ``layers`` over pp stages of vpp virtual stages each, split as
    ``split`` (layers per virtual stage, ``TrainConfig.chunk_layers``): ``("even", layers per
    chunk)``, ``("slots",)`` (the embedding and the loss as a layer slot each,
    ``cost.train.chunks_fit``: 126 layers in 64 chunks, 94 in 32), ``("ends", first, last)``
    without virtual stages: the first and the last stage apart from even middle ones, or
    ``("layout", split)``: --pipeline-model-parallel-layout, which takes any split (DeepSeek-V3's
    61 layers over pp 4 x vpp 8). A split the configuration states (``stated``: the search's
    balanced split, ``evaluate --pp-layout``) runs exactly: even or slots when it is theirs, else
    its layout. The rule's split without virtual stages takes the ends where they hold as many
    layers as the split's fullest middle stage (80 layers in 3 stages: 27, 27, 26; DeepSeek-V3's
    61 in 16: 3, 4 x 14, 2 where the split is 3, 4 x 13, 3, 3: the same fullest stage, so the same
    pipeline's pace)."""
    chunks = pp * vpp
    if layers % chunks == 0 and split == (layers // chunks,) * chunks:
        return ("even", layers // chunks)
    per = (layers + 2) // chunks
    if (layers + 2) % chunks == 0 and chunks > 1 and split == (per - 1,) + (per,) * (chunks - 2) + (per - 1,):
        return ("slots",)
    if vpp == 1 and not stated and pp > 1:
        middle = max(split[1:-1], default=0)
        last = layers - split[0] - (pp - 2) * middle
        if split[0] > 0 and 1 <= last <= max(split):
            return ("ends", split[0], last)
    return ("layout", split)


def has_dense_mlp(model) -> bool:
    """Whether some layer has a dense MLP (of width ``model.ffn``), which tensor parallelism cuts."""
    return not all(model.is_moe_layer(i) for i in range(model.layers))


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What an engine runs of a configuration that ``refusal`` accepts: the table each lowering
    module (``export.megatron``, ``export.torchtitan``, ``export.dtensor``, ``runtime.lower``)
    keeps of its engine, and its ``refusal`` reads (one reason per rule).

    Attributes:
        name: the engine as its refusals name it.
        engine: the cost engine (``cost.engine``) whose semantics it runs a plan with.
        zero: the ZeRO stages it runs.
        zero_as_costed: ZeRO above 0 only where the plan's own engine shards the parameters
            (FSDP2), not as a distributed optimizer beside replicated parameters.
        context_parallel: whether it runs context parallelism at all; ``cp_needs_fsdp``: only
            with FSDP over dp x cp (ZeRO above 0); ``a2a``: whether it runs it as all-to-alls (the
            attention cut by heads behind all-to-alls: Megatron-LM's --cp-comm-type a2a, DeepSpeed-Ulysses,
            ``TrainConfig.context``) besides ring attention.
        recompute: the recomputation modes it runs.
        precision: the precisions it runs as the plan is costed (``cost.precision.PRECISIONS``).

    An engine's expert grid is a rule of its ``refusal`` alone (``export.torchtitan._expert_grid``,
    ``runtime.lower.refusal``; Megatron's MoE parallel folding is the configuration rule's).
    """

    name: str
    engine: str
    zero: tuple[int, ...] = (0, 1, 2, 3)
    zero_as_costed: bool = False
    context_parallel: bool = True
    cp_needs_fsdp: bool = False
    a2a: bool = False
    recompute: tuple[str, ...] = ("none", "selective", "full")
    precision: tuple[str, ...] = ("bf16", "fp8")


class Heterogeneous(PlanError):
    """A plan whose ops do not agree on one configuration; ``differs``: what differs, in short
    phrases (``plan.summary.differences``)."""

    def __init__(self, differs: list[str]):
        super().__init__(f"this plan is heterogeneous ({differs[0]}); a Megatron configuration cuts every layer "
                         "alike on every device (plan with --space megatron)")
        self.differs = differs


def parallelism(plan) -> Parallelism:
    """The configuration of a plan whose ops agree on one (``plan.summary.config_summary``);
    ``Heterogeneous`` (a PlanError naming what differs) otherwise."""
    summary = config_summary(plan)
    if summary["heterogeneous"]:
        raise Heterogeneous(summary["differs"])
    return Parallelism.from_dict(summary)
