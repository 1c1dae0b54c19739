"""Per-operator and per-edge costs: compute roofline, redistribution collectives, saved bytes.

Everything here is a pure function of shapes, layouts, the mesh and a few constants; results are
memoised by the evaluator on (op signature, layout), so identical layers cost one evaluation.

Legend: ``mesh`` is a tuple of Axis; ``levels`` the cluster levels (innermost first); ``eff``
an :class:`~symtensor.cost.efficiency.Efficiency`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from symtensor.cost import kernels
from symtensor.cost.collectives import collective_time, level_counts
from symtensor.cost.efficiency import ATTENTION_KERNELS, attention_fractions
from symtensor.cost.kernels import gemm_dims as gemm_shape
from symtensor.cost.precision import cast_bytes, floor_speedup, fp8_gemm, gemm_speedup
from symtensor.cost.stack_kernels import LOSSES, attention_table, multiples, runs_eager
from symtensor.errors import PlanError
from symtensor.graph import DTYPE_BYTES, attention_span, kind_of
from symtensor.layout import OpLayout, TensorLayout, cut_factor, linked_layout, tensor_layout


@dataclass(frozen=True, slots=True)
class OpTime:
    """Seconds of one op on one device for one micro-batch."""

    fwd_s: float
    bwd_s: float
    fwd_flops: float  # local executed forward FLOPs


def local_sizes(op, layout: OpLayout, mesh) -> dict[str, float]:
    full = linked_layout(op, layout)
    return {d: size / cut_factor(full, d, mesh) for d, size in op.dims}


def _tensor_local_bytes(dims, sizes, dtype):
    n = DTYPE_BYTES[dtype]
    for d in dims:
        n *= sizes[d]
    return n


def op_time(op, layout: OpLayout, mesh, device, eff, tensors, grad_operands: int, dtype="bf16",
            fp8=None, loss: str | None = None, elementwise: str | None = None, attention: str | None = None
            ) -> OpTime:
    """Roofline time of the op's local piece, forward and backward, plus the idle gap before each of
    its kernels (``EndToEnd.kernel_gap_s``). ``fp8``: (recipe, weights cast every micro-batch) when
    the linear GEMMs run in FP8 (``cost.precision``): an FP8 GEMM runs at its measured speedup and
    pays its casts as memory-bound time. ``loss``, ``elementwise``, ``attention``: the loss kernel, the elementwise
    kernels and the attention kernel the stack states (``cost.stack_kernels``), None for the engine's own."""
    sizes = local_sizes(op, layout, mesh)
    nbytes = sum(_tensor_local_bytes(dims, sizes, tensors[t].dtype)
                 for t, dims in zip(op.inputs + op.outputs, op.in_dims + op.out_dims))
    knee = 0.0 if eff.tabled("gemm") else eff.gemm_knee
    t = _roofline(op, sizes, nbytes, device, eff, grad_operands, dtype, knee, floor=False, fp8=fp8, loss=loss,
                  elementwise=elementwise, attention=attention)
    if fp8 is not None and fp8_gemm(op):
        fwd_bytes, bwd_bytes = cast_bytes(op, sizes, *fp8)
        hbm = device.hbm_bandwidth * hbm_fraction(op, eff)
        t = OpTime(t.fwd_s + fwd_bytes / hbm, t.bwd_s + (bwd_bytes / hbm if t.bwd_s else 0.0), t.fwd_flops)
    gap = eff.end_to_end.kernel_gap_s
    if gap and op.kind != "reshape":
        kind = kind_of(op.kind)
        bwd_kernels = grad_operands if kind.bwd_ratio is not None else (1 if kind.bwd_fixed else 0)
        t = OpTime(t.fwd_s + gap, t.bwd_s + gap * bwd_kernels if t.bwd_s else t.bwd_s, t.fwd_flops)
    return t


