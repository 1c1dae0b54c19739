"""The sharding vocabulary: how an operator's iteration dims are cut across mesh axes.

A *mesh* is a tuple of :class:`~symtensor.hardware.Axis` (prime-sized, outermost level first).
An :class:`OpLayout` maps some of an op's iteration dims to the mesh axes (indices into the mesh)
that cut them, in order. The cut of each tensor axis follows from its dim (``tensor_axes``);
axes that cut a reduced dim leave the op's output *partial* (pending sum, like JAX's
``unreduced``); axes that cut a dim absent from an input leave that input's gradient partial.
Axes the op does not use replicate it.

Every cut must divide its dim: :func:`check_layout` refuses anything else, so an invalid layout
cannot reach the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from symtensor.errors import PlanError
from symtensor.graph import Op, op_no_cut

# Every distinct ``cuts`` ever built gets a small integer, its layout's ``uid``: equal layouts have
# equal uids, whichever object holds them. The search keys its memo tables by uids, which hash
# and compare as plain ints (an OpLayout hashes through a Python method). Never cleared, or uids
# would be reused; it holds one entry per distinct layout, a few thousand in a search.
_UIDS: dict = {}
# One shared instance per layout built by ``of`` and the derivations below, so dict lookups keyed
# by layouts mostly match by identity instead of comparing ``cuts``; a plain cache (clearable).
_CANON: dict = {}
# Memoised derivations (``with_cut``, ``without_axes``, ``linked_layout``): the search derives the
# same layouts over and over. (uid, "cut", dim, axis) | (uid, "drop", axes) | (uid, "link", links)
_DERIVED: dict = {}


@dataclass(frozen=True, slots=True)
class OpLayout:
    """``cuts``: ((dim, (axis index, ...)), ...) sorted by dim; hashable, so costs can be memoised."""

    cuts: tuple[tuple[str, tuple[int, ...]], ...] = ()
    _hash: int = field(default=0, compare=False, repr=False)
    uid: int = field(default=0, init=False, compare=False, repr=False)  # see _UIDS

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash(self.cuts))
        object.__setattr__(self, "uid", _UIDS.setdefault(self.cuts, len(_UIDS)))

    def __hash__(self):  # memo keys hash layouts constantly: compute it once
        return self._hash

    def __reduce__(self):  # rebuild from cuts: the hash and uid belong to this process
        return OpLayout, (self.cuts,)

    @staticmethod
    def of(mapping: dict[str, tuple[int, ...] | list[int]]) -> "OpLayout":
        """Canonical: dims sorted, each dim's axes sorted (the cost of a cut depends on the set of
        axes it spans, not their order)."""
        return _canonical(tuple(sorted((d, tuple(sorted(a))) for d, a in mapping.items() if a)))

    def as_dict(self) -> dict[str, tuple[int, ...]]:
        return dict(self.cuts)

    def axes_of(self, dim: str) -> tuple[int, ...]:
        for d, axes in self.cuts:
            if d == dim:
                return axes
        return ()

    def used_axes(self) -> set[int]:
        return {a for _, axes in self.cuts for a in axes}

    def with_cut(self, dim: str, axis: int) -> "OpLayout":
        key = (self.uid, "cut", dim, axis)
        hit = _DERIVED.get(key)
        if hit is None:
            m = self.as_dict()
            m[dim] = tuple(m.get(dim, ())) + (axis,)
            hit = _remember(key, OpLayout.of(m))
        return hit

    def without_axes(self, axes: set[int]) -> "OpLayout":
        key = (self.uid, "drop", frozenset(axes))
        hit = _DERIVED.get(key)
        if hit is None:
            hit = _remember(key, OpLayout.of({d: tuple(a for a in ax if a not in axes) for d, ax in self.cuts}))
        return hit


def _canonical(cuts) -> OpLayout:
    hit = _CANON.get(cuts)
    if hit is None:
        if len(_CANON) > 200_000:
            _CANON.clear()
        hit = _CANON[cuts] = OpLayout(cuts)
    return hit


def _remember(key, layout: OpLayout) -> OpLayout:
    if len(_DERIVED) > 500_000:
        _DERIVED.clear()
    _DERIVED[key] = layout
    return layout


REPLICATED = OpLayout.of({})


def cut_factor(layout: OpLayout, dim: str, mesh) -> int:
    f = 1
    for a in layout.axes_of(dim):
        f *= mesh[a].size
    return f


def linked_layout(op: Op, layout: OpLayout) -> OpLayout:
    """Mirror cuts onto linked dims (attention: cutting heads ``n`` cuts kv heads ``g`` too) and
    carried dims (MoE dispatch: a cut of tokens ``s`` is a cut of capacity slots ``c``).
    Memoised on the links and the layout: the cost model asks for it on every lookup miss."""
    linked = op.attr("linked", ()) + op.attr("carry", ())
    if not linked:
        return layout
    key = (layout.uid, "link", linked)
    hit = _DERIVED.get(key)
    if hit is None:
        m = layout.as_dict()
        for src, dst in linked:
            if src in m:
                m[dst] = m[src]
        hit = _remember(key, OpLayout.of(m))
    return hit


@dataclass(frozen=True, slots=True)
class TensorLayout:
    """The placement of one tensor: per tensor axis the mesh axes cutting it; ``partial`` axes hold
    pending sums."""

    axes: tuple[tuple[int, ...], ...]
    partial: frozenset = frozenset()
    _hash: int = field(default=0, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash((self.axes, self.partial)))

    def __hash__(self):
        return self._hash

    def factor(self, mesh) -> int:
        f = 1
        for ax in self.axes:
            for a in ax:
                f *= mesh[a].size
        return f


_TL_CACHE: dict = {}


def tensor_layout(layout: OpLayout, tensor_dims: tuple[str, ...], op_dims: tuple[tuple[str, int], ...],
                  partial_for_missing: bool) -> TensorLayout:
    """Placement of a tensor whose axes run over ``tensor_dims`` of an op with ``layout``.

    With ``partial_for_missing`` the axes cutting op dims that the tensor lacks become partial
    (an output of a reduction, or the gradient of an input). Memoised: a pure function of values.
    """
    key = (layout, tensor_dims, partial_for_missing)
    hit = _TL_CACHE.get(key)
    if hit is None:
        if len(_TL_CACHE) > 200_000:
            _TL_CACHE.clear()
        hit = _TL_CACHE[key] = _tensor_layout(layout, tensor_dims, partial_for_missing)
    return hit


def _tensor_layout(layout: OpLayout, tensor_dims, partial_for_missing: bool) -> TensorLayout:
    axes = tuple(layout.axes_of(d) for d in tensor_dims)
    partial = frozenset()
    if partial_for_missing:
        placed = {a for ax in axes for a in ax}
        partial = frozenset(a for d, ax in layout.cuts if d not in tensor_dims for a in ax if a not in placed)
    return TensorLayout(axes, partial)


def check_layout(op: Op, layout: OpLayout, mesh) -> None:
    """Refuse a layout that uses an axis twice, cuts a forbidden dim or does not divide a dim."""
    sizes = op.dim_sizes
    seen = set()
    forbidden = op_no_cut(op)
    for dim, axes in layout.cuts:
        if dim not in sizes:
            raise PlanError(f"op {op.name}: layout cuts dim {dim!r}, which is not one of its dims {sorted(sizes)}")
        if dim in forbidden:
            raise PlanError(f"op {op.name}: dim {dim!r} may not be cut (kind {op.kind})")
        for a in axes:
            if not 0 <= a < len(mesh):
                raise PlanError(f"op {op.name}: layout names mesh axis {a}, but the mesh has {len(mesh)} axes")
            if a in seen:
                raise PlanError(f"op {op.name}: mesh axis {mesh[a].name} is used twice in one layout")
            seen.add(a)
        f = cut_factor(layout, dim, mesh)
        if sizes[dim] % f:
            raise PlanError(f"op {op.name}: dim {dim}={sizes[dim]} is not divisible by its cut {f}; "
                            "choose a cut that divides it")
    full = linked_layout(op, layout)
    for dim, _ in full.cuts:
        f = cut_factor(full, dim, mesh)
        if sizes[dim] % f:
            raise PlanError(f"op {op.name}: linked dim {dim}={sizes[dim]} is not divisible by its cut {f}")
