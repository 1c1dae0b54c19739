"""The operator-graph IR: tensors, parameters, operators as einsums over named dims, the graph.

Words: a *dim* is an iteration dimension of one operator (``b``, ``s``, ``h``, ``n``, ...); an
*axis* of a tensor is one of its positions. Every operator declares its iteration space
(``dims``: name -> size) and, for each input and output tensor, which iteration dim each tensor
axis runs over (``in_dims`` / ``out_dims``). Dims of the iteration space that appear in no output
are reduced. A plan cuts iteration dims; the cut of a tensor axis follows from its dim. This is
what makes every parallelism a cut ("unified parallelism", DESIGN.md).

Legend of dim names used by the model builders:
    b batch (sequences in a micro-batch)   s query/token sequence   t key/value sequence
    h hidden                               n attention heads        g key/value heads
    d head dim                             f feed-forward           v vocabulary
    e experts                              c expert capacity per sequence   r LoRA rank
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from symtensor.errors import PlanError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "bool": 1, "int64": 8, "int32": 4}


@dataclass(frozen=True, slots=True, kw_only=True)
class Tensor:
    """A tensor of the graph: an activation, a graph input, or a parameter.

    Args:
        name: unique name in the graph.
        shape: sizes of its axes.
        labels: a semantic label per axis (``batch``, ``seq``, ``hidden`` ...), for display.
        dtype: one of ``DTYPE_BYTES``.
        param: True for parameters (weights), which live across steps.
        trainable: parameters only: False for frozen weights (LoRA base), which get no gradient.
        tie: parameters only: name of a tied group (embedding and LM head share one table).
    """

    name: str
    shape: tuple[int, ...]
    labels: tuple[str, ...]
    dtype: str = "bf16"
    param: bool = False
    trainable: bool = True
    tie: str | None = None

    def __post_init__(self):
        if len(self.shape) != len(self.labels):
            raise PlanError(f"tensor {self.name}: shape {self.shape} and labels {self.labels} differ in rank")
        for size in self.shape:
            if not isinstance(size, int) or size <= 0:
                raise PlanError(f"tensor {self.name}: every size must be a positive integer, got shape {self.shape}")
        if self.dtype not in DTYPE_BYTES:
            raise PlanError(f"tensor {self.name}: unknown dtype {self.dtype!r}; use one of {sorted(DTYPE_BYTES)}")

    @property
    def numel(self) -> int:
        n = 1
        for size in self.shape:
            n *= size
        return n

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One operator: an einsum over named iteration dims.

    Args:
        name: unique name, e.g. ``layers.3.mlp.up_proj``.
        kind: a registered kind (see ``symtensor.graph.kinds``).
        dims: the iteration space, ``((dim, size), ...)``.
        inputs / outputs: tensor names.
        in_dims / out_dims: per tensor, the iteration dim of each of its axes.
        layer: the transformer layer index; -1 before the first layer, ``L`` after the last.
        block: the position inside a layer (``attn.q_proj``); ops of different layers with the
            same block and shapes are identical, which the search exploits.
        attrs: kind-specific attributes (``causal``, ``fused``, ``linked`` dims ...).
    """

    name: str
    kind: str
    dims: tuple[tuple[str, int], ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    in_dims: tuple[tuple[str, ...], ...]
    out_dims: tuple[tuple[str, ...], ...]
    layer: int = -1
    block: str = ""
    attrs: tuple[tuple[str, object], ...] = ()
    _sizes: dict = field(default=None, compare=False, repr=False)
    _attrs: dict = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        # derived lookups, built once: the cost model asks for them millions of times
        object.__setattr__(self, "_sizes", dict(self.dims))
        object.__setattr__(self, "_attrs", dict(self.attrs))

    @property
    def dim_sizes(self) -> dict[str, int]:
        return self._sizes

    def output_slot(self, tname: str) -> int:
        """The output slot that holds tensor ``tname`` (0 for a stand-in producer, which holds
        none: a repeated skeleton layer's input comes from its own previous copy)."""
        return self.outputs.index(tname) if tname in self.outputs else 0

    def attr(self, key: str, default=None):
        return self._attrs.get(key, default)

    @property
    def signature(self) -> tuple:
        """Everything the cost of this op depends on, minus names: equal ops cost the same."""
        return (self.kind, self.dims, self.in_dims, self.out_dims, self.attrs)


@dataclass(slots=True)
class Graph:
    """A training graph for one micro-batch: tensors, ops in topological order, and metadata.

    ``meta`` holds the model description (layers, hidden, ...) and the shapes it was built for
    (``micro_batch``, ``seq``). Backward and optimizer are implied by the forward graph.
    """

    name: str
    tensors: dict[str, Tensor] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    # -- construction -------------------------------------------------------------------------
    def add_tensor(self, tensor: Tensor) -> Tensor:
        if tensor.name in self.tensors:
            raise PlanError(f"graph {self.name}: tensor {tensor.name} defined twice")
        self.tensors[tensor.name] = tensor
        return tensor

    def add_op(self, op: Op) -> Op:
        self.ops.append(op)
        return op

    # -- queries ------------------------------------------------------------------------------
    def params(self) -> Iterable[Tensor]:
        return (t for t in self.tensors.values() if t.param)

    def params_total(self) -> int:
        """Parameter count, counting each tied group once."""
        seen, total = set(), 0
        for t in self.params():
            key = t.tie or t.name
            if key not in seen:
                seen.add(key)
                total += t.numel
        return total

    def producers(self) -> dict[str, Op]:
        return {t: op for op in self.ops for t in op.outputs}

    def layer_ops(self, layer: int) -> list[Op]:
        return [op for op in self.ops if op.layer == layer]

    # -- validation ---------------------------------------------------------------------------
    def validate(self) -> Graph:
        """Check names, shapes against iteration dims, and topological order (no cycles)."""
        names = set()
        defined = {t.name for t in self.tensors.values() if t.param or t.name in self.meta.get("inputs", ())}
        from symtensor.graph.kinds import kind_of

        for op in self.ops:
            if op.name in names:
                raise PlanError(f"graph {self.name}: op {op.name} defined twice")
            names.add(op.name)
            kind_of(op.kind)  # raises for unknown kinds
            sizes = op.dim_sizes
            if len(sizes) != len(op.dims):
                raise PlanError(f"op {op.name}: a dim is declared twice in {op.dims}")
            for d, size in op.dims:
                if size <= 0:
                    raise PlanError(f"op {op.name}: dim {d} has non-positive size {size}")
            if len(op.inputs) != len(op.in_dims) or len(op.outputs) != len(op.out_dims):
                raise PlanError(f"op {op.name}: every input and output needs its list of dims")
            for tname, tdims in zip(op.inputs + op.outputs, op.in_dims + op.out_dims):
                if tname not in self.tensors:
                    raise PlanError(f"op {op.name}: tensor {tname} is not defined in the graph")
                tensor = self.tensors[tname]
                if len(tdims) != len(tensor.shape):
                    raise PlanError(f"op {op.name}: tensor {tname} has rank {len(tensor.shape)} but dims {tdims}")
                for axis, (d, size) in enumerate(zip(tdims, tensor.shape)):
                    if d not in sizes:
                        raise PlanError(f"op {op.name}: dim {d!r} of tensor {tname} is undefined; declare it in dims")
                    if sizes[d] != size:
                        raise PlanError(
                            f"op {op.name}: tensor {tname} axis {axis} has size {size} but dim {d} is {sizes[d]}"
                            " (shape mismatch between producer and consumer)")
            for tname in op.inputs:
                if tname not in defined:
                    raise PlanError(f"op {op.name}: input {tname} is used before it is produced (cycle or wrong order)")
            for tname in op.outputs:
                if tname in defined:
                    raise PlanError(f"op {op.name}: tensor {tname} is produced twice")
                defined.add(tname)
        return self



def rescale_dim(graph: Graph, dim: str, size: int) -> Graph:
    """The same graph with iteration dim ``dim`` resized (every op that has it, every tensor axis
    that runs over it): a graph captured for one micro-batch serves every micro-batch size."""
    axis_dim: dict[str, list] = {}
    for op in graph.ops:
        for tname, dims in zip(op.inputs + op.outputs, op.in_dims + op.out_dims):
            axis_dim.setdefault(tname, [None] * len(dims))
            for i, d in enumerate(dims):
                if d == dim:
                    axis_dim[tname][i] = d
    out = Graph(name=graph.name, meta=dict(graph.meta))
    for t in graph.tensors.values():
        marks = axis_dim.get(t.name)
        shape = tuple(size if marks and marks[i] == dim else n for i, n in enumerate(t.shape))
        out.add_tensor(Tensor(name=t.name, shape=shape, labels=t.labels, dtype=t.dtype, param=t.param,
                              trainable=t.trainable, tie=t.tie))
    for op in graph.ops:
        dims = tuple((d, size if d == dim else n) for d, n in op.dims)
        out.add_op(Op(name=op.name, kind=op.kind, dims=dims, inputs=op.inputs, outputs=op.outputs,
                      in_dims=op.in_dims, out_dims=op.out_dims, layer=op.layer, block=op.block, attrs=op.attrs))
    if dim == "b":
        out.meta["micro_batch"] = size
    return out.validate()
