"""The training configuration the cost model needs besides the graph, the cluster and the layouts."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from symtensor.cost import (
    moe as _moe,
    offload as _offload,
    precision as _precision,
    recompute as _modules,
    stack_kernels as _kernels,
)
from symtensor.cost.engine import (
    ALIASES,
    ENGINES,
    context_of,
    context_refusal,
    cpu_offload_refusal,
    engine_of,
    grad_reduce_refusal,
    overlap_refusal,
    refusal as engine_refusal,
    schedules_refusal,
)
from symtensor.cost.stack import KEYS as STACK_KEYS, Stack
from symtensor.errors import PlanError

RECOMPUTE = ("none", "selective", "full")
FRAMEWORKS = tuple(ENGINES)
# recomputation a configuration may state besides the searched ``RECOMPUTE`` (opt-in: the search never tries
# them), torchtitan's selective activation checkpointing (``cost.segment.recompute_share``): ``selective-op``,
# its per-op policy (activation_checkpoint.selective_ac_option = "op"), and ``layer:N``, every N-th
# transformer block checkpointed whole (selective_ac_option = "N")
SAC_OP, LAYER_SAC = "selective-op", "layer:"
# and Megatron-core's module list, ``modules:M,M`` (--recompute-granularity selective --recompute-modules M M:
# ``cost.recompute``)
MODULES_PREFIX = _modules.MODULES_PREFIX


def layer_every(recompute: str) -> int:
    """N of ``layer:N`` (every N-th layer recomputed whole), 0 for the other modes."""
    return int(recompute[len(LAYER_SAC):]) if recompute.startswith(LAYER_SAC) else 0


def recompute_refusal(recompute) -> str | None:
    """Why ``recompute`` is not a recomputation mode, in one line, or None."""
    if recompute in RECOMPUTE or recompute == SAC_OP:
        return None
    text = str(recompute)
    if text.startswith(MODULES_PREFIX):
        return _modules.refusal(text)
    if text.startswith(LAYER_SAC) and text[len(LAYER_SAC):].isdigit() and int(text[len(LAYER_SAC):]) >= 1:
        return None
    return (f"recompute={recompute!r}; use one of {', '.join(RECOMPUTE)}, {SAC_OP} (torchtitan's per-op selective "
            f"checkpointing), {LAYER_SAC}N (every N-th layer recomputed whole, N >= 1) or {MODULES_PREFIX}M,M "
            f"(Megatron's --recompute-modules: {', '.join(_modules.MODULES)})")


def chunks_fit(layers: int, pp: int, vpp: int) -> bool:
    """Whether ``layers`` split into pp*vpp interleaved chunks by Megatron's rules without a
    stated layout: evenly, or with the embedding and the loss counted as layer slots (Megatron's
    account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split, as NeMo's
    Llama 3.1 405B recipe runs 126 layers in 64 chunks). Any other split is a stated layout
    (``TrainConfig.layer_split``, Megatron's --pipeline-model-parallel-layout)."""
    chunks = pp * vpp
    return layers % chunks == 0 or (layers + 2) % chunks == 0


def rule_split(layers: int, pp: int, vpp: int = 1) -> tuple[int, ...]:
    """Layers per virtual stage (pp x vpp, Megatron's layout order) by the rule, without times:
    even, the embedding and loss as layer slots (``chunks_fit``), else as even as possible with
    the extra layers on the middle stages (the first holds the embedding, the last the head and
    loss)."""
    chunks = pp * vpp
    if pp > layers:
        raise PlanError(f"pp={pp} exceeds the {layers} layers; use pp <= {layers}")
    if chunks > layers + 2:
        raise PlanError(f"pp*vpp = {chunks} virtual stages exceed the {layers} layers and the embedding and loss "
                        "stages; choose a smaller vpp")
    if layers % chunks and chunks_fit(layers, pp, vpp):  # the embedding and the loss as layer slots
        per = (layers + 2) // chunks
        return (per - 1,) + (per,) * (chunks - 2) + (per - 1,)
    base, extra = divmod(layers, chunks)
    order = sorted(range(chunks), key=lambda i: (i in (0, chunks - 1), i))
    counts = [base] * chunks
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


def interleaved(counts: tuple[int, ...], pp: int) -> tuple[int, ...]:
    """Layers per pipeline rank of a split given per virtual stage (Megatron's layout order:
    virtual stage k is chunk k // pp of rank k % pp)."""
    return tuple(sum(counts[r::pp]) for r in range(pp))


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    """One training step.

    Attributes:
        global_batch: sequences per optimizer step.
        micro_steps: micro-batches per step (gradient accumulation / pipeline micro-batches); the
            graph is built for ``global_batch / micro_steps`` sequences, which the plan's batch
            cuts spread over the devices.
        pp: pipeline stages; ``vpp``: virtual stages (interleaved 1F1B chunks) per device.
        layer_split: layers per virtual pipeline stage, in Megatron's layout order (virtual stage k
            is chunk k // pp of pipeline rank k % pp; pp entries without interleaving, pp x vpp
            with it; 0 for a stage that holds only the embedding or the loss, as Megatron's
            --pipeline-model-parallel-layout allows); the embedding is work on the first, the LM
            head and loss on the last. None: the rule's split (``chunk_layers``).
        recompute: ``none``, ``selective`` (attention core) or ``full`` (every layer from its input), or, stated
            only (the search does not try them), torchtitan's ``selective-op`` (its per-op policy) and
            ``layer:N`` (every N-th layer whole): ``cost.segment.recompute_share``, and Megatron's module list
            ``modules:M,M`` (``cost.recompute``: the named modules' ops re-run, what they save freed).
        zero: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters sharded over replicas.
        dp_replicate: hybrid sharding (HSDP; Megatron's ``--num-distributed-optimizer-instances``,
            torchtitan's ``data_parallel_replicate_degree``): each parameter's data-parallel group
            is ``dp_replicate`` replicas (its outermost ranks) of a ZeRO shard group (the innermost:
            the dense layers' ``Parallelism.dp_shard``, the experts' smaller rest), whose reduced
            shards are all-reduced across the replicas (``cost.params.shard_axes``). Both engines
            fix the replicas for every parameter, experts included. None: ZeRO over the whole group.
        param_bytes / grad_bytes / optim_bytes: per parameter; None: the engine's
            (``cost.engine.Engine.state_bytes``: Megatron 2 + 4 + 12, FSDP2 4 + 4 + 8, or 2 + 2 + 4 with the
            stack's bf16 ``param_dtype``,
            DeepSpeed 2 + 2 + 12).
        framework: the engine whose semantics the step follows (``symtensor.cost.engine``):
            ``megatron`` (Megatron-core + Transformer Engine: distributed optimizer with bucketed
            overlapped gradient reduce and parameter gather; keeps the sequence-parallel shard of
            an all-gathered input for backward and gathers it again there), ``fsdp2`` (PyTorch
            FSDP2/DTensor as torchtitan runs it: per-block units, the next unit's all-gather
            prefetched; keeps gathered inputs), ``deepspeed`` (ZeRO with overlap_comm; stage 3
            gathers per parameter, again for a recomputed forward). ``torch`` is read as fsdp2.
        overlap_grad_reduce: whether gradient reduction overlaps backward (Megatron-LM 2022 ran
            it after backward: False).
        tp_overlap: Transformer Engine's tensor-parallel communication overlap (userbuffers,
            with sequence parallelism); ``None``: the engine's default (on for megatron).
        precision: ``bf16``, or ``fp8``: the transformer layers' linear GEMMs in FP8
            (``cost.precision``), or ``fp16``: the model in FP16 with dynamic loss scaling, as the engine runs
            it (``cost.engine.Engine.fp16``: its state, reduction and loss-scale check); ``fp8_recipe``: its
            scaling recipe as Megatron-LM names it (``delayed``, ``tensorwise``, ``blockwise``, ``mxfp8``), None
            without fp8 (with fp8: the
            caller's device default, ``precision.default_recipe``, else Megatron-LM's ``delayed``); or ``fp4``:
            the same GEMMs in NVFP4 on Blackwell, ``fp8_recipe`` then ``nvfp4`` (Megatron-LM's --fp4-recipe).
        stack: the facts of the user's software stack (``cost.stack.Stack``: the MoE token dispatcher, routing,
            capacity and overlaps, the gradient reduction's dtype, the allocator's expandable segments, CPU
            activation offloading, quantized parameters and BF16 layers), each as this step holds it: a fact the
            engine does not run at this point is cleared here (bf16 gradient reduction where FSDP2 runs DDP, the
            expert overlap where Megatron does not run it, CPU offloading with pipeline stages or recomputation),
            one it never runs refused. ``allocator_expandable``, ``reduced_bytes``, ``lowp_params`` and
            ``bf16_span`` are the rules that read the facts for the cost model; where Megatron refuses them on a
            stated configuration is ``plan.parallelism.refusal``'s.
    """

    global_batch: int
    micro_steps: int = 1
    pp: int = 1
    vpp: int = 1
    layer_split: tuple[int, ...] | None = None
    recompute: str = "none"
    zero: int = 0
    dp_replicate: int | None = None
    param_bytes: int | None = None
    grad_bytes: int | None = None
    optim_bytes: int | None = None
    framework: str = "megatron"
    overlap_grad_reduce: bool = True
    tp_overlap: bool | None = None
    precision: str = "bf16"
    fp8_recipe: str | None = None
    stack: Stack = Stack()

    def __post_init__(self):
        for key in ("global_batch", "micro_steps", "pp", "vpp"):
            v = getattr(self, key)
            if not isinstance(v, int) or v <= 0:
                raise PlanError(f"{key} must be a positive integer, got {v!r}")
        if self.global_batch % self.micro_steps:
            raise PlanError(f"global batch {self.global_batch} is not divisible into {self.micro_steps} micro-batches")
        why = recompute_refusal(self.recompute)
        if why is not None:
            raise PlanError(why)
        if self.zero not in (0, 1, 2, 3):
            raise PlanError(f"zero={self.zero!r}; use 0, 1, 2 or 3")
        if self.dp_replicate is not None:
            r = self.dp_replicate
            if not isinstance(r, int) or isinstance(r, bool) or r < 1:
                raise PlanError(f"dp_replicate must be a positive integer, got {r!r}")
            if self.zero == 0:
                raise PlanError("hybrid sharding shards ZeRO's state, which ZeRO 0 does not shard; use --zero 1, 2 "
                                "or 3, or leave --dp-shard out")
        object.__setattr__(self, "framework", ALIASES.get(self.framework, self.framework))
        if self.framework not in FRAMEWORKS:
            raise PlanError(f"framework={self.framework!r}; use one of {', '.join(FRAMEWORKS)}")
        eng = engine_of(self)
        if self.stack.grad_reduce_bf16:  # (where FSDP2 runs DDP it does not apply; no engine option refuses)
            why = grad_reduce_refusal(self.framework, self.zero)
            if why is not None and not eng.grad_reduce_bf16:
                raise PlanError(why)
            object.__setattr__(self, "stack", self.stack.replace(grad_reduce_bf16=why is None))
        if self.stack.grad_reduce_bf16 and eng.grad_reduce_bf16 == "buffer" and self.grad_bytes is None:
            object.__setattr__(self, "grad_bytes", 2)  # Megatron's gradient buffer in the parameters' bf16
        why = _kernels.param_dtype_refusal(self.stack.param_dtype, self.framework) or \
            overlap_refusal(self.framework, self.stack) or schedules_refusal(self.framework, self.stack.pp_schedules) \
            or context_refusal(self.framework, self.stack.cp_comm)
        if why is None and self.micro_steps % self.schedules:
            why = (f"{self.micro_steps} micro-batches per data-parallel replica do not split into "
                   f"{self.schedules} pipeline schedules (--pp-schedules): use a global batch whose micro-batches "
                   "divide by it")
        if why is not None:
            raise PlanError(why)
        if self.tp_overlap is None and self.stack.tp_comm_overlap is not None:
            object.__setattr__(self, "tp_overlap", self.stack.tp_comm_overlap)
        if self.stack.dp_comm_overlap is False:  # Megatron-LM without --overlap-grad-reduce (--overlap-param-gather)
            object.__setattr__(self, "overlap_grad_reduce", False)
        for key, default in zip(("param_bytes", "grad_bytes", "optim_bytes"),
                                _kernels.state_bytes(self.stack.param_dtype, eng.state_bytes)):
            if getattr(self, key) is None:
                object.__setattr__(self, key, default)
        if self.vpp > 1 and self.pp == 1:
            raise PlanError("virtual pipeline stages (vpp > 1) need pp > 1")
        if self.pp > 1 and eng.refuses_feature("pp"):  # (a search's pipelined point under such an engine: skipped)
            raise PlanError(engine_refusal(eng, pp=self.pp))
        if self.precision == "fp8" and self.fp8_recipe is None:
            object.__setattr__(self, "fp8_recipe", _precision.DEFAULT_RECIPE)
        if self.precision == "fp4" and self.fp8_recipe is None:
            object.__setattr__(self, "fp8_recipe", _precision.FP4_RECIPE)
        why = _precision.refusal(self.precision, self.fp8_recipe, None,
                                 self.framework if self.precision == "fp4" else None)
        if why is not None:
            raise PlanError(why)
        _moe.check(self)
        if self.stack.moe_ep_overlap and not _moe.ep_overlap_runs(self):
            # where Megatron does not run it (a search's point; a stated configuration is refused before)
            object.__setattr__(self, "stack", self.stack.replace(moe_ep_overlap=False))
        why = _modules.refusal(self.recompute, framework=self.framework, fp8_recipe=self.fp8,
                               shared_overlap=self.stack.moe_shared_overlap, ep_overlap=self.stack.moe_ep_overlap)
        if why is not None:
            raise PlanError(why)
        if self.stack.cpu_offload_layers:
            why = cpu_offload_refusal(self.framework, self.pp, self.recompute)
            if why is not None and not eng.cpu_offload:  # (an engine without it: refused)
                raise PlanError(why)
            if why is not None:  # where Megatron does not run it (a search's point; a stated one is refused before)
                object.__setattr__(self, "stack", self.stack.replace(cpu_offload_layers=0))
        if self.stack.offload_modules:
            why = _offload.engine_refusal(self.framework)
            if why is not None:
                raise PlanError(why)
            if _offload.combination_refusal(self.stack.offload_modules, self.recompute) is not None:
                # where Megatron does not run it (a search's point; a stated configuration is refused before)
                object.__setattr__(self, "stack", self.stack.replace(offload_modules=()))
        self._check_lowp(eng)
        if self.layer_split is not None:
            split = tuple(self.layer_split)
            if not all(isinstance(c, int) and c >= 0 for c in split):
                raise PlanError(f"layer split {list(split)} must be layer counts (integers >= 0)")
            object.__setattr__(self, "layer_split", split)

    def _check_lowp(self, eng) -> None:
        """The stack's low-precision facts (``fp8_param_gather``, ``bf16_layers``; well formed: ``Stack``): refused
        by an engine without them and where Megatron refuses them whatever the point (delayed scaling with BF16
        layers)."""
        why = None
        if self.stack.low_precision:
            why = engine_refusal(eng, lowp=True)
        if why is None and self.fp8 is not None:
            why = _precision.lowp_refusal(self.precision, self.fp8_recipe, 1, False, self.stack.bf16_layers)
        if why is not None:
            raise PlanError(why)

    @property
    def context(self) -> str:
        """How context parallelism runs at this point (``cost.engine.context_of``): ``p2p`` (ring attention) or
        ``a2a`` (all-to-alls around an attention core cut by heads)."""
        return context_of(self.framework, self.stack.cp_comm)

    @property
    def lowp_params(self) -> bool:
        """Whether the layers' GEMM weights are held quantized (``fp8_param_gather``) at this point: FP8 or FP4
        GEMMs with a distributed optimizer or Megatron-FSDP (ZeRO >= 1; NVFP4 at ZeRO 1 only)."""
        return self.stack.fp8_param_gather and _precision.quantized_params(self.precision, self.zero)

    @property
    def bf16_span(self) -> tuple[int, int]:
        """The transformer layers kept in BF16 at this point, (first N, last M): ``bf16_layers`` under FP8 or FP4
        GEMMs, (0, 0) in BF16."""
        return self.stack.bf16_layers if self.fp8 is not None else (0, 0)

    def in_bf16(self, layer: int, layers: int) -> bool:
        """Whether transformer layer ``layer`` (of ``layers``) runs in BF16 under ``bf16_span`` (Megatron's
        ``is_first_last_bf16_layer``: a global index below N or at least layers - M)."""
        first, last = self.bf16_span
        if not (first or last):  # (the common case first: a search asks it per layer)
            return False
        return 0 <= layer < layers and (layer < first or layer >= layers - last)

    @property
    def bf16(self) -> TrainConfig:
        """This step as a BF16 layer runs it (``bf16_span``): its GEMMs in BF16, no casts, nothing quantized."""
        return replace(self, precision="bf16", fp8_recipe=None,
                       stack=self.stack.replace(fp8_param_gather=False, bf16_layers=(0, 0)))

    @property
    def allocator_expandable(self) -> bool:
        """Whether the caching allocator runs with expandable segments: as stated, else the engine's default."""
        stated = self.stack.expandable_segments
        return engine_of(self).expandable_segments if stated is None else stated

    @property
    def reduced_bytes(self) -> int:
        """Bytes per element of the gradients the data-parallel collectives reduce: 2 under ``grad_reduce_bf16``,
        else the engine's reduction dtype (``Engine.reduce_bytes``) or the gradients' own."""
        return 2 if self.stack.grad_reduce_bf16 else engine_of(self).reduce_bytes or self.grad_bytes

    @property
    def schedules(self) -> int:
        """Pipeline schedules per step (``Stack.pp_schedules``); 1 without a pipeline."""
        return self.stack.pp_schedules if self.pp > 1 else 1

    def warmup_chunks(self, s: int) -> int:
        """Model chunks pipeline rank ``s`` runs forward before its first backward under the interleaved schedule:
        2 (pp - s - 1) + (vpp - 1) pp (megatron/core/pipeline_parallel/schedules.py ``get_pp_rank_microbatches``,
        ``microbatch_group_size_per_vp_stage`` at its default, pp; torch.distributed.pipelining's
        ScheduleInterleaved1F1B, torchtitan's, warms up as many: ``_get_warmup_ops``)."""
        return 2 * (self.pp - s - 1) + (self.vpp - 1) * self.pp

    @property
    def schedule_steps(self) -> int:
        """Micro-batches of one pipeline schedule: the step's over ``schedules``."""
        return self.micro_steps // self.schedules

    @property
    def graph_batch(self) -> int:
        """Sequences in the graph of one micro-step (all devices together)."""
        return self.global_batch // self.micro_steps

    def replace(self, **kw) -> TrainConfig:
        return replace(self, **kw)

    def as_dict(self) -> dict:
        """The fields by name, the stack's facts (``Stack.as_dict``) in place of ``stack``: the flat record a plan
        file's ``train`` section holds (``plan.io``)."""
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "stack"}
        return {**own, **self.stack.as_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        """The training configuration of a flat record (``as_dict``'s keys, the stack's facts among them)."""
        own = {k: v for k, v in data.items() if k not in STACK_KEYS}
        return cls(**own, stack=Stack(**{k: v for k, v in data.items() if k in STACK_KEYS}))

    @property
    def fp8(self) -> str | None:
        """The FP8 (or, under ``fp4``, NVFP4) recipe the linear GEMMs run under, or None in BF16."""
        return self.fp8_recipe if self.precision in _precision.QUANTIZED else None

    def stage_layers(self, layers: int) -> tuple[int, ...]:
        """Layers per pipeline rank (the sums of its virtual stages, ``chunk_layers``)."""
        return interleaved(self.chunk_layers(layers), self.pp)

    def chunk_layers(self, layers: int) -> tuple[int, ...]:
        """Layers per virtual pipeline stage (pp x vpp, Megatron's layout order): the stated
        ``layer_split``, or the rule's (``rule_split``)."""
        chunks = self.pp * self.vpp
        if self.layer_split is not None:
            split = self.layer_split
            if len(split) != chunks or sum(split) != layers or min(split) < 0:
                raise PlanError(f"layer split {list(split)} must give pp*vpp = {chunks} virtual stages summing to "
                                f"{layers} layers")
            return split
        return rule_split(layers, self.pp, self.vpp)