def op_floor(op, device, eff, tensors, grad_operands: int, dtype="bf16", fp8=None, attention: str | None = None
             ) -> tuple[float, float]:
    """Seconds of the whole op on one device, forward and backward, with no knee, no kernel gap and
    only its activations' bytes: ``op_time`` of any layout, summed over the devices that share the op,
    is at least this. A device's piece runs at most at the rates this charges the whole op (``op_rates``
    with ``floor``: every GEMM, grouped GEMM and attention kernel at the best its table allows at any
    size, which keeps the bound independent of the batch), and the pieces' FLOPs and activation bytes add
    up to at least the whole op's (FLOPs are linear in every dim; every activation element is read or
    written by some device), so the roofline's larger term is at least each term's share. (Weights are
    left out: what they add depends on the micro-batch count, and this bound must not; FLOPs and
    activations scale with the batch.) In FP8 (FP4) a GEMM is charged at its largest speedup over any piece
    (``precision.floor_speedup``) and no casts; a memory-bound op (the loss too) at one fused kernel's bytes, the
    fewest any stack moves (``memory_multiples``). Attention at its kernel's ceiling: the stated ``attention``
    kernel's where the stack states one (the kernel ``op_time`` then charges), else the engine's."""
    sizes = op.dim_sizes
    nbytes = sum(_tensor_local_bytes(dims, sizes, tensors[t].dtype)
                 for t, dims in zip(op.inputs + op.outputs, op.in_dims + op.out_dims) if not tensors[t].param)
    t = _roofline(op, sizes, nbytes, device, eff, grad_operands, dtype, knee=0.0, floor=True, fp8=fp8,
                  attention=attention)
    return t.fwd_s, t.bwd_s


def _roofline(op, sizes, nbytes: float, device, eff, grad_operands: int, dtype, knee: float,
              floor: bool = False, fp8=None, loss: str | None = None, elementwise: str | None = None,
              attention: str | None = None) -> OpTime:
    """The larger of compute and memory time of an op of these sizes moving ``nbytes``. An FP8 (FP4)
    GEMM's FLOPs run ``speed`` times faster (``precision.gemm_speedup`` under ``fp8``'s recipe;
    ``floor_speedup`` for ``op_floor``); its knee (idle time, not FLOPs) does not."""
    kind = kind_of(op.kind)
    flops, bwd_flops, rate, bwd_rate = _compute(op, kind, sizes, device, eff, grad_operands, dtype, floor, attention)
    speed = 1.0
    if fp8 is not None and fp8_gemm(op):
        recipe = fp8[0]
        speed = floor_speedup(op, sizes, device, recipe) if floor else gemm_speedup(op, sizes, device, recipe)
    hbm = device.hbm_bandwidth * hbm_fraction(op, eff)
    if kind.memory_bound:
        fwd_times, bwd_times = memory_multiples(op, eff, loss, elementwise, floor)
        fwd_bytes, bwd_bytes = fwd_times * nbytes, bwd_times * nbytes
        return OpTime(fwd_bytes / hbm, bwd_bytes / hbm if kind.bwd_fixed else 0.0, flops)
    # a kernel of F FLOPs runs at frac * F / (F + knee): it pays knee FLOPs of idle time
    fwd = max((flops / speed + knee) / rate, nbytes / hbm)
    bwd = max((bwd_flops / speed + knee * (bwd_flops / flops if flops else 0)) / bwd_rate, 2 * nbytes / hbm) \
        if bwd_flops else 0.0
    return OpTime(fwd, bwd, flops)


