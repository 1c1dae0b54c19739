"""The sharding vocabulary: how an operator's iteration dims are cut across mesh axes.

A *mesh* (:class:`~symtensor.hardware.Mesh`) is a tuple of prime-sized axes, outermost level
first. An :class:`OpLayout` maps some of an op's iteration dims to the mesh axes (positions in
the mesh) that cut them. The cut of each tensor axis follows from its dim (``tensor_axes``);
axes that cut a reduced dim leave the op's output *partial* (pending sum, like JAX's
``unreduced``); axes that cut a dim absent from an input leave that input's gradient partial.
Axes the op does not use replicate it.

One rule says which layouts are legal (:func:`refusal`, which gives the reason): every cut
divides its dim, no axis is used twice, no forbidden dim is cut and a matmul cuts its weight's
reduction or output dims, not both. Plan files (``check_layout``), the search and the runtime
apply it, so an invalid layout cannot reach the cost model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from symtensor.errors import PlanError
from symtensor.graph import Op, op_no_cut


@dataclass(frozen=True, slots=True, eq=False)
class OpLayout:
    """``cuts``: ((dim, (axis position, ...)), ...) sorted by dim; hashable, so costs can be memoised.

    ``uid`` is an exact key of the cuts (equal layouts have equal uids, whichever object holds
    them, in any process): the search keys its memo tables by it, as a str hashes once and
    compares in C, where an OpLayout hashes and compares through Python methods.

    A layout memoises what is derived from it (``with_cut``, ``without_axes``, ``linked_layout``,
    ``tensor_layout``, ``refusal``: the search derives the same layouts over and over) in
    ``_derived``, which lives and dies with it. Layouts derived from a ``family`` root belong to its family: one
    object per distinct cuts, so equal layouts share their memos (the search keeps one family,
    owned by its ``EvaluatorPool``, which goes with it). The shared constant ``REPLICATED``
    keeps nothing (its derivations would outlive every search)."""

    cuts: tuple[tuple[str, tuple[int, ...]], ...] = ()
    _hash: int = field(default=0, repr=False)
    uid: str = field(default="", init=False, repr=False)
    _derived: dict | None = field(default=None, init=False, repr=False)
    _family: dict | None = field(default=None, init=False, repr=False)  # cuts -> the family's layout

    def __post_init__(self):
        uid = repr(self.cuts)
        object.__setattr__(self, "uid", uid)
        object.__setattr__(self, "_hash", hash(uid))
        object.__setattr__(self, "_derived", {})

    def __hash__(self):  # memo keys hash layouts constantly: compute it once
        return self._hash

    def __eq__(self, other) -> bool:
        return self is other or (type(other) is OpLayout and self.uid == other.uid)

    def __reduce__(self):  # rebuild from cuts: the hash and the family belong to this process
        return OpLayout, (self.cuts,)

    @staticmethod
    def of(mapping: dict[str, tuple[int, ...] | list[int]]) -> OpLayout:
        """Canonical: dims sorted, each dim's axes sorted (the cost of a cut depends on the set of
        axes it spans, not their order)."""
        return OpLayout(_canonical(mapping))

    @staticmethod
    def constant() -> OpLayout:
        """A replicated layout that memoises nothing: a module constant's derivations would outlive
        every search (``REPLICATED``)."""
        layout = OpLayout()
        object.__setattr__(layout, "_derived", None)
        return layout

    @staticmethod
    def family() -> OpLayout:
        """A replicated layout that roots a family of layouts (see the class docstring)."""
        root = OpLayout()
        object.__setattr__(root, "_family", {(): root})
        return root

    def relative(self, mapping) -> OpLayout:
        """The layout of ``mapping`` (dim -> axis positions) in this layout's family: the family's
        own object for those cuts (a new layout when this one has no family)."""
        cuts = _canonical(mapping)
        family = self._family
        if family is None:
            return OpLayout(cuts)
        hit = family.get(cuts)
        if hit is None:
            hit = family[cuts] = OpLayout(cuts)
            object.__setattr__(hit, "_family", family)
        return hit

    def placement(self, axes, partial: frozenset) -> TensorLayout:
        """``TensorLayout(axes, partial)``, the family's own object for it (see ``relative``)."""
        family = self._family
        if family is None:
            return TensorLayout(axes, partial)
        key = (None, axes, partial)  # (cuts never start with None: no clash with layouts)
        hit = family.get(key)
        if hit is None:
            hit = family[key] = TensorLayout(axes, partial)
        return hit

    def _keep(self, key, derived):
        """Memoise ``derived`` under ``key`` (unless this layout keeps nothing); returns it."""
        if self._derived is not None:
            self._derived[key] = derived
        return derived

    def as_dict(self) -> dict[str, tuple[int, ...]]:
        return dict(self.cuts)

    def axes_of(self, dim: str) -> tuple[int, ...]:
        for d, axes in self.cuts:
            if d == dim:
                return axes
        return ()

    def used_axes(self) -> set[int]:
        return {a for _, axes in self.cuts for a in axes}

    # The derivations below are memoised on the layout (``_derived``, keyed by what they take);
    # the lookups are written out: the search calls them hundreds of thousands of times.

    def with_cut(self, dim: str, axis: int) -> OpLayout:
        """This layout with one more cut: ``dim`` by ``axis``."""
        memo, key = self._derived, ("cut", dim, axis)
        hit = memo.get(key) if memo is not None else None
        if hit is None:
            m = self.as_dict()
            m[dim] = tuple(m.get(dim, ())) + (axis,)
            hit = self._keep(key, self.relative(m))
        return hit

    def without_axes(self, axes) -> OpLayout:
        """This layout without the cuts of the mesh positions ``axes``."""
        axes = frozenset(axes)
        memo, key = self._derived, ("drop", axes)
        hit = memo.get(key) if memo is not None else None
        if hit is None:
            hit = self._keep(key, self.relative({d: tuple(a for a in ax if a not in axes) for d, ax in self.cuts}))
        return hit

    def without_outer(self, k: int) -> OpLayout:
        """The layout on the mesh without its ``k`` outermost axes (``Mesh.drop_outer``): their
        cuts are dropped and the other positions shift down."""
        return self.relative({d: tuple(a - k for a in ax if a >= k) for d, ax in self.cuts})

    def named(self, mesh) -> dict[str, tuple[str, ...]]:
        """The cuts by mesh-axis names (plans and plan files name axes; see ``hardware.mesh``)."""
        return {d: mesh.names_of(axes) for d, axes in self.cuts}

    @staticmethod
    def from_names(cuts: dict, mesh) -> OpLayout:
        """The layout of cuts by mesh-axis names (``named``); an unknown name is a PlanError."""
        return OpLayout.of({d: tuple(mesh.position(a) for a in axes) for d, axes in cuts.items()})


