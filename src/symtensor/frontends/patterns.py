"""Whole-graph analyses of an exported FX graph, run before the walk.

* ``live_nodes``: values that depend on a graph input or a parameter; the rest are constants.
* ``find_rms_norms``: the RMSNorm decomposition Hugging Face writes by hand,
  ``w * (x * rsqrt(mean(x**2, -1, keepdim) + eps)).to(dtype)``, fused back into one ``norm``.
* ``find_log_softmax_nll``: ``nll_loss(log_softmax(x), target)`` fused into one ``cross_entropy``.
* ``find_gated``: ``silu(a) * b`` (SwiGLU) and ``gelu(a) * b`` (GeGLU), one elementwise op as the
  builders have.
* ``find_rope``: ``x * cos + cat(-x2, x1) * sin`` (rotary embedding, HF ``rotate_half``), one op.
* ``find_gelu_tanh``: GPT-2's ``0.5 x (1 + tanh(c (x + 0.044715 x^3)))``, one ``gelu`` op.

A fusion returns ``{final node: Fused}`` and the set of absorbed nodes the walk skips; a node is
absorbed only when all its users are inside the pattern, so no value is lost.
"""

from __future__ import annotations

from dataclasses import dataclass

# ops whose result does not depend on their tensor arguments' values (only shapes/dtypes)
CREATION_OPS = frozenset({
    "arange", "zeros", "ones", "full", "empty", "empty_strided", "scalar_tensor", "rand", "randn", "randint",
    "zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like", "randint_like",
    "new_zeros", "new_ones", "new_full", "new_empty", "new_empty_strided", "linspace", "logspace", "eye", "tensor",
})
CAST_OPS = frozenset({"_to_copy", "to", "type_as", "_assert_tensor_metadata"})


@dataclass(frozen=True, slots=True)
class Fused:
    """A pattern recognised in the FX graph; ``args`` are the FX nodes it reads."""

    kind: str
    args: tuple
    attrs: tuple = ()


def op_short(node) -> str:
    """``aten::add.Tensor`` -> ``add``; ``operator.getitem`` -> ``getitem``."""
    target = node.target
    if hasattr(target, "name") and callable(target.name):
        return target.name().split("::")[-1].split(".")[0]
    return getattr(target, "__name__", str(target))


def live_nodes(graph, roots) -> set:
    """Nodes whose value depends on one of ``roots`` (graph inputs and parameters)."""
    live = set(roots)
    for node in graph.nodes:
        if node.op != "call_function" or op_short(node) in CREATION_OPS:
            continue
        if any(inp in live for inp in node.all_input_nodes):
            live.add(node)
    return live


def _is(node, *names) -> bool:
    return hasattr(node, "op") and node.op == "call_function" and op_short(node) in names


def _users(node) -> list:
    """Users that compute something (export's ``_assert_tensor_metadata`` checks do not)."""
    return [u for u in node.users if not op_short(u).startswith("_assert")]


def _only_user(node):
    users = _users(node)
    return users[0] if len(users) == 1 else None


def _other(node, known):
    """The other tensor argument of a binary op, or None."""
    a, b = node.args[0], node.args[1]
    return b if a is known else a if b is known else None


def _rms_core(rsqrt):
    """``(x, [pow, mean, add, rsqrt, mul])`` for ``x * rsqrt(mean(x**2) + eps)``, or None."""
    add = rsqrt.args[0]
    if not _is(add, "add") or not _is(add.args[0], "mean") or isinstance(add.args[1], type(add)):
        return None
    mean = add.args[0]
    sq = mean.args[0]
    if not (_is(sq, "pow") and sq.args[1] == 2) and not (_is(sq, "mul") and sq.args[0] is sq.args[1]):
        return None
    x = sq.args[0]
    mul = _only_user(rsqrt)
    if mul is None or not _is(mul, "mul") or _other(mul, rsqrt) is not x:
        return None
    chain = [sq, mean, add, rsqrt, mul]
    if any(_only_user(n) is None for n in chain[:-2]):
        return None
    return x, chain


def _rms_tail(mul, is_weight):
    """Extend past an optional cast and an optional ``weight *``: ``(final, weight, extra nodes)``."""
    final, extra, weight = mul, [], None
    nxt = _only_user(final)
    if nxt is not None and _is(nxt, "_to_copy", "to", "type_as"):
        final, extra = nxt, [nxt]
        nxt = _only_user(final)
    if nxt is not None and _is(nxt, "mul"):
        w = _other(nxt, final)
        if w is not None and is_weight(w):
            final, weight, extra = nxt, w, extra + [nxt]
    return final, weight, extra


def find_rms_norms(graph, is_weight) -> tuple[dict, set]:
    """RMSNorm decompositions; ``is_weight(node)`` says whether a node is a 1-D parameter."""
    fused, absorbed = {}, set()
    for node in graph.nodes:
        if not _is(node, "rsqrt"):
            continue
        core = _rms_core(node)
        if core is None:
            continue
        x, chain = core
        final, weight, extra = _rms_tail(chain[-1], is_weight)
        inner = chain + extra
        if _is(x, "_to_copy", "to") and set(_users(x)) <= set(inner):
            inner, x = [x] + inner, x.args[0]
        absorbed.update(n for n in inner if n is not final)
        fused[final] = Fused("rmsnorm", (x, weight), (("eps", node.args[0].args[1]),))
    return fused, absorbed


