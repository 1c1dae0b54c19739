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


@dataclass(frozen=True, slots=True)
class OpLayout:
    """``cuts``: ((dim, (axis index, ...)), ...) sorted by dim; hashable, so costs can be memoised."""

    cuts: tuple[tuple[str, tuple[int, ...]], ...] = ()
    _hash: int = field(default=0, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "_hash", hash(self.cuts))

    def __hash__(self):  # memo keys hash layouts constantly: compute it once
        return self._hash

    @staticmethod
    def of(mapping: dict[str, tuple[int, ...] | list[int]]) -> "OpLayout":
        """Canonical: dims sorted, each dim's axes sorted (the cost of a cut depends on the set of
        axes it spans, not their order)."""
        return OpLayout(tuple(sorted((d, tuple(sorted(a))) for d, a in mapping.items() if a)))

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
        m = self.as_dict()
        m[dim] = tuple(m.get(dim, ())) + (axis,)
        return OpLayout.of(m)

    def without_axes(self, axes: set[int]) -> "OpLayout":
        return OpLayout.of({d: tuple(a for a in ax if a not in axes) for d, ax in self.cuts})


REPLICATED = OpLayout()


def cut_factor(layout: OpLayout, dim: str, mesh) -> int:
    f = 1
    for a in layout.axes_of(dim):
        f *= mesh[a].size
    return f


def linked_layout(op: Op, layout: OpLayout) -> OpLayout:
    """Mirror cuts onto linked dims (attention: cutting heads ``n`` cuts kv heads ``g`` too) and
    carried dims (MoE dispatch: a cut of tokens ``s`` is a cut of capacity slots ``c``)."""
    linked = op.attr("linked", ()) + op.attr("carry", ())
    if not linked:
        return layout
    m = layout.as_dict()
    for src, dst in linked:
        if src in m:
            m[dst] = m[src]
    return OpLayout.of(m)


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