def _canonical(mapping) -> tuple:
    """Cuts with dims sorted and each dim's axes sorted; dims without axes left out."""
    return tuple(sorted((d, tuple(sorted(a))) for d, a in mapping.items() if a))


REPLICATED = OpLayout.constant()


def cut_factor(layout: OpLayout, dim: str, mesh) -> int:
    """Devices that cut ``dim``: ``mesh.size`` of its axes (written out: the cost model's
    innermost loop)."""
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
    memo, key = layout._derived, ("link", linked)
    hit = memo.get(key) if memo is not None else None
    if hit is None:
        m = layout.as_dict()
        for src, dst in linked:
            if src in m:
                m[dst] = m[src]
        hit = layout._keep(key, layout.relative(m))
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
        """Devices that split the tensor: ``mesh.size`` of the axes cutting it (written out: the
        cost model's innermost loop)."""
        f = 1
        for ax in self.axes:
            for a in ax:
                f *= mesh[a].size
        return f


def tensor_layout(layout: OpLayout, tensor_dims: tuple[str, ...], op_dims: tuple[tuple[str, int], ...],
                  partial_for_missing: bool) -> TensorLayout:
    """Placement of a tensor whose axes run over ``tensor_dims`` of an op with ``layout``.

    With ``partial_for_missing`` the axes cutting op dims that the tensor lacks become partial
    (an output of a reduction, or the gradient of an input). Memoised on the layout.
    """
    memo, key = layout._derived, ("view", tensor_dims, partial_for_missing)
    hit = memo.get(key) if memo is not None else None
    if hit is None:
        axes = tuple(layout.axes_of(d) for d in tensor_dims)
        partial = frozenset()
        if partial_for_missing:
            placed = {a for ax in axes for a in ax}
            partial = frozenset(a for d, ax in layout.cuts if d not in tensor_dims for a in ax if a not in placed)
        hit = layout._keep(key, layout.placement(axes, partial))
    return hit