def memory_multiples(op, eff, loss: str | None = None, elementwise: str | None = None,
                     floor: bool = False) -> tuple[float, float]:
    """The bytes a memory-bound op moves forward and backward, as multiples of its inputs' and outputs' bytes: a
    stated loss kernel's (``cost.stack_kernels``), an eager PyTorch composite's where the stack runs them
    (``EAGER_BYTES``: the engine's kernels, or the stated ``elementwise``, ``cost.stack_kernels.ELEMENTWISE``), else
    one fused kernel each way (its backward ``2 x bwd_fixed``). A floor charges one fused kernel, the fewest bytes
    any stack moves."""
    if op.kind == "cross_entropy" and (loss is not None or floor):
        return multiples("fused" if floor else loss)
    eager = runs_eager(elementwise, eff.eager_elementwise)  # (the loss: op_facts gives it no elementwise)
    composite = EAGER_BYTES.get((op.kind, op.attr("fn"))) if eager and not floor else None
    return composite if composite is not None else (1.0, kind_of(op.kind).bwd_fixed * 2)


def hbm_fraction(op, eff) -> float:
    """The fraction of HBM bandwidth the op's memory traffic reaches: with memory-bound kernels costed
    from the tables, the device's measured STREAM fraction (``cost.kernels.HBM_PATTERNS``) of the op's
    pattern: a memory-bound op reading two or more activations and writing one (a residual add,
    SwiGLU's product) is a triad (2 loads + 1 store), the others (and the operand traffic of a GEMM or
    attention) a scale (1 load + 1 store; a norm's small weight does not count); else ``eff.hbm``."""
    if not eff.tabled("hbm"):
        return eff.hbm
    pattern = "triad" if op is not None and _activation_inputs(op) >= 2 and kind_of(op.kind).memory_bound \
        else "scale"
    return kernels.hbm_fraction(eff.kernels, pattern)


def _activation_inputs(op) -> int:
    """Inputs of ``op`` that are not its parameters (the in-dims a parameter's would not carry b or s)."""
    return sum(1 for dims in op.in_dims if "b" in dims or "t" in dims or "s" in dims or "c" in dims)


def stream_fraction(eff, pattern: str) -> float:
    """The measured HBM fraction of a STREAM ``pattern`` (the optimizer step: a triad), or ``eff.hbm``."""
    return kernels.hbm_fraction(eff.kernels, pattern) if eff.tabled("hbm") else eff.hbm


# Bytes an eager PyTorch composite moves, forward and backward, as multiples of the op's fused
# bytes (its inputs and outputs once; a fused kernel's backward moves 2 x bwd_fixed of them). Counted
# kernel by kernel over a bf16 tensor of N elements (B = bytes per element, reads + writes):
#   RMSNorm, x * rsqrt(mean(x^2) + eps) * w in fp32 opmath (torch.nn.RMSNorm's composite and
#     torchtitan's ``_norm(x.float()).type_as(x) * weight``): forward cast up 6, pow 8, mean 4,
#     multiply 8, cast down 6, weight multiply 4 = 36 B; backward weight-multiply grads 4 + 8, cast 6,
#     multiply grads 8 + 16, pow grad 8, gradient add 12, cast 6 = 68 B; fused: 4 B (x, y).
#   RoPE as torchtitan's complex rotation (``view_as_complex(x.float())``, complex multiply,
#     ``type_as``): cast up 6, complex multiply 8, cast down 6 = 20 B each way; fused: 4 B.
#   SwiGLU as ``silu(x1) * x3``: forward silu 4 + multiply 6 = 10 B, backward the multiply's two
#     grads 6 + 6 and silu's 6 = 18 B; fused: 6 B (x1, x3, y).
#   Cross-entropy over fp32 logits (torchtitan's ``cross_entropy(pred.float(), labels)``; under
#     autocast, as Composer's amp_bf16 runs it, cross_entropy is on the fp32 list): forward cast up
#     6, log_softmax 8 = 14 B per logit; backward nll-loss grad fill 4, log_softmax backward 12, cast
#     down 6 = 22 B; fused: the bf16 logits, 2 B.
# LayerNorm, GeLU, dropout and residual adds are single ATen kernels: fused already.
EAGER_BYTES = {("norm", "rmsnorm"): (36 / 4, 68 / 4), ("elementwise", "rope"): (20 / 4, 20 / 4),
               ("elementwise", "swiglu"): (10 / 6, 18 / 6), ("cross_entropy", None): multiples("fp32")}


