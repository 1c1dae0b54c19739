"""What ``symtensor profile`` measures: the shapes, sizes and time budgets, per device class.

A GPU grid spans the shapes of LLaMA-scale training (GEMMs from skinny 16-row products to 8192^3,
attention from 512 to 8192 tokens, messages from 1 KiB to 1 GiB); a CPU grid is the same design
at sizes a few processes of one CPU finish in seconds. ``--quick`` keeps a few points per curve.
Every point is timed for at most ``point_budget_s`` after one warm-up call, so the grid bounds the
run: the GPU default is about 140 points of 0.25 s at most (the issue's bound: 5 minutes on 8 GPUs),
``--quick`` about 55 of 0.05 s (bound: 1 minute), plus process start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

from symtensor.cost.kernels import ALIGN_ELEMENTS

STEP_MARK = "symtensor-profile-step"  # rank 0 prints "STEP_MARK done total what" per point
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")  # the collectives measured
MEMORY_KERNELS = ("copy", "rmsnorm", "swiglu", "softmax")


@dataclass(frozen=True, slots=True, kw_only=True)
class Grid:
    """The benchmark points of one run.

    Attributes:
        gemm: (M, N, K) of ``[M, K] @ [K, N]``.
        bmm: (batch, M, N, K) of a batched product of two activations.
        attention: (batch, heads, seq, head_dim, causal) of fused scaled_dot_product_attention.
        memory: (kernel, elements) of memory-bound kernels (``MEMORY_KERNELS``).
        message_bytes: collective message sizes (``cost.collectives`` definitions of the size).
        norm_width: the row length of the normalised and soft-maxed tensors.
        point_budget_s: seconds of timed repetitions per point at most.
        unaligned: (M, N, K) of ``[M, K] @ [K, N]`` with N or K no multiple of 8 (an odd one, 2 and 4 times an odd
            one), each timed with its aligned twin (N and K rounded down to multiples of 8: ``aligned_twin``): what
            cuBLAS's unaligned kernels cost on this device (``cost.kernels.alignment_factor``).
    """

    gemm: tuple[tuple[int, int, int], ...]
    bmm: tuple[tuple[int, int, int, int], ...]
    attention: tuple[tuple[int, int, int, int, bool], ...]
    memory: tuple[tuple[str, int], ...]
    message_bytes: tuple[int, ...]
    norm_width: int
    point_budget_s: float
    unaligned: tuple[tuple[int, int, int], ...] = ()

    def steps(self, levels: int) -> int:
        """Progress steps of a run whose collectives span ``levels`` levels (one per point)."""
        compute = len(self.gemm) + len(self.bmm) + len(self.attention) + len(self.memory) + len(self.unaligned)
        return compute + levels * len(KINDS) * len(self.message_bytes)


def _attention(batch: int, heads: int, seqs, head_dims) -> tuple:
    return tuple((batch, heads, s, d, causal) for d in head_dims for s in seqs for causal in (False, True))


def _memory(sizes) -> tuple:
    return tuple((kernel, n) for kernel in MEMORY_KERNELS for n in sizes)


def _powers(lo: int, hi: int, step: int) -> tuple[int, ...]:
    out, n = [], 2**lo
    while n <= 2**hi:
        out.append(n)
        n *= 2**step
    return tuple(out)


# LLaMA-3-8B/70B shapes: hidden 4096/8192, MLP 14336/28672; skinny products are decode-like.
_GPU_GEMM = tuple((n, n, n) for n in (256, 512, 1024, 2048, 4096, 8192)) + (
    (16, 4096, 4096), (64, 8192, 8192), (256, 4096, 4096), (8192, 1024, 4096), (4096, 14336, 4096),
    (4096, 4096, 14336), (8192, 28672, 8192), (1024, 8192, 8192))
_GPU_GEMM_QUICK = ((512, 512, 512), (2048, 2048, 2048), (8192, 8192, 8192), (64, 4096, 4096), (4096, 14336, 4096))
_CPU_GEMM = tuple((n, n, n) for n in (32, 64, 128, 256, 512)) + ((8, 512, 512), (512, 128, 512), (64, 1024, 256))
_CPU_GEMM_QUICK = ((32, 32, 32), (128, 128, 128), (384, 384, 384), (16, 384, 384))

def aligned_twin(width: int) -> int:
    """The width an unaligned GEMM of the grid is timed against: ``width`` rounded down to a multiple of
    ``cost.kernels.ALIGN_ELEMENTS``."""
    return width - width % ALIGN_ELEMENTS


# GEMMs of a weight 4,097 / 4,098 / 4,100 wide (an odd width, 2 and 4 times an odd one), and 4,100 deep
_GPU_UNALIGNED = ((8192, 4097, 4096), (8192, 4098, 4096), (8192, 4100, 4096), (8192, 4096, 4100))
_CPU_UNALIGNED = ((256, 257, 256), (256, 258, 256), (256, 260, 256))

GRIDS = {
    ("cuda", False): Grid(gemm=_GPU_GEMM, bmm=((64, 1024, 1024, 128), (64, 4096, 4096, 128), (256, 2048, 128, 2048)),
                          attention=_attention(2, 16, (512, 1024, 2048, 4096, 8192), (64, 128)),
                          memory=_memory((2**24, 2**26, 2**28)), message_bytes=_powers(10, 30, 2), norm_width=4096,
                          point_budget_s=0.25, unaligned=_GPU_UNALIGNED),
    ("cuda", True): Grid(gemm=_GPU_GEMM_QUICK, bmm=((64, 2048, 2048, 128),),
                         attention=_attention(2, 16, (1024, 4096), (128,)), memory=_memory((2**26,)),
                         message_bytes=_powers(12, 28, 4), norm_width=4096, point_budget_s=0.05,
                         unaligned=_GPU_UNALIGNED[:1] + _GPU_UNALIGNED[2:3]),
    ("cpu", False): Grid(gemm=_CPU_GEMM, bmm=((16, 128, 128, 64), (16, 256, 256, 64)),
                         attention=_attention(1, 4, (64, 128, 256, 512), (32, 64)), memory=_memory((2**21, 2**23)),
                         message_bytes=_powers(10, 24, 2), norm_width=1024, point_budget_s=0.1,
                         unaligned=_CPU_UNALIGNED),
    ("cpu", True): Grid(gemm=_CPU_GEMM_QUICK, bmm=((8, 128, 128, 64),), attention=_attention(1, 4, (64, 256), (32,)),
                        memory=_memory((2**21,)), message_bytes=_powers(10, 22, 4), norm_width=1024,
                        point_budget_s=0.02, unaligned=_CPU_UNALIGNED[:1]),
}


def grid_for(device_type: str, quick: bool) -> Grid:
    """The grid for ``cuda`` or ``cpu``, full or ``--quick``."""
    return GRIDS[(device_type, quick)]
