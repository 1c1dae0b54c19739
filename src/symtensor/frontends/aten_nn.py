"""ATen ops with their own IR kinds: contractions, attention, norms, softmax, embeddings, losses, experts.

    linear mm addmm matmul bmm baddbmm einsum, one operand a parameter     -> linear
    the same between two activations                                     -> bmm
    scaled_dot_product_attention, its flash/efficient/cudnn/math variants  -> attention
        (Q[b,s,n,d], K/V[b,t,g,d]; K/V repeated by repeat_kv are read before the repeat: GQA)
    layer_norm native_layer_norm rms_norm, the RMSNorm decomposition       -> norm(axis, fn)
    softmax log_softmax                                                  -> softmax(axis)
    embedding                                                            -> embedding
    cross_entropy_loss, nll_loss(log_softmax(x))                         -> cross_entropy
    grouped_mm over stacked expert weights [e, in, out]                   -> linear over e, b, c
    index gathers feeding / fed by the expert GEMMs                      -> moe_dispatch / moe_combine
"""

from __future__ import annotations

from symtensor.frontends.aten_map import (
    _dim,
    bind,
    generic,
    handles,
    pointwise,
    renames_into,
    shape_of,
)
from symtensor.frontends.lower import AtomRef, Lowering, Val
from symtensor.frontends.patterns import Fused, op_short

ATTENTION_OPS = ("scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                 "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_attention_math",
                 "_scaled_dot_product_attention_math_for_mps", "_scaled_dot_product_fused_attention_overrideable")
_CAUSAL_MARKERS = {"le", "ge", "lt", "gt", "tril", "triu"}
_REDUCTION = {0: "none", 1: "mean", 2: "sum"}


# -- helpers --------------------------------------------------------------------------------------
def _flat(axes) -> tuple[int, ...]:
    return tuple(a for axis in axes for a in axis)


def _untwin(dims, axis, others):
    """Leaves of ``axis`` already used by ``others`` get fresh twins (``K^T``'s ``s`` becomes ``t``)."""
    taken = {dims.find(leaf) for leaf in dims.leaves_of(_flat(others))}
    new, renames = [], []
    for leaf in dims.leaves_of(axis):
        if leaf in taken and dims.size[leaf] > 1:
            twin = dims.twin(leaf)
            renames.append(((leaf,), (twin,)))
            new.append(twin)
        else:
            new.append(leaf)
    return tuple(new), renames


def _transposed(v: Val) -> Val:
    """The view of ``v`` with its last two axes swapped."""
    axes, shape = list(v.axes), list(v.shape)
    axes[-2:], shape[-2:] = axes[:-3:-1], shape[:-3:-1]
    return Val(v.tensor, tuple(axes), tuple(shape), v.dtype)


def _align_right(lw: Lowering, v: Val, axes, shape) -> list:
    """Unify a broadcast operand (a bias) with the trailing axes it matches."""
    renames = []
    for k in range(1, len(v.axes) + 1):
        if v.shape[-k] == shape[-k] and v.axes[-k] and axes[-k]:
            renames += renames_into(lw.dims, axes[-k], v.axes[-k])
    return renames


def _out(lw: Lowering, node, axes, name=None, dtype=None) -> Val:
    """The node's output, or an intermediate tensor ``name`` (attention's scores) sized from its axes."""
    if name is None:
        return lw.out_val(node, axes)
    shape = []
    for axis in axes:
        size = 1
        for leaf in lw.dims.leaves_of(axis):
            size *= lw.dims.size[leaf]
        shape.append(size)
    return lw.new_tensor(name, axes, shape, dtype)