def matmul_roles(op) -> tuple[set[str], set[str]]:
    """(reduction dims, output dims) of a linear op's weight; never both cut in one op."""
    if op.kind != "linear":
        return set(), set()
    x, w, y = set(op.in_dims[0]), set(op.in_dims[1]), set(op.out_dims[0])
    return (w & x) - y, (w & y) - x


def refusal(op: Op, layout: OpLayout, mesh) -> str | None:
    """Why ``layout`` is not a legal layout of ``op`` on ``mesh``, or None when it is: the one
    legality rule, which plan files, the search and the runtime all apply.

    A layout is legal when it cuts only dims of the op that its kind lets be cut, names each
    mesh position at most once, every cut divides its dim (the cuts mirrored onto linked and
    carried dims too, see ``linked_layout``), and a matmul does not cut both its weight's
    reduction and output dims (a partial output of a partial weight is no Megatron layout and
    no cost rule prices it).

    >>> from symtensor.hardware import load_cluster
    >>> from symtensor.models import build_graph, load_model_config
    >>> g = build_graph(load_model_config("tiny-llama"), micro_batch=2, seq=16)
    >>> q = next(op for op in g.ops if op.block.endswith("q_proj"))
    >>> refusal(q, OpLayout.of({"h": (0,), "n": (1,)}), load_cluster("dgx-h100", devices=4).mesh())
    "the layout cuts both the weight's reduction dim(s) ['h'] and output dim(s) ['n']; cut one of them"

    Memoised on the layout (by the op's signature, all the rule reads of an op, and the mesh):
    every Megatron configuration of a search checks its layouts, and they share most of them.
    """
    memo, key = layout._derived, ("refusal", op.signature, mesh)
    hit = memo.get(key, _UNKNOWN) if memo is not None else _UNKNOWN
    if hit is _UNKNOWN:  # (None is an answer: legal)
        hit = layout._keep(key, _refusal(op, layout, mesh))
    return hit


_UNKNOWN = object()  # a refusal not memoised yet


def _refusal(op: Op, layout: OpLayout, mesh) -> str | None:
    sizes = op.dim_sizes
    forbidden = op_no_cut(op)
    seen: set[int] = set()
    for dim, axes in layout.cuts:
        if dim not in sizes:
            return f"the layout cuts dim {dim!r}, which is not one of its dims {sorted(sizes)}"
        if dim in forbidden:
            return f"dim {dim!r} may not be cut (kind {op.kind})"
        for a in axes:
            if not 0 <= a < len(mesh):
                return f"the layout names mesh axis {a}, but the mesh has {len(mesh)} axes"
            if a in seen:
                return f"mesh axis {mesh[a].name} is used twice in one layout"
            seen.add(a)
        f = cut_factor(layout, dim, mesh)
        if sizes[dim] % f:
            return f"dim {dim}={sizes[dim]} is not divisible by its cut {f}; choose a cut that divides it"
    full = linked_layout(op, layout)
    for dim, _ in full.cuts:
        f = cut_factor(full, dim, mesh)
        if sizes[dim] % f:
            return f"linked dim {dim}={sizes[dim]} is not divisible by its cut {f}"
    reduce_dims, out_dims = matmul_roles(op)
    cut = {d for d, _ in layout.cuts}
    if cut & reduce_dims and cut & out_dims:
        return (f"the layout cuts both the weight's reduction dim(s) {sorted(cut & reduce_dims)} and output "
                f"dim(s) {sorted(cut & out_dims)}; cut one of them")
    return None


def check_layout(op: Op, layout: OpLayout, mesh) -> None:
    """Raise a PlanError naming the op and the rule when ``layout`` is illegal (``refusal``)."""
    why = refusal(op, layout, mesh)
    if why is not None:
        raise PlanError(f"op {op.name}: {why}")
