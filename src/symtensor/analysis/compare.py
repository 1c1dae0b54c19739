"""Two plans side by side: where they differ and what each difference costs or saves.

Either side is a plan (``plan.Plan``) or a baseline rebuilt on the other side's model,
cluster, sequence and batch: ``megatron_recipe``, ``megatron_grid_best``, ``fsdp`` or ``drec``
(the same searches ``symtensor plan`` reports, through the same cost model).

    config       the Megatron-style summaries and the keys that differ
    step         step time of each, B - A, and A's speedup over B
    breakdown    each step-time component (seconds), A, B and B - A
    comm_bytes   bytes per device per step by collective kind
    memory       bytes per device by part (parameters, gradients, optimizer, activations, ...)
    ops          per layer type whose cuts differ: both cuts and degrees, and B - A of the op's
                 terms (analysis/terms.py: compute, communication, redistribution, memory)

Op terms are each plan's own (its micro-batches, recomputation and ZeRO stage); their differences
explain the breakdown's, but do not add up to it exactly: the step also has the pipeline bubble
and the slowest stage.
"""

from __future__ import annotations

from pathlib import Path

from symtensor.analysis.terms import op_terms, problem_of
from symtensor.cost.bands import verdict
from symtensor.errors import PlanError, did_you_mean
from symtensor.hardware import GIB
from symtensor.plan.document import config_band
from symtensor.plan.summary import degrees, layer_types
from symtensor.search import BASELINES, baseline_plans

CONFIG_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "sp", "zero", "recompute", "micro_batch", "micro_steps", "vpp",
               "heterogeneous")


def resolve(spec: str, other=None, precision: dict | None = None):
    """A plan file path, or a baseline name rebuilt on ``other``'s model and cluster (in
    ``precision``: ``baseline_plans``' precision and fp8_recipe; default BF16); returns (label, plan,
    source)."""
    from symtensor.plan import load_plan

    if spec in BASELINES:
        if other is None:
            raise PlanError(f"{spec} is a baseline: compare it with a plan file, e.g. "
                            f"symtensor compare plan.json {spec}")
        plan = baseline_plans(other.model, other.cluster, other.train.global_batch, other.seq, other.engine,
                              (spec,), **(precision or {}))[spec]
        if plan is None:
            raise PlanError(f"baseline {spec} has no valid configuration for {other.model.name} on "
                            f"{other.cluster.n_devices} devices")
        return spec, plan, "baseline"
    if not Path(spec).exists():
        raise PlanError(f"{spec!r} is neither a plan file nor a baseline name." + did_you_mean(spec, BASELINES))
    return spec, load_plan(spec), "plan file"


def compare_specs(a: str, b: str, precision: str | None = None, fp8_recipe: str | None = None) -> dict:
    """``symtensor compare A B``: each a plan file or a baseline name (not both baselines); a
    baseline is costed in ``precision`` (default BF16, the recipes')."""
    held = {"precision": precision, "fp8_recipe": fp8_recipe}
    if a in BASELINES and b in BASELINES:
        raise PlanError(f"both {a} and {b} are baselines; give a plan file for at least one side")
    if a in BASELINES:
        label_b, plan_b, src_b = resolve(b)
        label_a, plan_a, src_a = resolve(a, plan_b, held)
    else:
        label_a, plan_a, src_a = resolve(a)
        label_b, plan_b, src_b = resolve(b, plan_a, held)
    return compare_plans(plan_a, plan_b, (label_a, src_a), (label_b, src_b))


def _side(plan, label: str, source: str) -> dict:
    rep = plan.report
    return {"label": label, "source": source, "model": plan.model.name, "cluster": plan.cluster.name,
            "devices": plan.cluster.n_devices, "seq": plan.seq, "global_batch": plan.train.global_batch,
            "config": plan.config, "step_time_s": rep.step_time_s, "tokens_per_s": rep.tokens_per_s,
            "mfu": rep.mfu, "memory_gib_per_device": rep.memory_peak / GIB, "fits": rep.fits,
            "mesh": [{"name": a.name, "size": a.size} for a in plan.mesh]}


def _delta(a: dict, b: dict) -> dict:
    keys = list(dict.fromkeys(list(a) + list(b)))
    return {k: {"a": a.get(k, 0.0), "b": b.get(k, 0.0), "delta": b.get(k, 0.0) - a.get(k, 0.0)} for k in keys}


