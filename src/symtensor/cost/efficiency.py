"""Achievable fractions of peak, and the end-to-end constants: what the symbolic model multiplies by.

Compute time of an op is a roofline, ``max(FLOPs / (peak * eff), bytes / (HBM bandwidth * hbm))``;
a collective's beta is ``1 / (link bandwidth * link)``.

Kernel rates come from measurements, not from end-to-end fits (issue 22): every device's GEMMs (by
shape, forward and both backward GEMMs), grouped GEMMs (by tokens per expert), fused attention (by the
engine's kernel, sequence, head dim and causality) and memory-bound kernels (at the measured fraction of
HBM bandwidth) are read from ``cost.kernels``' tables, each with its source (``Efficiency.kernels`` and
``tables``; the lookups are in ``cost.opcost``). A cluster file's measured fraction of a class
(``symtensor profile``) takes that class out of the tables: its own measurement wins.

The scalar fractions below (gemm, bmm, attention, hbm, the knees) are v2's end-to-end fit on the same
rows; they cost only a class a cluster file does not measure and no table covers (none of the shipped
devices) and are kept as the transfer of last resort. The link fractions (NCCL bus bandwidth over the
link rate: all-reduce 0.82, all-gather / reduce-scatter 0.79) are v2's fit too, inside what nccl-tests
publishes for DGX A100 (about 230 of 300 GB/s NVLink bus bandwidth, 0.77) and below the 0.9 no NCCL run
exceeds; they are not refitted.

The end-to-end constants (``EndToEnd``: per-step and per-micro-batch host overhead, the idle gap between
kernels, the compute share a concurrent collective takes) are what no microbenchmark sees. They are
fitted by ``symtensor calibrate --fit`` on ../shared/data/calibration.csv (Korthikanti et al. 2022, DGX
A100) and calibration_h100.csv (NeMo 2 on DGX H100) together, one value for every device (the kernel
tables carry what differs between devices), inside each constant's physical range
(``hardware.efficiency.END_TO_END_RANGES``); ``symtensor calibrate`` prints their in-sample and
leave-one-source-out error. No other published measurement was used for fitting: those judge the model.
"""

from __future__ import annotations

from symtensor.cost import kernels
from symtensor.cost.engine import ENGINES, attention_kernel, engine_named
from symtensor.errors import PlanError
from symtensor.hardware.efficiency import TABLE_CLASSES, Efficiency, EndToEnd

# [Fitted] by ``symtensor calibrate --fit`` (calibration.fit_end_to_end) on both calibration files, of the
# constants ``calibration.select_constants`` kept: only the host time per micro-batch (microbatch_s) lowers
# the leave-one-source-out error (mean tolerance-scaled error of the time rows 0.66 with no constant -> 0.48;
# the idle time per op, per-step overhead and a fitted compute share of concurrent collectives raise it or
# leave it: 0.50-1.12, written in benchmarks/results/cost_model_fidelity.md). 5.2 ms per micro-batch and
# pipeline stage, the same in each leave-one-source-out fold, inside its range (0-50 ms). Before the H100
# GEMMs took the sustained ceiling (cost/kernels.py MSMF_H200) the fit kept only kernel_gap_s, at the top of
# its range (20 us per op), standing in for H100 GEMMs costed at the boost clock. The others keep their
# priors: no per-op gap, no per-step overhead, the NCCL SM share 16/108 (engine.COMM_SM_FRACTION).
END_TO_END = EndToEnd(microbatch_s=0.05 / 9.6)

# Fused attention's backward reaches 0.86 of its forward's fraction of peak (FlashAttention-2,
# Dao 2023: up to 73% of A100 peak forward, 63% backward); its sequence knee is in opcost.py.
ATTENTION_BWD_RATIO = 0.63 / 0.73
ATTENTION_KNEE_TOKENS = 340.0

