"""Error bands: how far a predicted step time may be from the measured one.

A band is a residual range r = predicted / measured - 1 around a prediction: the measured step is
expected in [step / (1 + hi), step / (1 + lo)]. It is built by one documented rule (``band``):

1. The base range. On a device with calibration rows of its own (A100: Korthikanti et al. 2022,
   calibration.csv; H100: NeMo 2 Llama 3.1, calibration_h100.csv), the range of its time rows'
   residuals, in-sample and LEAVE-ONE-SOURCE-OUT (``RESIDUALS``: the rows predicted by constants fitted
   with and without their source, as ``symtensor calibrate`` prints them; MFU rows count as times,
   r = measured MFU / predicted MFU - 1). Both straddle zero since the H100 GEMMs take the GH100's
   sustained ceiling (cost/kernels.py; before, the H100 range lay below zero, optimistic). A device without
   rows (H200, B200, GB200, B300, GB300, Ascend 910B: they read another device's kernel tables,
   ``efficiency.TRANSFERS``) takes the union of the calibrated ranges, widened by ``WIDEN["device"]``.
2. Widening per dimension the prediction leaves the calibrated domain (``DOMAIN``) along, each by its
   ``WIDEN`` width on both sides: the engine (only Megatron-LM runs are in the calibration files), the
   regime (sharded data parallelism, long context, LoRA: no time rows), the model family (mixture of
   experts: no rows), the precision (FP8: no rows), the scale (devices outside 8 .. 2,240), the network
   (inter-node bandwidth per GPU outside 25 .. 50 GB/s, the DGX A100 and DGX H100 rails), the parallelism
   (a tensor-parallel degree outside those of the device's own time rows, ``TENSOR_PARALLEL``: every A100
   row runs TP 8, so a data-parallel A100 plan is not what its base range was measured on), the model's width
   (a hidden size outside those of the device's own time rows, ``WIDTH``: a narrower model runs GEMMs of shapes
   no row ran and a larger share of memory-bound and host work than any row holds).
3. The range never goes below -0.6 (a prediction 2.5x too fast) nor above +1.5.

The widths are stated guesses of how much each unmodelled difference moves a step, sized from what was
seen: issue 22 measured a signed bias of 20-36% on three stacks the model was not calibrated for
(``engine`` 0.15 on each side, with ``device`` 0.10 and the rest 0.05-0.15), except ``parallelism``'s, a
measurement (the A100's sustained clock against its burst, ``WIDEN``); the band's coverage of the
calibration rows, each judged without its own source (a held-out source's device is then uncalibrated),
is measured by ``coverage`` and printed by ``symtensor calibrate`` and benchmarks/cost_model_fidelity.py.
A band that never contains the truth is worse than none.
"""

from __future__ import annotations

from dataclasses import dataclass

from symtensor.cost import kernels
from symtensor.cost.engine import sharded_parameters

# (lowest, highest) residual of the time rows (iteration time and MFU) per (device table, regime), over
# their in-sample predictions (what a user gets) and their leave-one-source-out ones (what a new source
# would see): ``symtensor calibrate`` prints both (tests/integration/test_calibration_fits.py checks these)
RESIDUALS = {("A100", "dense 3D"): (-0.0419, 0.0656), ("H100", "dense 3D"): (-0.0348, 0.0321)}
# the legacy symmetric range some callers state for "no calibration at all" (kept for the report)
UNCALIBRATED = (-0.25, 0.25)
REGIMES = ("dense 3D", "FSDP", "long context", "LoRA", "MoE")
# the calibrated domain of the shipped rows (calibration.csv, calibration_h100.csv)
DOMAIN = {"engine": ("megatron",), "precision": ("bf16", "fp16"), "devices": (8, 2240),
          "network_gbps_per_device": (25.0, 50.0)}
# (lowest, highest) tensor-parallel degree of each device table's time rows: calibration.csv's Korthikanti et al.
# 2022 runs are all TP 8, calibration_h100.csv's NeMo runs TP 1, 4 and 8 (tests/unit/test_cost_physics.py reads
# them back from the files)
TENSOR_PARALLEL = {"A100": (8, 8), "H100": (1, 8)}
# (smallest, largest) hidden size of the models of each device table's time rows: calibration.csv's GPT 22B to 1T,
# calibration_h100.csv's Llama 3.1 8B to 405B (tests/unit/test_cost_physics.py reads them back from the files)
WIDTH = {"A100": (6144, 25600), "H100": (4096, 16384)}
# residual widened on each side per dimension outside the domain (rule 2 of the module docstring); parallelism's
# is the A100's measured sustained clock against the burst its TP-8 rows ran at (1 - 1,200 / 1,410 MHz,
# ``kernels.A100_SUSTAINED_CLOCK``): a data-parallel A100 step may run at either (published data-parallel A100
# runs match the sustained one, tests/unit/test_published_mfu.py)
# width's is the engine's, a guess of the same kind: what no row measured (other GEMM shapes, the memory-bound
# and host share of a narrow model's step) moves a step about as much as a stack nobody calibrated
WIDEN = {"device": 0.10, "engine": 0.15, "regime": 0.10, "family": 0.15, "precision": 0.10, "scale": 0.05,
         "network": 0.05, "parallelism": round(1 - kernels.A100_SUSTAINED_CLOCK, 3), "width": 0.15}
LIMITS = (-0.6, 1.5)


