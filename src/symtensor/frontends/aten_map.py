"""ATen op -> IR kind: the registry, and the handlers for views, pointwise ops, reductions and data
movement. Contractions, attention, norms, embeddings, losses and experts are in ``aten_nn``.

Each handler is ``handler(lw, node)``: it reads the values of the node's arguments
(``lw.val``), unifies or splits dims, sets ``lw.vals[node]`` and, unless the node is a view,
records one operator with ``lw.emit``. Mapping:

    view reshape _unsafe_view flatten unflatten transpose t permute movedim unsqueeze squeeze
    expand contiguous clone alias detach, casts to the same dtype, dropout(p=0) -> folded (no op)
    a view whose sizes cut no dim evenly                                  -> reshape
    add mul div neg silu gelu tanh where masked_fill comparisons casts ...  -> elementwise(fn)
    dropout                                                                -> elementwise(dropout)
    sum mean amax var ... (reductions)                                      -> elementwise(fn), reduced dims
    cat stack                                                              -> elementwise(cat|stack)
    split chunk unbind slice select narrow pad repeat flip roll            -> reshape(fn)
    topk sort cumsum histc index gather scatter ... (routing, gathers)     -> generic(fn), no warning
    anything else                                                          -> generic, listed in a warning
"""

from __future__ import annotations

from symtensor.frontends.lower import Lowering, Val, ir_dtype, static_shape

HANDLERS: dict = {}
VIEW_KEYS: set[str] = set()


def handles(*names: str, view: bool = False):
    """Register a handler for ATen ops (``add`` means ``aten::add``); duplicates are refused."""
    def register(fn):
        for name in names:
            key = name if "::" in name or name == "getitem" else f"aten::{name}"
            if key in HANDLERS:
                raise ValueError(f"ATen op {key} is mapped twice")
            HANDLERS[key] = fn
            if view:
                VIEW_KEYS.add(key)
        return fn
    return register


def op_key(node) -> str:
    """``aten::add`` for ``aten.add.Tensor``; in-place ``aten::add_`` maps like ``aten::add``."""
    target = node.target
    if hasattr(target, "name") and callable(target.name):
        key = target.name().split(".")[0]
        if key.endswith("_") and not key.endswith("__") and key not in HANDLERS and key[:-1] in HANDLERS:
            return key[:-1]
        return key
    return getattr(target, "__name__", str(target))


def bind(node) -> dict:
    """The node's arguments by schema name, defaults filled in."""
    schema = node.target._schema
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        else:
            out[arg.name] = arg.default_value if arg.has_default_value() else None
    return out


def lower_node(lw: Lowering, node) -> None:
    """Map one live FX node; unmapped ATen ops become ``generic`` and are counted for the warning."""
    value = node.meta.get("val")
    if not _has_tensor(value):
        lw.vals[node] = None
        return
    handler = HANDLERS.get(op_key(node))
    if handler is None:
        generic(lw, node, warn=True)
    else:
        handler(lw, node)


def _has_tensor(value) -> bool:
    if isinstance(value, (tuple, list)):
        return any(_has_tensor(v) for v in value)
    return hasattr(value, "shape") and hasattr(value, "dtype")


def shape_of(node) -> tuple[int, ...]:
    return static_shape(node.meta["val"])


def _dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def set_view(lw: Lowering, node, x: Val, axes) -> None:
    value = node.meta["val"]
    lw.vals[node] = Val(x.tensor, tuple(tuple(a) for a in axes), static_shape(value), ir_dtype(value.dtype))


def materialize(lw: Lowering, node, x: Val, axes, fn: str, kind: str = "reshape") -> Val:
    """An op that moves data of ``x`` into a new tensor over ``axes`` (slice, pad, repeat ...)."""
    out = lw.out_val(node, axes, like=[x])
    lw.emit(node, kind, [x], [out], attrs={"fn": fn})
    lw.vals[node] = out
    return out


