"""A plan file's structure and value types, checked by the input boundary's rules (``symtensor.validate``)
before ``plan.io.load_plan`` rebuilds the plan from it and re-costs it."""

from __future__ import annotations

import dataclasses

from symtensor.cost import TrainConfig
from symtensor.cost.stack import Stack
from symtensor.errors import PlanError
from symtensor.models import ModelConfig
from symtensor.validate import (
    HARDWARE_MAX_SI,
    MAX_BATCH,
    MAX_DEVICES,
    MAX_LAYERS,
    MAX_LEVELS,
    MAX_SEQ,
    _show,
    boolean,
    integer,
    keys,
    name,
    number,
)


def _typed(value, annotation: str, what: str):
    """A JSON value against a dataclass field's annotation (``int``, ``float | None``, ``tuple[int, ...]``)."""
    kinds = [k.strip() for k in annotation.split("|")]
    if value is None:
        if "None" in kinds:
            return None
        raise PlanError(f"{what} must not be null")
    kind = next(k for k in kinds if k != "None")
    if kind == "int":
        return integer(value, what, lo=0, hi=MAX_BATCH)
    if kind == "float":
        return number(value, what, hi=1e6, positive=False)
    if kind == "bool":
        return boolean(value, what)
    if kind == "str":
        if not isinstance(value, str) or len(value) > 4096:
            raise PlanError(f"{what} must be a string, got {_show(value)}")
        return value
    if kind.startswith("tuple["):
        if not isinstance(value, list) or len(value) > MAX_LAYERS:
            raise PlanError(f"{what} must be a list, got {_show(value)}")
        item = kind[len("tuple["):].split(",")[0].strip()
        return tuple(_typed(v, item, f"{what}[{i}]") for i, v in enumerate(value))
    if isinstance(value, (dict, list)):
        raise PlanError(f"{what} must be a single value, got {_show(value)}")
    return value


_REPLAN = "; write the plan again with symtensor plan --out"


def _keys(data, where: str, required: tuple, optional: tuple = ()) -> dict:
    return keys(data, where, required, optional, _REPLAN)


def _types(cls) -> dict:
    """A dataclass's field annotations by name."""
    return {f.name: f.type for f in dataclasses.fields(cls)}


# a plan file's ``train`` section: TrainConfig's keys, the stack's facts in place of its ``stack``
# (``TrainConfig.as_dict``)
_TRAIN_TYPES = {**{k: t for k, t in _types(TrainConfig).items() if k != "stack"}, **_types(Stack)}


def _fields(data, types: dict, where: str, required=()) -> dict:
    """A JSON object read as fields of the annotations ``types``: known keys only, each of its field's type."""
    _keys(data, where, tuple(required), tuple(k for k in types if k not in required))
    return {k: _typed(v, types[k], f"{where}.{k}") for k, v in data.items()}


# the model dimensions a plan file must carry in full (run --plan and explain compare them)
PLAN_MODEL_DIMS = ("name", "family", "layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab",
                   "experts", "top_k", "moe_ffn")


def _plan_cluster(c, where: str) -> None:
    # (a profiled or calibrated cluster's sections, checked where plan.io reads them: hardware.cluster_calibration)
    _keys(c, where, ("name", "devices", "device", "levels"), ("efficiency", "end_to_end", "band"))
    name(c["name"], f"{where}.name")
    integer(c["devices"], f"{where}.devices", hi=MAX_DEVICES)
    dev = _keys(c["device"], f"{where}.device", ("name", "peak_flops", "hbm_bandwidth", "memory"), ("host_bandwidth",))
    name(dev["name"], f"{where}.device.name")
    peaks = dev["peak_flops"]
    if not isinstance(peaks, dict) or not peaks:
        raise PlanError(f"{where}.device.peak_flops must map dtypes to FLOP/s, e.g. {{\"bf16\": 9.89e14}}")
    for dtype, flops in peaks.items():
        number(flops, f"{where}.device.peak_flops.{dtype}", HARDWARE_MAX_SI["peak_flops"])
    for key in ("hbm_bandwidth", "memory"):
        number(dev[key], f"{where}.device.{key}", HARDWARE_MAX_SI[key])
    if "host_bandwidth" in dev:  # written where the plan offloads activations to the host (plan.io)
        number(dev["host_bandwidth"], f"{where}.device.host_bandwidth", HARDWARE_MAX_SI["bandwidth"])
    levels = c["levels"]
    if not isinstance(levels, list) or not 1 <= len(levels) <= MAX_LEVELS:
        raise PlanError(f"{where}.levels must be a list of 1 to {MAX_LEVELS} levels")
    for i, lv in enumerate(levels):
        here = f"{where}.levels[{i}]"
        _keys(lv, here, ("name", "fanout", "bandwidth", "latency"), ("partial", "link_efficiency"))
        name(lv["name"], f"{here}.name", identifier=True)
        integer(lv["fanout"], f"{here}.fanout", lo=0, hi=MAX_DEVICES)
        integer(lv.get("partial", 0), f"{here}.partial", lo=0, hi=MAX_DEVICES)
        number(lv["bandwidth"], f"{here}.bandwidth", HARDWARE_MAX_SI["bandwidth"])
        number(lv["latency"], f"{here}.latency", HARDWARE_MAX_SI["latency"], positive=False)


def plan_file(data, path):
    """The structure and value types of a plan file; its ModelConfig and TrainConfig (``load_plan``
    then rebuilds the rest and re-costs it)."""
    where = f"plan file {path}"
    _keys(data, where, ("format", "model", "cluster", "train", "seq", "mesh", "layouts"), ("config", "predicted"))
    model = _fields(data["model"], _types(ModelConfig), f"{where}: model", required=PLAN_MODEL_DIMS)
    train = _fields(data["train"], _TRAIN_TYPES, f"{where}: train", required=("global_batch",))
    _plan_cluster(data["cluster"], f"{where}: cluster")
    integer(data["seq"], f"{where}: seq", hi=MAX_SEQ)
    mesh = data["mesh"]
    if not isinstance(mesh, list) or len(mesh) > 64:
        raise PlanError(f"{where}: mesh must be a list of axes {{name, size, level}}")
    for i, axis in enumerate(mesh):
        _keys(axis, f"{where}: mesh[{i}]", ("name", "size", "level"))
        name(axis["name"], f"{where}: mesh[{i}].name")
        integer(axis["size"], f"{where}: mesh[{i}].size", hi=MAX_DEVICES)
        integer(axis["level"], f"{where}: mesh[{i}].level", lo=0, hi=MAX_LEVELS)
    layouts = data["layouts"]
    if not isinstance(layouts, dict):
        raise PlanError(f"{where}: layouts must map op names to {{dim: [mesh axis, ...]}}")
    for op, cuts in layouts.items():
        if not isinstance(cuts, dict) or not all(
                isinstance(axes, list) and all(isinstance(a, str) for a in axes) for axes in cuts.values()):
            raise PlanError(f"{where}: layouts.{_show(op)} must map dims to lists of mesh axis names, "
                            f"got {_show(cuts)}")
    for key in ("config", "predicted"):
        if key in data and not isinstance(data[key], dict):
            raise PlanError(f"{where}: {key} must be an object")
    try:
        return ModelConfig(**model), TrainConfig.from_dict(train)
    except PlanError as exc:
        raise PlanError(f"{where}: {exc}") from None