# -- contractions ---------------------------------------------------------------------------------
def _batch_axes(lw: Lowering, a: Val, b: Val):
    """Broadcast batch axes of a matmul, unifying those both operands hold."""
    A, B = a.axes[:-2], b.axes[:-2]
    n = max(len(A), len(B))
    out, renames = [], []
    for i in range(n):
        ia, ib = i - (n - len(A)), i - (n - len(B))
        xa, xb = (A[ia] if ia >= 0 else None), (B[ib] if ib >= 0 else None)
        sa, sb = (a.shape[ia] if ia >= 0 else 1), (b.shape[ib] if ib >= 0 else 1)
        if xa is not None and xb is not None and sa == sb:
            if xa and xb:
                renames += renames_into(lw.dims, xa, xb)
            out.append(xa or xb)
        else:
            out.append(xa if xa is not None and sa >= sb else xb)
    return out, renames


def contract(lw: Lowering, node, a: Val, b: Val, bias: Val | None = None, name=None, label=None) -> Val:
    """``a @ b`` (numpy matmul rules) as ``linear`` when exactly one operand is a parameter, else ``bmm``."""
    dims = lw.dims
    a_vec, b_vec = len(a.axes) == 1, len(b.axes) == 1
    ka, kb = a.axes[-1], (b.axes[0] if b_vec else b.axes[-2])
    renames = renames_into(dims, ka, kb)
    if a_vec or b_vec:  # a vector operand has no batch axes: the other's are kept
        batch, more = list(b.axes[:-2] if a_vec else a.axes[:-2]), []
    else:
        batch, more = _batch_axes(lw, a, b)
    renames += more
    m = () if a_vec else a.axes[-2]
    n, more = _untwin(dims, () if b_vec else b.axes[-1], [*batch, m, ka])
    renames += more
    axes = list(batch) + ([] if a_vec else [m]) + ([] if b_vec else [n])
    out = _out(lw, node, axes, name, a.dtype)
    pa, pb = lw.is_param(a), lw.is_param(b)
    if pa != pb:
        x, w, k_axis, o_axis = (a, b, kb, n) if pb else (b, a, ka, m)
        ins, ren, kind = [x, w], {(1 if pb else 0): renames}, "linear"
        _weight_order(lw, w, (*w.axes[:-2], k_axis, o_axis))
        lw.linears.append((dims.leaves_of(k_axis), dims.leaves_of(o_axis)))
        if len(w.axes) > 2 and pb:
            _stacked_experts(lw, x, w, out)
    else:
        ins, ren, kind, w = [a, b], {1: renames}, "bmm", None
        _hint_bmm(lw, batch, ka, n)
    if bias is not None:
        ren[len(ins)] = _align_right(lw, bias, axes, out.shape)
        ins.append(bias)
    attrs = {"saves": ()} if w is not None and not lw.tensors[w.tensor].trainable else {}
    lw.emit(node, kind, ins, [out], attrs=attrs, renames=ren, label=label)
    return out


def _hint_bmm(lw: Lowering, batch, k_axis, n_axis) -> None:
    """Unfused attention names: batch dims other than ``b`` are heads (``n``, or ``g, r`` after a
    GQA repeat); a contracted or output dim that is no twin of another is a head dim ``d``
    (``Q K^T`` contracts ``d`` and makes the twin ``t``; ``P V`` contracts ``t`` and makes ``d``)."""
    dims = lw.dims
    b = dims.find(lw.batch_atom) if lw.batch_atom is not None else None
    heads = [x for x in dims.leaves_of(_flat(batch)) if x != b and dims.size[x] > 1]
    for leaf, name in zip(heads, ("n",) if len(heads) == 1 else ("g", "r")):
        dims.hint(leaf, name, 6)
    for axis in (k_axis, n_axis):
        leaves = [x for x in dims.leaves_of(axis) if dims.size[x] > 1]
        if len(leaves) == 1 and leaves[0] not in dims.twin_of:
            dims.hint(leaves[0], "d", 6)


def _weight_order(lw: Lowering, w: Val, axes) -> None:
    """Store a weight as ``[input dims, output dims]`` (the builders' ``[h, n, d]``), not torch's ``[out, in]``."""
    rec = lw.tensors[w.tensor]
    if rec.order is not None:
        return
    rec.order = list(_flat(axes))
    for other in lw.tensors.values():  # a tied table (GPT-2's wte = lm_head) is stored one way
        if rec.tie is not None and other.tie == rec.tie:
            other.order = rec.order