# -- views: no op ---------------------------------------------------------------------------------
@handles("view", "_unsafe_view", "reshape", "_reshape_alias", "flatten", "unflatten", "view_as", "reshape_as",
         view=True)
def _reshape(lw, node):
    x, shape = lw.val(node.args[0]), shape_of(node)
    axes = lw.dims.regroup(x.axes, shape)
    if axes is None:  # a view that cuts no dim evenly: keep it as an explicit data movement
        materialize(lw, node, x, lw.fresh_axes(shape), "reshape")
    else:
        set_view(lw, node, x, axes)


@handles("transpose", "swapaxes", "swapdims", view=True)
def _transpose(lw, node):
    x = lw.val(node.args[0])
    axes = list(x.axes)
    i, j = _dim(node.args[1], len(axes)), _dim(node.args[2], len(axes))
    axes[i], axes[j] = axes[j], axes[i]
    set_view(lw, node, x, axes)


@handles("t", "numpy_T", view=True)
def _t(lw, node):
    x = lw.val(node.args[0])
    set_view(lw, node, x, x.axes[::-1])


@handles("permute", view=True)
def _permute(lw, node):
    x = lw.val(node.args[0])
    set_view(lw, node, x, [x.axes[_dim(d, len(x.axes))] for d in node.args[1]])


@handles("movedim", view=True)
def _movedim(lw, node):
    x = lw.val(node.args[0])
    rank = len(x.axes)
    src = [_dim(d, rank) for d in _as_list(node.args[1])]
    dst = [_dim(d, rank) for d in _as_list(node.args[2])]
    order = [d for d in range(rank) if d not in src]
    for s, d in sorted(zip(dst, src)):
        order.insert(s, d)
    set_view(lw, node, x, [x.axes[d] for d in order])


@handles("unsqueeze", view=True)
def _unsqueeze(lw, node):
    x = lw.val(node.args[0])
    axes = list(x.axes)
    axes.insert(_dim(node.args[1], len(axes) + 1), ())
    set_view(lw, node, x, axes)


@handles("squeeze", view=True)
def _squeeze(lw, node):
    x = lw.val(node.args[0])
    rank = len(x.axes)
    chosen = range(rank) if len(node.args) < 2 else [_dim(d, rank) for d in _as_list(node.args[1])]
    drop = {d for d in chosen if x.shape[d] == 1}
    set_view(lw, node, x, [a for d, a in enumerate(x.axes) if d not in drop])


@handles("expand", "expand_as", "broadcast_to", view=True)
def _expand(lw, node):
    x, shape = lw.val(node.args[0]), shape_of(node)
    lead = len(shape) - len(x.axes)
    axes = [lw.fresh_axes((s,))[0] for s in shape[:lead]]
    for axis, old, new in zip(x.axes, x.shape, shape[lead:]):
        axes.append(axis if old == new else lw.fresh_axes((new,))[0])  # new atoms are broadcast
    set_view(lw, node, x, axes)


@handles("contiguous", "clone", "alias", "detach", "lift_fresh_copy", "lift_fresh", "view_copy", view=True)
def _identity(lw, node):
    x = lw.val(node.args[0])
    set_view(lw, node, x, x.axes)


@handles("_to_copy", "to", "type_as", "_to_dtype", view=True)
def _cast(lw, node):
    """A cast to another dtype is an elementwise op; to the same dtype (or of a constant) a view."""
    x = lw.val(node.args[0])
    if ir_dtype(node.meta["val"].dtype) == x.dtype or lw.tensors[x.tensor].role == "const":
        set_view(lw, node, x, x.axes)
    else:
        pointwise(lw, node, "cast", [x])