# Fused attention's efficiency falls at short key sequences and small head dims (FlashAttention-2,
# Dao 2023, Fig. 4-7: causal, head dim 128 on A100 reaches ~62% of its 16K-token speed at 512
# tokens, i.e. half speed at ~340 tokens; head dim 64 runs ~0.83x head dim 128). Shapes of the
# curve, taken from that kernel benchmark; the scale (``eff.attention``) is fitted per device.
ATTENTION_HEAD_DIM_KNEE = 32.0
ATTENTION_REF_HEAD_DIM = 128.0


def attention_keys(op, sizes) -> float:
    """The keys a query block of fused attention ``op`` reads: the sequence's, at most its packed document's
    (``graph.kinds.attention_span``) and at most its sliding window; the kernel's efficiency follows them."""
    keys = attention_span(sizes["t"], op.attr("document"))
    window = op.attr("window")
    return min(keys, window) if window else keys


def attention_shape_factor(sizes, eff, keys=None) -> float:
    """Fused attention's efficiency relative to its long-sequence, head-dim-128 value at ``keys`` keys per
    query block (``attention_keys``; default the sequence's)."""
    t, d = (keys or sizes["t"]), sizes["d"]
    seq = t / (t + eff.attention_knee) if eff.attention_knee else 1.0
    ref = ATTENTION_REF_HEAD_DIM / (ATTENTION_REF_HEAD_DIM + ATTENTION_HEAD_DIM_KNEE)
    return seq * (d / (d + ATTENTION_HEAD_DIM_KNEE)) / ref


def _compute(op, kind, sizes, device, eff, grad_operands: int, dtype, floor: bool = False,
             attention: str | None = None) -> tuple[float, float, float, float]:
    """Forward and backward FLOPs of the op at these (local) sizes, and the FLOP/s its forward
    and backward kernels reach at best (peak times the fraction of ``op_rates``)."""
    flops = kind.fwd_flops(sizes, dict(op.attrs))
    bwd_flops = flops * (kind.bwd_fixed if kind.bwd_ratio is None else kind.bwd_ratio * grad_operands)
    peak = device.flops(dtype)
    fwd_eff, bwd_eff = op_rates(op, sizes, eff, grad_operands, dtype, flops, floor, attention)
    return flops, bwd_flops, peak * fwd_eff, peak * bwd_eff


