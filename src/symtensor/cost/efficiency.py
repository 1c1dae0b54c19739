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
        link: achievable fraction of link bandwidth for collectives (NCCL bus bandwidth / link).
        dp_overlap: fraction of data-parallel gradient communication hidden behind backward.
        source: provenance of the numbers.
    """

    gemm: float
    bmm: float
    attention: float
    hbm: float
    link: float
    dp_overlap: float
    source: str = field(default="", compare=False)

    def replace(self, **kw) -> "Efficiency":
        return replace(self, **kw)


# [Fitted] on calibration.csv (Korthikanti et al. 2022, DGX A100, 8 iteration times); see
# ``symtensor calibrate``. attention = gemm is an assumption (no fused-attention run in the
# calibration set); dp_overlap = 0.9 is the default of the authors' PARADISE estimator (spec 2.4).
CALIBRATED = Efficiency(gemm=0.75, bmm=0.45, attention=0.75, hbm=0.8, link=0.75, dp_overlap=0.9,
                        source="fitted on shared/data/calibration.csv (Korthikanti et al. 2022); see symtensor calibrate")


def efficiency_for(device_name: str) -> Efficiency:
    """The calibrated constants; other devices reuse the A100 fractions (a documented transfer)."""
    return CALIBRATED