@handles("linear")
def _linear(lw, node):
    args = bind(node)
    x, w, bias = lw.val(args["input"]), lw.val(args["weight"]), lw.val(args["bias"])
    wt = _transposed(w) if len(w.axes) == 2 else w
    lw.vals[node] = contract(lw, node, x, wt, bias)


@handles("mm", "bmm", "matmul")
def _matmul(lw, node):
    a, b = lw.val(node.args[0]), lw.val(node.args[1])
    lw.vals[node] = contract(lw, node, a, b)


@handles("addmm", "baddbmm", "addbmm")
def _addmm(lw, node):
    bias, a, b = (lw.val(x) for x in node.args[:3])
    lw.vals[node] = contract(lw, node, a, b, bias)


@handles("einsum")
def _einsum(lw, node):
    equation, ops = node.args[0].replace(" ", ""), [lw.val(t) for t in node.args[1]]
    if "..." in equation or "->" not in equation or None in ops:
        return generic(lw, node, warn=False)
    lhs, result = equation.split("->")
    letters, renames = {}, {}
    for j, (term, v) in enumerate(zip(lhs.split(","), ops)):
        for letter, axis in zip(term, v.axes):
            if letter in letters:
                renames.setdefault(j, []).extend(renames_into(lw.dims, letters[letter], axis))
            else:
                letters[letter], more = _untwin(lw.dims, axis, list(letters.values()))
                renames.setdefault(j, []).extend(more)
    out = lw.out_val(node, [letters[c] for c in result])
    params = [j for j, v in enumerate(ops) if lw.is_param(v)]
    kind = "linear" if len(ops) == 2 and len(params) == 1 else "bmm" if len(ops) == 2 and not params else "generic"
    if kind == "linear":
        term = lhs.split(",")[params[0]]
        order = [letters[c] for c in term if c not in result] + [letters[c] for c in term if c in result]
        _weight_order(lw, ops[params[0]], order)
    lw.emit(node, kind, ops, [out], renames=renames, attrs={"fn": "einsum"} if kind == "generic" else {})
    lw.vals[node] = out


# -- attention ------------------------------------------------------------------------------------
def _causal_mask(mask, budget: int = 64) -> bool:
    """Whether a mask is built by comparing positions (HF's causal masks are), searching its inputs."""
    seen, todo = set(), [mask] if hasattr(mask, "op") else []
    while todo and len(seen) < budget:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "call_function" and op_short(node) in _CAUSAL_MARKERS:
            return True
        todo.extend(node.all_input_nodes)
    return False


def _single(lw: Lowering, v: Val, axis):
    """The one leaf of ``axis`` that ``v``'s tensor holds (broadcast leaves dropped), or None."""
    held = set(lw.dims.leaves_of(lw.tensors[v.tensor].atoms))
    leaves = [x for x in lw.dims.leaves_of(axis) if x in held or lw.dims.size[x] == 1]
    real = [x for x in leaves if lw.dims.size[x] > 1] or leaves
    return real[0] if len(real) == 1 else None