# A100 [Fitted] gemm, bmm, hbm, link, link_gather, gemm_knee: by ``symtensor calibrate --fit`` on
# calibration.csv (Korthikanti et al. 2022, DGX A100: 8 iteration times and 6 MFU values).
# A knee of 1e10 FLOPs is ~40 us of a kernel at A100 speed: launch and wave-quantisation loss.
# Those runs used unfused attention, so A100 fused attention is FlashAttention-2's published
# forward fraction (73% of peak at head dim 128, long sequences; Dao 2023), not fitted.
A100 = Efficiency(gemm=0.784, bmm=0.3417, attention=0.73, attention_bwd=0.73 * ATTENTION_BWD_RATIO, attention_sdpa=0.73,
                  attention_knee=ATTENTION_KNEE_TOKENS, hbm=0.882, link=0.8194, link_gather=0.7872,
                  gemm_knee=1e10, kernels="A100-SXM4-80GB", tables=TABLE_CLASSES, attention_kernel="fa2",
                  end_to_end=END_TO_END,
                  source="A100: fitted on shared/data/calibration.csv (Korthikanti et al. 2022); "
                         "see symtensor calibrate")
CALIBRATED = A100

# H100 [Fitted] gemm and attention (the backward at ATTENTION_BWD_RATIO) by ``symtensor calibrate
# --fit`` on calibration_h100.csv (NeMo 2 Llama 3.1 8B/70B/405B runs on DGX H100, 17 iteration
# times); the batched-matmul, HBM and link fractions are A100's (the H100 rows cannot separate
# them: every run overlaps its communication and uses fused attention).
# attention_sdpa, the scalar fallback of a device without attention tables (none shipped): PyTorch's SDPA as
# FlashAttention-2, which reaches ~35% of the BF16 peak forward on H100 (~350 TFLOP/s at head dim 128; Shah et
# al. 2024, FlashAttention-3, Fig. 5), against the fused attention Transformer Engine runs in the NeMo rows. With
# the tables, SDPA runs cuDNN's fused attention on H100 since torch 2.11 (``engine.SDPA_ATTENTION``).
H100 = A100.replace(kernels="H100-SXM5-80GB", attention_kernel="cudnn",
                    gemm=0.6208, attention=0.6332, attention_bwd=0.6332 * ATTENTION_BWD_RATIO, attention_sdpa=0.35,
                    source="H100: fitted on shared/data/calibration_h100.csv (NeMo 2 Llama 3.1 on DGX H100); "
                           "see symtensor calibrate")

# One table per device that has calibration rows of its own; the others use one of these, a
# documented transfer (device name part, table, why): their predictions are uncalibrated (cost.bands).
TABLES = {"A100": A100, "H100": H100}
TRANSFERS = (
    ("H200", "H100", "the H100's GH100 die: the same SMs, clocks and Tensor Cores; only the HBM differs, "
                     "which the roofline reads from the device"),
    ("B200", "H100", "no Blackwell rows in the calibration files: Hopper's fractions of peak, the nearest "
                     "generation with Transformer Engine kernels, applied to Blackwell's own peaks"),
    ("B300", "H100", "no Blackwell Ultra rows in the calibration files: Hopper's fractions of peak, as B200's "
                     "(the same dense BF16 Tensor Core generation), applied to Blackwell Ultra's own peaks"),
    ("910B", "A100", "no Ascend rows in the calibration files: A100's fractions of peak (a similar BF16 peak "
                     "and HBM2e bandwidth)"),
)


def own_table(device_name: str) -> str | None:
    """The table fitted on this device's own calibration rows (A100, H100), or None."""
    name = device_name.upper()
    return next((k for k in TABLES if k in name), None)


def _transfer(device_name: str) -> tuple[str, str]:
    """The table a device without its own reads and why: its documented transfer (``TRANSFERS``), else A100's."""
    name = device_name.upper()
    return next(((table, why) for part, table, why in TRANSFERS if part in name), ("A100", "no table of its own"))


def device_table(device_name: str) -> str:
    """The efficiency table a device uses: its own (``own_table``), else its transfer (``_transfer``)."""
    return own_table(device_name) or _transfer(device_name)[0]


# engines whose kernels are PyTorch's own (SDPA attention, eager elementwise composites): ``Engine.pytorch_kernels``
PYTORCH_KERNELS = tuple(name for name, engine in ENGINES.items() if engine.pytorch_kernels)

