"""RunSpec: the parallel layout the runtime executes under torchrun (pure data; no torch import).

A RunSpec names a device mesh (ordered axis name -> size) and gives every mesh axis one role:

    tp_axis      tensor parallel: modules with a ``colwise``/``rowwise`` style are cut over it
    dp_axes      data parallel: the batch is cut over them, gradients are all-reduced
    fsdp_axes    FSDP2 (``fully_shard``): the batch is cut over them, parameters, gradients and
                 optimizer state are sharded; ``reshard_after_forward`` True (ZeRO-3) gathers each
                 group's parameters again for backward, False (ZeRO-2: the fsdp2 engine's ZeRO 1/2)
                 keeps them from forward to backward. With one ``dp_axes`` axis before it in the
                 mesh: hybrid sharding (HSDP), ``fully_shard`` on the 2-D mesh (dp axis, fsdp axis),
                 sharded over the fsdp axis and replicated over the dp axis, whose gradients
                 fully_shard all-reduces after each reduce-scatter
    ep_axes      expert parallel: ``dp_axes`` and/or ``tp_axis`` (Megatron's MoE parallel folding:
                 the expert layers regroup the ranks attention uses); experts are cut on dim 0
                 over them (flattened in mesh order) and tokens travel to their experts by
                 all-to-all. Over ``tp_axis`` it needs ``sequence_parallel``: each rank of a
                 tensor-parallel group routes its own sequence shard (Megatron requires sequence
                 parallelism for MoE with tensor parallelism too)
    pp_axis      pipeline parallel: the layer stack is split into ``mesh[pp_axis]`` stages

Module keys are the planner's op names, relative to a layer (``attn.q_proj`` ... ``mlp.experts``),
plus the two model-level keys ``embed`` and ``lm_head``. A style says how a module's weight is cut
over ``tp_axis``:

    key                              legal styles            what the non-replicate style means
    attn.q_proj/k_proj/v_proj        colwise | replicate     heads cut (weight dim 0 of [out, in])
    attn.o_proj                      rowwise | replicate     heads cut on the input side, output all-reduced
    mlp.gate_proj/up_proj            colwise | replicate     ffn cut
    mlp.down_proj                    rowwise | replicate     ffn cut on the input side, output all-reduced
    mlp.experts                      replicate               (experts are cut by ``ep_axes`` instead)
    embed                            rowwise | replicate     vocab cut (Megatron's vocab-parallel embedding)
    lm_head                          colwise | replicate     vocab cut, logits all-gathered for the loss

An attention block (or an MLP block) is either tensor parallel as a whole (Megatron: column then
row) or replicated as a whole. Styles not given are ``replicate``. ``layer_styles`` overrides
``styles`` for single layers, so attention and MLP, and layer 0 and layer 1, may differ. A
mixture-of-experts layer has no dense MLP: under sequence parallelism its router and experts run
on the rank's sequence shard.

Example:
    >>> spec = RunSpec(mesh={"dp": 2, "tp": 2}, tp_axis="tp", dp_axes=("dp",),
    ...                styles=ATTN_TP | MLP_TP, sequence_parallel=True)
    >>> spec.world_size, spec.batch_cut, spec.style(0, "attn.o_proj")
    (4, 2, 'rowwise')
    >>> RunSpec.from_dict(spec.to_dict()) == spec
    True
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from symtensor.errors import PlanError, did_you_mean

LAYER_KEYS = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "mlp.experts")
MODEL_KEYS = ("embed", "lm_head")
MODULE_KEYS = MODEL_KEYS + LAYER_KEYS
STYLES = ("colwise", "rowwise", "replicate")
SCHEDULES = ("1f1b", "gpipe")
OPTIMIZERS = ("sgd", "adamw")  # what the runtime's worker trains with

ATTN_KEYS = LAYER_KEYS[:4]
MLP_KEYS = LAYER_KEYS[4:7]
# the tensor-parallel style of each key; every key may also be "replicate"
TP_STYLE = {"attn.q_proj": "colwise", "attn.k_proj": "colwise", "attn.v_proj": "colwise",
            "attn.o_proj": "rowwise", "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
            "mlp.down_proj": "rowwise", "embed": "rowwise", "lm_head": "colwise"}
ATTN_TP = {k: TP_STYLE[k] for k in ATTN_KEYS}
MLP_TP = {k: TP_STYLE[k] for k in MLP_KEYS}
VOCAB_TP = {k: TP_STYLE[k] for k in MODEL_KEYS}


def tp_styles(moe: bool) -> dict[str, str]:
    """The tensor-parallel style of each module of a whole model: attention, the MLP unless the
    layers are MoE (``moe``), then the vocabulary (``VOCAB_TP``: embed rowwise, lm_head colwise)."""
    return ATTN_TP | ({} if moe else MLP_TP) | VOCAB_TP

Styles = tuple[tuple[str, str], ...]


def _pairs(value: Mapping | tuple, what: str) -> tuple[tuple[Any, Any], ...]:
    """A mapping (or pairs) as a tuple of pairs, so that the spec stays hashable."""
    items = value.items() if isinstance(value, Mapping) else value
    try:
        pairs = tuple((k, v) for k, v in items)
    except (TypeError, ValueError):
        raise PlanError(f"RunSpec.{what} must be a mapping, got {value!r}") from None
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise PlanError(f"RunSpec.{what} repeats a key: {keys}")
    return pairs


def _check_styles(styles: Styles, where: str, keys: tuple[str, ...]) -> None:
    """Every key known and legal for its place, every style legal for its key, blocks consistent."""
    for key, style in styles:
        if key not in keys:
            raise PlanError(f"RunSpec.{where}: unknown module key {key!r}." + did_you_mean(str(key), keys))
        legal = ("replicate", TP_STYLE[key]) if key in TP_STYLE else ("replicate",)
        if style not in legal:
            hint = " (experts are cut by ep_axes, not by tp_axis)" if key == "mlp.experts" else ""
            raise PlanError(f"RunSpec.{where}: {key}={style!r} is not allowed{hint}; use one of {', '.join(legal)}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSpec:
    """A parallel layout to execute; checked when built (see the module docstring).

    Args:
        mesh: ordered mesh axis name -> size; the product is the world size.
        tp_axis: the tensor-parallel axis, or None.
        styles: module key -> style, for every layer and for ``embed``/``lm_head``.
        layer_styles: layer index -> {layer key -> style}, overriding ``styles`` for that layer.
        sequence_parallel: norms and the residual stream are cut on the sequence over ``tp_axis``
            (Megatron-SP: all-gather before, reduce-scatter after each tensor-parallel block).
        dp_axes: data-parallel axes (batch cut, gradient all-reduce); with ``fsdp_axes``, the one
            replicate axis of hybrid sharding.
        fsdp_axes: fully_shard axes (batch cut, parameters sharded on dim 0).
        reshard_after_forward: with ``fsdp_axes``, fully_shard's ``reshard_after_forward``: True
            (ZeRO-3: parameters gathered in forward and again in backward) or False (ZeRO-2: gathered
            once, kept to backward).
        ep_axes: expert-parallel axes: ``dp_axes`` and/or ``tp_axis`` (with ``sequence_parallel``).
        pp_axis: pipeline axis; its size is the number of stages.
        pp_schedule: ``1f1b`` or ``gpipe``.
        microbatches: micro-batches per step (pipeline only).
        global_batch: sequences per training step, over all data-parallel ranks.
        seq: tokens per sequence.
    """

    mesh: tuple[tuple[str, int], ...]
    tp_axis: str | None = None
    styles: Styles = ()
    layer_styles: tuple[tuple[int, Styles], ...] = ()
    sequence_parallel: bool = False
    dp_axes: tuple[str, ...] = ()
    fsdp_axes: tuple[str, ...] = ()
    reshard_after_forward: bool = True
    ep_axes: tuple[str, ...] = ()
    pp_axis: str | None = None
    pp_schedule: str = "1f1b"
    microbatches: int = 1
    global_batch: int = 4
    seq: int = 16

    def __post_init__(self):
        def set_(name, value):
            object.__setattr__(self, name, value)

        # mesh order is meaningful; styles are sorted so that equal layouts compare and hash equal
        set_("mesh", _pairs(self.mesh, "mesh"))
        set_("styles", tuple(sorted(_pairs(self.styles, "styles"), key=str)))
        set_("layer_styles", tuple(sorted(((layer, tuple(sorted(_pairs(st, f"layer_styles[{layer}]"), key=str)))
                                           for layer, st in _pairs(self.layer_styles, "layer_styles")), key=str)))
        for name in ("dp_axes", "fsdp_axes", "ep_axes"):  # a bare string is one axis, not its letters
            axes = getattr(self, name)
            set_(name, (axes,) if isinstance(axes, str) else tuple(axes))
        self._check_mesh()
        self._check_counts()
        self._check_roles()
        set_("ep_axes", tuple(a for a, _ in self.mesh if a in self.ep_axes))  # experts flatten in mesh order
        _check_styles(self.styles, "styles", MODULE_KEYS)
        for layer, styles in self.layer_styles:
            if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
                raise PlanError(f"RunSpec.layer_styles: layer index must be an integer >= 0, got {layer!r}")
            _check_styles(styles, f"layer_styles[{layer}]", LAYER_KEYS)
        self._check_blocks()
        self._check_batch()

    # -- checks -----------------------------------------------------------------------------
    def _check_mesh(self) -> None:
        if not self.mesh:
            raise PlanError("RunSpec.mesh is empty; give at least one axis, e.g. {'dp': 2}")
        for name, size in self.mesh:
            if not isinstance(name, str) or not name:
                raise PlanError(f"RunSpec.mesh: axis names must be non-empty strings, got {name!r}")
            if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
                raise PlanError(f"RunSpec.mesh: axis {name!r} size must be a positive integer, got {size!r}")

    def _check_roles(self) -> None:
        """Each named axis exists, plays one role, and every axis of size > 1 has a role."""
        sizes = dict(self.mesh)
        roles = [("tp_axis", self.tp_axis), ("pp_axis", self.pp_axis)]
        roles += [("dp_axes", a) for a in self.dp_axes] + [("fsdp_axes", a) for a in self.fsdp_axes]
        roles = [(field, axis) for field, axis in roles if axis is not None]
        for field, axis in roles + [("ep_axes", a) for a in self.ep_axes]:
            if axis not in sizes:
                raise PlanError(f"RunSpec.{field}: axis {axis!r} is not in the mesh." + did_you_mean(str(axis), sizes))
        used = [axis for _, axis in roles]
        for axis in set(used):
            if used.count(axis) > 1:
                fields = [f for f, a in roles if a == axis]
                raise PlanError(f"RunSpec: axis {axis!r} has several roles ({', '.join(fields)}); give it one")
        for axis, size in self.mesh:
            if size > 1 and axis not in used:
                raise PlanError(f"RunSpec.mesh: axis {axis!r} (size {size}) has no role; name it in tp_axis, "
                                "dp_axes, fsdp_axes or pp_axis, or give it size 1")
        if len(set(self.ep_axes)) != len(self.ep_axes):
            raise PlanError(f"RunSpec.ep_axes repeats an axis: {list(self.ep_axes)}")
        for axis in self.ep_axes:
            if axis not in self.dp_axes and axis != self.tp_axis:
                raise PlanError(f"RunSpec.ep_axes: {axis!r} is neither one of dp_axes {list(self.dp_axes)} nor the "
                                f"tp_axis {self.tp_axis!r}: experts fold over the ranks that cut the tokens")
        if self.tp_axis in self.ep_axes and not self.sequence_parallel:
            raise PlanError(f"RunSpec.ep_axes includes the tp_axis {self.tp_axis!r}, which needs sequence_parallel: "
                            "without it every rank of a tensor-parallel group would route the same tokens")
        self._check_combinations()

    def _check_combinations(self) -> None:
        """Combinations this runtime does not execute are refused here, before any process starts."""
        if self.pp_axis is not None:
            others = [f for f, v in (("tp_axis", self.tp_axis), ("fsdp_axes", self.fsdp_axes),
                                     ("ep_axes", self.ep_axes)) if v and self.axis_size_of(v) > 1]
            if others:
                raise PlanError(f"RunSpec: pipeline parallel combines only with dp_axes in this runtime, "
                                f"not with {', '.join(others)}")
            if self.pp_schedule not in SCHEDULES:
                raise PlanError(f"RunSpec.pp_schedule={self.pp_schedule!r}; use one of {', '.join(SCHEDULES)}")
            if self.microbatches < self.pp_size:
                raise PlanError(f"RunSpec.microbatches={self.microbatches} must be >= the {self.pp_size} "
                                "pipeline stages (pp_axis size)")
        elif self.microbatches != 1:
            raise PlanError(f"RunSpec.microbatches={self.microbatches} needs pp_axis; set microbatches=1")
        if not isinstance(self.reshard_after_forward, bool):
            raise PlanError(f"RunSpec.reshard_after_forward must be true or false, got {self.reshard_after_forward!r}")
        if not self.reshard_after_forward and not self.fsdp_axes:
            raise PlanError("RunSpec.reshard_after_forward=False needs fsdp_axes (it is fully_shard's setting); "
                            "name the sharded axes or leave it true")
        if self.fsdp_axes and self.ep_axes:
            raise PlanError("RunSpec: fsdp_axes with ep_axes is not supported by this runtime; use either")
        if self.hybrid:
            names = [a for a, _ in self.mesh]
            if len(self.dp_axes) != 1 or len(self.fsdp_axes) != 1:
                raise PlanError(f"RunSpec: hybrid sharding (dp_axes with fsdp_axes) takes one replicate axis and one "
                                f"shard axis, got dp_axes {list(self.dp_axes)} and fsdp_axes {list(self.fsdp_axes)}")
            if names.index(self.dp_axes[0]) > names.index(self.fsdp_axes[0]):
                raise PlanError(f"RunSpec: hybrid sharding replicates over the outer axis; put dp_axes "
                                f"{self.dp_axes[0]!r} before fsdp_axes {self.fsdp_axes[0]!r} in the mesh")

    def _check_blocks(self) -> None:
        """A block is tensor parallel as a whole or replicated as a whole; TP needs tp_axis."""
        for layer in [None] + [i for i, _ in self.layer_styles]:
            for block, keys in (("attention", ATTN_KEYS), ("MLP", MLP_KEYS)):
                styles = {k: self.style(layer, k) for k in keys}
                if len({s == "replicate" for s in styles.values()}) > 1:
                    where = "styles" if layer is None else f"layer {layer}"
                    raise PlanError(f"RunSpec {where}: the {block} block mixes replicated and tensor-parallel "
                                    f"modules {styles}; make all of {', '.join(keys)} tensor parallel "
                                    f"({', '.join(TP_STYLE[k] for k in keys)}) or all replicate")
        if self.tp_axis is None and any(s != "replicate" for s in self._all_styles()):
            raise PlanError("RunSpec: a colwise/rowwise style needs tp_axis; name the tensor-parallel mesh axis")
        if self.sequence_parallel:
            if self.tp_axis is None:
                raise PlanError("RunSpec.sequence_parallel needs tp_axis")
            if any(self.style(layer, k) == "replicate" for layer in [None] + [i for i, _ in self.layer_styles]
                   for k in ATTN_KEYS):
                raise PlanError("RunSpec.sequence_parallel needs every attention block tensor parallel "
                                "(a replicated block would see only its sequence shard); turn it off or make "
                                "the blocks colwise/rowwise")

    def _check_counts(self) -> None:
        for name in ("global_batch", "seq", "microbatches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise PlanError(f"RunSpec.{name} must be a positive integer, got {value!r}")

    def _check_batch(self) -> None:
        if self.global_batch % (self.batch_cut * self.microbatches):
            raise PlanError(f"RunSpec.global_batch={self.global_batch} must be a multiple of the batch cut "
                            f"{self.batch_cut} (dp_axes x fsdp_axes) times microbatches={self.microbatches}")
        if self.sequence_parallel and self.seq % self.tp_size:
            raise PlanError(f"RunSpec.seq={self.seq} must be a multiple of the tp size {self.tp_size} "
                            "for sequence parallel")

    # -- queries ----------------------------------------------------------------------------
    def axis_size_of(self, axes: str | tuple[str, ...] | None) -> int:
        """The product of the sizes of ``axes`` (1 for None or no axes)."""
        if axes is None:
            return 1
        sizes = dict(self.mesh)
        return math.prod(sizes[a] for a in ((axes,) if isinstance(axes, str) else axes))

    @property
    def world_size(self) -> int:
        return math.prod(size for _, size in self.mesh)

    @property
    def tp_size(self) -> int:
        return self.axis_size_of(self.tp_axis)

    @property
    def pp_size(self) -> int:
        return self.axis_size_of(self.pp_axis)

    @property
    def ep_size(self) -> int:
        return self.axis_size_of(self.ep_axes)

    @property
    def hybrid(self) -> bool:
        """Hybrid sharding (HSDP): fully_shard over ``fsdp_axes``, replicated over ``dp_axes``."""
        return bool(self.fsdp_axes) and bool(self.dp_axes)

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """Axes that cut the batch, in mesh order."""
        return tuple(a for a, _ in self.mesh if a in self.dp_axes or a in self.fsdp_axes)

    @property
    def batch_cut(self) -> int:
        return self.axis_size_of(self.batch_axes)

    def style(self, layer: int | None, key: str) -> str:
        """The style of module ``key`` in ``layer`` (None for the model-level keys)."""
        if key not in MODULE_KEYS:
            raise PlanError(f"unknown module key {key!r}." + did_you_mean(key, MODULE_KEYS))
        override = dict(dict(self.layer_styles).get(layer, ()))
        return override.get(key, dict(self.styles).get(key, "replicate"))

    def _all_styles(self) -> list[str]:
        return [s for _, s in self.styles] + [s for _, st in self.layer_styles for _, s in st]

    # -- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """A JSON-ready dict with every field (layer indices become strings)."""
        return {"mesh": dict(self.mesh), "tp_axis": self.tp_axis, "styles": dict(self.styles),
                "layer_styles": {str(i): dict(st) for i, st in self.layer_styles},
                "sequence_parallel": self.sequence_parallel, "dp_axes": list(self.dp_axes),
                "fsdp_axes": list(self.fsdp_axes), "reshard_after_forward": self.reshard_after_forward,
                "ep_axes": list(self.ep_axes), "pp_axis": self.pp_axis,
                "pp_schedule": self.pp_schedule, "microbatches": self.microbatches,
                "global_batch": self.global_batch, "seq": self.seq}

    @classmethod
    def from_dict(cls, data: Mapping) -> RunSpec:
        """Read ``to_dict`` output strictly: unknown and missing keys are refused."""
        if not isinstance(data, Mapping):
            raise PlanError(f"a RunSpec must be a JSON object, got {type(data).__name__}")
        fields = [f.name for f in dataclasses.fields(cls)]
        unknown = [k for k in data if k not in fields]
        if unknown:
            raise PlanError(f"RunSpec: unknown key(s) {unknown}." + did_you_mean(str(unknown[0]), fields))
        missing = [k for k in fields if k not in data]
        if missing:
            raise PlanError(f"RunSpec: missing key(s) {missing}; every field must be given (see to_dict())")
        layer_styles = {}
        for key, styles in dict(data["layer_styles"]).items():
            if not str(key).isdigit():
                raise PlanError(f"RunSpec.layer_styles: key {key!r} must be a layer index like '0'")
            layer_styles[int(key)] = styles
        return cls(**{**data, "mesh": dict(data["mesh"]), "styles": dict(data["styles"]),
                      "layer_styles": layer_styles, "dp_axes": tuple(data["dp_axes"]),
                      "fsdp_axes": tuple(data["fsdp_axes"]), "ep_axes": tuple(data["ep_axes"])})


def check_fits(spec: RunSpec, cfg, world_size: int) -> None:
    """Refuse a spec that does not match the world size or the model, before any process starts.

    Args:
        spec: the layout.
        cfg: a ``symtensor.models.ModelConfig``.
        world_size: processes that will run it.
    """
    if spec.world_size != world_size:
        raise PlanError(f"RunSpec.mesh {dict(spec.mesh)} has {spec.world_size} devices but the run has "
                        f"world size {world_size}; make the product of the mesh sizes {world_size}")
    for layer, _ in spec.layer_styles:
        if layer >= cfg.layers:
            raise PlanError(f"RunSpec.layer_styles: layer {layer} does not exist; model {cfg.name} has "
                            f"layers 0..{cfg.layers - 1}")
    tp = spec.tp_size
    layers = range(cfg.layers)
    moe = [i for i in layers if cfg.is_moe_layer(i)]
    if spec.ep_axes and not moe:
        raise PlanError(f"RunSpec.ep_axes={list(spec.ep_axes)} but model {cfg.name} has no experts; drop ep_axes")
    attn_tp = any(spec.style(i, "attn.q_proj") != "replicate" for i in layers)
    dense = [i for i in layers if not cfg.is_moe_layer(i)]
    rules = [(attn_tp, "heads", cfg.heads, tp, "tp"), (attn_tp, "kv_heads", cfg.kv_heads, tp, "tp"),
             (any(spec.style(i, "mlp.gate_proj") != "replicate" for i in dense), "ffn", cfg.ffn, tp, "tp"),
             (spec.style(None, "embed") != "replicate" or spec.style(None, "lm_head") != "replicate",
              "vocab", cfg.vocab, tp, "tp"),
             (bool(spec.ep_axes), "experts", cfg.experts, spec.ep_size, "ep"),
             (spec.pp_axis is not None, "layers", cfg.layers, spec.pp_size, "pp")]
    for used, field, value, size, axis in rules:
        if used and value % size:
            raise PlanError(f"model {cfg.name}: {field}={value} is not divisible by the {axis} size {size}; "
                            f"make the {axis} size a divisor of {value}")
    for i in moe:
        if any(spec.style(i, k) != "replicate" for k in MLP_KEYS):
            raise PlanError(f"RunSpec: layer {i} of {cfg.name} is a mixture of experts and has no dense MLP; "
                            f"leave {', '.join(MLP_KEYS)} replicate there and cut experts with ep_axes")
    if spec.sequence_parallel:
        replicated = [i for i in dense if spec.style(i, "mlp.gate_proj") == "replicate"]
        if replicated:
            raise PlanError(f"RunSpec.sequence_parallel needs the MLP of every dense layer tensor parallel "
                            f"(layer {replicated[0]} of {cfg.name} is replicated and would see only its sequence "
                            "shard); turn it off or make the MLP blocks colwise/rowwise")