def _attention_plan(lw: Lowering, q: Val, k: Val, v: Val):
    """Renames and op-local names mapping Q, K, V onto ``b, s, t, n, g, d``; None when they do not fit."""
    if not len(q.axes) == len(k.axes) == len(v.axes) == 4:
        return None
    roles = [[_single(lw, t, axis) for axis in t.axes] for t in (q, k, v)]
    if any(r is None for rs in roles for r in rs):
        return None
    (qb, qn, qs, qd), (kb, kg, kt, kd), (vb, vg, vt, vd) = roles
    size = lw.size
    if size(kd) != size(qd) or size(vd) != size(qd) or size(kt) != size(vt) or size(kg) != size(vg) \
            or size(qn) % size(kg):
        return None  # e.g. a V head dim unlike Q's (MLA): the bmm-softmax-bmm fallback handles it
    dims = lw.dims
    ren_k = renames_into(dims, (qb,), (kb,)) + renames_into(dims, (qd,), (kd,))
    ren_v = [r for keep, other in ((qb, vb), (qd, vd), (kg, vg), (kt, vt))
             for r in renames_into(dims, (keep,), (other,))]
    t, g = kt, kg
    if dims.find(kt) == dims.find(qs):
        t = dims.twin(qs)
        ren_k.append(((kt,), (t,)))
        ren_v.append(((vt,), (t,)))
    if dims.find(kg) == dims.find(qn):
        g = dims.twin(qn)
        ren_k.append(((kg,), (g,)))
        ren_v.append(((vg,), (g,)))
    for atom, name in ((qn, "n"), (qd, "d"), (g, "g"), (t, "t")):
        dims.hint(atom, name, 8 if name != "t" else 7)
    names = {qb: "b", qn: "n", qs: "s", t: "t", g: "g", qd: "d"}
    return {1: ren_k, 2: ren_v}, names


@handles(*ATTENTION_OPS)
def _attention(lw, node):
    args = bind(node)
    q, k, v = (lw.val(args[n]) for n in ("query", "key", "value"))
    mask = args.get("attn_mask", args.get("attn_bias"))
    causal = bool(args.get("is_causal")) or _causal_mask(mask)
    multi = isinstance(node.meta["val"], (tuple, list))
    plan = _attention_plan(lw, q, k, v)
    if plan is None:
        out = _attention_math(lw, node, q, k, v, multi)
    else:
        out = lw.out_val(node, q.axes, like=[q], index=0 if multi else None)
        attrs = {"causal": causal, "linked": (("n", "g"),)}
        if args.get("dropout_p"):
            attrs["dropout"] = float(args["dropout_p"])
        lw.emit(node, "attention", [q, k, v], [out], attrs=attrs, renames=plan[0], names=plan[1])
    lw.vals[node] = (out,) + (None,) * (len(node.meta["val"]) - 1) if multi else out


def _attention_math(lw: Lowering, node, q: Val, k: Val, v: Val, multi: bool) -> Val:
    """Attention whose Q/K/V do not map onto single dims: ``softmax(Q K^T) V`` as bmm, softmax, bmm."""
    scores = contract(lw, node, q, _transposed(k), name=f"%{node.name}.scores", label="scores")
    probs = _out(lw, node, scores.axes, f"%{node.name}.probs", scores.dtype)
    lw.emit(node, "softmax", [scores], [probs], attrs={"axis": AtomRef(_flat(scores.axes[-1:])[0])}, label="softmax")
    return contract(lw, node, probs, v, name=f"%{node.name}.0" if multi else f"%{node.name}", label="context")


# -- norms, softmax, embedding --------------------------------------------------------------------
def norm(lw: Lowering, node, x: Val, k: int, weight: Val | None, bias: Val | None, fn: str) -> None:
    """A norm over the last ``k`` axes of ``x`` with optional weight and bias over those axes."""
    axes = x.axes[len(x.axes) - k:]
    ins, renames = [x], {}
    for p in (weight, bias):
        if p is not None:
            renames[len(ins)] = renames_into(lw.dims, _flat(axes), _flat(p.axes))
            ins.append(p)
    values = node.meta["val"]
    multi = isinstance(values, (tuple, list))
    outs = [lw.out_val(node, x.axes, like=[x], index=0 if multi else None)]
    if multi:
        stats = x.axes[:len(x.axes) - k] + ((),) * k
        outs += [lw.out_val(node, stats, index=i) for i in range(1, len(values))]
    first = _flat(axes)
    if not first:
        return pointwise(lw, node, fn, [x])
    lw.emit(node, "norm", ins, outs, attrs={"axis": AtomRef(first[0]), "fn": fn}, renames=renames, label="norm")
    lw.vals[node] = tuple(outs) if multi else outs[0]