@dataclass(frozen=True, slots=True)
class Band:
    """[low, high] seconds around a predicted step, its regime, whether that regime was calibrated on
    its device, and the dimensions it was widened along (``WIDEN``)."""

    low_s: float
    high_s: float
    regime: str
    calibrated: bool
    widened: tuple[str, ...] = ()

    def overlaps(self, other: Band) -> bool:
        """Two predictions the model cannot tell apart: their bands overlap."""
        return self.low_s <= other.high_s and other.low_s <= self.high_s

    def as_list(self) -> list[float]:
        return [self.low_s, self.high_s]

    def contains(self, measured_s: float) -> bool:
        return self.low_s <= measured_s <= self.high_s


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


def outside(*, framework: str = "megatron", regime: str = "dense 3D", precision: str = "bf16",
            devices: int | None = None, network_gbps_per_device: float | None = None,
            table: str | None = None, tp: int | None = None, hidden: int | None = None) -> tuple[str, ...]:
    """The dimensions (``WIDEN`` keys but ``device``) along which a prediction leaves ``DOMAIN`` (and, for a
    device ``table`` with rows of its own, its rows' ``TENSOR_PARALLEL`` degrees and ``WIDTH``)."""
    out = []
    if framework not in DOMAIN["engine"]:
        out.append("engine")
    if regime == "MoE":
        out.append("family")
    elif regime != "dense 3D":
        out.append("regime")
    if precision not in DOMAIN["precision"]:
        out.append("precision")
    lo, hi = DOMAIN["devices"]
    if devices is not None and not lo <= devices <= hi:
        out.append("scale")
    lo, hi = DOMAIN["network_gbps_per_device"]
    if network_gbps_per_device is not None and not lo * 0.999 <= network_gbps_per_device <= hi * 1.001:
        out.append("network")
    lo, hi = TENSOR_PARALLEL.get(table, (None, None))
    if tp is not None and lo is not None and not lo <= tp <= hi:
        out.append("parallelism")
    lo, hi = WIDTH.get(table, (None, None))
    if hidden is not None and lo is not None and not lo <= hidden <= hi:
        out.append("width")
    return tuple(out)


def band_of(step_s: float, device_name: str, *, zero: int, seq: int, lora: bool, moe: bool, framework: str,
            precision: str = "bf16", devices: int | None = None,
            network_gbps_per_device: float | None = None, tp: int | None = None, hidden: int | None = None
            ) -> Band:
    """The band of a prediction for a configuration on a device (its own table and regime, the rule of
    the module docstring): a device that borrows another's table (``efficiency.TRANSFERS``) has no
    calibration rows, so no measured range of its own. ``hidden``: the model's hidden size (``WIDTH``)."""
    from symtensor.cost.efficiency import own_table

    regime = regime_of(zero=zero, seq=seq, lora=lora, moe=moe, framework=framework)
    table = own_table(device_name)
    dims = outside(framework=framework, regime=regime, precision=precision, devices=devices,
                   network_gbps_per_device=network_gbps_per_device, table=table, tp=tp, hidden=hidden)
    return band(step_s, table or device_name, regime, dims)


def residual_range(table: str, dims: tuple[str, ...] = (),
                   residuals: dict | None = None) -> tuple[float, tuple[str, ...], bool]:
    """(lo, hi), the dimensions widened, and whether ``table``'s own rows gave the base (the rule)."""
    residuals = RESIDUALS if residuals is None else residuals
    own = residuals.get((table, "dense 3D"))
    widened = list(dims)
    if own is None:
        ranges = list(residuals.values()) or [(0.0, 0.0)]
        own = (min(r[0] for r in ranges), max(r[1] for r in ranges))
        widened.insert(0, "device")
    lo, hi = own
    extra = sum(WIDEN[d] for d in widened)
    return (max(LIMITS[0], lo - extra), min(LIMITS[1], hi + extra)), tuple(widened), not widened


def band(step_s: float, table: str, regime: str, dims: tuple[str, ...] = (), residuals: dict | None = None) -> Band:
    """The band of a step of ``step_s`` seconds predicted with device table ``table`` in ``regime``, outside
    the calibrated domain along ``dims`` (``outside``); ``residuals``: the base ranges (``RESIDUALS``).

    A residual r = predicted / measured - 1 in [lo, hi] puts the measured step in
    [step / (1 + hi), step / (1 + lo)]."""
    if regime != "dense 3D" and "regime" not in dims and "family" not in dims:
        dims = dims + (("family",) if regime == "MoE" else ("regime",))
    (lo, hi), widened, calibrated = residual_range(table, dims, residuals)
    return from_residuals(step_s, (lo, hi), regime, calibrated, widened)


def from_residuals(step_s: float, residuals: tuple[float, float], regime: str, calibrated: bool,
                   widened: tuple[str, ...] = ()) -> Band:
    """The band of a step of ``step_s`` seconds whose residuals (predicted / measured - 1) lie in
    ``residuals`` = (lowest, highest): the measured step in [step / (1 + hi), step / (1 + lo)]."""
    lo, hi = residuals
    return Band(step_s / (1 + hi), step_s / (1 + lo), regime, calibrated, tuple(widened))


def coverage(results, loso_residuals) -> dict:
    """Leave-one-source-out coverage of the bands on calibration time rows: each row's band built from
    the residuals of the other sources only (``loso_residuals``: source family -> {(table, regime):
    (lo, hi)}), around its leave-one-source-out prediction. ``results``: (family, device table, time
    residual r) triples. Returns {device table: (rows covered, rows)} and "all"."""
    out: dict = {}
    for fam, table, r in results:
        (lo, hi), _, _ = residual_range(table, (), loso_residuals[fam])
        hit = lo - 1e-12 <= r <= hi + 1e-12
        for key in (table, "all"):
            got, n = out.get(key, (0, 0))
            out[key] = (got + hit, n + 1)
    return out
