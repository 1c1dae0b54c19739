"""The facts of the user's software stack that a search holds fixed besides its parallel degrees.

How the MoE layers run (the token dispatcher, the routing, the capacity, the two overlaps; ``cost.moe``),
the gradient reduction's dtype, the allocator's expandable segments, CPU activation offloading and the low-precision
parameter facts are not choices of the planner: the user's stack states them, and every point of a search, the
Megatron grid and the baselines run with them (``search.pool.EvaluatorPool``). ``Stack`` is their one
representation: the library's entry points take one (``api.evaluate``, ``api.plan``, ``api.sweep``, ...), the CLI
builds one from its options (``cli.stack_of``), a configuration (``plan.parallelism.Parallelism``) and the training
configuration the cost model reads (``cost.train.TrainConfig``) each hold one as their field ``stack``, and the
plan's summary names the facts that differ from the defaults (``plan.summary``). It lives in the cost layer, which
reads it; ``plan.stack`` names it for the library's users. Where a configuration is a flat record (the plan file's
``config`` and ``train`` sections, the Megatron grid's dicts) the facts stand beside the degrees under their own
names (``KEYS``).

    >>> Stack(moe_routing="aux_loss").differing()
    {'moe_routing': 'aux_loss'}
    >>> Stack(moe_dispatcher="nccl")
    Traceback (most recent call last):
    ...
    symtensor.errors.PlanError: moe_dispatcher='nccl'; use one of alltoall, deepep, hybridep
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from symtensor.cost import moe as _moe, offload as _offload, stack_kernels as _kernels
from symtensor.cost.engine import CP_COMMS, offload_count_refusal
from symtensor.cost.precision import lowp_fact_refusal
from symtensor.errors import PlanError


@dataclass(frozen=True, slots=True, kw_only=True)
class Stack:
    """The stack facts a search holds, each with its default: today's costing (``Parallelism.stack``,
    ``TrainConfig.stack``, where the cost model reads them). Checked when built: a bad value is a one-line
    PlanError.

    Attributes:
        moe_dispatcher, moe_routing, moe_capacity_factor, moe_shared_overlap: how the MoE layers run
            (``cost.moe``): the token dispatcher (``alltoall``, NCCL's all-to-all, ``deepep`` or ``hybridep``),
            ``balanced`` or auxiliary-loss (``aux_loss``: the most-loaded rank paces the step) routing, the
            capacity factor beyond which experts drop tokens (None: dropless), the shared expert beside the
            dispatch (Megatron's --moe-shared-expert-overlap); the defaults: all-to-all, balanced, dropless,
            serial.
        moe_ep_overlap: Megatron's --overlap-moe-expert-parallel-comm (with --delay-wgrad-compute): the
            1F1B steady state runs one micro-batch's forward beside another's backward, layer by layer,
            so each one's dispatch and combine hide behind the other's compute (``cost.moe``).
        grad_reduce_bf16: gradients reduced in bf16 instead of fp32 (Megatron's --grad-reduce-in-bf16, torchtitan's
            mixed_precision_reduce; ``cost.train.TrainConfig.reduced_bytes``).
        expandable_segments: whether PyTorch's caching allocator runs with expandable segments
            (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), None for the engine's default
            (``cost.engine.Engine.expandable_segments``): the reserved memory's fragmentation.
        cpu_offload_layers: Megatron-LM's CPU activation offloading (--cpu-offloading-num-layers N): the saved
            activations of the first N transformer layers of a pipeline stage go to host memory in forward and
            come back in backward, on a side stream (``cost.engine.CPU_OFFLOAD``); 0: none. Megatron only.
        offload_modules: Megatron-core's fine-grained activation offloading (--fine-grained-activation-offloading
            --offload-modules M ...): each named module's input activation goes to host memory in forward and comes
            back before its backward, on a side stream, in every layer (``cost.offload``, names in its ``MODULES``
            order); (): none. Megatron only, not beside cpu_offload_layers.
        fp8_param_gather: Megatron-LM's --fp8-param-gather (--fp4-param-gather under fp4): the layers' GEMM weights
            kept as Transformer Engine FP8 (NVFP4) tensors, no BF16 copy beside them, and gathered in those bytes
            (``cost.precision``); held where the precision is FP8 or FP4 and ZeRO >= 1. Megatron only.
        bf16_layers: (N, M): Megatron-LM's --first-last-layers-bf16 --num-layers-at-start-in-bf16 N
            --num-layers-at-end-in-bf16 M, the first N and last M transformer layers kept in BF16 under FP8 or FP4
            (``cost.precision``); (0, 0): none. Megatron only.
        loss: the loss kernel over the vocabulary (``cost.stack_kernels``: ``fused``, ``vocab-parallel``, ``fp32``,
            ``bf16``), what it moves, keeps and allocates per logit; None: the engine's own.
        elementwise: the norms', RoPE's and SwiGLU's kernels (``cost.stack_kernels.ELEMENTWISE``: ``eager`` PyTorch
            composites, ``fused`` kernels: Transformer Engine's, torch.compile's); None: the engine's own.
        attention: the attention kernel (``cost.stack_kernels.ATTENTION``: ``te``, Transformer Engine's; ``sdpa``,
            PyTorch's flash backend; ``fa3``, FlashAttention-3), priced at its measured table on the device;
            None: the engine's own.
        tp_comm_overlap: Megatron's --tp-comm-overlap (Transformer Engine's userbuffers, beside sequence parallelism):
            the tensor-parallel all-gathers and reduce-scatters hidden behind the GEMMs (``cost.engine.tp_overlapped``);
            False: exposed, Megatron-LM's default; None: the engine's own (on).
        dp_comm_overlap: Megatron's --overlap-grad-reduce and --overlap-param-gather: the data-parallel gradient
            reduction behind backward and the parameter all-gather behind the next forward (``cost.engine.exposure``);
            False: after backward and before forward, Megatron-LM's defaults; None: the engine's own (on).
        pp_schedules: gradient accumulation as this many pipeline schedules per step, each of the step's micro-batches
            over it, each filling and draining the pipeline (torchtitan and NeMo AutoModel with a local batch below
            the step's: global batch / (dp x local batch) schedules) and, under FSDP2, gathering and reduce-scattering
            its stage once (``cost.engine.Engine.pipeline_sync_once``); 1: one schedule per step, what Megatron runs
            and what the torchtitan export launches. Without a pipeline it changes nothing.
        cp_comm: how context parallelism runs (``cost.engine.CP_COMMS``, Megatron-LM's --cp-comm-type): ``p2p``, ring
            attention, or ``a2a``, all-to-alls around an attention core cut by heads (DeepSpeed-Ulysses' scheme, which
            Megatron-LM runs as a2a); None: the engine's own (``cost.engine.Engine.context``: Megatron's and
            torchtitan's p2p, DeepSpeed's a2a). The per-op search is not held to it where it is None: a plan whose
            attention core is cut by heads on the devices that cut its query's sequence reads as a2a
            (``plan.summary``).
        param_dtype: the dtype the parameters are kept and updated in (``cost.stack_kernels.PARAM_DTYPES``: ``fp32``,
            ``bf16``: no fp32 master copy, bf16 gradients and Adam moments, as NeMo AutoModel's MoE models train
            under FSDP2); None: the engine's own (fp32 master weights).
    """

    moe_dispatcher: str = "alltoall"
    moe_routing: str = "balanced"
    moe_capacity_factor: float | None = None
    moe_shared_overlap: bool = False
    moe_ep_overlap: bool = False
    grad_reduce_bf16: bool = False
    expandable_segments: bool | None = None
    cpu_offload_layers: int = 0
    offload_modules: tuple[str, ...] = ()
    fp8_param_gather: bool = False
    bf16_layers: tuple[int, int] = (0, 0)
    loss: str | None = None
    elementwise: str | None = None
    attention: str | None = None
    param_dtype: str | None = None
    tp_comm_overlap: bool | None = None
    dp_comm_overlap: bool | None = None
    pp_schedules: int = 1
    cp_comm: str | None = None

    def __post_init__(self):
        why = refusal(self)
        if why is not None:
            raise PlanError(why)
        object.__setattr__(self, "bf16_layers", tuple(self.bf16_layers))
        object.__setattr__(self, "offload_modules", tuple(m for m in _offload.MODULES if m in self.offload_modules))

    def as_dict(self) -> dict:
        """The facts by name (``KEYS`` order): how a flat record (a plan file, the Megatron grid's dicts) holds them."""
        return {k: getattr(self, k) for k in KEYS}

    def replace(self, **changed) -> Stack:
        return replace(self, **changed)

    def differing(self) -> dict:
        """The facts that differ from the defaults (``DEFAULTS``): none for today's costing."""
        return {k: v for k, v in self.as_dict().items() if v != DEFAULTS[k]}

    @property
    def offloads(self) -> bool:
        """Whether activations go to host memory: CPU offloading of whole layers or of modules' inputs."""
        return bool(self.cpu_offload_layers or self.offload_modules)

    @property
    def low_precision(self) -> bool:
        """Whether it states a low-precision fact: quantized parameters or layers kept in BF16."""
        return self.fp8_param_gather or self.bf16_layers != (0, 0)


def refusal(stack) -> str | None:
    """One line naming the bad value of ``stack`` (the facts of a ``Stack`` being built) and the fix, or None."""
    why = _moe.refusal(stack.moe_dispatcher, stack.moe_capacity_factor, stack.moe_routing, stack.moe_shared_overlap,
                       stack.moe_ep_overlap)
    if why is None and not isinstance(stack.grad_reduce_bf16, bool):
        why = f"grad_reduce_bf16={stack.grad_reduce_bf16!r}; use True or False"
    k = stack.pp_schedules
    if why is None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        why = f"pp_schedules={k!r}; use a positive integer (pipeline schedules per step; 1: one, the default)"
    for key in ("expandable_segments", "tp_comm_overlap", "dp_comm_overlap"):
        if why is None and getattr(stack, key) not in (None, True, False):
            why = f"{key}={getattr(stack, key)!r}; use True, False or None (the engine's default)"
    if why is None and stack.cp_comm not in (None, *CP_COMMS):
        why = f"cp_comm={stack.cp_comm!r}; use one of {', '.join(CP_COMMS)} (or leave it out: the engine's own)"
    why = why or offload_count_refusal(stack.cpu_offload_layers) or _offload.refusal(stack.offload_modules)
    if why is None and stack.offload_modules and stack.cpu_offload_layers:
        why = ("offload_modules and cpu_offload_layers: Megatron runs one CPU offloading at a time (TransformerConfig "
               "refuses fine_grained_activation_offloading with cpu_offloading); drop one of them")
    why = why or lowp_fact_refusal(stack.fp8_param_gather, stack.bf16_layers)
    return why or _kernels.refusal(stack.loss, stack.elementwise, stack.attention, stack.param_dtype)


KEYS = tuple(f.name for f in fields(Stack))  # the facts' names, the one list of them
DEFAULTS = {f.name: f.default for f in fields(Stack)}  # each fact's default: today's costing