# The fused-attention kernels a run may name (``models.config.ATTENTION``; the graph's attention op
# carries it as its ``kernel`` attr) other than ``flash``, the engine's own (``Efficiency.attention``:
# Transformer Engine's under megatron, SDPA's FlashAttention-2 under the PyTorch stacks), as a
# fraction of the device's FlashAttention-2 (``attention_sdpa``), forward and backward alike:
#   flash2  FlashAttention-2: PyTorch SDPA since torch 2.2, flash-attn >= 2.0 (Megatron-LM's
#           --use-flash-attn), whatever the engine.
#   flash1  FlashAttention (v1) and its Triton port (flash-attn's flash_attn_triton.py, which MPT runs
#           as llm-foundry's ``attn_impl: triton`` before FlashAttention-2): FlashAttention-2 yields
#           "around 2x speedup compared to FlashAttention" (Dao 2023, arXiv:2307.08691, abstract:
#           FlashAttention reaches 25-40% of the A100's peak, FlashAttention-2 50-73%); the Triton
#           port's forward + backward is "slightly slower than" the CUDA kernels (its docstring).
#           The A100 ratio is transferred to H100 (neither kernel uses Hopper's instructions).
ATTENTION_KERNELS = {"flash2": 1.0, "flash1": 0.5}


def attention_fractions(eff: Efficiency, kernel: str | None = None) -> tuple[float, float]:
    """Forward and backward fractions of peak of fused attention run by ``kernel`` (an attention
    op's ``kernel`` attr) under ``eff``: the engine's own kernel (``None`` or ``flash``) at
    ``eff.attention`` and ``eff.attention_bwd``, the others (``ATTENTION_KERNELS``) at their share of
    FlashAttention-2 (``eff.attention_sdpa``, else ``eff.attention``), the backward at
    ``ATTENTION_BWD_RATIO`` of it. The one rule: the evaluator, the search and explain read it."""
    if kernel is None or kernel == "flash":
        return eff.attention, eff.attention_bwd
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention kernel {kernel!r}; use one of flash, {', '.join(ATTENTION_KERNELS)}")
    fwd = (eff.attention_sdpa or eff.attention) * ATTENTION_KERNELS[kernel]
    return fwd, fwd * ATTENTION_BWD_RATIO


# the Efficiency fields a cluster file's measured fraction of each table class replaces (the class then
# leaves the tables)
CLASS_FIELDS = {"gemm": ("gemm", "bmm", "gemm_knee"),
                "attention": ("attention", "attention_bwd", "attention_sdpa", "attention_knee"),
                "hbm": ("hbm",)}


def kernel_device(device_name: str) -> str:
    """The ``cost.kernels`` device whose tables ``device_name`` reads: its own, else A100's (the transfer of
    every device without a table, as ``device_table``)."""
    try:
        return kernels.device_kernels(device_name).name
    except PlanError:
        return kernels.A100.name


def efficiency_for(cluster, framework: str = "megatron") -> Efficiency:
    """The efficiency of ``cluster`` under ``framework``'s engine: its device's kernel tables
    (``cost.kernels``; a device without its own reads a documented transfer) with the engine's attention
    kernel on that device (``Engine.attention_kernels``), the end-to-end constants (``END_TO_END``), and
    the fields its cluster file sets (``Cluster.efficiency``, e.g. measured by ``symtensor profile``: a
    class it measures leaves the tables) and its ``end_to_end:`` constants over them. The PyTorch stacks
    (``PYTORCH_KERNELS``) run SDPA attention and eager elementwise ops. ``cluster`` may also be a device
    name."""
    name = cluster if isinstance(cluster, str) else cluster.device.name
    own_name = own_table(name)
    table, why = (own_name, "") if own_name else _transfer(name)
    base = TABLES[table]
    kdev = kernel_device(name)
    if own_name is None:
        base = base.replace(source=f"{table}'s table transferred to {name} ({why}); {base.source}")
    engine = engine_named(framework)
    base = base.replace(kernels=kdev, attention_kernel=attention_kernel(
        engine, name, lambda k: kernels.has_attention(kdev, k)), pads_vocab=engine.pads_vocab)
    if framework in PYTORCH_KERNELS:
        sdpa = base.attention_sdpa or base.attention
        base = base.replace(attention=sdpa, attention_bwd=sdpa * ATTENTION_BWD_RATIO, eager_elementwise=True)
    own = dict(getattr(cluster, "efficiency", ()) or ())
    if own:
        tables = tuple(c for c in base.tables if not any(f in own for f in CLASS_FIELDS[c]))
        base = base.replace(**own, tables=tables,
                            source=getattr(cluster, "efficiency_source", "") or "cluster file")
    e2e = dict(getattr(cluster, "end_to_end", ()) or ())
    if e2e:
        base = base.replace(end_to_end=base.end_to_end.replace(**e2e))
    return base
