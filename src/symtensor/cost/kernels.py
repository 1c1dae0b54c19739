"""Measured kernel efficiency per device: GEMM by shape, grouped GEMM by tokens per expert, attention by
kernel and shape, memory-bound kernels as a fraction of HBM bandwidth (issue 22, point 1).

Every number here is a published microbenchmark (each table names its source, and its licence where rows are
copied) or an exact conversion of one; none is fitted to an end-to-end run. A device without its own table uses
another device's, and says which and why (``DeviceKernels.transfers``). The cost model reads them through
the memoised lookups at the end of this module (``cost.opcost``: GEMMs by shape, grouped GEMMs by tokens per
expert, attention by the engine's kernel, memory-bound ops at the measured HBM fraction);
``benchmarks/kernel_table_check.py`` compares what it charges with the tables.

Units: every lookup returns a fraction in (0, 1]: achieved FLOP/s over the device's dense peak of that dtype
(``hardware`` presets: A100 312, H100/H200 989 BF16 and 1,979 FP8, B200 2,250 BF16 TFLOP/s), or achieved bytes/s
over its HBM bandwidth. GEMM FLOPs are 2 M N K (Y[M,N] = X[M,K] W[K,N]); attention FLOPs are the executed ones,
as ``graph.kinds`` counts them (causal kernels skip the masked half), so a causal fraction is comparable with
the cost model's.

Lookup rules (one per table kind):
  GEMM   eff(M, N, K) = E(F), F = 2 M N K at the measured device's peak (a transferred table is read at the
         same ideal time F / peak). E is the upper envelope of the measured rows over FLOPs: sorted by F, a row
         enters when it beats every smaller one; between envelope rows E is linear in log F, clamped at both
         ends, and capped at the device's measured ceiling. So a larger GEMM is never allowed less than a
         smaller one, and every envelope row is returned exactly. Tile and wave quantisation are in the table:
         each row is a real shape with its own quantisation loss, and the rows under the envelope (the same
         FLOPs run slower at a worse shape: K = 512, N = 576, N = 3,584 on 108 SMs) are kept and returned by
         ``gemm_measured``. The envelope is what the device was measured to allow at that size: the bound
         issue 22 tests the model against, not a prediction for a given shape. Above the table's largest
         FLOPs E stays at its top row (the clamp), never extrapolated towards the ceiling: no larger GEMM was
         measured faster (see ``H100_BF16`` for why that holds on H100). A table that records no layout
         (``-``: XLA's H100 rows, DeepGEMM) serves every layout with the same rows (``gemm_measured``: best
         of the shape; ``gemm_shape_efficiency``: the nearest row of any layout). A device whose own table
         was not timed as a training stack runs its GEMMs (``DeviceKernels.stack``: H100's XLA rows) is
         charged the lower of the shape rule on its own table and on the stack's; its bound stays its own.
  wave   ``gemm_wave``, NVIDIA's "Matrix Multiplication Background User's Guide" (tile and wave quantisation)
         as a function: the output is cut into tiles, one per thread block; a tile that overhangs M or N
         wastes its idle part, and tiles run in waves of one per SM, the last wave partly empty. wave(M, N) =
         (M N / (tiles * tile area)) * (tiles / (waves * SMs)), maximised over the tile shapes a library can
         choose (``TILES``), 1 when the device's SM count is unknown. Not applied by ``gemm_efficiency`` (the
         measured rows already carry their quantisation; dividing it out overstated rows whose library tile
         the model does not know): it is there for shapes no row is near, e.g. a tensor-parallel shard.
  grouped  eff(tokens per expert) = upper envelope over tokens per expert of the measured rows (any N, K,
         forward and backward), linear in log tokens, clamped; per direction (forward, input gradient, weight
         gradient: ``grouped_direction_efficiency``) the envelope of that direction's rows, under the former.
  attention  eff(seq) per (kernel, direction, causal, head dim): the published curve, linear in log seq,
         clamped; a head dim between two tabulated ones is interpolated linearly in log head dim at the same
         seq (clamped outside). A causal curve that was not published (backward) reads the non-causal one:
         an upper bound, causal being slower at every published seq.
  hbm    hbm_fraction(device, pattern): the measured fraction of STREAM-like kernels at full occupancy.
  alignment  ``alignment_factor``: a dense GEMM whose weight has a dimension no multiple of 8 elements (16 bytes of
         BF16) runs at the device's measured unaligned-over-aligned ratio for that dimension's class (odd; 2 or 4
         times an odd number) and layout (the mean of its measured rows); 1 where both dimensions are multiples of
         8 or the device measured none (``DeviceKernels.alignment``: the GH100 only; plans say so elsewhere).

Unknown devices, kernels, dtypes and directions raise a one-line ``PlanError``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from symtensor.cost import kernels_data as simumax
from symtensor.errors import PlanError, did_you_mean

# -- sources -----------------------------------------------------------------------------------------------------
MAMF = ("Bekman, ml-engineering, compute/accelerator/README.md, 'Maximum Achievable Matmul FLOPS comparison table' "
        "(BF16 torch.matmul, best of a brute-force shape search; CC BY-SA 4.0)")
SIMUMAX = ("SimuMax (MooreThreads/SimuMax @4dcaae51, Apache-2.0): measured Transformer Engine kernels in "
           "configs/system/{a100_pcie,b200_bf16_ceperm}.json, rows copied in cost/kernels_data.py")
DEEPGEMM = ("DeepGEMM README 'Performance' (deepseek-ai/DeepGEMM @327ec92f, 2025-04-09, MIT): FP8 GEMMs with "
            "1x128/128x128 block scaling on H800 SXM5 (same GH100 die and 1,979 TFLOP/s FP8 peak as H100 SXM5), "
            "NVCC 12.8")
FA3_PAPER = ("Shah et al. 2024, FlashAttention-3 (arXiv:2407.08608, CC BY 4.0), Fig. 5 (forward) and Fig. 6 "
             "(backward), H100 80GB SXM5, BF16, batch x seq = 16k tokens, hidden 2048; TFLOP/s bar labels")
FA2_PAPER = ("Dao 2023, FlashAttention-2 (arXiv:2307.08691): on A100 'up to 73% of the theoretical maximum "
             "FLOPs/s' forward and up to 63% backward (head dim 128, long sequences)")
GPU_BENCHES = ("te42kyfo/gpu-benches @1c36d509 (GPL-3.0), gpu-stream/{a100_80,h100_pcie,h200}.txt: STREAM-like "
               "kernels, row 'blockSize 1024' (100% occupancy), GB/s over the datasheet bandwidth")
XLA_SM90 = ("XLA's matmul performance table (tensorflow/tensorflow @372d578b, third_party/xla/xla/service/gpu/model/"
            "matmul_interpolator_data.h, kDefaultMatmulPTable key 'sm_90', Apache-2.0): BF16 dots timed on H100 SXM "
            "by XLA's matmul_perf_table_gen (short timed runs, i.e. the boost clock), rows copied in "
            "cost/kernels_data.py")
NVIDIA_GEMM_GUIDE = "NVIDIA Deep Learning Performance docs, 'Matrix Multiplication Background User's Guide'"
HOPPER_ALIGNMENT = ("this project's benchmarks/hopper_measure.py round 2 on one H200 (torch 2.11 + CUDA 13.0, cuBLAS "
                    "through torch.mm, back to back; raw rows in benchmarks/results/hopper_h200/round2.json, read in "
                    "benchmarks/results/hopper_runs.md): 16,384-token BF16 GEMMs whose weight has a dimension no "
                    "multiple of 8 against the nearest aligned one, in each layout")
MSMF = ("Bekman, ml-engineering, compute/accelerator/benchmarks/README.md, section 'MAMF & MSMF' (the revision after "
        "744d01e1 of 2026-08-22 that adds mamf-finder's sustained mode; CC BY-SA 4.0): MSMF = Maximum Sustainable "
        "Matmul FLOPS, BF16, measured after a thermal soak with the SM clock at its power-saturated floor, 'the "
        "sustained rate that matches real training throughput', every GPU of the node computing")

# SimuMax's attention benchmark counts a causal kernel's FLOPs as if it were not causal
# (test_fa_efficiency.py: fwd = 2 b s^2 h (dqk + dv), bwd = 5 b s^2 h (dqk + dv)); the causal kernel executed
# half of them, so the executed fraction is the reported one times this.
SIMUMAX_CAUSAL_FLOPS = 0.5

# Thread-block tiles (rows x columns of the output) the wave model may choose from: the guide's example tile
# (256 x 128 on A100) and the smaller CUTLASS/cuBLAS tiles a heuristic falls back to for small outputs.
TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))


# -- table types -------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class GemmTable:
    """Measured dense GEMMs of one dtype on one device.

    Attributes:
        rows: (M, N, K, layout, efficiency) as measured (layout ``TN`` forward, ``NN`` input gradient, ``NT``
            weight gradient, ``-`` not recorded); efficiency is achieved / peak of ``peak_tflops``.
        peak_tflops: the dense peak the rows are a fraction of.
        sms: SM count of the measured device (its rows' wave factors).
        source: where the rows come from.
    """

    rows: tuple
    peak_tflops: float
    sms: int | None
    source: str


@dataclass(frozen=True, slots=True)
class Curve:
    """A published efficiency curve over one variable (sequence length, tokens per expert)."""

    xs: tuple
    ys: tuple
    source: str

    def __post_init__(self):
        assert len(self.xs) == len(self.ys) and list(self.xs) == sorted(self.xs), self.source


@dataclass(frozen=True, slots=True)
class AlignmentTable:
    """Measured GEMMs whose weight (out x in) has a dimension no multiple of ``ALIGN_ELEMENTS``, each against the
    nearest aligned weight at the same tokens and layout (``alignment_factor`` reads them).

    Attributes:
        rows: (out, in, layout, TFLOP/s, aligned out, aligned in, aligned TFLOP/s), layout as ``GEMM_LAYOUTS``.
        source: where the rows come from.
    """

    rows: tuple
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceKernels:
    """One device's kernel tables.

    Attributes:
        name: the device (``hardware`` preset name where there is one).
        sms: streaming multiprocessors (the wave model); None where no source is at hand.
        peak_tflops: dense peak per dtype, TFLOP/s (the fractions' denominators).
        gemm: dtype -> (GemmTable, scale): the table and the factor its efficiencies take on this device (1
            for the device's own measurements at the clock it is costed at; the sustained/burst ratio
            ``GH100_SUSTAINED`` for burst-timed GH100 rows; a ratio of measured ceilings for a transfer,
            ``transfers``).
        grouped: dtype -> (Curve over tokens per expert, scale).
        attention: (kernel, "fwd"/"bwd", causal, head dim) -> Curve over sequence length (executed FLOPs).
        hbm: STREAM pattern -> measured fraction of HBM bandwidth (``HBM_PATTERNS``).
        transfers: table -> why this device reads another device's numbers.
        ceiling: dtype -> (best measured dense GEMM fraction, source): no lookup exceeds it.
        alignment: dtype -> AlignmentTable: what a GEMM whose weight dimensions are no multiple of 8 elements
            runs at against an aligned one (``alignment_factor``); a device without one is charged aligned rates.
        stack: dtype -> (GemmTable, scale): where the device's own GEMM table was not timed the way a training
            stack runs its GEMMs (H100: XLA autotunes each dot and times the kernel alone), a training stack's
            measured table (scaled as ``gemm``): the cost model's charged rate (``gemm_shape_efficiency``) is
            the lower of the two tables' shape rules; the bound (``gemm_efficiency``, the envelope) stays the
            device's own measurement.
    """

    name: str
    sms: int | None
    peak_tflops: dict
    gemm: dict = field(default_factory=dict)
    grouped: dict = field(default_factory=dict)
    attention: dict = field(default_factory=dict)
    hbm: dict = field(default_factory=dict)
    transfers: dict = field(default_factory=dict)
    ceiling: dict = field(default_factory=dict)
    stack: dict = field(default_factory=dict)
    alignment: dict = field(default_factory=dict)


# -- helpers -----------------------------------------------------------------------------------------------------
def interp_log(xs, ys, x: float) -> float:
    """``ys`` at ``x``, linear in log x between the points, clamped at both ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            t = math.log(x / xs[i - 1]) / math.log(xs[i] / xs[i - 1])
            return ys[i - 1] + t * (ys[i] - ys[i - 1])
    raise AssertionError("unreachable")


def envelope(points) -> tuple[tuple, tuple]:
    """The upper envelope of (x, y) points over x: sorted by x, a point enters when its y beats every point
    of smaller x (equal x: the best). Non-decreasing in y by construction; every kept point is a measured one."""
    best: dict = {}
    for x, y in points:
        best[x] = max(y, best.get(x, 0.0))
    xs, ys = [], []
    for x in sorted(best):
        if not ys or best[x] > ys[-1]:
            xs.append(x)
            ys.append(best[x])
    return tuple(xs), tuple(ys)


@functools.lru_cache(maxsize=65536)
def wave(m: float, n: float, sms: int | None) -> float:
    """Tile x wave quantisation efficiency of an M x N output on ``sms`` SMs, best over ``TILES``
    (``NVIDIA_GEMM_GUIDE``); 1 when the SM count is unknown."""
    if not sms:
        return 1.0
    best = 0.0
    for tm, tn in TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        fill = (m * n) / (tiles * tm * tn)
        waves = math.ceil(tiles / sms)
        best = max(best, fill * tiles / (waves * sms))
    return best


@functools.cache  # (a table is frozen: its envelope, sorted once, serves every lookup)
def _gemm_envelope(table: GemmTable):
    return envelope((2.0 * m * n * k, eff) for m, n, k, _, eff in table.rows)


def gemm_envelope(device, dtype: str = "bf16") -> tuple[tuple, tuple]:
    """The envelope points of ``device``'s GEMM table as (FLOPs on this device, fraction) pairs:
    ``gemm_efficiency`` returns each exactly (below the ceiling)."""
    dev = device_kernels(device)
    table, scale = _gemm_table(dev, dtype)
    xs, ys = _gemm_envelope(table)
    ratio = dev.peak_tflops[dtype] / table.peak_tflops
    return tuple(x * ratio for x in xs), tuple(min(y * scale, _cap(dev, dtype)) for y in ys)


def gemm_dims(op, sizes) -> tuple[float, float, float, float]:
    """(M, N, K, groups) of a linear op or batched matmul at these sizes: Y[M,N] = X[M,K] W[K,N] per
    group; groups are the dims both inputs and the output carry (experts, attention's batch and heads),
    K the dims both inputs carry and the output does not, M the first input's others, N the second's."""
    a, b, out = set(op.in_dims[0]), set(op.in_dims[1]), set(op.out_dims[0])
    m = n = k = g = 1.0
    for d in a | b:
        size = sizes[d]
        if d in a and d in b:
            if d in out:
                g *= size
            else:
                k *= size
        elif d in a:
            m *= size
        else:
            n *= size
    return m, n, k, g


def gemm_wave(device, m: float, n: float) -> float:
    """``wave`` on ``device``'s SM count."""
    return wave(m, n, device_kernels(device).sms)


def _curve_from_rows(points, source: str) -> Curve:
    xs, ys = envelope(points)
    return Curve(xs, ys, source)


# -- the tables --------------------------------------------------------------------------------------------------
# A100 PCIe, BF16 (SimuMax a100_pcie.json): 183 Transformer Engine GEMMs of LLM layer shapes (DeepSeek, LLaMA,
# Qwen; M = 4,096 to 33,024 tokens).
A100_PCIE_BF16 = GemmTable(rows=simumax.SIMUMAX_A100_GEMM, peak_tflops=312.0, sms=108,
                           source=f"{SIMUMAX}: a100_pcie.json matmul (A100 PCIe, BF16, 183 shapes)")
# B200, BF16 (SimuMax b200_bf16_ceperm.json): 514 rows (432 distinct shapes x layouts).
B200_BF16 = GemmTable(rows=simumax.SIMUMAX_B200_GEMM, peak_tflops=2250.0, sms=None,
                      source=f"{SIMUMAX}: b200_bf16_ceperm.json matmul (B200, BF16, peak 2,250 TFLOP/s)")
# H800 SXM5, FP8 (DeepGEMM, TFLOP/s per (M, N, K); layout not recorded): fractions of 1,979 TFLOP/s.
_DEEPGEMM_DENSE = ((64, 2112, 7168, 206), (64, 24576, 1536, 289), (64, 32768, 512, 219), (64, 7168, 16384, 336),
                   (64, 4096, 7168, 287), (64, 7168, 2048, 295), (128, 2112, 7168, 352), (128, 24576, 1536, 535),
                   (128, 32768, 512, 358), (128, 7168, 16384, 645), (128, 4096, 7168, 533), (128, 7168, 2048, 510),
                   (4096, 2112, 7168, 1127), (4096, 24576, 1536, 1212), (4096, 32768, 512, 775),
                   (4096, 7168, 16384, 1520), (4096, 4096, 7168, 1410), (4096, 7168, 2048, 1168))
# (Every FP8 recipe reads these blockwise rows. Measured since on the GH100 (benchmarks/results/hopper_runs.md):
# cuBLASLt's tensorwise FP8 GEMM, what Transformer Engine's delayed and current scaling run, at 0.54-0.67 of 1,979
# back to back, within 2% of this table's charge at 8,192-16,384-sized products and 8-28% above it at 2,048-4,096
# dims; a table per recipe is not built.)
H800_FP8 = GemmTable(rows=tuple((m, n, k, "-", tf / 1979.0) for m, n, k, tf in _DEEPGEMM_DENSE), peak_tflops=1979.0,
                     sms=132, source=f"{DEEPGEMM}: 'Normal GEMMs for dense models'")
# H100 SXM, BF16 (XLA's sm_90 table, ``XLA_SM90``): 375 dots, b in (1, 2, 4) x m, n, k in 256 .. 4,096, timed as
# bursts. A batched row (b > 1: [b, m, k] x [b, k, n]) is read as the GEMM of M = b m, N = n, K = k (the
# convention of ``gemm_shape_efficiency``, whose wave model puts a batch's groups in M): the same FLOPs, the
# same output tiles (m is a multiple of every tile height in ``TILES``) and the same K loop per tile; only its
# b distinct right-hand operands add traffic, so it runs at or below the flat GEMM (the table's own pairs
# agree within 1.3%: 4,096^3 783.3, 2 x 2,048 x 4,096^2 779.3, 4 x 1,024 x 4,096^2 773.5 TFLOP/s; 4,096 x
# 1,024^2 488.1, 489.0, 489.8). Where several rows fold to one shape the best is kept (as ``gemm_measured``
# keeps the best of a shape). The rows are fractions of H100 SXM's 989 TFLOP/s at the boost clock; the device
# reads them times ``GH100_SUSTAINED`` (a training step runs at the power-limited clock). The top rows reach
# 808.7 (4 x 4,096 x 2,048 x 4,096) and 807.7 (2 x 4,096^3) TFLOP/s: 0.693 sustained against the MSMF ceiling
# 0.706 (the cap). Above them E stays at 0.693 (the module docstring's clamp): the envelope is flat there
# (4 x 4,096^3, the largest GEMM, ran at 793.1, below both), the MSMF is the best of a brute-force search over
# shapes of about the same size (MAMF's A100 best is 6,912 x 16,384 x 2,048, 4.6e11 FLOPs; these rows reach
# 5.5e11), so the 1.9% between them is a shape's, not a size's, and the MSMF spread over its own 40 runs is
# 4.5%: nothing measured says a larger GEMM runs faster.
# The rows are XLA's, not a training stack's: matmul_perf_table_gen compiles each dot with XLA's full pipeline
# (its GEMM autotuner picks the fastest kernel per shape) and reports the median kernel time from a kernel
# tracer (kernel-only, no launch gaps); four rows exceed the H100 MAMF (792.1 TFLOP/s, torch.matmul's best over
# a brute-force shape search). Charged alone they put the NeMo H100 calibration rows 5.5% fast (mean |error|
# 1.8% -> 5.5%), where the Transformer Engine rows of SimuMax (A100 PCIe, at 88% of their device's MAMF at
# 4,096^3 against XLA's 97% of its best) match them: H100 is charged the lower of both (``H100.stack``).
def _fold_batched(rows, peak_tflops: float) -> tuple:
    """(M, N, K, "-", fraction of peak) of (b, m, n, k, FLOP/s) rows, M = b m, the best row of each shape."""
    best: dict = {}
    for b, m, n, k, flops_per_s in rows:
        key = (b * m, n, k)
        best[key] = max(best.get(key, 0.0), flops_per_s / (peak_tflops * 1e12))
    return tuple((m, n, k, "-", eff) for (m, n, k), eff in sorted(best.items()))


H100_BF16 = GemmTable(rows=_fold_batched(simumax.XLA_H100_GEMM, 989.0), peak_tflops=989.0, sms=132,
                      source=f"{XLA_SM90}: 375 BF16 dots (b x m x n x k, batched rows at M = b m), H100 SXM, "
                             "fractions of 989 TFLOP/s at the boost clock, read at the sustained clock "
                             "(times GH100_SUSTAINED, MSMF / MAMF)")
# DeepGEMM grouped FP8 (groups, M per group, N, K, TFLOP/s): contiguous layout (training forward) and masked
# layout (inference decoding), both grouped over M only.
_DEEPGEMM_GROUPED = ((4, 8192, 4096, 7168, 1346), (4, 8192, 7168, 2048, 1214), (8, 4096, 4096, 7168, 1346),
                     (8, 4096, 7168, 2048, 1214), (1, 1024, 4096, 7168, 1233), (1, 1024, 7168, 2048, 925),
                     (2, 512, 4096, 7168, 1040), (2, 512, 7168, 2048, 916), (4, 256, 4096, 7168, 932),
                     (4, 256, 7168, 2048, 815))
H800_FP8_GROUPED = _curve_from_rows(((m, tf / 1979.0) for _, m, _, _, tf in _DEEPGEMM_GROUPED),
                                    f"{DEEPGEMM}: 'Grouped GEMMs for MoE models' (contiguous and masked layouts)")
A100_PCIE_GROUPED = _curve_from_rows(((m, eff) for _, m, _, _, _, eff in simumax.SIMUMAX_A100_GROUPED),
                                     f"{SIMUMAX}: a100_pcie.json group_matmul (BF16, forward and backward)")
B200_GROUPED = _curve_from_rows(((m, eff) for _, m, _, _, _, eff in simumax.SIMUMAX_B200_GROUPED),
                                f"{SIMUMAX}: b200_bf16_ceperm.json group_matmul (BF16, forward and backward)")
# The same rows per direction (SimuMax's fwd, bwd_grad_act, bwd_grad_w), by the source of the envelope they come
# from: the weight-gradient GEMM reduces over the tokens and runs 20-50% below forward at few tokens per expert
# (A100 PCIe at 616: 0.52 against 0.63-0.68; B200 at 512: 0.22 against 0.37-0.43). A table without directions
# (DeepGEMM's FP8 forward rows) charges every direction its envelope.
GROUPED_DIRECTIONS = ("fwd", "bwd_grad_act", "bwd_grad_w")


def _by_direction(rows, source: str) -> dict:
    return {d: _curve_from_rows(((m, eff) for _, m, _, _, dd, eff in rows if dd == d), f"{source}, {d}")
            for d in GROUPED_DIRECTIONS}


GROUPED_BY_DIRECTION = {A100_PCIE_GROUPED.source: _by_direction(simumax.SIMUMAX_A100_GROUPED, A100_PCIE_GROUPED.source),
                        B200_GROUPED.source: _by_direction(simumax.SIMUMAX_B200_GROUPED, B200_GROUPED.source)}

# Measured GEMM ceilings (MAMF, BF16, boost-clock bursts of 100 iterations): A100 SXM 267.9, A100 PCIe 256.4,
# H100 SXM 792.1, GH200 821.0 TFLOP/s (CUDA 12.1/12.5).
MAMF_A100_SXM = 267.9 / 312
MAMF_A100_PCIE = 256.4 / 312
MAMF_H100_SXM = 792.1 / 989
# Sustained ceilings (MSMF, BF16): H200 698.6 TFLOP/s, the mean of 8 GPUs x 5 rounds with every GPU of the node
# computing (n = 40, range 4.5%; GPU0 alone 702.9; MAMF of the same runs 823.9). A training step is a
# sustained load: its GEMMs run at the power-saturated clock (1,405-1,527 MHz there), not at the burst's boost
# clock, so this, not the MAMF, is what a GEMM of a training step may reach on the GH100 die at 700 W. H100 SXM
# is the same die, SM count and 700 W TDP (MAMF table: "H200 is the same"), only its HBM differs: it takes
# H200's sustained ceiling. No MSMF is published for A100; its ceiling stays the MAMF burst (an A100 step is
# costed at least as fast as it may really run). Its sustained clock was measured once: "A100 frequency drop due
# to the power limit (peak 1410MHZ --> ~1200 MHZ)" under FlashAttention-2 (nvidia-smi, liangan1/GPU_travel
# @bc68a95 performance/flash-attn/README.md), 0.851 of the burst, the GH100's MSMF / MAMF (0.848) again. Not
# taken: A100's calibration rows (Korthikanti et al. 2022, all TP 8) ran at the burst rates. At 0.851 on GEMMs
# and attention their 8 time rows come out 9-21% slow (mean +15.4%, from -4..+7%), and no reading of the power
# limit as a duty cycle reconciles them (compute fills 79-83% of their steps; with dynamic power C V^2 f and the
# voltage rising with the clock, power grows about as f^3, so the clock could rise at most (1/0.8)^(1/3) = 1.08x
# above the sustained one, less with any power drawn while communicating, not the 1.18x to the burst; it would
# take power growing no faster than f^1.4 and none while communicating). Measured on the GH100 since (one H200,
# benchmarks/results/hopper_runs.md): back-to-back 8,192^3 products hold 1,485 MHz at 692 W, the same products
# sharing the time with 1 GiB copies 1,620 MHz at three quarters of it and 1,920 MHz at half, and whole training
# steps of GPT-3 350M-2.7B (GEMMs and attention 55-78% of their kernel time) ran at 1,935-1,965 MHz at 571-662 W,
# their GEMMs at 0.81-0.85 of 989: a real step's kernels draw less than the benchmark's random-data products, so the
# f^3 argument above bounds the benchmark, not a step. What clock a multi-GPU step of large GEMMs holds (the
# calibration rows') was not measured; the tables keep the sustained rate. The published data-parallel A100
# runs (tests/unit/test_published_mfu.py) are nearer the sustained clock (21 of 24 cases inside their range at
# 0.851, the 70B ones 0.4-1.7 points below; 17 of 24 at the burst): a plan unlike the TP-8 rows gets that clock's
# spread in its error band
# (``cost.bands.WIDEN["parallelism"]``). B200 keeps its own measured rows (SimuMax; best row 0.655
# of 2,250 TFLOP/s against an MSMF of 1,426.4 = 0.634: the rows are already at the sustained level).
A100_SUSTAINED_CLOCK = 1200 / 1410
MSMF_H200 = 698.6 / 989
# The same runs' sustained over burst ratio (MSMF / MAMF, 698.6 / 823.9): what a burst-timed GH100 table keeps
# under a training step's sustained load. XLA's BF16 rows (``H100_BF16``) were timed as bursts: they take it.
# DeepGEMM's FP8 rows were timed as bursts too and no FP8 MSMF is published: they take the same ratio (an FP8
# GEMM saturates the same 700 W), so FP8/BF16 speedups stay those of the burst measurements.
GH100_SUSTAINED = 698.6 / 823.9
# Transfers of the A100 PCIe shape table: a shape at a given fraction of the measured device's ceiling runs at
# the same fraction of the target device's ceiling. The A100 PCIe rows were timed as bursts (their best, 0.803,
# sits under that device's MAMF 0.822, never above), so the scale maps that MAMF to the target's ceiling: A100
# SXM's MAMF (the same die at 400 W instead of 300 W; no per-shape SXM table was found), GH100's MSMF (H100's
# grouped GEMMs only: its dense BF16 GEMMs read its own rows, ``H100_BF16``).
A100_SXM_SCALE = MAMF_A100_SXM / MAMF_A100_PCIE
H100_SCALE = MSMF_H200 / MAMF_A100_PCIE


def _fa3(xs, ys, what: str) -> Curve:
    return Curve(xs, tuple(y / 989.0 for y in ys), f"{FA3_PAPER}: {what}")


SEQS = (512, 1024, 2048, 4096, 8192, 16384)
# H100 SXM5, BF16, TFLOP/s read off the FA3 paper's bars (512 .. 16k tokens). The causal panels are the ones
# whose standard-attention bars stay under 40 TFLOP/s (masking makes unfused attention slower still). At 512
# tokens the non-causal hd-128 labels of cuDNN and FA3 read 497 / 467 or 467 / 497 in two transcriptions: the
# lower is taken for both. The backward figure (Fig. 6) has no causal panel.
H100_ATTENTION = {
    ("fa3", "fwd", False, 128): _fa3(SEQS, (467, 565, 625, 638, 646, 648), "fwd, hd 128"),
    ("fa3", "fwd", True, 128): _fa3(SEQS, (292, 423, 521, 579, 602, 616), "fwd causal, hd 128"),
    ("fa3", "fwd", False, 64): _fa3(SEQS, (333, 392, 460, 476, 496, 497), "fwd, hd 64"),
    ("fa3", "fwd", True, 64): _fa3(SEQS, (197, 265, 371, 420, 460, 473), "fwd causal, hd 64"),
    ("fa3", "fwd", True, 256): _fa3(SEQS, (286, 427, 537, 612, 628, 642), "fwd causal, hd 256"),
    ("fa3", "bwd", False, 128): _fa3(SEQS, (316, 424, 501, 542, 559, 561), "bwd, hd 128"),
    ("fa2", "fwd", False, 128): _fa3(SEQS, (309, 350, 362, 368, 370, 370), "FlashAttention-2 fwd, hd 128"),
    ("fa2", "fwd", True, 128): _fa3(SEQS, (191, 260, 298, 319, 333, 335), "FlashAttention-2 fwd causal, hd 128"),
    ("fa2", "fwd", False, 64): _fa3(SEQS, (282, 306, 318, 321, 322, 324), "FlashAttention-2 fwd, hd 64"),
    ("fa2", "fwd", True, 64): _fa3(SEQS, (180, 229, 262, 284, 295, 299), "FlashAttention-2 fwd causal, hd 64"),
    ("fa2", "fwd", True, 256): _fa3(SEQS, (208, 251, 278, 293, 297, 298), "FlashAttention-2 fwd causal, hd 256"),
    ("fa2", "bwd", False, 128): _fa3(SEQS, (214, 260, 291, 310, 318, 322), "FlashAttention-2 bwd, hd 128"),
    ("cudnn", "fwd", False, 128): _fa3(SEQS, (467, 574, 617, 609, 600, 595), "cuDNN fwd, hd 128"),
    ("cudnn", "fwd", True, 128): _fa3(SEQS, (315, 410, 484, 518, 529, 539), "cuDNN fwd causal, hd 128"),
    ("cudnn", "fwd", False, 64): _fa3(SEQS, (335, 373, 395, 408, 412, 413), "cuDNN fwd, hd 64"),
    ("cudnn", "fwd", True, 64): _fa3(SEQS, (225, 288, 334, 363, 379, 388), "cuDNN fwd causal, hd 64"),
    ("cudnn", "fwd", True, 256): _fa3(SEQS, (308, 391, 450, 483, 497, 509), "cuDNN fwd causal, hd 256"),
    ("cudnn", "bwd", False, 128): _fa3(SEQS, (305, 408, 465, 499, 518, 516), "cuDNN bwd, hd 128"),
    # standard attention (unfused PyTorch: two batched GEMMs, softmax, masking) runs out of memory at 16k
    ("unfused", "fwd", False, 128): _fa3(SEQS[:5], (74, 100, 119, 133, 139), "standard attention fwd, hd 128"),
    ("unfused", "fwd", True, 128): _fa3(SEQS[:5], (26, 31, 34, 35, 35), "standard attention fwd causal, hd 128"),
    ("unfused", "fwd", False, 64): _fa3(SEQS[:5], (52, 63, 67, 72, 73), "standard attention fwd, hd 64"),
    ("unfused", "fwd", True, 64): _fa3(SEQS[:5], (16, 18, 18, 18, 18), "standard attention fwd causal, hd 64"),
    ("unfused", "bwd", False, 128): _fa3(SEQS[:5], (104, 131, 159, 174, 181), "standard attention bwd, hd 128"),
}


def _a100_fa2() -> dict:
    """FlashAttention-2 on A100: the paper's long-sequence fractions (``FA2_PAPER``: 0.73 forward, 0.63
    backward, hd 128, not causal) times the shape of the same kernel's curves on H100 (``H100_ATTENTION``
    "fa2", each point over the non-causal 16k value of its direction). A transfer of shape, not a measurement
    of A100 at every seq: the A100 figure's per-seq labels were not at hand (``A100.transfers``)."""
    out = {}
    for (kernel, direction, causal, hd), curve in H100_ATTENTION.items():
        if kernel != "fa2":
            continue
        ref = H100_ATTENTION[("fa2", direction, False, 128)].ys[-1]
        top = 0.73 if direction == "fwd" else 0.63
        out[(kernel, direction, causal, hd)] = Curve(curve.xs, tuple(top * y / ref for y in curve.ys),
                                                    f"{FA2_PAPER}, shaped by {curve.source}")
    return out


def _simumax_te(rows, peak_note: str) -> Curve:
    """SimuMax's causal Transformer Engine attention rows with head dims 128/128, executed fraction
    (``SIMUMAX_CAUSAL_FLOPS``), upper envelope over seq of all head counts (batch 1)."""
    pts = [(s, eff * SIMUMAX_CAUSAL_FLOPS) for b, s, hq, hk, dqk, dv, eff in rows if dqk == dv == 128]
    return _curve_from_rows(pts, f"{SIMUMAX}: {peak_note}, causal, head dim 128, batch 1")


A100_TE = {("te", "fwd", True, 128): _simumax_te(simumax.SIMUMAX_A100_SDP_FWD, "a100_pcie.json sdp_fwd"),
           ("te", "bwd", True, 128): _simumax_te(simumax.SIMUMAX_A100_SDP_BWD, "a100_pcie.json sdp_bwd")}
B200_TE = {("te", "fwd", True, 128): _simumax_te(simumax.SIMUMAX_B200_SDP_FWD, "b200_bf16_ceperm.json sdp_fwd"),
           ("te", "bwd", True, 128): _simumax_te(simumax.SIMUMAX_B200_SDP_BWD, "b200_bf16_ceperm.json sdp_bwd")}

# Fractions of the datasheet HBM bandwidth (``GPU_BENCHES``, 100% occupancy): init = 1 store stream, read =
# 1 load, scale = 1 load + 1 store (an elementwise op), triad = 2 loads + 1 store (a binary op, a residual add).
HBM_PATTERNS = ("init", "read", "scale", "triad")
_A100_HBM = {"init": 1880 / 2039, "read": 1769 / 2039, "scale": 1732 / 2039, "triad": 1759 / 2039}
# (H100 PCIe over 2,039 GB/s, the peak gpu-benches' own gpu-stream/plot.py divides it by; its datasheet rounds
# to 2 TB/s, which the 2,016 GB/s store stream would exceed.)
_H100_PCIE_HBM = {"init": 2016 / 2039, "read": 1942 / 2039, "scale": 1704 / 2039, "triad": 1832 / 2039}
_H200_HBM = {"init": 3884 / 4800, "read": 2756 / 4800, "scale": 3165 / 4800, "triad": 3534 / 4800}

# A GEMM's operands are rows of its weight's dimensions (Y[M,N] = X[M,K] W[K,N]: X's rows are K long, W's and
# Y's N long, in every layout of its three GEMMs); cuBLAS's fast Tensor Core kernels load 16-byte vectors (and on
# Hopper by TMA, whose strides must be multiples of 16 bytes: CUDA driver API cuTensorMapEncodeTiled), so a row of
# BF16 elements that is no multiple of 8 leaves it kernels that load 2, 4 or 8 bytes at a time (NVIDIA's "Matrix
# Multiplication Background User's Guide", Tensor Core requirements: "multiples of 8" for FP16/BF16, most efficient
# when aligned). Measured on the GH100 (H200): an odd width (50,257, GPT-2's vocabulary) 0.15-0.21 of the aligned
# rate, a width of 2 or 4 times an odd number (50,258, 50,260; GPT-3 13B's hidden 5,140) 0.30-0.43. Rows: (out,
# in, layout, TFLOP/s, aligned out, aligned in, aligned TFLOP/s), rounded to 0.1 TFLOP/s.
ALIGN_ELEMENTS = 8
GH100_ALIGNMENT = AlignmentTable(source=HOPPER_ALIGNMENT, rows=(
    (50257, 2048, "TN", 99.0, 50304, 2048, 648.1), (50257, 2048, "NN", 142.5, 50304, 2048, 695.5),
    (50257, 2048, "NT", 148.5, 50304, 2048, 705.8),
    (50258, 2048, "TN", 278.0, 50304, 2048, 648.1), (50258, 2048, "NN", 246.9, 50304, 2048, 695.5),
    (50258, 2048, "NT", 280.9, 50304, 2048, 705.8),
    (50260, 2048, "TN", 279.0, 50304, 2048, 648.1), (50260, 2048, "NN", 248.2, 50304, 2048, 695.5),
    (50260, 2048, "NT", 282.6, 50304, 2048, 705.8),
    (5140, 5140, "TN", 214.1, 5120, 5120, 690.4), (5140, 5140, "NN", 228.6, 5120, 5120, 688.7),
    (5140, 5140, "NT", 217.2, 5120, 5120, 717.6),
    (20560, 5140, "TN", 236.2, 20480, 5120, 699.4), (20560, 5140, "NN", 237.9, 20480, 5120, 669.9),
    (20560, 5140, "NT", 235.9, 20480, 5120, 668.5)))

A100 = DeviceKernels(
    name="A100-SXM4-80GB", sms=108, peak_tflops={"bf16": 312.0, "fp16": 312.0},
    gemm={"bf16": (A100_PCIE_BF16, A100_SXM_SCALE)}, grouped={"bf16": (A100_PCIE_GROUPED, A100_SXM_SCALE)},
    attention={**_a100_fa2(), **A100_TE}, hbm=dict(_A100_HBM),
    ceiling={"bf16": (MAMF_A100_SXM, f"{MAMF}: A100 SXM 267.9 of 312 TFLOP/s at 6912x16384x2048, CUDA 12.1")},
    transfers={
        "gemm": "SimuMax's A100 PCIe shapes (the only per-shape A100 table found) times the ratio of the measured "
                f"ceilings A100 SXM / A100 PCIe = {A100_SXM_SCALE:.4f} ({MAMF})",
        "grouped": "A100 PCIe grouped rows, same ratio",
        "attention fa2": "FlashAttention-2 paper's A100 fractions, shaped over seq by the same kernel on H100",
        "attention te": "A100 PCIe measurements, unscaled (attention is not the GEMM ceiling)",
    })

H100 = DeviceKernels(
    name="H100-SXM5-80GB", sms=132, peak_tflops={"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0},
    gemm={"bf16": (H100_BF16, GH100_SUSTAINED), "fp8": (H800_FP8, GH100_SUSTAINED)},
    grouped={"bf16": (A100_PCIE_GROUPED, H100_SCALE), "fp8": (H800_FP8_GROUPED, GH100_SUSTAINED)},
    attention=dict(H100_ATTENTION), hbm=dict(_H100_PCIE_HBM), stack={"bf16": (A100_PCIE_BF16, H100_SCALE)},
    alignment={"bf16": GH100_ALIGNMENT},
    ceiling={"bf16": (MSMF_H200, f"{MSMF}: H200 SXM 698.6 of 989 TFLOP/s sustained (8 GPUs x 5 rounds, "
                                 "torch 2.14 + CUDA 13.0), the GH100 die of H100 SXM at the same 700 W"),
             "fp8": (1520 / 1979 * GH100_SUSTAINED, f"{DEEPGEMM}: best dense row, 4096x7168x16384 at 1,520 "
                                                    "TFLOP/s, at the sustained clock (GH100_SUSTAINED)")},
    transfers={
        "gemm bf16 (charged)": "the charged rate is also capped by a training stack's GEMMs (DeviceKernels.stack): "
                               "XLA's rows are autotuned kernel-only timings, above what torch.matmul reaches on "
                               "H100 at any shape (MAMF 792.1 TFLOP/s; XLA's best 808.7), and no per-shape H100 "
                               "table of a training stack was found: SimuMax's A100 PCIe Transformer Engine shapes "
                               "at the same ideal time times the ratio of the measured ceilings, GH100 sustained "
                               f"(MSMF, H200) / A100 PCIe burst (MAMF) = {H100_SCALE:.4f}",
        "grouped bf16": "no per-tokens H100 BF16 grouped-GEMM table was found: A100 PCIe grouped rows times the "
                        "ratio of the measured ceilings, GH100 sustained (MSMF, H200) / A100 PCIe burst (MAMF) = "
                        f"{H100_SCALE:.4f}",
        "gemm fp8": "DeepGEMM on H800 SXM5: the same GH100 die, clocks and FP8 peak as H100 SXM5; burst timings "
                    f"times the GH100's sustained/burst ratio {GH100_SUSTAINED:.4f} (MSMF)",
        "hbm": "no H100 SXM measurement found: H100 PCIe (HBM2e, 2,039 GB/s) from the same benchmark, the upper of "
               "the two GH100 parts measured (H200, HBM3e: init 0.81, scale 0.66)",
    })

# A per-shape table of a PyTorch stack's GEMMs on the GH100 was measured since (benchmarks/hopper_measure.py on one
# H200: 137 aligned shapes of GPT-3 layers, cuBLAS through torch 2.11, back to back at the power-limited clock;
# benchmarks/results/hopper_runs.md): 0.60-0.78 of 989 where the A100 transfer charges 0.48-0.63. Taken as H100's
# and H200's stack table it makes the NeMo H100 calibration rows 4.1% fast (mean |error| from 1.9%) and the A100
# rows' leave-one-source-out error 8.5% (from 3.2%): not taken. Those multi-GPU Transformer Engine runs ran slower
# than one GPU's PyTorch GEMMs; what clock they held was not measured.
# H200: the GH100 die of H100 SXM5 (132 SMs, 989 BF16 TFLOP/s) with 141 GB of HBM3e at 4.8 TB/s: its compute
# kernels are H100's; its HBM fractions are its own measurement.
H200 = DeviceKernels(
    name="H200", sms=132, peak_tflops=dict(H100.peak_tflops), gemm=dict(H100.gemm), grouped=dict(H100.grouped),
    attention=dict(H100.attention), hbm=dict(_H200_HBM), ceiling=dict(H100.ceiling), stack=dict(H100.stack),
    alignment=dict(H100.alignment),
    transfers={"gemm, grouped, attention": "H100 SXM5's tables: the same GH100 die, SM count, clocks and 700 W; "
                                           "only HBM differs (the sustained GEMM ceiling is H200's own MSMF)",
               **{k: v for k, v in H100.transfers.items() if k != "hbm"}})

B200 = DeviceKernels(
    name="B200", sms=None, peak_tflops={"bf16": 2250.0, "fp16": 2250.0},
    gemm={"bf16": (B200_BF16, 1.0)}, grouped={"bf16": (B200_GROUPED, 1.0)}, attention=dict(B200_TE),
    hbm=dict(_H200_HBM),
    transfers={"hbm": "no B200 STREAM measurement found: H200's fractions (HBM3e too); SimuMax's B200 bandwidth "
                      "factors are starter values by its own docs/system.md, not used",
               "wave": "no cited SM count: wave = 1"})

# Blackwell Ultra (B300; GB300's GPU): no per-shape kernel table of its own was found. Its dense BF16/FP16 Tensor
# Core peak is B200's (HGX B300 and HGX B200 specs: 36 PFLOP/s FP16/BF16 with sparsity for 8 GPUs), on the same
# Blackwell SM and HBM3e at 8 TB/s; what differs (more dense FP4, less INT8/FP64, doubled attention SFU
# throughput) is in no table here. It reads B200's tables as a stated transfer, as H200 reads H100's.
B300 = DeviceKernels(
    name="B300", sms=None, peak_tflops=dict(B200.peak_tflops), gemm=dict(B200.gemm), grouped=dict(B200.grouped),
    attention=dict(B200.attention), hbm=dict(B200.hbm), ceiling=dict(B200.ceiling), stack=dict(B200.stack),
    transfers={"gemm, grouped, attention": "no Blackwell Ultra kernel table found: B200's (SimuMax), the same dense "
                                           "BF16/FP16 Tensor Core peak (2,250 TFLOP/s per HGX GPU) and Blackwell SM; "
                                           "its faster softmax exponentials (2x SFU) are not modelled",
               **B200.transfers})

# Ascend 910B: no per-shape kernel table was found for it. Its presets already reuse A100's fractions (a device
# of the same dense FP16 peak, 313 vs 312 TFLOP/s); the kernels do the same, as a stated transfer, not a
# measurement, and without a wave model (its cube units are not SMs).
ASCEND_910B = DeviceKernels(
    name="Ascend-910B", sms=None, peak_tflops={"bf16": 313.0, "fp16": 313.0},
    gemm=dict(A100.gemm), grouped=dict(A100.grouped), attention=dict(A100.attention), hbm=dict(A100.hbm),
    transfers={"all": "no published Ascend 910B kernel table found: A100-SXM4-80GB's tables (same dense FP16 peak; "
                      "the presets' existing transfer), no wave model"})

DEVICES = {d.name: d for d in (A100, H100, H200, B200, B300, ASCEND_910B)}
# names the hardware presets and users write, upper-cased, -> device
_ALIASES = {"A100": "A100-SXM4-80GB", "A100-SXM4-80GB": "A100-SXM4-80GB", "H100": "H100-SXM5-80GB",
            "H100-SXM5-80GB": "H100-SXM5-80GB", "H200": "H200", "B200": "B200", "B300": "B300",
            "ASCEND-910B": "Ascend-910B",
            "910B": "Ascend-910B"}


# -- lookups -----------------------------------------------------------------------------------------------------
def device_kernels(device) -> DeviceKernels:
    """The tables of ``device`` (a name such as ``A100-SXM4-80GB`` or ``H100``, or an object with ``.name``)."""
    name = getattr(device, "name", device)
    key = str(name).upper()
    hit = _ALIASES.get(key) or next((v for k, v in sorted(_ALIASES.items(), key=lambda kv: -len(kv[0]))
                                     if k in key), None)
    if hit is None:
        raise PlanError(f"no kernel tables for device {name!r}." + did_you_mean(str(name), DEVICES))
    return DEVICES[hit]


def _gemm_table(dev: DeviceKernels, dtype: str):
    if dtype not in dev.gemm:
        raise PlanError(f"no GEMM table for {dtype} on {dev.name}; it has {', '.join(sorted(dev.gemm))}")
    return dev.gemm[dtype]


def _cap(dev: DeviceKernels, dtype: str) -> float:
    """The most any ``dtype`` GEMM lookup returns on ``dev``: its measured ceiling (``DeviceKernels.ceiling``), at
    most the peak."""
    return min(dev.ceiling.get(dtype, (1.0,))[0], 1.0)


def gemm_efficiency(device, m: float, n: float, k: float, dtype: str = "bf16") -> float:
    """Fraction of ``device``'s dense ``dtype`` peak a GEMM of output M x N and reduction K may reach
    (the module docstring's GEMM rule), capped at the device's measured ceiling."""
    dev = device_kernels(device)
    table, scale = _gemm_table(dev, dtype)
    if min(m, n, k) <= 0:
        raise PlanError(f"GEMM shape {m} x {n} x {k}: every dimension must be positive")
    xs, ys = _gemm_envelope(table)
    # the table's FLOPs at the same ideal time (FLOPs / peak) on the measured device
    f = 2.0 * m * n * k * table.peak_tflops / dev.peak_tflops[dtype]
    return min(interp_log(xs, ys, f) * scale, _cap(dev, dtype))


def gemm_measured(device, m: int, n: int, k: int, dtype: str = "bf16") -> float | None:
    """The measured fraction of exactly this shape (best over layouts), scaled as ``gemm_efficiency``; None
    when the table has no such row."""
    dev = device_kernels(device)
    table, scale = _gemm_table(dev, dtype)
    hits = [eff for rm, rn, rk, _, eff in table.rows if (rm, rn, rk) == (m, n, k)]
    return min(max(hits) * scale, 1.0) if hits else None


def gemm_nearest(device, m: float, n: float, k: float, dtype: str = "bf16") -> tuple[tuple, float]:
    """The measured row nearest to (M, N, K) in log space (Euclidean over log M, log N, log K) and its
    fraction scaled as ``gemm_efficiency``: a shape-matched measurement beside the envelope's bound (for a
    transferred table the row is the measured device's, at the same shape)."""
    dev = device_kernels(device)
    table, scale = _gemm_table(dev, dtype)
    q = (math.log(m), math.log(n), math.log(k))
    row = min(table.rows, key=lambda r: sum((math.log(v) - w) ** 2 for v, w in zip(r[:3], q)))
    return row[:3], min(row[4] * scale, _cap(dev, dtype))


def grouped_gemm_efficiency(device, tokens_per_expert: float, dtype: str = "bf16") -> float:
    """Fraction of peak an expert GEMM grouped over experts reaches with ``tokens_per_expert`` rows per
    expert (the module docstring's grouped rule)."""
    dev = device_kernels(device)
    if dtype not in dev.grouped:
        raise PlanError(f"no grouped-GEMM table for {dtype} on {dev.name}; it has {', '.join(sorted(dev.grouped))}")
    if tokens_per_expert <= 0:
        raise PlanError(f"tokens per expert must be positive, got {tokens_per_expert}")
    curve, scale = dev.grouped[dtype]
    return min(interp_log(curve.xs, curve.ys, tokens_per_expert) * scale, 1.0)


def grouped_direction_efficiency(device, tokens_per_expert: float, dtype: str = "bf16", direction: str = "fwd"
                                 ) -> float:
    """Fraction of peak one direction of a grouped expert GEMM reaches (``GROUPED_DIRECTIONS``: forward, input
    gradient, weight gradient): its own rows' curve at the device's scale, never above the envelope
    (``grouped_gemm_efficiency``); the envelope where the table has no directions."""
    if direction not in GROUPED_DIRECTIONS:
        raise PlanError(f"grouped GEMM direction {direction!r}; use one of {', '.join(GROUPED_DIRECTIONS)}")
    e = grouped_gemm_efficiency(device, tokens_per_expert, dtype)
    curve, scale = device_kernels(device).grouped[dtype]
    by = GROUPED_BY_DIRECTION.get(curve.source)
    if by is None:
        return e
    own = by[direction]
    return min(interp_log(own.xs, own.ys, tokens_per_expert) * scale, e)


def attention_kernels(device) -> list[str]:
    return sorted({key[0] for key in device_kernels(device).attention})


def attention_efficiency(device, kernel: str, seq: float, head_dim: float, causal: bool = True,
                         backward: bool = False) -> float:
    """Fraction of the BF16 peak a fused attention ``kernel`` (``fa2``, ``fa3``, ``cudnn``, ``te``,
    ``unfused``: whichever the device has) reaches at ``seq`` keys per query and ``head_dim`` (the module
    docstring's attention rule), in executed FLOPs."""
    dev = device_kernels(device)
    direction = "bwd" if backward else "fwd"
    have = [key for key in dev.attention if key[0] == kernel and key[1] == direction]
    if not have:
        kinds = sorted({f"{k[0]} {k[1]}" for k in dev.attention})
        raise PlanError(f"no {direction} attention table for kernel {kernel!r} on {dev.name}; it has "
                        f"{', '.join(kinds)}")
    if seq <= 0 or head_dim <= 0:
        raise PlanError(f"attention seq {seq} and head dim {head_dim} must be positive")
    flags = {key[2] for key in have}
    if causal in flags:
        flag = causal
    elif causal:
        flag = False  # no causal curve published: the non-causal one bounds it
    else:
        raise PlanError(f"no non-causal {direction} attention table for kernel {kernel!r} on {dev.name}")
    dims = sorted(key[3] for key in have if key[2] == flag)
    at = [interp_log(dev.attention[(kernel, direction, flag, d)].xs, dev.attention[(kernel, direction, flag, d)].ys,
                     seq) for d in dims]
    return min(interp_log(tuple(dims), tuple(at), head_dim), 1.0)


def hbm_fraction(device, pattern: str = "scale") -> float:
    """Measured fraction of ``device``'s HBM bandwidth a streaming kernel of ``pattern`` reaches
    (``HBM_PATTERNS``; ``scale``, one load and one store stream, is an elementwise op)."""
    dev = device_kernels(device)
    if pattern not in dev.hbm:
        raise PlanError(f"HBM pattern {pattern!r}; use one of {', '.join(HBM_PATTERNS)}")
    return dev.hbm[pattern]


def all_tables():
    """(device, kind, key, table, source) for every table: what the tests check and the report lists."""
    out = []
    for dev in DEVICES.values():
        for dtype, (table, _) in dev.gemm.items():
            out.append((dev.name, "gemm", dtype, table, table.source))
        for dtype, (curve, _) in dev.grouped.items():
            out.append((dev.name, "grouped", dtype, curve, curve.source))
        for key, curve in dev.attention.items():
            out.append((dev.name, "attention", key, curve, curve.source))
        out.append((dev.name, "hbm", "all", dev.hbm, GPU_BENCHES))
        for dtype, table in dev.alignment.items():
            out.append((dev.name, "alignment", dtype, table, table.source))
    return out


# -- the cost model's lookups (memoised: the evaluator asks once per op shape) -----------------------------------
# A table's layout of each GEMM of a linear layer Y[M,N] = X[M,K] W[K,N] (``kernels_data``): the forward is TN
# (M, N, K), the input gradient NN (M, K, N: output M x K, reduced over N), the weight gradient NT (N, K, M:
# output N x K, reduced over the M tokens).
GEMM_LAYOUTS = ("TN", "NN", "NT")


class _ShapeIndex(NamedTuple):
    """A GEMM table as the shape lookups read it: per layout (``by``; every row under ``-`` when the table
    records no layout, all rows under ``*``), the rows' (log M, log N, log K) and efficiencies; the envelope
    (``xs``, ``ys``) and the conversions of ``gemm_efficiency``; ``lo``, the table's measured box (the
    smallest log M, log N, log K of its rows)."""

    by: dict
    xs: tuple
    ys: tuple
    scale: float
    cap: float
    ratio: float
    lo: np.ndarray


@functools.cache
def _shape_index(device_name: str, dtype: str, stack: bool = False) -> _ShapeIndex:
    """The ``_ShapeIndex`` of the device's GEMM table for ``dtype``; of its ``stack`` table with ``stack``."""
    dev = DEVICES[device_name]
    table, scale = dev.stack[dtype] if stack else _gemm_table(dev, dtype)
    rows: dict = {}
    for m, n, k, layout, eff in table.rows:
        rows.setdefault(layout if layout in GEMM_LAYOUTS else "-", []).append(
            (math.log(m), math.log(n), math.log(k), eff))
    # per layout: (log M, log N, log K) rows and their efficiencies as arrays (the nearest-row scan is hot)
    by = {layout: (np.array([r[:3] for r in group]), [r[3] for r in group]) for layout, group in rows.items()}
    every = [r for group in rows.values() for r in group]
    by["*"] = (np.array([r[:3] for r in every]), [r[3] for r in every])
    xs, ys = _gemm_envelope(table)
    return _ShapeIndex(by, xs, ys, scale, _cap(dev, dtype), table.peak_tflops / dev.peak_tflops[dtype],
                       by["*"][0].min(axis=0))


def table_dtype(device, dtype: str) -> str:
    """The GEMM table a ``dtype`` reads on ``device``: its own, else BF16's (FP16 runs the same Tensor Core
    rate; another dtype without a table reads BF16's fractions of its own peak)."""
    dev = device_kernels(device)
    return dtype if dtype in dev.gemm else "bf16"


@functools.lru_cache(maxsize=65536)
def gemm_shape_efficiency(device_name: str, m: float, n: float, k: float, dtype: str, layout: str,
                          groups: float = 1.0) -> float:
    """Fraction of peak the cost model charges one GEMM of output M x N reduced over K in ``layout``
    (``GEMM_LAYOUTS``; ``groups`` such GEMMs batched in one kernel): the measured row of that layout nearest
    in shape (Euclidean over log M, log N, log K, as ``gemm_nearest``), scaled as ``gemm_efficiency``, never
    above the envelope at its FLOPs (``gemm_efficiency``: what the device was measured to allow at that size)
    nor above the device's ceiling times the output's tile and wave fill (``wave`` over the groups' tiles:
    the rows are 4,096 tokens and more, so a far smaller output, such as a tiny model's or a thin shard's,
    is bounded by the quantisation NVIDIA's guide describes, not extrapolated at the smallest row's rate).
    A shape-matched measurement where the table has one near, the size's bound where it has none. A device
    with a ``stack`` table (``DeviceKernels.stack``) is charged the lower of this rule on its own table and
    the same rule on the stack table where the shape lies inside its own table's measured box (every dim at
    least the table's smallest: XLA's H100 rows start at 256), and the stack table's rule alone below it (a
    table bounds the range it measured: below it the nearest row is an extrapolation, whose steps between
    far-apart rows would make a split GEMM cheaper per FLOP than the whole, which no kernel does)."""
    index = _shape_index(device_name, dtype)
    own = _shape_rule(index, m, n, k, layout, groups, DEVICES[device_name].sms)
    if dtype not in DEVICES[device_name].stack:
        return own
    stack = _shape_rule(_shape_index(device_name, dtype, True), m, n, k, layout, groups, DEVICES[device_name].sms)
    return min(own, stack) if _inside(index, m * groups, n, k) else stack


def _inside(index: _ShapeIndex, m: float, n: float, k: float) -> bool:
    """Whether the GEMM (M, N, K) has every dim at least the smallest the table measured in it (``index.lo``)."""
    lo = index.lo
    return math.log(m) >= lo[0] - 1e-9 and math.log(n) >= lo[1] - 1e-9 and math.log(k) >= lo[2] - 1e-9


def _shape_rule(index: _ShapeIndex, m, n, k, layout, groups, sms) -> float:
    by, xs, ys, scale, cap, ratio, _ = index
    bound = min(interp_log(xs, ys, 2.0 * m * n * k * groups * ratio) * scale, cap, cap * wave(m * groups, n, sms))
    logs, effs = by.get(layout) or by.get("-") or by["*"]
    d = logs - (math.log(m), math.log(n), math.log(k))
    return min(effs[int(np.einsum("ij,ij->i", d, d).argmin())] * scale, bound)


def aligned_elements(width: float) -> int:
    """The largest power of two, at most ``ALIGN_ELEMENTS``, that divides ``width`` (1 for an odd width)."""
    w, a = int(width), 1
    while a < ALIGN_ELEMENTS and w % (2 * a) == 0:
        a *= 2
    return a


def alignment_class(out: float, inp: float) -> int:
    """The alignment class of a GEMM's weight ``out`` x ``inp``: ``aligned_elements`` of its less aligned dimension
    (1, 2 or 4; ``ALIGN_ELEMENTS`` when both are aligned)."""
    return min(aligned_elements(out), aligned_elements(inp))


@functools.cache
def alignment_means(device_name: str, dtype: str) -> dict:
    """(alignment class, layout) -> the mean over the device's measured rows of that class of unaligned over
    aligned TFLOP/s; the class of a row is its weight's ``alignment_class``."""
    table = device_kernels(device_name).alignment.get(dtype)
    by: dict = {}
    for out, inp, layout, tf, _, _, aligned in table.rows if table else ():
        key = (alignment_class(out, inp), layout)
        by.setdefault(key, []).append(tf / aligned)
    return {key: sum(v) / len(v) for key, v in by.items()}


def alignment_factor(device_name: str, out: float, inp: float, dtype: str, layout: str, measured=()) -> float:
    """The fraction of its aligned rate a GEMM of weight ``out`` x ``inp`` runs at in ``layout`` on the device
    (``ALIGN_ELEMENTS``): 1 where both are multiples of 8 or nothing was measured, else the mean measured ratio of
    its class: ``measured``, the (class, fraction) pairs a cluster file's profile measured (every layout alike;
    ``Efficiency.unaligned``), else the device's table for ``dtype`` (``alignment_means``); a class not measured
    reads the nearest lower one measured, an odd width's at worst."""
    a = alignment_class(out, inp)
    if a >= ALIGN_ELEMENTS:
        return 1.0
    means = ({(c, lay): f for c, f in measured for lay in GEMM_LAYOUTS} if measured
             else alignment_means(device_name, dtype) if device_name else {})
    if not means:
        return 1.0
    lower = [c for c, lay in means if lay == layout and c <= a] or [min(c for c, _ in means)]
    return means[(max(lower), layout)]


@functools.lru_cache(maxsize=65536)
def gemm_bound(device_name: str, flops: float, dtype: str) -> float:
    """``gemm_efficiency`` of a GEMM of ``flops`` (its envelope: no shape of these FLOPs was measured faster)."""
    _, xs, ys, scale, cap, ratio, _ = _shape_index(device_name, dtype)
    return min(interp_log(xs, ys, flops * ratio) * scale, cap)


@functools.lru_cache(maxsize=4096)
def grouped_efficiency(device_name: str, tokens_per_expert: float, dtype: str) -> float:
    """Memoised ``grouped_gemm_efficiency`` (BF16's table for a dtype without its own)."""
    dev = DEVICES[device_name]
    return grouped_gemm_efficiency(dev.name, tokens_per_expert, dtype if dtype in dev.grouped else "bf16")


@functools.lru_cache(maxsize=4096)
def grouped_direction(device_name: str, tokens_per_expert: float, dtype: str, direction: str) -> float:
    """Memoised ``grouped_direction_efficiency`` (BF16's table for a dtype without its own)."""
    dev = DEVICES[device_name]
    return grouped_direction_efficiency(dev.name, tokens_per_expert, dtype if dtype in dev.grouped else "bf16",
                                        direction)


@functools.lru_cache(maxsize=64)
def grouped_ceiling(device_name: str, dtype: str) -> float:
    """The best grouped-GEMM fraction of ``device`` at any tokens per expert."""
    dev = DEVICES[device_name]
    curve, scale = dev.grouped[dtype if dtype in dev.grouped else "bf16"]
    return min(max(curve.ys) * scale, 1.0)


@functools.lru_cache(maxsize=16384)
def attention_table(device_name: str, kernel: str, seq: float, head_dim: float, causal: bool,
                    backward: bool) -> float:
    """Memoised ``attention_efficiency``."""
    return attention_efficiency(device_name, kernel, seq, head_dim, causal, backward)


@functools.lru_cache(maxsize=256)
def attention_ceiling(device_name: str, kernel: str, backward: bool) -> float:
    """The best fraction any ``kernel`` curve of that direction reaches on ``device`` (any seq, head dim and
    causality): what no piece of an attention op beats."""
    direction = "bwd" if backward else "fwd"
    curves = [c for key, c in DEVICES[device_name].attention.items() if key[0] == kernel and key[1] == direction]
    if not curves:
        raise PlanError(f"no {direction} attention table for kernel {kernel!r} on {device_name}")
    return min(max(max(c.ys) for c in curves), 1.0)


def has_attention(device, kernel: str) -> bool:
    """Whether ``device`` has forward and backward tables of ``kernel``."""
    have = {(key[0], key[1]) for key in device_kernels(device).attention}
    return (kernel, "fwd") in have and (kernel, "bwd") in have