def op_rates(op, sizes, eff, grad_operands: int, dtype, flops: float, floor: bool, attention: str | None = None
             ) -> tuple[float, float]:
    """Forward and backward fractions of peak of a compute op (the one rule: the evaluator, the search,
    explain's formulas and the kernel-table test read it).

    From the kernel tables (``eff.tables``, ``cost.kernels``): a dense GEMM or batched matmul at the
    measured row nearest its local shape (M, N, K: ``gemm_shape``), forward (TN), input gradient (NN)
    and weight gradient (NT) each, never above the envelope at its FLOPs; its backward rate is the
    two gradient GEMMs' together (with one gradient operand, the slower of the two). A grouped expert
    GEMM at its tokens per expert, each direction at its own curve (``kernels.grouped_direction``), its
    backward as the dense one's, times its tile fill (``grouped_tile_factor``). Attention at the
    engine's kernel (``eff.attention_kernel``; the stack's stated ``attention``, ``cost.stack_kernels.ATTENTION``;
    or the op's ``kernel`` attr) for its keys per query,
    head dim and causality. With ``floor``, the upper bounds no piece of the op exceeds (``op_floor``).
    Without tables: the scalar fractions of ``eff``."""
    if op.kind == "attention":
        if not eff.tabled("attention"):  # the op's kernel (``efficiency.attention_fractions``) at its shape
            if attention is not None:
                raise PlanError(f"attention {attention} is priced at its measured kernel table, and this device's "
                                "efficiency has none: leave --attention out")
            shape = attention_shape_factor(sizes, eff, attention_keys(op, sizes))
            fwd_eff, bwd_eff = attention_fractions(eff, op.attr("kernel"))
            return fwd_eff * shape, bwd_eff * shape
        kernel, scale = table_attention_kernel(eff, op.attr("kernel"), attention)
        if floor:
            return (scale * kernels.attention_ceiling(eff.kernels, kernel, False),
                    scale * kernels.attention_ceiling(eff.kernels, kernel, True))
        keys = attention_keys(op, sizes)
        causal = bool(op.attr("causal", True))
        return (scale * kernels.attention_table(eff.kernels, kernel, keys, sizes["d"], causal, False),
                scale * kernels.attention_table(eff.kernels, kernel, keys, sizes["d"], causal, True))
    if not eff.tabled("gemm") or len(op.in_dims) < 2:  # (a reshape: no FLOPs)
        e = (eff.bmm if op.kind == "bmm" else eff.gemm) * (1.0 if floor else grouped_tile_factor(op, sizes))
        if not floor and eff.unaligned and len(op.in_dims) >= 2:  # (measured by symtensor profile)
            m, n, k, groups = gemm_shape(op, sizes)
            e *= _unaligned(op, n, k, groups, eff, dtype)[0]
        return e, e
    tdtype = kernels.table_dtype(eff.kernels, dtype)
    m, n, k, groups = gemm_shape(op, sizes)
    if groups > 1 and op.kind == "linear":  # a grouped expert GEMM
        if floor:
            e = kernels.grouped_ceiling(eff.kernels, tdtype)
            return e, e
        tile = grouped_tile_factor(op, sizes)  # each direction at its own measured curve (kernels.GROUPED_DIRECTIONS)
        fwd, dgrad, wgrad = (kernels.grouped_direction(eff.kernels, m, tdtype, d) * tile
                             for d in kernels.GROUPED_DIRECTIONS)
        return fwd, 2 / (1 / dgrad + 1 / wgrad) if grad_operands >= 2 else min(dgrad, wgrad)
    if floor:  # the best the table allows any GEMM (the floor may not depend on the batch)
        e = kernels.gemm_bound(eff.kernels, math.inf, tdtype)
        return e, e
    fwd = kernels.gemm_shape_efficiency(eff.kernels, m, n, k, tdtype, "TN", groups)
    dgrad = kernels.gemm_shape_efficiency(eff.kernels, m, k, n, tdtype, "NN", groups)
    wgrad = kernels.gemm_shape_efficiency(eff.kernels, n, k, m, tdtype, "NT", groups)
    fwd, dgrad, wgrad = (e * f for e, f in zip((fwd, dgrad, wgrad), _unaligned(op, n, k, groups, eff, tdtype)))
    bwd = 2 / (1 / dgrad + 1 / wgrad) if grad_operands >= 2 else min(dgrad, wgrad)
    return fwd, bwd


def _unaligned(op, n: float, k: float, groups: float, eff, dtype: str) -> tuple[float, ...]:
    """Per layout (``kernels.GEMM_LAYOUTS``), the fraction of its aligned rate a dense linear op's GEMM of weight
    ``n`` x ``k`` runs at, a dimension being no multiple of 8 (``kernels.alignment_factor``: the cluster file's
    measured fractions, else the device's table), the LM head at the vocabulary the model states where the engine
    does not pad it; 1 for other ops."""
    if op.kind != "linear" or groups != 1:
        return 1.0, 1.0, 1.0
    out = n if eff.pads_vocab or op.attr("stated_vocab") is None else op.attr("stated_vocab")
    return tuple(unaligned_factor(eff, out, k, dtype, layout) for layout in kernels.GEMM_LAYOUTS)


