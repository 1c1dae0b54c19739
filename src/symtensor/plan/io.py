"""Plan files: a plan is data (JSON) that export, run, explain and compare read back.

    {"format": "symtensor-plan/1", "model": {...ModelConfig fields...},
     "cluster": {"name", "devices", "device": {...}, "levels": [...], and a cluster file's efficiency,
                 end_to_end and band sections where it has them},
     "train": {...TrainConfig fields...}, "seq": S,
     "mesh": [{"name", "size", "level"}, ...],            # the stage mesh, outermost first
     "layouts": {op name: {dim: [axis name, ...]}},       # ops of the skeleton graph
     "config": {...}, "predicted": {...}}

Loading checks every key and re-costs the plan, so a file edited by hand is validated like a
searched one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from symtensor.cost import Evaluator, TrainConfig
from symtensor.cost.stack import DEFAULTS as STACK_DEFAULTS
from symtensor.errors import PlanError
from symtensor.hardware import Cluster, Device, Level
from symtensor.hardware.cluster import calibrated_sections, cluster_calibration, level_link_efficiency
from symtensor.layout import OpLayout, check_layout
from symtensor.models import ModelConfig, build_graph
from symtensor.output import write_atomic
from symtensor.plan.plan import Plan
from symtensor.plan.schema import plan_file
from symtensor.validate import read_json

FORMAT = "symtensor-plan/1"
KEYS = {"format", "model", "cluster", "train", "seq", "mesh", "layouts", "config", "predicted"}
# the training configuration's keys a plan file names only where they differ from the defaults (None, (0, 0), ())
_STATED_ONLY = ("dp_replicate", "fp8_param_gather", "bf16_layers", "offload_modules")
_DEFAULTS = {**{f.name: f.default for f in dataclasses.fields(TrainConfig)}, **STACK_DEFAULTS}


def plan_to_dict(plan: Plan) -> dict:
    """The plan file's content (see the module docstring)."""
    cl = plan.cluster
    return {
        "format": FORMAT,
        "model": {f.name: getattr(plan.model, f.name) for f in dataclasses.fields(ModelConfig)},
        "cluster": {"name": cl.name, "devices": cl.n_devices,
                    "device": {"name": cl.device.name, "peak_flops": cl.device.peak_flops,
                               "hbm_bandwidth": cl.device.hbm_bandwidth, "memory": cl.device.memory,
                               # the host link where the plan moves activations over it (other files unchanged)
                               **({"host_bandwidth": cl.device.host_bandwidth} if plan.train.stack.offloads else {})},
                    "levels": [{"name": lv.name, "fanout": lv.fanout, "bandwidth": lv.bandwidth,
                                "latency": lv.latency, **({"partial": lv.partial} if lv.partial else {}),
                                **({"link_efficiency": dict(lv.link_efficiency)} if lv.link_efficiency else {})}
                               for lv in cl.levels],
                    # a profiled or calibrated cluster's constants (none for a preset)
                    **calibrated_sections(cl)},
        # (hybrid sharding's dp_replicate and the low-precision facts only where they are stated: other plan files
        # stay as they were)
        # (the flat record of ``TrainConfig.as_dict``: the stack's facts beside the other keys)
        "train": {k: v for k, v in plan.train.as_dict().items() if k not in _STATED_ONLY or v != _DEFAULTS[k]},
        "seq": plan.seq,
        "mesh": [{"name": a.name, "size": a.size, "level": a.level} for a in plan.mesh],
        "layouts": {name: {d: list(axes) for d, axes in cuts.items()} for name, cuts in plan.layouts.items()},
        "config": plan.config,
        "predicted": plan.report.as_dict(),
    }


def save_plan(plan: Plan, path: str | Path) -> None:
    write_atomic(path, json.dumps(plan_to_dict(plan), indent=1, default=list), "plan file")


def _need(data: dict, keys, where: str) -> None:
    if not isinstance(data, dict):
        raise PlanError(f"plan file: {where} must be an object")
    missing = [k for k in keys if k not in data]
    if missing:
        raise PlanError(f"plan file: {where} lacks {', '.join(missing)}")


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file; returns the Plan re-costed by the model (every layout
    checked by the one legality rule, ``layout.refusal``)."""
    p = Path(path)
    data = read_json(p, "plan file", f"; write one with symtensor plan ... --out {p}")
    _need(data, KEYS - {"config", "predicted"}, "the top level")
    unknown = set(data) - KEYS
    if unknown:
        raise PlanError(f"plan file {p}: unknown key(s) {sorted(unknown)}")
    if data["format"] != FORMAT:
        raise PlanError(f"plan file {p}: format {data['format']!r}, expected {FORMAT!r}")
    cfg, train = plan_file(data, p)  # every key typed and in range; the full model dims
    cl = data["cluster"]
    _need(cl, ("name", "devices", "device", "levels"), "cluster")
    device = cl["device"]
    dev = Device(name=device["name"], peak_flops=dict(device["peak_flops"]),
                 hbm_bandwidth=float(device["hbm_bandwidth"]), memory=float(device["memory"]),
                 host_bandwidth=float(device.get("host_bandwidth", 0.0)))
    levels = tuple(Level(name=lv["name"], fanout=int(lv["fanout"]), bandwidth=float(lv["bandwidth"]),
                         latency=float(lv["latency"]), partial=int(lv.get("partial", 0)),
                         link_efficiency=level_link_efficiency(lv, f"plan file {p}: cluster.levels[{i}]"))
                   for i, lv in enumerate(cl["levels"]))
    cluster = Cluster(name=cl["name"], device=dev, levels=levels, n_devices=int(cl["devices"]),
                      **cluster_calibration(cl, f"plan file {p}: cluster"))
    graph = build_graph(cfg, micro_batch=train.graph_batch, seq=int(data["seq"]), skeleton=True)
    ev = Evaluator(graph, cluster, pp=train.pp, framework=train.framework)
    mesh_names = [m["name"] for m in data["mesh"]]
    if mesh_names != list(ev.mesh.names):
        raise PlanError(f"plan file {p}: mesh {mesh_names} does not match the cluster's stage mesh "
                        f"{list(ev.mesh.names)} for {cluster.n_devices} devices and pp={train.pp}")
    ops = {op.name: op for op in graph.ops}
    layouts = {}
    for name, cuts in data["layouts"].items():
        if name not in ops:
            raise PlanError(f"plan file {p}: op {name!r} is not in the graph of {cfg.name}")
        try:
            lay = OpLayout.from_names(cuts, ev.mesh)
        except PlanError as exc:
            raise PlanError(f"plan file {p}: op {name}: {exc}") from None
        check_layout(ops[name], lay, ev.mesh)
        layouts[name] = lay
    report = ev.evaluate(layouts, train)
    return Plan.of(cfg, cluster, train, int(data["seq"]), graph, ev.mesh, ev.pp_axes, layouts, report)