@handles("layer_norm", "native_layer_norm")
def _layer_norm(lw, node):
    args = bind(node)
    norm(lw, node, lw.val(args["input"]), len(args["normalized_shape"]), lw.val(args["weight"]),
         lw.val(args["bias"]), "layernorm")


@handles("rms_norm", "_fused_rms_norm")
def _rms_norm(lw, node):
    args = bind(node)
    norm(lw, node, lw.val(args["input"]), len(args["normalized_shape"]), lw.val(args["weight"]), None, "rmsnorm")


def fused_rms_norm(lw: Lowering, node, fused: Fused) -> None:
    """The hand-written RMSNorm found by ``patterns.find_rms_norms``."""
    norm(lw, node, lw.val(fused.args[0]), 1, lw.val(fused.args[1]), None, "rmsnorm")


def fused_elementwise(lw: Lowering, node, fused: Fused) -> None:
    """A pointwise pattern (SwiGLU, rotary embedding, tanh GeLU) as one elementwise op."""
    pointwise(lw, node, dict(fused.attrs)["fn"], [lw.val(a) for a in fused.args])


@handles("softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax")
def _softmax(lw, node):
    x = lw.val(node.args[0])
    axis = x.axes[_dim(node.args[1], len(x.axes))]
    if not axis:
        return pointwise(lw, node, "softmax", [x])
    out = lw.out_val(node, x.axes, like=[x])
    attrs = {"axis": AtomRef(axis[0])}
    if "log" in op_short(node):
        attrs["fn"] = "log_softmax"
    lw.emit(node, "softmax", [x], [out], attrs=attrs)
    lw.vals[node] = out


@handles("embedding")
def _embedding(lw, node):
    args = bind(node)
    w, ids = lw.val(args["weight"]), lw.val(args["indices"])
    positional = args["indices"] not in lw.live
    for atom in w.axes[0]:
        lw.dims.hint(atom, "p" if positional else "v", 5)
    for atom in _flat(w.axes[1:]):
        lw.dims.hint(atom, "h", 5)
    out = lw.out_val(node, ids.axes + w.axes[1:])
    # position ids are constants: backward needs nothing saved, as the builders' pos embedding
    lw.emit(node, "embedding", [ids, w], [out], attrs={"saves": ()} if positional else {})
    lw.vals[node] = out


# -- losses ---------------------------------------------------------------------------------------
def cross_entropy(lw: Lowering, node, logits_node, target_node, reduction: int) -> None:
    """Cross entropy of logits ``[N, C, ...]`` (or ``[C]``) against class ids or probabilities."""
    x, y = lw.val(logits_node), lw.val(target_node)
    cls = 1 if len(x.axes) > 1 else 0
    rest = x.axes if y.shape == x.shape else tuple(a for i, a in enumerate(x.axes) if i != cls)
    renames = []
    for ax, ay in zip(rest, y.axes):
        if ax and ay:
            renames += renames_into(lw.dims, ax, ay)
    for atom in x.axes[cls]:
        lw.dims.hint(atom, "v", 6)
    values = node.meta["val"]
    multi = isinstance(values, (tuple, list))
    axes = y.axes if reduction == 0 and y.shape != x.shape else ()
    outs = [lw.out_val(node, axes, index=0 if multi else None)]
    if multi:
        outs += [lw.out_val(node, (), index=i) for i in range(1, len(values))]
    lw.emit(node, "cross_entropy", [x, y], outs, renames={1: renames},
            attrs={"reduction": _REDUCTION.get(reduction, str(reduction))}, label="cross_entropy")
    lw.vals[node] = tuple(outs) if multi else outs[0]


@handles("cross_entropy_loss")
def _cross_entropy_loss(lw, node):
    args = bind(node)
    cross_entropy(lw, node, args["self"], args["target"], args["reduction"])


