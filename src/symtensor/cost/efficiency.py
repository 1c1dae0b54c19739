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
    source: str = field(default="", compare=False)

    def replace(self, **kw) -> "Efficiency":
        return replace(self, **kw)


# [Fitted] gemm, bmm, hbm, link: by ``symtensor calibrate --fit`` on calibration.csv (Korthikanti
# et al. 2022, DGX A100: 8 iteration times and 6 MFU values; hbm reached its 0.9 bound). Worst
# residual: 3.3% in time, 1.8 MFU points. attention = gemm is an assumption (the calibration set has
# no fused-attention run); dp_overlap = 0.9 is the default of the authors' PARADISE estimator
# (spec 2.4), for frameworks that overlap the gradient reduction with backward.
CALIBRATED = Efficiency(gemm=0.7875, bmm=0.4408, attention=0.7875, hbm=0.9, link=0.7875, dp_overlap=0.9,
                        source="fitted on shared/data/calibration.csv (Korthikanti et al. 2022); see symtensor calibrate")


def efficiency_for(device_name: str) -> Efficiency:
    """The calibrated constants; other devices reuse the A100 fractions (a documented transfer)."""
    return CALIBRATED
