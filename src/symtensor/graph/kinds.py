"""Operator kinds: what each kind computes, saves for backward, and which dims it lets a plan cut.

One entry per kind in a registry that refuses duplicates. Formulas take a mapping of dim sizes
and use plain arithmetic, so the same function returns a number for ints and a sympy expression
for symbols (this is how the cost model is symbolic and fast at once).

Kinds:
    linear        Y = X . W with one parameter W (dense, QKV, MLP, router, expert GEMMs, LoRA)
    bmm           batched matmul of two activations (unfused attention scores and context)
    attention     fused (Flash) attention: Q[b,s,n,d], K/V[b,t,g,d] -> O[b,s,n,d]; GQA via g;
                  V[b,t,g,w] -> O[b,s,n,w] when the value head dim w differs (MLA); attr
                  ``window``: sliding-window keys per query; a 4th input [n]: attention sinks
    norm          RMSNorm / LayerNorm over one dim (attr ``axis``), with a weight
    softmax       softmax over one dim (attr ``axis``)
    elementwise   activation, SwiGLU gate, residual add, dropout, cast (attr ``fn``)
    embedding     table lookup: ids[b,s], table[v,h] -> x[b,s,h]
    cross_entropy loss over the vocabulary: logits[b,s,v] -> loss[b,s]
    moe_dispatch  route tokens x[b,s,h] to expert slots xe[e,b,c,h] (capacity c per sequence)
    moe_combine   gather expert outputs ye[e,b,c,h] back to tokens y[b,s,h], weighted by gates
    reshape       merge or split dims with a dimension mapping (attr ``merge``)
    generic       an operator with no specific model (captured graphs); memory-bound
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from symtensor.errors import PlanError, did_you_mean


def _prod(sizes, names=None):
    p = 1
    for name, size in sizes.items():
        if names is None or name in names:
            p = p * size
    return p


@dataclass(frozen=True, slots=True)
class Kind:
    """What the cost model needs to know about one kind of operator.

    Attributes:
        name: the kind's name.
        fwd_flops: executed forward FLOPs from (dim sizes, attrs) for the whole (uncut) op.
        bwd_ratio: backward FLOPs per forward FLOP and per operand that needs a gradient
            (matmuls: 1 each for dX and dW); ``None`` means ``bwd_fixed`` applies.
        bwd_fixed: backward FLOPs / forward FLOPs when not per operand (FlashAttention: 2.5).
        memory_bound: time is bytes moved over memory bandwidth rather than FLOPs.
        saves: which tensors backward needs: ``("in0", "out0")`` etc.
        extra_saved_bytes: bytes saved beyond those tensors (dropout mask, softmax stats).
        no_cut: dims a plan may never cut (attention head_dim and key sequence, a norm's axis).
        model_flops: forward FLOPs in the MFU convention when they differ from the executed ones.
    """

    name: str
    fwd_flops: Callable
    bwd_ratio: float | None = 1.0
    bwd_fixed: float = 0.0
    memory_bound: bool = False
    saves: tuple[str, ...] = ()
    extra_saved_bytes: Callable | None = None
    no_cut: Callable | None = None
    model_flops: Callable | None = None


KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
    if kind.name in KINDS:
        raise ValueError(f"operator kind {kind.name} is registered twice")
    KINDS[kind.name] = kind
    return kind


def kind_of(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise PlanError(f"unknown operator kind {name!r}." + did_you_mean(name, KINDS)) from None


def _matmul_flops(sizes, attrs):
    return 2 * _prod(sizes)


def _keys_per_query(t, window):
    """Keys a query attends to: all ``t``, or at most ``window`` (sliding-window attention)."""
    if not window:
        return t
    if isinstance(t, (int, float)):
        return min(window, t)
    import sympy  # a symbolic size (analysis/formula.py)

    return sympy.Min(window, t)


def attention_span(t, document=None):
    """The keys a query's attention can reach: the ``t`` keys of the sequence, or, with packed documents
    (an attention op's attr ``document``, ``ModelConfig.doc_tokens``), those of its document when it is shorter."""
    return _keys_per_query(t, document)


def _attention_flops(sizes, attrs, executed=True):
    # QK^T over the query/key head dim d and PV over the value head dim w (MLA; else w = d):
    # 2*b*n*s*keys*(d + w), keys = the span a query reaches (t, or its packed document's length: attention_span)
    # or, with a sliding window (attr ``window``), min(window, span). Causal kernels skip the masked pairs: with
    # k keys per query out of a span of D, on average a query sees k*(1 - k/(2D)) of them (D/2 without a
    # window; about the window when it is short).
    span = attention_span(sizes["t"], attrs.get("document"))
    keys = _keys_per_query(span, attrs.get("window"))
    head = sizes["d"] if "w" not in sizes else (sizes["d"] + sizes["w"]) / 2
    full = 4 * sizes["b"] * sizes["n"] * sizes["s"] * keys * head
    if executed and attrs.get("causal", True):
        return full * (1 - keys / (2 * span))
    return full


def _elementwise_flops(sizes, attrs):
    return attrs.get("flops_per_element", 1) * _prod(sizes)


def _axis_no_cut(op):
    return {op.attr("axis")}


register(Kind("linear", _matmul_flops, bwd_ratio=1.0, saves=("in0",)))
register(Kind("bmm", _matmul_flops, bwd_ratio=1.0, saves=("in0", "in1")))
register(Kind(
    "attention", _attention_flops, bwd_ratio=None, bwd_fixed=2.5, saves=("in0", "in1", "in2", "out0"),
    # log-sum-exp statistics in fp32, one per query row and head
    extra_saved_bytes=lambda sizes, attrs: 4 * sizes["b"] * sizes["s"] * sizes["n"],
    no_cut=lambda op: {"t", "d", "g", "w"},
))
register(Kind("norm", lambda sizes, attrs: 4 * _prod(sizes), bwd_fixed=2.0, bwd_ratio=None, memory_bound=True,
              saves=("in0",), no_cut=_axis_no_cut))
register(Kind("softmax", lambda sizes, attrs: 5 * _prod(sizes), bwd_fixed=1.0, bwd_ratio=None, memory_bound=True,
              saves=("out0",), no_cut=_axis_no_cut))
register(Kind(
    "elementwise", _elementwise_flops, bwd_fixed=1.0, bwd_ratio=None, memory_bound=True,
    saves=(),  # set per function below through attrs["saves"]
    # dropout keeps a 1-byte mask per element
    extra_saved_bytes=lambda sizes, attrs: _prod(sizes) if attrs.get("fn") == "dropout" else 0,
))
register(Kind("embedding", lambda sizes, attrs: 0, bwd_fixed=0.0, bwd_ratio=None, memory_bound=True, saves=("in0",)))
register(Kind(
    "cross_entropy", lambda sizes, attrs: 5 * _prod(sizes), bwd_fixed=1.0, bwd_ratio=None, memory_bound=True,
    # Megatron keeps the fp32 softmax of the logits for backward
    extra_saved_bytes=lambda sizes, attrs: 4 * _prod(sizes),
))
# dispatch permutes tokens into expert buffers; its backward un-permutes their gradients, moving the
# same bytes (a memory-bound gather/scatter both ways)
register(Kind("moe_dispatch", lambda sizes, attrs: 0, bwd_fixed=1.0, bwd_ratio=None, memory_bound=True,
              saves=("in1",)))
register(Kind("moe_combine", lambda sizes, attrs: 2 * _prod(sizes, {"e", "b", "c", "h"}), bwd_fixed=1.0,
              bwd_ratio=None, memory_bound=True, saves=("in0", "in1")))
register(Kind("reshape", lambda sizes, attrs: 0, bwd_fixed=0.0, bwd_ratio=None, memory_bound=False))
register(Kind("generic", lambda sizes, attrs: _prod(sizes), bwd_fixed=1.0, bwd_ratio=None, memory_bound=True,
              saves=("in0",)))


def op_saves(op) -> tuple[str, ...]:
    """The operand slots (``in0``, ``out0`` ...) that backward needs for this op."""
    explicit = op.attr("saves")
    if explicit is not None:
        return tuple(explicit)
    return kind_of(op.kind).saves


def op_saved_activations(op, tensors) -> tuple[tuple[str, int, str], ...]:
    """The activations backward needs of this op: (``in`` or ``out``, operand index, tensor name) per slot of
    ``op_saves`` whose tensor (``tensors``: the graph's, by name) is not a parameter."""
    out = []
    for slot in op_saves(op):
        io, idx = slot[:-1], int(slot[-1])
        tname = op.inputs[idx] if io == "in" else op.outputs[idx]
        if not tensors[tname].param:
            out.append((io, idx, tname))
    return tuple(out)


def op_fwd_flops(op, sizes=None):
    """Executed forward FLOPs of the whole op (before any cut)."""
    kind = kind_of(op.kind)
    return kind.fwd_flops(sizes or op.dim_sizes, dict(op.attrs))


def op_model_flops(op, grad_operands: int, causal_halved: bool = True) -> float:
    """Forward + backward FLOPs in the MFU convention: no recomputation; attention's two matmuls
    with a backward of twice the forward, causal attention halved as the kernels run it (the
    Megatron-LM convention). ``causal_halved=False``: attention in full (the PaLM / Korthikanti et
    al. 2022 / torchtitan / llm-foundry convention, 12*L*H*Q*T per token: ``graph.analysis.
    full_attention_ratio``)."""
    kind = kind_of(op.kind)
    attrs = dict(op.attrs)
    fwd = (kind.model_flops or kind.fwd_flops)(op.dim_sizes, attrs)
    if kind.memory_bound or kind.name == "reshape":
        return 0.0
    if kind.name == "attention":
        return 3 * (fwd if causal_halved else _attention_flops(op.dim_sizes, attrs, executed=False))
    if kind.name == "bmm" and causal_halved and {"s", "t"} <= set(op.dim_sizes) and attrs.get("causal", True):
        fwd /= 2  # unfused causal attention (scores, context): the model counts the unmasked half
    if kind.bwd_ratio is None:
        return fwd * (1 + kind.bwd_fixed)
    return fwd * (1 + kind.bwd_ratio * grad_operands)


def op_no_cut(op) -> set[str]:
    kind = kind_of(op.kind)
    return set(kind.no_cut(op)) if kind.no_cut else set()