def unaligned_factor(eff, out: float, inp: float, dtype: str = "bf16", layout: str = "TN") -> float:
    """``kernels.alignment_factor`` of a weight ``out`` x ``inp`` under ``eff``: the cluster file's measured fractions
    (``Efficiency.unaligned``) first, else the device's table where its GEMMs are tabled (none where a cluster file
    measured its GEMM rate without them)."""
    device = eff.kernels if eff.tabled("gemm") else ""
    return kernels.alignment_factor(device, out, inp, dtype, layout, eff.unaligned)


# The table kernel of each ``kernel`` attr a run may name (``models.config.ATTENTION``) other than the
# engine's own (``None`` or ``flash``: ``eff.attention_kernel``), and its share of that table:
# FlashAttention-2 (``flash2``) at its table; FlashAttention v1 and its Triton port (``flash1``) at half of
# FlashAttention-2 (``ATTENTION_KERNELS``: "around 2x speedup compared to FlashAttention", Dao 2023).
def table_attention_kernel(eff, kernel: str | None, attention: str | None = None) -> tuple[str, float]:
    """(table kernel, share of its table) of an attention op's ``kernel`` attr under ``eff``, the engine's own fused
    kernel being the stack's stated ``attention`` kernel where it states one (``stack_kernels.attention_table``)."""
    if kernel is None or kernel == "flash":
        if attention is not None:  # (a device without its table is refused before: ``stack_kernels.device_refusal``)
            return attention_table(attention, eff.kernels), 1.0
        return eff.attention_kernel, 1.0
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention kernel {kernel!r}; use one of flash, {', '.join(ATTENTION_KERNELS)}")
    own = "fa2" if kernels.has_attention(eff.kernels, "fa2") else eff.attention_kernel
    return own, ATTENTION_KERNELS[kernel]


# Grouped expert GEMMs tile each expert's tokens in blocks of GEMM_TILE_ROWS rows (CUTLASS and
# cuBLAS grouped GEMMs on A100/H100 use 128-row tiles): an expert with c tokens fills
# c / (128 * ceil(c / 128)) of its tiles' rows.
GEMM_TILE_ROWS = 128


def grouped_tile_factor(op, sizes) -> float:
    """The fraction of a grouped expert GEMM's tile rows that hold tokens (1 for other ops)."""
    if op.kind != "linear" or len(op.in_dims) < 2 or "e" not in op.in_dims[0] or "e" not in op.in_dims[1]:
        return 1.0
    c = sizes.get("c")
    if not c:
        return 1.0
    return c / (GEMM_TILE_ROWS * math.ceil(c / GEMM_TILE_ROWS))


@dataclass(frozen=True, slots=True)
class Collective:
    kind: str
    nbytes: float  # the message size as defined in collectives.py (the runtime counts the same)
    axes: tuple[int, ...]


def redistribute(src: TensorLayout, dst: TensorLayout, numel: int, itemsize: int, mesh) -> tuple[Collective, ...]:
    """Collectives that turn a tensor placed as ``src`` into ``dst`` (spec section 2.6).

    Per mesh axis: partial in ``src`` and cutting ``dst`` -> reduce-scatter; partial and unused by
    ``dst`` -> all-reduce; the same tensor axis cut in both -> nothing; a different tensor axis ->
    all-to-all; cut in ``src`` only -> all-gather; cut in ``dst`` only -> a local slice (free).
    """
    src_axis_of = {a: i for i, ax in enumerate(src.axes) for a in ax}
    dst_axis_of = {a: i for i, ax in enumerate(dst.axes) for a in ax}
    rs, ar, a2a, ag = [], [], [], []
    for a in src.partial:
        (rs if a in dst_axis_of else ar).append(a)
    for a, i in src_axis_of.items():
        j = dst_axis_of.get(a)
        if j is None:
            ag.append(a)
        elif j != i:
            a2a.append(a)
    if not (rs or ar or a2a or ag):
        return ()
    cur = numel * itemsize / src.factor(mesh)
    out = []
    if rs:
        out.append(Collective("reduce_scatter", cur, tuple(sorted(rs))))
        cur /= _group(rs, mesh)
    if ar:
        out.append(Collective("all_reduce", cur, tuple(sorted(ar))))
    if a2a:
        out.append(Collective("all_to_all", cur, tuple(sorted(a2a))))
    if ag:
        cur *= _group(ag, mesh)
        out.append(Collective("all_gather", cur, tuple(sorted(ag))))
    return tuple(out)