@handles("dropout", "native_dropout", "feature_dropout", "alpha_dropout", view=True)
def _dropout(lw, node):
    """Dropout with p > 0 in training is an elementwise op; otherwise the identity."""
    x, p = lw.val(node.args[0]), node.args[1] if len(node.args) > 1 else 0.5
    train = node.args[2] if len(node.args) > 2 else True
    multi = isinstance(node.meta["val"], (tuple, list))  # native_dropout: (output, mask)
    if p and train is not False and node in lw.live:
        out = pointwise(lw, node, "dropout", [x], index=0 if multi else None)
    else:
        out = Val(x.tensor, x.axes, x.shape, x.dtype)
    lw.vals[node] = (out, None) if multi else out


@handles("getitem", view=True)
def _getitem(lw, node):
    src = lw.vals.get(node.args[0])
    lw.vals[node] = src[node.args[1]] if isinstance(src, (tuple, list)) else None


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


# -- pointwise ------------------------------------------------------------------------------------
POINTWISE = (
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "neg", "abs", "exp",
    "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal", "pow", "square", "sin", "cos",
    "tan", "tanh", "sigmoid", "silu", "gelu", "relu", "relu6", "leaky_relu", "elu", "selu", "celu", "softplus",
    "mish", "hardswish", "hardsigmoid", "hardtanh", "erf", "erfc", "clamp", "clamp_min", "clamp_max", "clip", "where",
    "masked_fill", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "logical_not", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_not", "bitwise_xor", "__and__", "__or__",
    "__xor__", "__invert__", "sign", "sgn", "floor", "ceil", "round", "trunc", "frac", "lerp", "addcmul", "addcdiv",
    "copysign", "atan2", "isnan", "isinf", "nan_to_num", "fill", "triu", "tril", "logit", "threshold", "glu")
# operand slots backward reads, per function (as the model builders declare them)
SAVES = {"swiglu": ("in0", "in1"), "geglu": ("in0", "in1"), "mul": ("in0", "in1"), "div": ("in0", "in1"),
         "silu": ("in0",), "gelu": ("in0",), "pow": ("in0",), "log": ("in0",), "where": ("in0",),
         "masked_fill": ("in1",), "glu": ("in0",), "sigmoid": ("out0",), "tanh": ("out0",), "exp": ("out0",),
         "rsqrt": ("out0",), "sqrt": ("out0",), "relu": ("out0",)}
# rough FLOPs per element (memory-bound anyway); activations match the builders (gelu 8, swiglu 4)
FLOPS = {"swiglu": 4, "geglu": 8, "rope": 3, "gelu": 8, "silu": 4, "sigmoid": 4, "tanh": 4, "exp": 2, "erf": 4,
         "softplus": 4, "cat": 0, "stack": 0, "cast": 0}


def broadcast(lw: Lowering, ins, shape):
    """Output axes of a broadcasting op, unifying aligned operand axes; also the local renames."""
    axes, renames = [], {}
    for i, size in enumerate(shape):
        first = None
        for j, v in enumerate(ins):
            k = i - (len(shape) - len(v.shape))
            if k < 0 or v.shape[k] != size or not v.axes[k]:
                continue
            if first is None:
                first = v.axes[k]
            elif size > 1:
                renames.setdefault(j, []).extend(renames_into(lw.dims, first, v.axes[k]))
        axes.append(first or ())
    return axes, renames


def renames_into(dims, keep, other) -> list:
    """Unify ``other`` into ``keep`` (``dims.unify``); the pairs that cannot merge become renames of
    ``other``'s operand (as ``Lowering.emit``'s ``renames`` take them)."""
    return [(_tup(y), _tup(x)) for x, y in dims.unify(keep, other)]


def _tup(x) -> tuple:
    return tuple(x) if isinstance(x, tuple) else (x,)


def tensor_args(lw: Lowering, node) -> list[Val]:
    """Tensor arguments (lists flattened), without constant scalars."""
    out = []
    for arg in list(node.args) + list(node.kwargs.values()):
        for item in (arg if isinstance(arg, (list, tuple)) else [arg]):
            v = lw.val(item)
            if v is not None and (v.shape or lw.tensors[v.tensor].role not in ("const",)):
                out.append(v)
    return out


