"""What a cluster file may state about its achievable rates: the ``Efficiency`` fields (fractions of
the device and link peaks) and the collective kinds a level's ``link_efficiency`` names.

Data only, below the cost model: ``hardware.cluster`` checks a file's ``efficiency:`` and
``link_efficiency`` keys against them, and ``cost.efficiency`` holds the calibrated tables of this
type and the rules that choose one (``efficiency_for``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from symtensor.errors import PlanError

# the collectives the cost model times (``cost.collectives``); a level's link_efficiency keys
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
# op classes whose rates a device's measured kernel tables (``cost.kernels``) may give: dense and
# batched GEMMs (``gemm``), fused attention (``attention``), memory-bound kernels (``hbm``)
TABLE_CLASSES = ("gemm", "attention", "hbm")


@dataclass(frozen=True, slots=True, kw_only=True)
class EndToEnd:
    """The end-to-end constants: what no kernel or collective microbenchmark sees, fitted on whole
    training steps (``symtensor calibrate``; a cluster file's ``end_to_end:`` section overrides them,
    e.g. fitted by ``calibrate --runs`` on a user's own steps). Each has a physical range it may not
    leave (``END_TO_END_RANGES``, with why).

    Attributes:
        step_s: seconds per optimizer step outside the micro-batches (the training loop's Python, data
            loader hand-off, gradient-norm and loss all-reduces, logging, learning-rate schedule).
        microbatch_s: seconds per micro-batch per pipeline stage outside the kernels (the schedule's
            Python, autograd bookkeeping, the host-side launch of a micro-batch's first kernels).
        kernel_gap_s: seconds the GPU idles per op of the graph, forward and per backward GEMM (the
            launches of the op's kernels not hidden by the queue, stream synchronisation).
        comm_sm_fraction: share of the compute a collective running beside it takes away (the SMs
            NCCL's thread blocks hold, and the HBM bandwidth its copies use).
        expert_s: host seconds per local expert of each mixture-of-experts layer per micro-batch, forward and
            backward, on the step's critical path: a grouped GEMM that runs one GEMM per expert (Transformer
            Engine's GroupedLinear: one cuBLAS call per expert on several streams, PR NVIDIA/TransformerEngine#853,
            "the CPU overheads of PyTorch ops, such as torch.split() and torch.empty() (2x num_gemms calls)",
            #1499) launches per expert, and the layer cannot hide that host work behind the GPU: the dispatcher
            synchronises the host once per layer for the token counts (Megatron's MoEAlltoAllTokenDispatcher
            ``cuda_sync_point``, DeepEP's normal kernels, HybridEP: ``cost.moe``). Measured once, on one H200
            (``benchmarks/results/hopper_runs.md``): one GEMM per expert issued from a Python loop leaves 124-150
            us per local expert exposed at 128 tokens per expert, 81-106 at 512 and 10 or less at 2,048, where
            the GPU outruns the host; Transformer Engine's loop runs in C++ and was not measured, so the loop's
            figures bound it from above and do not price it. The shipped calibration rows have no MoE run: 0
            unless a user's own runs fit it (``symtensor calibrate --runs``, ``calibration.USER_ONLY``).
    """

    step_s: float = 0.0
    microbatch_s: float = 0.0
    kernel_gap_s: float = 0.0
    comm_sm_fraction: float = 16 / 108
    expert_s: float = 0.0

    def replace(self, **kw) -> EndToEnd:
        bad = [k for k in kw if k not in END_TO_END_RANGES]
        if bad:
            raise PlanError(f"unknown end-to-end constant {bad[0]!r}; use one of {', '.join(END_TO_END_RANGES)}")
        for k, v in kw.items():
            lo, hi, why = END_TO_END_RANGES[k]
            if not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise PlanError(f"end-to-end {k}={v!r} is outside its physical range [{lo:g}, {hi:g}] ({why})")
        return replace(self, **kw)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# (lowest, highest, why) of each end-to-end constant: a fit may not leave them
END_TO_END_RANGES = {
    "step_s": (0.0, 1.0, "a training loop's per-step host work: Megatron-LM's and torchtitan's logged step "
                         "overheads are tens to hundreds of milliseconds; a second would be visible in any profile"),
    "microbatch_s": (0.0, 0.05, "host work per micro-batch: a Python forward/backward call and its first launches "
                                "take milliseconds; 50 ms is 49 TFLOP of H100 work"),
    "kernel_gap_s": (0.0, 20e-6, "per op of the graph: the stack runs a few kernels per op (Transformer Engine's "
                                 "GEMM with its cast and amax kernels, attention with its preprocessing), each "
                                 "launch 2-5 us (CUDA C Best Practices Guide); 20 us is four synchronising launches"),
    "comm_sm_fraction": (0.0, 0.3, "NCCL runs on 16 of an A100's 108 SMs at 8 NICs (NCCL maintainer, NVIDIA/nccl#689), "
                                   "up to 32 channels (NCCL_MAX_NCHANNELS) = 0.3 of 108"),
    "expert_s": (0.0, 1e-3, "host work per local expert per MoE layer and micro-batch: six GEMM launches (two "
                            "forward, four backward) with their PyTorch ops; Transformer Engine's fused grouped "
                            "MLP block took about 52 us of CPU per expert (NVIDIA/TransformerEngine#2897: 3.3 ms "
                            "forward and backward for 64 experts); a millisecond is twenty times that"),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiency:
    """Achievable fractions of the device and link peaks.

    Attributes:
        gemm: dense GEMM FLOP/s as a fraction of peak (linear layers, LM head, expert GEMMs).
        bmm: batched matmul of two activations (unfused attention scores and context).
        attention: fused FlashAttention kernels, fraction of peak FLOP/s (forward).
        attention_bwd: the same for the backward kernels (0: equal to ``attention``).
        attention_sdpa: forward fraction of PyTorch's ``scaled_dot_product_attention`` flash
            backend (FlashAttention-2), the kernel FSDP2/DeepSpeed stacks run, where ``attention``
            is Transformer Engine's fused (cuDNN) attention of the Megatron stack (0: the same).
        eager_elementwise: memory-bound ops run as eager PyTorch composites (several kernels, each
            reading and writing the tensor: ``opcost.EAGER_BYTES``) rather than fused kernels.
        attention_knee: key/value tokens at which fused attention reaches half of its
            long-sequence efficiency (short sequences leave the tensor cores idle); 0: none.
        hbm: achievable fraction of HBM bandwidth for memory-bound kernels.
        link: achievable fraction of link bandwidth for all-reduce (NCCL bus bandwidth / link).
        link_gather: the same for all-gather, reduce-scatter and point-to-point.
        link_all_to_all: the same for all-to-all (0: equal to ``link_gather``).
        link_half_bytes: message bytes at which a collective reaches half of its large-message
            bus bandwidth (the size curve of nccl-tests); 0: no size curve.
        gemm_knee: FLOPs at which a matmul kernel reaches half of ``gemm`` (a small GEMM leaves
            the device partly idle): eff(F) = gemm * F / (F + gemm_knee) (spec open point 16).
        kernels: the device whose measured kernel tables (``cost.kernels``) cost the op classes in
            ``tables`` (its name, e.g. ``A100-SXM4-80GB``); "" for none.
        tables: the op classes (``TABLE_CLASSES``) costed from those tables instead of the fractions
            above; a cluster file's measured fraction of a class takes the class out of the tables.
        attention_kernel: the table kernel (``cost.kernels``: fa2, fa3, cudnn, te) the engine's
            fused attention runs on this device.
        gemm_unaligned_1, gemm_unaligned_2, gemm_unaligned_4: the fraction of the aligned rate a dense GEMM runs at
            whose weight's less aligned dimension is an odd number, 2 or 4 times one (no multiple of 8 elements:
            cuBLAS's unaligned kernels), as ``symtensor profile`` measures it; 0: not measured, the device's kernel
            table's (``cost.kernels.alignment_factor``).
        pads_vocab: the engine pads the vocabulary as the graph is built (``Engine.pads_vocab``); where it does
            not, the LM head's GEMMs run the model's stated vocabulary and its alignment
            (``cost.opcost.op_rates``).
        end_to_end: the end-to-end constants (``EndToEnd``).
        source: provenance of the numbers.
    """

    gemm: float
    bmm: float
    attention: float
    hbm: float
    link: float
    link_gather: float = 0.0
    gemm_knee: float = 0.0
    attention_bwd: float = 0.0
    attention_knee: float = 0.0
    attention_sdpa: float = 0.0
    eager_elementwise: bool = False
    link_all_to_all: float = 0.0
    link_half_bytes: float = 0.0
    kernels: str = ""
    tables: tuple[str, ...] = ()
    attention_kernel: str = ""
    gemm_unaligned_1: float = 0.0
    gemm_unaligned_2: float = 0.0
    gemm_unaligned_4: float = 0.0
    pads_vocab: bool = True
    end_to_end: EndToEnd = EndToEnd()
    source: str = field(default="", compare=False)

    def __post_init__(self):
        if not self.link_gather:
            object.__setattr__(self, "link_gather", self.link)
        if not self.link_all_to_all:
            object.__setattr__(self, "link_all_to_all", self.link_gather)
        if not self.attention_bwd:
            object.__setattr__(self, "attention_bwd", self.attention)

    def replace(self, **kw) -> Efficiency:
        return replace(self, **kw)

    @property
    def unaligned(self) -> tuple[tuple[int, float], ...]:
        """The measured (alignment class, fraction of the aligned rate) pairs (``gemm_unaligned_*``), if any."""
        return tuple((c, f) for c, f in ((1, self.gemm_unaligned_1), (2, self.gemm_unaligned_2),
                                         (4, self.gemm_unaligned_4)) if f)

    def tabled(self, cls: str) -> bool:
        """Whether op class ``cls`` (``TABLE_CLASSES``) is costed from the kernel tables."""
        return cls in self.tables

    def link_for(self, kind: str) -> float:
        if kind == "all_reduce":
            return self.link
        return self.link_all_to_all if kind == "all_to_all" else self.link_gather
