"""Lower a ``torch.export`` program into the IR: values, tensors, operator records, emission.

The walk (``Lowering.run``) visits the exported FX graph once, in order. Each torch value gets a
:class:`Val`: the IR tensor it lives in and, per torch axis, the atoms (``dims.DimTable``) that
axis runs over. Views (reshape, transpose, expand, ...) only make a new ``Val`` over the same IR
tensor, so they vanish from the IR; computing ops append an :class:`OpRec`. Atoms are unified
and split during the walk; only at the end (``Lowering.graph``) are they resolved to leaves and
named, so every tensor sees the finest dims found anywhere in the graph.

Values that depend on no graph input and no parameter (causal masks, rotary tables, position
ids) are *constants*: they are folded, and those an operator reads become graph inputs listed in
``meta["constants"]``. The number of folded ATen calls is kept in ``meta["folded_ops"]``.
"""

from __future__ import annotations

import re
import warnings
from collections import Counter
from dataclasses import dataclass, field

from symtensor.errors import PlanError
from symtensor.frontends.dims import DimTable
from symtensor.graph import Graph, Op, Tensor


class CaptureWarning(UserWarning):
    """A captured graph holds ATen ops with no mapping (they became ``generic`` ops)."""


@dataclass(slots=True)
class TensorRec:
    """An IR tensor under construction; ``atoms`` are in storage order."""

    name: str
    atoms: list[int]
    dtype: str
    role: str  # "input", "param", "const" or "act"
    trainable: bool = True
    tie: str | None = None
    order: list[int] | None = None  # preferred axis order (a weight: input dims, then output dims)
    used: bool = False


@dataclass(frozen=True, slots=True)
class Val:
    """A torch value: a view of IR tensor ``tensor`` whose torch axis ``i`` runs over ``axes[i]``.

    Atoms of ``axes`` that are not in the tensor are broadcast (``expand``); an empty tuple is a
    size-1 axis that the tensor does not have (``unsqueeze``).
    """

    tensor: str
    axes: tuple[tuple[int, ...], ...]
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, slots=True)
class AtomRef:
    """An attribute value naming a dim; resolved to the op-local name at emission."""

    atom: int


@dataclass(slots=True)
class OpRec:
    """An operator under construction. ``renames[i]`` maps leaves of input ``i`` to other leaves
    for this op only (the key sequence of ``probs @ V`` is ``t`` here, ``s`` elsewhere)."""

    name: str
    kind: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict
    layer: int | None
    block: str
    renames: dict[int, list[tuple[tuple[int, ...], tuple[int, ...]]]] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    aten: str = ""


_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "bool": "bool", "int64": "int64",
                 "int32": "int32"}
# dtypes the IR lacks are stored as one of the same width (bytes are what the cost model needs)
_BY_WIDTH = {8: "int64", 4: "fp32", 2: "fp16", 1: "fp8"}
_LAYER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def ir_dtype(dtype) -> str:
    """The IR dtype of a torch dtype (same width when the IR has no exact match)."""
    name = str(dtype).removeprefix("torch.")
    if name in _TORCH_DTYPES:
        return _TORCH_DTYPES[name]
    if name.startswith("float8"):
        return "fp8"
    return _BY_WIDTH.get(getattr(dtype, "itemsize", 4), "fp32")


def static_shape(value) -> tuple[int, ...]:
    """The shape of a (fake) tensor as ints; dynamic shapes are refused."""
    try:
        return tuple(int(s) for s in value.shape)
    except (TypeError, RuntimeError):
        raise PlanError(f"captured a tensor of dynamic shape {tuple(value.shape)}; capture with static "
                        "example inputs (no dynamic_shapes)") from None