def find_log_softmax_nll(graph) -> tuple[dict, set]:
    """``nll_loss(log_softmax(x, dim), target)`` over the class dim, as one cross entropy."""
    fused, absorbed = {}, set()
    for node in graph.nodes:
        if not _is(node, "nll_loss", "nll_loss_forward", "nll_loss_nd", "nll_loss2d", "nll_loss2d_forward"):
            continue
        logp = node.args[0]
        if _is(logp, "log_softmax", "_log_softmax") and _only_user(logp) is node:
            fused[node] = Fused("cross_entropy", (logp.args[0],) + tuple(node.args[1:]))
            absorbed.add(logp)
    return fused, absorbed


def find_gated(graph) -> tuple[dict, set]:
    """``silu(a) * b`` -> swiglu(a, b) and ``gelu(a) * b`` -> geglu(a, b)."""
    fused, absorbed = {}, set()
    for node in graph.nodes:
        if not _is(node, "silu", "gelu"):
            continue
        mul = _only_user(node)
        if mul is None or not _is(mul, "mul") or not hasattr(_other(mul, node), "op"):
            continue
        fn = "swiglu" if _is(node, "silu") else "geglu"
        fused[mul] = Fused("elementwise", (node.args[0], _other(mul, node)), (("fn", fn),))
        absorbed.add(node)
    return fused, absorbed


def _half_source(node):
    """``(x, nodes)`` when ``node`` is a half of ``x``: ``x[..., a:b]`` or ``x.chunk(2, -1)[i]``."""
    if _is(node, "slice"):
        return node.args[0], [node]
    if hasattr(node, "op") and op_short(node) == "getitem" and _is(node.args[0], "chunk", "split", "split_with_sizes"):
        return node.args[0].args[0], [node, node.args[0]]
    return None, []


def _rotate_half(cat):
    """``x`` when ``cat`` is ``cat([-x2, x1], -1)`` for the halves ``x1, x2`` of ``x``, with its nodes."""
    parts = cat.args[0] if isinstance(cat.args[0], (list, tuple)) else ()
    if len(parts) != 2 or not _is(parts[0], "neg"):
        return None, []
    x_hi, hi_nodes = _half_source(parts[0].args[0])
    x_lo, lo_nodes = _half_source(parts[1])
    if x_hi is None or x_hi is not x_lo:
        return None, []
    inner = list(dict.fromkeys([parts[0], *hi_nodes, *lo_nodes]))
    if any(n not in (hi_nodes[-1],) and _only_user(n) is None for n in inner):
        return None, []
    if len(hi_nodes) == 2 and set(_users(hi_nodes[-1])) - set(inner):
        return None, []
    return x_hi, inner


def find_rope(graph) -> tuple[dict, set]:
    """Rotary embeddings ``x * cos + rotate_half(x) * sin`` -> one elementwise ``rope(x, cos, sin)``."""
    fused, absorbed = {}, set()
    for node in graph.nodes:
        if not _is(node, "add") or not all(_is(a, "mul") for a in node.args[:2]):
            continue
        for m_x, m_rot in (node.args[:2], node.args[1::-1]):
            cat = next((a for a in m_rot.args if _is(a, "cat")), None)
            if cat is None:
                continue
            x, inner = _rotate_half(cat)
            if x is None or x not in m_x.args[:2]:
                continue
            cos, sin = _other(m_x, x), _other(m_rot, cat)
            outer = [m_x, m_rot, cat]  # the nodes of rotate_half were checked by _rotate_half
            if not hasattr(cos, "op") or not hasattr(sin, "op") or any(_only_user(n) is None for n in outer):
                continue
            fused[node] = Fused("elementwise", (x, cos, sin), (("fn", "rope"),))
            absorbed.update(outer + inner)
            break
    return fused, absorbed


def _pointwise_region(start, x, budget: int = 12):
    """Nodes between ``x`` and ``start`` if every path back from ``start`` reaches only ``x`` and
    scalars through single-user mul/add/pow/tanh nodes; else None."""
    region, todo = [], [start]
    while todo:
        node = todo.pop()
        if node is x:
            continue
        if not _is(node, "mul", "add", "pow", "tanh") or len(region) > budget:
            return None
        region.append(node)
        todo.extend(a for a in node.args if hasattr(a, "op"))
    return region


def find_gelu_tanh(graph) -> tuple[dict, set]:
    """GPT-2's tanh GeLU written out in pointwise ops -> one ``gelu`` op."""
    fused, absorbed = {}, set()
    for node in graph.nodes:
        if not _is(node, "tanh"):
            continue
        one = _only_user(node)
        final = _only_user(one) if one is not None and _is(one, "add") else None
        if final is None or not _is(final, "mul"):
            continue
        half = _other(final, one)
        x = next((a for a in getattr(half, "args", ()) if hasattr(a, "op")), None) if _is(half, "mul") else None
        region = _pointwise_region(final, x) if x is not None else None
        if region is None or any(_only_user(n) is None for n in region if n is not final):
            continue
        fused[final] = Fused("elementwise", (x,), (("fn", "gelu"),))
        absorbed.update(n for n in region if n is not final)
    return fused, absorbed
