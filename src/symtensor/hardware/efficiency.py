"""What a cluster file may state about its achievable rates: the ``Efficiency`` fields (fractions of
the device and link peaks) and the collective kinds a level's ``link_efficiency`` names.

Data only, below the cost model: ``hardware.cluster`` checks a file's ``efficiency:`` and
``link_efficiency`` keys against them, and ``cost.efficiency`` holds the calibrated tables of this
type and the rules that choose one (``efficiency_for``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

# the collectives the cost model times (``cost.collectives``); a level's link_efficiency keys
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


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

    def link_for(self, kind: str) -> float:
        if kind == "all_reduce":
            return self.link
        return self.link_all_to_all if kind == "all_to_all" else self.link_gather