def fused_cross_entropy(lw: Lowering, node, fused: Fused) -> None:
    """``nll_loss(log_softmax(x), target)`` found by ``patterns.find_log_softmax_nll``."""
    reduction = fused.args[3] if len(fused.args) > 3 else 1
    cross_entropy(lw, node, fused.args[0], fused.args[1], reduction)


@handles("nll_loss", "nll_loss_forward", "nll_loss_nd", "nll_loss2d", "nll_loss2d_forward")
def _nll_loss(lw, node):
    generic(lw, node, warn=False)  # on log-probabilities computed elsewhere: a gather and a mean


# -- mixture of experts ---------------------------------------------------------------------------
@handles("_grouped_mm", "transformers::grouped_mm_fallback")
def _grouped_mm(lw, node):
    """``x[R, in] @ w[e, in, out]`` with rows sorted by expert: a linear over ``[e, b, c]`` rows
    (``c`` = capacity per sequence, as the builders; balanced routing: R = e*b*c)."""
    x, w = lw.val(node.args[0]), lw.val(node.args[1])
    if x is None or w is None or not lw.is_param(w) or len(w.shape) != 3 or len(x.shape) != 2:
        return generic(lw, node, warn=True)
    experts, rows = w.shape[0], x.shape[0]
    batch = lw.dims.size[lw.dims.find(lw.batch_atom)] if lw.batch_atom is not None else 0
    target = (experts, batch, rows // (experts * batch)) if batch and rows % (experts * batch) == 0 \
        else (experts, rows // experts) if rows % experts == 0 else None
    groups = lw.dims.regroup((x.axes[0],), target) if target else None
    if groups is None:
        return generic(lw, node, warn=True)
    renames_into(lw.dims, w.axes[0], groups[0])
    if len(groups) == 3:
        renames_into(lw.dims, (lw.batch_atom,), groups[1])
    for atom, name in ((w.axes[0][0], "e"), (groups[-1][0], "c")):
        lw.dims.hint(atom, name, 6)
    lw.capacity_atom = groups[-1][0]
    renames = renames_into(lw.dims, x.axes[1], w.axes[1])
    out = lw.out_val(node, (x.axes[0], w.axes[2]))
    _weight_order(lw, w, w.axes)
    lw.linears.append((lw.dims.leaves_of(x.axes[1]), lw.dims.leaves_of(w.axes[2])))
    attrs = {} if lw.tensors[w.tensor].trainable else {"saves": ()}
    lw.emit(node, "linear", [x, w], [out], attrs=attrs, renames={1: renames}, label="experts")
    lw.vals[node] = out
    lw.experts.add(out.tensor)
    _mark_dispatch(lw, x.tensor)


def _stacked_experts(lw: Lowering, x: Val, w: Val, out: Val) -> None:
    """``x[e, C, in] @ w[e, in, out]``, a weight stacked over experts: name ``e``, split the rows
    ``C`` into ``[b, c]`` (capacity per sequence, as the builders) when the batch divides them."""
    dims = lw.dims
    for atom in _flat(w.axes[:-2]):
        dims.hint(atom, "e", 6)
    rows = x.axes[-2] if len(x.axes) >= 2 else ()
    batch = dims.size[dims.find(lw.batch_atom)] if lw.batch_atom is not None else 0
    size = x.shape[-2] if len(x.shape) >= 2 else 0
    if batch > 1 and size % batch == 0 and len(dims.leaves_of(rows)) == 1:
        groups = dims.regroup((rows,), (batch, size // batch))
        if groups is not None:
            renames_into(dims, (lw.batch_atom,), groups[0])
            dims.hint(groups[1][0], "c", 6)
            lw.capacity_atom = groups[1][0]
    lw.experts.add(out.tensor)
    _mark_dispatch(lw, x.tensor)


_DISPATCH = {"aten::index", "aten::index_copy", "aten::index_put", "aten::index_add", "aten::scatter",
             "aten::scatter_add"}


def _mark_dispatch(lw: Lowering, tensor: str, hops: int = 3) -> None:
    """The gather or scatter producing an expert GEMM's rows (through casts) is the MoE dispatch."""
    rec = lw.producer.get(tensor)
    while rec is not None and hops:
        if rec.aten in _DISPATCH:
            rec.kind = "moe_dispatch"
            rec.attrs.update(_carry(lw, "s", "c"))
            _mark_router(lw, rec)
            return
        if rec.kind != "elementwise" or not rec.inputs:
            return
        rec, hops = lw.producer.get(rec.inputs[0]), hops - 1


def _carry(lw: Lowering, src: str, dst: str) -> dict:
    """``carry``, as the builders: a cut of the token sequence ``s`` carries over to the capacity
    slots ``c`` (dispatch) and back (combine)."""
    atoms = {"s": lw.token_atoms[1] if len(lw.token_atoms) > 1 else None, "c": lw.capacity_atom}
    if atoms[src] is None or atoms[dst] is None:
        return {}
    return {"carry": ((AtomRef(atoms[src]), AtomRef(atoms[dst])),)}


def _mark_router(lw: Lowering, dispatch, hops: int = 8) -> None:
    """Name ``e`` the scores axis of the top-k that chose the experts of ``dispatch``."""
    frontier = list(dispatch.inputs[1:])
    for _ in range(hops):
        recs = [lw.producer.get(t) for t in frontier]
        for rec in recs:
            if rec is not None and rec.attrs.get("fn") == "topk":
                lw.dims.hint(lw.tensors[rec.inputs[0]].atoms[-1], "e", 5)
                return
        frontier = [i for r in recs if r is not None for i in r.inputs]


def _from_experts(lw: Lowering, tensor: str, hops: int = 4) -> bool:
    frontier = [tensor]
    for _ in range(hops):
        if any(t in lw.experts for t in frontier):
            return True
        recs = [lw.producer.get(t) for t in frontier]
        frontier = [i for r in recs if r is not None and r.kind in ("elementwise", "generic") for i in r.inputs]
    return False


@handles("index")
def _index(lw, node):
    """Advanced indexing ``x[..., idx, ...]``: a gather whose selected rows are new dims (a permutation
    or selection is not the dim it reads); the one collecting expert outputs is the MoE combine."""
    x, shape = lw.val(node.args[0]), shape_of(node)
    picked = [i for i, idx in enumerate(node.args[1]) if idx is not None]
    first, count = (picked[0], len(picked)) if picked else (0, 0)
    if picked != list(range(first, first + count)):
        first = 0
    width = len(shape) - len(x.axes) + count
    axes = list(x.axes[:first]) + list(lw.fresh_axes(shape[first:first + width])) + list(x.axes[first + count:])
    if len(axes) != len(shape):
        axes = list(lw.fresh_axes(shape))
    out = lw.out_val(node, axes, like=[x])
    combine = _from_experts(lw, x.tensor)
    lw.emit(node, "moe_combine" if combine else "generic",
            [v for v in (lw.val(a) for a in [node.args[0], *node.args[1]]) if v is not None], [out],
            attrs={"fn": "index", **(_carry(lw, "c", "s") if combine else {})})
    lw.vals[node] = out


@handles("index_select", "gather")
def _gather(lw, node):
    """``index_select``/``gather`` along ``dim``: that axis is a new dim, the others are kept."""
    x, shape = lw.val(node.args[0]), shape_of(node)
    dim = _dim(node.args[1], len(x.axes))
    axes = [lw.fresh_axes((size,))[0] if d == dim or d >= len(x.shape) or x.shape[d] != size else x.axes[d]
            for d, size in enumerate(shape)]
    out = lw.out_val(node, axes, like=[x])
    lw.emit(node, "generic", [v for v in (lw.val(a) for a in node.args) if v is not None], [out],
            attrs={"fn": op_short(node)})
    lw.vals[node] = out

