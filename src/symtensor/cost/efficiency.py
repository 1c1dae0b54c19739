"""Achievable fractions of peak: the few constants the symbolic model multiplies by.

Compute time of an op is a roofline, ``max(FLOPs / (peak * eff), bytes / (HBM bandwidth * hbm))``;
a collective's beta is ``1 / (link bandwidth * link)``. The constants marked [Fitted] were fitted
by ``symtensor calibrate --fit`` on ../shared/data/calibration.csv only (Korthikanti et al. 2022
iteration times on DGX A100); ``symtensor calibrate`` prints the residual error. No other
published measurement was used for fitting: those judge the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiency:
    """Achievable fractions of the device and link peaks.

    Attributes:
        gemm: dense GEMM FLOP/s as a fraction of peak (linear layers, LM head, expert GEMMs).
        bmm: batched matmul of two activations (unfused attention scores and context).
        attention: fused FlashAttention kernels, fraction of peak FLOP/s (forward).
        attention_bwd: the same for the backward kernels (0: equal to ``attention``).
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
        dp_overlap: fraction of data-parallel gradient communication hidden behind backward
            (a training configuration can override it: Megatron-LM 2022 did not overlap).
        source: provenance of the numbers.
    """

    gemm: float
    bmm: float
    attention: float
    hbm: float
    link: float
    dp_overlap: float
    link_gather: float = 0.0
    gemm_knee: float = 0.0
    attention_bwd: float = 0.0
    attention_knee: float = 0.0
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

    def replace(self, **kw) -> "Efficiency":
        return replace(self, **kw)

    def link_for(self, kind: str) -> float:
        if kind == "all_reduce":
            return self.link
        return self.link_all_to_all if kind == "all_to_all" else self.link_gather


# [Fitted] gemm, bmm, hbm, link, link_gather, gemm_knee: by ``symtensor calibrate --fit`` on
# calibration.csv (Korthikanti et al. 2022, DGX A100: 8 iteration times and 6 MFU values).
# Worst residual: 4.1% in time, 1.7 MFU points (``symtensor calibrate``). A knee of 1e10 FLOPs is
# ~40 us of a kernel at A100 speed: launch and wave-quantisation loss. attention = gemm is an
# assumption (the calibration set has no fused-attention run); dp_overlap = 0.9 is the default of
# the authors' PARADISE estimator (spec 2.4), for frameworks that overlap gradient reduction.
CALIBRATED = Efficiency(gemm=0.784, bmm=0.3417, attention=0.784, hbm=0.882, link=0.8194, link_gather=0.7872,
                        gemm_knee=1e10, dp_overlap=0.9,
                        source="fitted on shared/data/calibration.csv (Korthikanti et al. 2022); see symtensor calibrate")


def efficiency_for(cluster) -> Efficiency:
    """The efficiency table of ``cluster``: the fields its cluster file sets (``Cluster.efficiency``,
    e.g. measured by ``symtensor profile``) over else the calibrated table of its device (other devices reuse the A100 fractions, a
    documented transfer). ``cluster`` may also be a device name."""
    base = CALIBRATED
    own = dict(getattr(cluster, "efficiency", ()) or ())
    if own:
        return base.replace(**own, source=getattr(cluster, "efficiency_source", "") or "cluster file")
    return base