def compare_plans(a, b, label_a=("A", "plan"), label_b=("B", "plan")) -> dict:
    """Where plans ``a`` and ``b`` differ and what it costs; every delta is B - A.

    Args:
        a, b: ``plan.Plan`` of the same model on the same number of devices.
        label_a, label_b: (label, source) of each side, for the output.
    """
    if a.model.name != b.model.name or a.cluster.n_devices != b.cluster.n_devices:
        raise PlanError(f"compare needs plans of one model on one device count: A is {a.model.name} on "
                        f"{a.cluster.n_devices} devices, B is {b.model.name} on {b.cluster.n_devices}")
    ra, rb = a.report, b.report
    sa, sb = _side(a, *label_a), _side(b, *label_b)
    notes = []
    if (a.seq, a.train.global_batch) != (b.seq, b.train.global_batch):
        notes.append(f"A runs seq {a.seq} x batch {a.train.global_batch}, B seq {b.seq} x batch "
                     f"{b.train.global_batch}: step times are for different amounts of work")
    config_diff = {k: [sa["config"].get(k), sb["config"].get(k)] for k in CONFIG_KEYS
                   if sa["config"].get(k) != sb["config"].get(k)}
    memory = _delta({k: v for k, v in ra.memory.items() if k not in ("activations_layers", "layer_state")},
                    {k: v for k, v in rb.memory.items() if k not in ("activations_layers", "layer_state")})
    ops = op_differences(a, b)
    band_a, band_b = _band(a), _band(b)
    out = {"a": sa, "b": sb, "config_diff": config_diff,
           "step_time_s": {"a": ra.step_time_s, "b": rb.step_time_s, "delta": rb.step_time_s - ra.step_time_s},
           "speedup_of_a": rb.step_time_s / ra.step_time_s,
           "step_time_band_s": {"a": band_a.as_list(), "b": band_b.as_list()},
           "verdict_of_a": verdict(band_a, band_b, ra.step_time_s, rb.step_time_s),
           "breakdown": _delta(ra.breakdown, rb.breakdown), "comm_bytes": _delta(ra.comm_bytes, rb.comm_bytes),
           "memory_bytes": memory, "ops": ops,
           "ops_differing": sum(len(o["ops"]) for o in ops), "notes": notes}
    out["summary"] = summary_line(out)
    return out


def _band(p):
    """The error band of plan ``p``'s predicted step (``cost.bands``)."""
    return config_band(p.model, p.cluster, p.report.step_time_s, zero=p.train.zero, seq=p.seq, framework=p.engine,
                       precision=p.train.precision, tp=p.config["tp"])


def op_differences(a, b) -> list[dict]:
    """Per layer type whose cuts differ (by mesh-axis names): both layouts and B - A of its terms."""
    pa, pb = problem_of(a), problem_of(b)
    la, lb = a.op_layouts(), b.op_layouts()
    ops_a = {o.name: o for o in a.graph.ops}
    ops_b = {o.name: o for o in b.graph.ops}
    spans = {r["op"]: r["layers"] for r in layer_types(a)}
    groups: dict = {}
    for name, op in ops_a.items():
        if name not in ops_b or name not in a.layouts or name not in b.layouts:
            continue
        ca, cb = a.layouts[name], b.layouts[name]
        if _key(ca) == _key(cb):
            continue
        key = (op.block, _key(ca), _key(cb))
        groups.setdefault(key, []).append(name)
    out = []
    for (block, _, _), names in groups.items():
        rep = max(names, key=lambda n: pa.weight[n])
        ta = op_terms(pa, ops_a[rep], la[rep], la).as_dict()
        tb = op_terms(pb, ops_b[rep], lb[rep], lb).as_dict()
        delta = {k: tb[k] - ta[k] for k in ("time_s", "compute_s", "communication_s", "redistribution_s",
                                             "optimizer_s", "memory_bytes")}
        delta["comm_bytes"] = sum(tb["comm_bytes"].values()) - sum(ta["comm_bytes"].values())
        out.append({"block": block, "kind": ops_a[rep].kind, "op": rep, "ops": names,
                    "layers": [spans.get(n, "") for n in names],
                    "a_cuts": _lists(a.layouts[rep]), "b_cuts": _lists(b.layouts[rep]),
                    "a_degrees": degrees(ops_a[rep], a.layouts[rep], a.mesh),
                    "b_degrees": degrees(ops_b[rep], b.layouts[rep], b.mesh),
                    "a_terms": ta, "b_terms": tb, "delta": delta})
    out.sort(key=lambda r: -abs(r["delta"]["time_s"]))
    return out


def _key(cuts: dict) -> tuple:
    return tuple(sorted((d, tuple(ax)) for d, ax in cuts.items()))


def _lists(cuts: dict) -> dict[str, list[str]]:
    return {d: list(ax) for d, ax in cuts.items()}


def summary_line(out: dict) -> str:
    """One sentence: which is faster, by how much, the components that differ most, and memory."""
    st = out["step_time_s"]
    a, b = out["a"]["label"], out["b"]["label"]
    terms = sorted(out["breakdown"].items(), key=lambda kv: -abs(kv[1]["delta"]))
    moved = ", ".join(f"{k} {v['delta']:+.3f} s" for k, v in terms[:3] if abs(v["delta"]) > 1e-6)
    mem = out["memory_bytes"].get("total", {"delta": 0.0})["delta"] / GIB
    faster = a if st["delta"] > 0 else b
    ratio = max(out["speedup_of_a"], 1 / out["speedup_of_a"])
    head = (f"{a} and {b} take the same time" if abs(st["delta"]) <= 1e-9 * st["a"]
            else f"{faster} is {ratio:.2f}x faster")
    if out.get("verdict_of_a") == "tie within model error" and abs(st["delta"]) > 1e-9 * st["a"]:
        head = (f"{a} and {b} tie within model error ({faster} is predicted {ratio:.2f}x faster, inside "
                "the calibrated error bands)")
    return (f"{head} ({b} - {a} = {st['delta']:+.4g} s per step" + (f": {moved}" if moved else "")
            + f"); memory {b} - {a} = {mem:+.1f} GiB per device")