def pointwise(lw: Lowering, node, fn: str, ins=None, index=None) -> Val:
    """An elementwise op over the broadcast of its tensor operands (``SAVES``, ``FLOPS`` by ``fn``)."""
    ins = tensor_args(lw, node) if ins is None else ins
    value = node.meta["val"] if index is None else node.meta["val"][index]
    axes, renames = broadcast(lw, ins, static_shape(value))
    out = lw.out_val(node, axes, like=ins, index=index)
    # constants (rotary tables, masks) are kept anyway: backward saves nothing for them
    saves = tuple(s for s in SAVES.get(fn, ()) if s == "out0" or int(s[2:]) >= len(ins)
                  or lw.tensors[ins[int(s[2:])].tensor].role != "const")
    lw.emit(node, "elementwise", ins, [out], renames=renames,
            attrs={"fn": fn, "saves": saves, "flops_per_element": FLOPS.get(fn, 1)})
    lw.vals[node] = out
    return out


def _pointwise_handler(lw, node):
    name = op_key(node).split("::")[-1]
    if name in ("max", "min"):
        name = "maximum" if name == "max" else "minimum"
    pointwise(lw, node, name.strip("_") or name)


handles(*POINTWISE)(_pointwise_handler)


# -- reductions -----------------------------------------------------------------------------------
REDUCTIONS = (
    "sum", "mean", "amax", "amin", "max", "min", "var", "std", "var_mean", "std_mean", "prod", "logsumexp", "argmax",
    "argmin", "all", "any", "linalg_vector_norm", "norm", "count_nonzero", "nansum", "nanmean")


@handles(*REDUCTIONS)
def _reduce(lw, node):
    """A reduction: an elementwise op whose reduced dims are in no output."""
    if node.target._overloadname == "other":  # max(a, b) / min(a, b) are pointwise
        return _pointwise_handler(lw, node)
    x = lw.val(node.args[0])
    args = bind(node)
    dims = args.get("dim")
    keep = bool(args.get("keepdim"))
    rank = len(x.axes)
    reduced = set(range(rank)) if dims is None or dims == [] else {_dim(d, rank) for d in _as_list(dims)}
    axes = [() if d in reduced else a for d, a in enumerate(x.axes) if keep or d not in reduced]
    values = node.meta["val"]
    multi = isinstance(values, (tuple, list))
    outs = [lw.out_val(node, axes, like=[x], index=i) for i in range(len(values))] if multi \
        else [lw.out_val(node, axes, like=[x])]
    fn = op_key(node).split("::")[-1]
    saves = () if fn in ("sum", "mean") else ("in0",)  # max, var, norm ... need their input back
    lw.emit(node, "elementwise", [x], outs, attrs={"fn": fn, "saves": saves, "flops_per_element": 1})
    lw.vals[node] = tuple(outs) if multi else outs[0]


# -- concatenation and splitting ------------------------------------------------------------------
@handles("cat", "concat", "concatenate")
def _cat(lw, node):
    """Concatenation: the joined axis is a new dim, the other axes of the pieces are unified."""
    ins = [lw.val(t) for t in node.args[0] if lw.val(t) is not None and lw.val(t).shape]
    if not ins:
        return generic(lw, node, warn=False)
    shape = shape_of(node)
    dim = _dim(node.args[1] if len(node.args) > 1 else 0, len(shape))
    axes, renames = list(ins[0].axes), {}
    for j, v in enumerate(ins[1:], 1):
        for i in range(len(axes)):
            if i != dim and v.shape[i] == shape[i] and v.axes[i] and axes[i]:
                renames.setdefault(j, []).extend(renames_into(lw.dims, axes[i], v.axes[i]))
    axes[dim] = lw.fresh_axes((shape[dim],))[0]
    out = lw.out_val(node, axes, like=ins)
    lw.emit(node, "elementwise", ins, [out], renames=renames,
            attrs={"fn": "cat", "saves": (), "flops_per_element": 0})
    lw.vals[node] = out


