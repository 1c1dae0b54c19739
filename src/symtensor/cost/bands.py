"""Error bands: how far a predicted step time may be from the measured one, per device and regime.

A band is the spread of the calibration residuals (predicted / measured - 1 of the iteration-time
rows) of the regime the plan belongs to, on its device. The residuals are those ``symtensor
calibrate`` prints (tests/test_cost_model.py checks these constants against it):

    A100 dense 3D   8 rows of Korthikanti et al. 2022 (calibration.csv)        -1.63% .. +4.06%
    H100 dense 3D   17 NeMo 2 Llama 3.1 runs (calibration_h100.csv)            -4.17% .. +4.57%

A regime without calibration rows of its own (sharded data parallelism, long context, LoRA,
mixture of experts), or a device without calibration rows of its own (H200, B200, GB200, Ascend
910B: they borrow another device's efficiency table, ``efficiency.TRANSFERS``), has no measured
spread: it takes a residual range of +-25% and says it is extrapolated. That is a stated guess,
the size of the errors analytic models show outside the regime they were fitted in (before v2,
this model was 20-75% too fast on FSDP runs it had not been fitted on).
"""

from __future__ import annotations

from dataclasses import dataclass

from symtensor.cost.engine import sharded_parameters

# (lowest, highest) residual of the iteration-time rows, per (device table, regime)
RESIDUALS = {("A100", "dense 3D"): (-0.0163, 0.0406), ("H100", "dense 3D"): (-0.0417, 0.0457)}
# an uncalibrated regime or device: this residual range (a stated guess, see the docstring)
UNCALIBRATED = (-0.25, 0.25)
REGIMES = ("dense 3D", "FSDP", "long context", "LoRA", "MoE")


@dataclass(frozen=True, slots=True)
class Band:
    """[low, high] seconds around a predicted step, and whether its regime was calibrated."""

    low_s: float
    high_s: float
    regime: str
    calibrated: bool

    def overlaps(self, other: Band) -> bool:
        """Two predictions the model cannot tell apart: their bands overlap."""
        return self.low_s <= other.high_s and other.low_s <= self.high_s

    def as_list(self) -> list[float]:
        return [self.low_s, self.high_s]


def regime_of(*, zero: int, seq: int, lora: bool, moe: bool, framework: str) -> str:
    """The regime a configuration belongs to for its error band (the first that applies)."""
    if moe:
        return "MoE"
    if lora:
        return "LoRA"
    if seq >= 32768:
        return "long context"
    if sharded_parameters(zero, framework):
        return "FSDP"
    return "dense 3D"


def verdict(a: Band, b: Band, a_s: float, b_s: float) -> str:
    """How A's prediction compares with B's: a tie when the model cannot tell them apart."""
    if a.overlaps(b):
        return "tie within model error"
    return "faster" if a_s < b_s else "slower"


def band_of(step_s: float, device_name: str, *, zero: int, seq: int, lora: bool, moe: bool,
            framework: str) -> Band:
    """The band of a prediction for a configuration on a device (its own table and regime): a device
    that borrows another's table (``efficiency.TRANSFERS``) has no calibration rows, so no measured
    spread."""
    from symtensor.cost.efficiency import own_table

    regime = regime_of(zero=zero, seq=seq, lora=lora, moe=moe, framework=framework)
    return band(step_s, own_table(device_name) or device_name, regime)


def band(step_s: float, table: str, regime: str) -> Band:
    """The band of a step of ``step_s`` seconds predicted with device table ``table``.

    A residual r = predicted / measured - 1 in [lo, hi] puts the measured step in
    [step / (1 + hi), step / (1 + lo)]."""
    rng = RESIDUALS.get((table, regime))
    calibrated = rng is not None
    return from_residuals(step_s, rng if calibrated else UNCALIBRATED, regime, calibrated)


def from_residuals(step_s: float, residuals: tuple[float, float], regime: str, calibrated: bool) -> Band:
    """The band of a step of ``step_s`` seconds whose residuals (predicted / measured - 1) lie in
    ``residuals`` = (lowest, highest): the measured step in [step / (1 + hi), step / (1 + lo)]."""
    lo, hi = residuals
    return Band(step_s / (1 + hi), step_s / (1 + lo), regime, calibrated)