class Lowering:
    """State of one capture: the dim table, IR tensors, values of FX nodes, operator records."""

    def __init__(self, name: str):
        self.name = name
        self.dims = DimTable()
        self.tensors: dict[str, TensorRec] = {}
        self.vals: dict = {}
        self.ops: list[OpRec] = []
        self.producer: dict[str, OpRec] = {}
        self.live: set = set()
        self.unmapped: Counter = Counter()
        self.folded: Counter = Counter()
        self.linears: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        self.experts: set[str] = set()
        self.batch_atom: int | None = None
        self.capacity_atom: int | None = None
        self.param_shapes: dict[str, tuple[int, ...]] = {}
        self.token_shape: tuple[int, ...] | None = None
        self.token_atoms: list[int] = []
        self.seen_layer = False
        self._op_names: set[str] = set()

    # -- values -----------------------------------------------------------------------------------
    def val(self, arg) -> Val | None:
        """The value of an FX argument, or None for non-tensors (numbers, lists, None)."""
        value = self.vals.get(arg) if hasattr(arg, "op") else None
        return value if isinstance(value, Val) else None

    def size(self, atom: int) -> int:
        return self.dims.size[self.dims.find(atom)]

    def fresh_axes(self, shape, keep_ones: bool = False) -> tuple[tuple[int, ...], ...]:
        """One new atom per axis; size-1 axes get none unless ``keep_ones``."""
        return tuple((self.dims.new(s),) if s > 1 or keep_ones else () for s in shape)

    def new_tensor(self, name: str, axes, shape, dtype: str, role: str = "act", like=(), **kw) -> Val:
        """A new IR tensor holding ``axes``; its atom order follows ``like`` when it has the same leaves."""
        axes = self._distinct(axes)
        flat = list(dict.fromkeys(a for axis in axes for a in axis))
        leaves = set(self.dims.leaves_of(flat))
        for other in like:
            if other is None:
                continue
            rec = self.tensors[other.tensor]
            if set(self.dims.leaves_of(rec.atoms)) == leaves and len(rec.atoms) > 1:
                flat = list(self.dims.leaves_of(rec.atoms))
                break
        self.dims.mark_apart(self.dims.leaves_of(flat))
        assert name not in self.tensors, name
        self.tensors[name] = TensorRec(name=name, atoms=flat, dtype=dtype, role=role, **kw)
        return Val(name, tuple(tuple(a) for a in axes), tuple(shape), dtype)

    def _distinct(self, axes) -> list[tuple[int, ...]]:
        """Axes whose leaves are all distinct: a leaf met again (an outer product ``x[:, None] * x``)
        is replaced by a twin, so the tensor keeps one dim per axis and its true size."""
        seen, out = set(), []
        for axis in axes:
            leaves = []
            for leaf in self.dims.leaves_of(axis):
                if leaf in seen and self.dims.size[leaf] > 1:
                    leaf = self.dims.twin(leaf)
                seen.add(leaf)
                leaves.append(leaf)
            out.append(tuple(axis) if tuple(leaves) == self.dims.leaves_of(axis) else tuple(leaves))
        return out

    def out_val(self, node, axes, like=(), index: int | None = None) -> Val:
        """A new activation for output ``index`` (None: the only output) of ``node``."""
        value = node.meta["val"] if index is None else node.meta["val"][index]
        name = f"%{node.name}" if index is None else f"%{node.name}.{index}"
        return self.new_tensor(name, axes, static_shape(value), ir_dtype(value.dtype), like=like)

    def is_param(self, value: Val | None) -> bool:
        return value is not None and self.tensors[value.tensor].role == "param"

    # -- operators --------------------------------------------------------------------------------
    def emit(self, node, kind: str, inputs, outputs, attrs=None, renames=None, names=None, label=None) -> OpRec:
        """Record an operator computing ``outputs`` (Vals) from ``inputs`` (Vals) for ``node``."""
        path, cls = _module_of(node)
        layer = _layer_of(path)
        self.seen_layer |= layer is not None
        if layer is None and not self.seen_layer:
            layer = -1
        op_name = self._unique_name(path, cls, kind, label or _aten_short(node))
        for v in inputs:
            self.tensors[v.tensor].used = True
        rec = OpRec(name=op_name, kind=kind, inputs=[v.tensor for v in inputs], outputs=[v.tensor for v in outputs],
                    attrs=dict(attrs or {}), layer=layer, block=_block_of(op_name, path),
                    renames=dict(renames or {}), names=dict(names or {}), aten=_aten_name(node))
        self.ops.append(rec)
        for v in outputs:
            self.producer[v.tensor] = rec
        return rec

    def _unique_name(self, path: str, cls: str, kind: str, label: str) -> str:
        owner = kind in ("linear", "embedding", "norm") and cls.endswith(("Linear", "Embedding", "Norm", "Conv1D"))
        base = path if owner and path else (f"{path}.{label}" if path else label)
        name, k = base, 1
        while name in self._op_names:
            name, k = f"{base}_{k}", k + 1
        self._op_names.add(name)
        return name

    # -- emission ---------------------------------------------------------------------------------
    def graph(self, meta: dict) -> Graph:
        """Resolve atoms to leaves, name them, and build the validated :class:`Graph`."""
        names = _DimNamer(self.dims)
        layers = 1 + max((op.layer for op in self.ops if op.layer is not None and op.layer >= 0), default=-1)
        emitted = list(self._emitted_tensors())
        g = Graph(name=self.name, meta=dict(
            meta, layers=layers, inputs=tuple(r.name for r in emitted if r.role in ("input", "const")),
            constants=tuple(r.name for r in emitted if r.role == "const")))
        for rec in emitted:
            leaves = self._storage_leaves(rec)
            g.add_tensor(Tensor(name=rec.name, shape=tuple(self.dims.size[x] for x in leaves),
                                labels=tuple(names.global_name(x) for x in leaves), dtype=rec.dtype,
                                param=rec.role == "param", trainable=rec.trainable, tie=rec.tie))
        consumed = {t for op in self.ops for t in op.inputs}
        for rec in self.ops:
            g.add_op(self._op(rec, names, layers, consumed))
        self._warn_unmapped()
        return g.validate()

    def _emitted_tensors(self):
        wanted = {t for op in self.ops for t in op.inputs + op.outputs}
        for role in ("input", "param", "const", "act"):
            for rec in self.tensors.values():
                if rec.role == role and (role in ("input", "param") or rec.name in wanted):
                    yield rec

    def _storage_leaves(self, rec: TensorRec) -> tuple[int, ...]:
        leaves = self.dims.leaves_of(rec.atoms)
        if rec.order is not None:
            preferred = tuple(dict.fromkeys(self.dims.leaves_of(rec.order)))
            if sorted(preferred) == sorted(leaves):
                return preferred
        return leaves

    def _op(self, rec: OpRec, names, layers: int, consumed) -> Op:
        local = _LocalNames(self.dims, names, rec.names)
        in_dims = []
        for i, t in enumerate(rec.inputs):
            mapping = self._renames(rec.renames.get(i, ()))
            in_dims.append(tuple(local.name(mapping.get(x, x)) for x in self._storage_leaves(self.tensors[t])))
        outputs = [t for k, t in enumerate(rec.outputs) if k == 0 or t in consumed]
        out_dims = [tuple(local.name(x) for x in self._storage_leaves(self.tensors[t])) for t in outputs]
        attrs = {k: self._attr(v, local) for k, v in rec.attrs.items()}
        layer = layers if rec.layer is None else rec.layer
        return Op(name=rec.name, kind=rec.kind, dims=tuple(local.sizes.items()), inputs=tuple(rec.inputs),
                  outputs=tuple(outputs), in_dims=tuple(in_dims), out_dims=tuple(out_dims), layer=layer,
                  block=rec.block, attrs=tuple(sorted(attrs.items())))

    def _attr(self, value, local: _LocalNames):
        """An attribute with its dims (AtomRef, or pairs of them as ``carry``) named as in the op;
        a pair naming a dim the op does not have is dropped."""
        if isinstance(value, AtomRef):
            return local.known(self.dims.leaves(value.atom)[0])
        if isinstance(value, tuple) and any(isinstance(p, tuple) and any(isinstance(x, AtomRef) for x in p)
                                            for p in value):
            pairs = (tuple(self._attr(x, local) for x in pair) for pair in value)
            return tuple(p for p in pairs if None not in p)
        return value

    def _renames(self, pairs) -> dict[int, int]:
        mapping = {}
        for src, dst in pairs:
            a, b = self.dims.leaves_of(src), self.dims.leaves_of(dst)
            if len(a) == len(b) and all(self.dims.size[x] == self.dims.size[y] for x, y in zip(a, b)):
                mapping.update((x, y) for x, y in zip(a, b) if x != y)
        return mapping

    def _warn_unmapped(self) -> None:
        if self.unmapped:
            listed = ", ".join(f"{name} (x{n})" for name, n in sorted(self.unmapped.items()))
            warnings.warn(f"capture of {self.name}: {len(self.unmapped)} ATen op(s) have no mapping and became "
                          f"'generic' operators (memory-bound, no cut rules): {listed}", CaptureWarning, stacklevel=4)