@handles("stack")
def _stack(lw, node):
    """Stacking: a new dim of size len(pieces); the pieces' axes are unified."""
    ins = [lw.val(t) for t in node.args[0] if lw.val(t) is not None]
    if len(ins) != len(node.args[0]):
        return generic(lw, node, warn=False)
    shape = shape_of(node)
    dim = _dim(node.args[1] if len(node.args) > 1 else 0, len(shape))
    axes, renames = list(ins[0].axes), {}
    for j, v in enumerate(ins[1:], 1):
        for i, axis in enumerate(axes):
            if axis and v.axes[i]:
                renames.setdefault(j, []).extend(renames_into(lw.dims, axis, v.axes[i]))
    axes.insert(dim, lw.fresh_axes((shape[dim],))[0])
    out = lw.out_val(node, axes, like=ins)
    lw.emit(node, "elementwise", ins, [out], renames=renames,
            attrs={"fn": "stack", "saves": (), "flops_per_element": 0})
    lw.vals[node] = out


@handles("split", "split_with_sizes", "chunk", "unbind", "tensor_split", "unsafe_split", "unsafe_chunk")
def _split(lw, node):
    """Equal pieces share one dim (the split dim becomes ``pieces x piece``); unequal ones get fresh dims."""
    x = lw.val(node.args[0])
    shapes = [static_shape(v) for v in node.meta["val"]]
    rank = len(x.axes)
    dim = _dim(bind(node).get("dim") or 0, rank)
    unbind = op_key(node) == "aten::unbind"
    piece = 1 if unbind else shapes[0][dim]
    groups = None
    if all(s == shapes[0] for s in shapes) and piece * len(shapes) == x.shape[dim]:
        groups = lw.dims.regroup((x.axes[dim],), (len(shapes), piece))
    outs = []
    for i, shape in enumerate(shapes):
        axes = list(x.axes)
        if unbind:
            axes.pop(dim)
        else:
            axes[dim] = groups[1] if groups else lw.fresh_axes((shape[dim],))[0]
        outs.append(lw.out_val(node, axes, like=[x], index=i))
    lw.emit(node, "reshape", [x], outs, attrs={"fn": op_key(node).split("::")[-1]})
    lw.vals[node] = tuple(outs)


@handles("slice", "narrow")
def _slice(lw, node):
    x, shape = lw.val(node.args[0]), shape_of(node)
    if shape == x.shape:
        return set_view(lw, node, x, x.axes)
    axes = [a if old == new else lw.fresh_axes((new,))[0] for a, old, new in zip(x.axes, x.shape, shape)]
    materialize(lw, node, x, axes, op_key(node).split("::")[-1])


@handles("select")
def _select(lw, node):
    x = lw.val(node.args[0])
    dim = _dim(node.args[1], len(x.axes))
    materialize(lw, node, x, [a for d, a in enumerate(x.axes) if d != dim], "select")


@handles("repeat_interleave", view=True)
def _repeat_interleave(lw, node):
    """``x.repeat_interleave(r, dim)`` is ``x`` broadcast over a new inner dim of size r (GQA's repeat_kv)."""
    x = lw.val(node.args[0])
    repeats, dim = (node.args[1] if len(node.args) > 1 else None), bind(node).get("dim")
    if x is None or not isinstance(repeats, int) or dim is None:
        return _move(lw, node)
    dim = _dim(dim, len(x.axes))
    axes = list(x.axes)
    axes[dim] = tuple(axes[dim]) + lw.fresh_axes((repeats,))[0]
    set_view(lw, node, x, axes)