def _group(axes, mesh) -> int:
    g = 1
    for a in axes:
        g *= mesh[a].size
    return g


def collectives_time(colls, mesh, levels, eff) -> float:
    return sum(collective_time(c.kind, c.nbytes, level_counts(c.axes, mesh, len(levels)), levels,
                               eff.link_for(c.kind)) for c in colls)


def input_layout(op, layout: OpLayout, slot: int, grad: bool = False) -> TensorLayout:
    """How the op sees its input ``slot``; with ``grad`` the gradient it produces (partial axes)."""
    full = linked_layout(op, layout)
    return tensor_layout(full, op.in_dims[slot], op.dims, partial_for_missing=grad)


def param_layout(op, layout: OpLayout, slot: int) -> TensorLayout:
    """Placement of parameter ``slot`` and of its gradient: partial over the axes that cut output
    dims the parameter lacks (the batch and sequence a weight gradient sums over). A row-parallel
    bias, added after the reduction, is not partial over the reduction's axes."""
    full = linked_layout(op, layout)
    pdims = op.in_dims[slot]
    axes = tuple(full.axes_of(d) for d in pdims)
    placed = {a for ax in axes for a in ax}
    out_dims = {d for dims in op.out_dims for d in dims}
    partial = frozenset(a for d, ax in full.cuts if d in out_dims and d not in pdims for a in ax if a not in placed)
    return TensorLayout(axes, partial)


def output_layout(op, layout: OpLayout, slot: int = 0, partial: bool = True) -> TensorLayout:
    full = linked_layout(op, layout)
    return tensor_layout(full, op.out_dims[slot], op.dims, partial_for_missing=partial)


def extra_saved_bytes(op, layout: OpLayout, mesh, loss: str | None = None) -> float:
    """Bytes ``op`` keeps for backward beyond its saved inputs: its kind's, or a stated loss kernel's
    (``cost.stack_kernels``)."""
    kind = kind_of(op.kind)
    if kind.extra_saved_bytes is None:
        return 0.0
    sizes = local_sizes(op, layout, mesh)
    return loss_saved_bytes(op, sizes, loss)


def loss_saved_bytes(op, sizes: dict, loss: str | None):
    """What ``op`` of local ``sizes`` keeps for backward beyond its saved inputs (numbers or sympy symbols): a stated
    loss kernel's bytes per logit (``cost.stack_kernels``), else its kind's."""
    if loss is not None and op.kind == "cross_entropy":
        return LOSSES[loss].saved * math.prod(sizes.values())
    return kind_of(op.kind).extra_saved_bytes(sizes, dict(op.attrs))


def intra_collectives(op, layout: OpLayout, mesh) -> tuple[Collective, ...]:
    """Collectives inside one op (forward). Vocab-parallel cross-entropy all-reduces three fp32
    statistics per token (max logit, sum of exponentials, target logit; Megatron's
    ``_VocabParallelCrossEntropy``) instead of gathering the logits."""
    if op.kind != "cross_entropy":
        return ()
    axes = layout.axes_of("v")
    if not axes:
        return ()
    sizes = local_sizes(op, layout, mesh)
    stat = 4 * sizes["b"] * sizes["s"]
    return tuple(Collective("all_reduce", stat, tuple(sorted(axes))) for _ in range(3))
