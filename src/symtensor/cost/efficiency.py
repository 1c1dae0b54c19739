"""Achievable fractions of peak: the few constants the symbolic model multiplies by.

Compute time of an op is a roofline, ``max(FLOPs / (peak * eff), bytes / (HBM bandwidth * hbm))``;
a collective's beta is ``1 / (link bandwidth * link)``. The constants marked [Fitted] were fitted
by ``symtensor calibrate --fit`` on ../shared/data/calibration.csv only (Korthikanti et al. 2022
iteration times on DGX A100); ``symtensor calibrate`` prints the residual error. No other
published measurement was used for fitting: those judge the model.
"""

from __future__ import annotations

from symtensor.cost.engine import ENGINES
from symtensor.hardware.efficiency import Efficiency

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
                  gemm_knee=1e10,
                  source="A100: fitted on shared/data/calibration.csv (Korthikanti et al. 2022); "
                         "see symtensor calibrate")
CALIBRATED = A100

# H100 [Fitted] gemm and attention (the backward at ATTENTION_BWD_RATIO) by ``symtensor calibrate
# --fit`` on calibration_h100.csv (NeMo 2 Llama 3.1 8B/70B/405B runs on DGX H100, 17 iteration
# times); the batched-matmul, HBM and link fractions are A100's (the H100 rows cannot separate
# them: every run overlaps its communication and uses fused attention).
# On H100 PyTorch's SDPA runs FlashAttention-2, which reaches ~35% of the BF16 peak forward
# (~350 TFLOP/s at head dim 128; Shah et al. 2024, FlashAttention-3, Fig. 5), against the fused
# attention Transformer Engine runs in the NeMo rows.
H100 = A100.replace(gemm=0.6208, attention=0.6332, attention_bwd=0.6332 * ATTENTION_BWD_RATIO, attention_sdpa=0.35,
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
    ("910B", "A100", "no Ascend rows in the calibration files: A100's fractions of peak (a similar BF16 peak "
                     "and HBM2e bandwidth)"),
)


def own_table(device_name: str) -> str | None:
    """The table fitted on this device's own calibration rows (A100, H100), or None."""
    name = device_name.upper()
    return next((k for k in TABLES if k in name), None)


def device_table(device_name: str) -> str:
    """The efficiency table a device uses: its own (``own_table``), else its documented transfer
    (``TRANSFERS``), else A100's."""
    name = device_name.upper()
    return own_table(name) or next((table for part, table, _ in TRANSFERS if part in name), "A100")


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


def efficiency_for(cluster, framework: str = "megatron") -> Efficiency:
    """The efficiency table of ``cluster``: the fields its cluster file sets (``Cluster.efficiency``,
    e.g. measured by ``symtensor profile``) over the calibrated table of its device (or the table a
    device without one borrows: ``TRANSFERS``, said in its ``source``), with the kernels of
    ``framework``'s stack (``PYTORCH_KERNELS``: SDPA attention and eager elementwise ops).
    ``cluster`` may also be a device name."""
    name = cluster if isinstance(cluster, str) else cluster.device.name
    base = TABLES[device_table(name)]
    if own_table(name) is None:
        why = next((why for part, _, why in TRANSFERS if part in name.upper()), "no table of its own")
        base = base.replace(source=f"{device_table(name)}'s table transferred to {name} ({why}); {base.source}")
    if framework in PYTORCH_KERNELS:
        sdpa = base.attention_sdpa or base.attention
        base = base.replace(attention=sdpa, attention_bwd=sdpa * ATTENTION_BWD_RATIO, eager_elementwise=True)
    own = dict(getattr(cluster, "efficiency", ()) or ())
    if own:
        return base.replace(**own, source=getattr(cluster, "efficiency_source", "") or "cluster file")
    return base
