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
        attention: fused FlashAttention kernels, fraction of peak FLOP/s.
        hbm: achievable fraction of HBM bandwidth for memory-bound kernels.
        link: achievable fraction of link bandwidth for all-reduce (NCCL bus bandwidth / link).
        link_gather: the same for all-gather, reduce-scatter, all-to-all and point-to-point.
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
    source: str = field(default="", compare=False)

    def __post_init__(self):
        if not self.link_gather:
            object.__setattr__(self, "link_gather", self.link)

    def replace(self, **kw) -> "Efficiency":
        return replace(self, **kw)

    def link_for(self, kind: str) -> float:
        return self.link if kind == "all_reduce" else self.link_gather


# [Fitted] gemm, bmm, hbm, link, link_gather, gemm_knee: by ``symtensor calibrate --fit`` on
# calibration.csv (Korthikanti et al. 2022, DGX A100: 8 iteration times and 6 MFU values).
# Worst residual: 4.1% in time, 1.7 MFU points (``symtensor calibrate``). A knee of 1e10 FLOPs is
# ~40 us of a kernel at A100 speed: launch and wave-quantisation loss. attention = gemm is an
# assumption (the calibration set has no fused-attention run); dp_overlap = 0.9 is the default of
# the authors' PARADISE estimator (spec 2.4), for frameworks that overlap gradient reduction.
CALIBRATED = Efficiency(gemm=0.784, bmm=0.3417, attention=0.784, hbm=0.882, link=0.8194, link_gather=0.7872,
                        gemm_knee=1e10, dp_overlap=0.9,
                        source="fitted on shared/data/calibration.csv (Korthikanti et al. 2022); see symtensor calibrate")


def efficiency_for(device_name: str) -> Efficiency:
    """The calibrated constants; other devices reuse the A100 fractions (a documented transfer)."""
    return CALIBRATED