class _DimNamer:
    """Global names of leaves: naming hints first (``b``, ``s``, ``h``, ...), twins after their
    original (``s`` -> ``t``), fresh names ``x0, x1, ...`` for the rest, in order of appearance."""

    def __init__(self, dims: DimTable):
        self.dims, self._names, self._fresh = dims, {}, 0

    def global_name(self, leaf: int) -> str:
        root = self.dims.find(leaf)
        if root not in self._names:
            self._names[root] = self._choose(root)
        return self._names[root]

    def _choose(self, root: int) -> str:
        hint = self.dims.hints.get(root)
        if hint is not None:
            return hint[1]
        if root in self.dims.twin_of:
            base = self.global_name(self.dims.leaves(self.dims.twin_of[root])[0])
            if base == "s":
                return "t"
            if base.isalpha():
                return f"{base}2"
        self._fresh += 1
        return f"x{self._fresh - 1}"


class _LocalNames:
    """Names of the dims of one op: forced names first, then global names made unique in the op."""

    def __init__(self, dims: DimTable, names: _DimNamer, forced: dict[int, str]):
        self.dims, self.global_names = dims, names
        self.forced = {}
        for atom, name in forced.items():
            for k, leaf in enumerate(dims.leaves(atom)):
                self.forced[leaf] = name if k == 0 else f"{name}{k}"
        self.sizes: dict[str, int] = {}
        self._by_leaf: dict[int, str] = {}

    def known(self, leaf: int) -> str | None:
        """The name of a leaf the op already has, or None."""
        return self._by_leaf.get(self.dims.find(leaf))

    def name(self, leaf: int) -> str:
        leaf = self.dims.find(leaf)
        if leaf in self._by_leaf:
            return self._by_leaf[leaf]
        base = self.forced.get(leaf) or self.global_names.global_name(leaf)
        name, k = base, 1
        taken = set(self.sizes) | {n for x, n in self.forced.items() if x != leaf}
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        self._by_leaf[leaf] = name
        self.sizes[name] = self.dims.size[leaf]
        return name


def _module_of(node) -> tuple[str, str]:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1]
    cls = getattr(cls, "__name__", str(cls)).rsplit(".", 1)[-1].rstrip("'>")
    return (path if not path.startswith("L[") else ""), cls


def _layer_of(path: str) -> int | None:
    m = _LAYER.search(path)
    return int(m.group(1)) if m else None


def _block_of(op_name: str, path: str) -> str:
    """The op's name without its layer prefix (``model.layers.3.`` -> ``""``)."""
    m = _LAYER.search(op_name)
    return op_name[m.end():] if m and m.end() < len(op_name) else op_name


def _aten_name(node) -> str:
    target = node.target
    if hasattr(target, "name") and callable(target.name):
        return target.name().split(".")[0]
    return getattr(target, "__name__", str(target))


def _aten_short(node) -> str:
    return _aten_name(node).split("::")[-1].strip("_") or "op"