@handles("repeat", "tile", view=True)
def _repeat(lw, node):
    """``x.repeat(r0, r1, ...)`` is ``x`` broadcast over new outer dims of sizes r (no data is new)."""
    x = lw.val(node.args[0])
    reps = list(node.args[1])
    lead = len(reps) - len(x.axes)
    if lead < 0:
        return _move(lw, node)
    axes = [lw.fresh_axes((r,))[0] for r in reps[:lead]]
    axes += [lw.fresh_axes((r,))[0] + tuple(a) for r, a in zip(reps[lead:], x.axes)]
    set_view(lw, node, x, axes)


@handles("pad", "constant_pad_nd", "flip", "roll")
def _move(lw, node):
    """Data movement that keeps the axes of equal size and gives resized ones fresh dims."""
    x, shape = lw.val(node.args[0]), shape_of(node)
    lead = len(shape) - len(x.axes)
    axes = list(lw.fresh_axes(shape[:lead]))
    axes += [a if old == new else lw.fresh_axes((new,))[0] for a, old, new in zip(x.axes, x.shape, shape[lead:])]
    materialize(lw, node, x, axes, op_key(node).split("::")[-1])


# -- generic --------------------------------------------------------------------------------------
# no IR kind models these beyond "generic" (routing, sorting, gathers, scans); they raise no warning
ROUTING = (
    "topk", "sort", "argsort", "msort", "cumsum", "cumprod", "histc", "bincount", "one_hot", "index_fill",
    "masked_select", "masked_scatter", "searchsorted", "nonzero", "unique", "embedding_bag", "kthvalue", "mode")


def guess_axes(lw: Lowering, ins, shape):
    """Axes of an unknown op's output: those of its first input where sizes agree by position."""
    x = ins[0] if ins else None
    axes = []
    for i, size in enumerate(shape):
        if x is not None and i < len(x.shape) and x.shape[i] == size:
            axes.append(x.axes[i])
        else:
            axes.append(lw.fresh_axes((size,))[0])
    return axes


def generic(lw: Lowering, node, warn: bool, kind: str = "generic") -> list[Val]:
    """A ``generic`` op over the node's tensor arguments and outputs."""
    if warn:
        lw.unmapped[op_key(node)] += 1
    ins = tensor_args(lw, node)
    values = node.meta["val"]
    multi = isinstance(values, (tuple, list))
    outs = []
    for i, v in enumerate(values if multi else [values]):
        if _has_tensor(v):
            outs.append(lw.out_val(node, guess_axes(lw, ins, static_shape(v)), like=ins, index=i if multi else None))
        else:
            outs.append(None)
    lw.emit(node, kind, ins, [o for o in outs if o is not None], attrs={"fn": op_key(node).split("::")[-1]})
    lw.vals[node] = tuple(outs) if multi else outs[0]
    return outs


def _routing_handler(lw, node):
    generic(lw, node, warn=False)


handles(*ROUTING)(_routing_handler)


@handles("scatter", "scatter_add", "scatter_reduce", "index_add", "index_copy", "index_put")
def _scatter(lw, node):
    """Writes of ``src`` rows into ``self``: the output has ``self``'s dims; the row dims ``src``
    shares with ``self`` (all but the indexed ones, aligned from the right) are unified."""
    x = lw.val(node.args[0])
    ins = tensor_args(lw, node)
    src = ins[-1] if len(ins) > 1 and ins[-1] is not x else None
    renames = {}
    if src is not None:
        for k in range(1, min(len(src.axes), len(x.axes))):
            if src.shape[-k] == x.shape[-k] and src.axes[-k] and x.axes[-k]:
                renames.setdefault(len(ins) - 1, []).extend(renames_into(lw.dims, x.axes[-k], src.axes[-k]))
    out = lw.out_val(node, x.axes, like=[x])
    lw.emit(node, "generic", ins, [out], renames=renames, attrs={"fn": op_key(node).split("::")[-1]})
    lw.vals[node] = out
