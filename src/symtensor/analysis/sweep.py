"""Plans across a range: step time, memory and the chosen layouts per point, and the breakpoints.

A sweep varies one of sequence length, device count (or nodes) and global batch; every point is a
full search. A *breakpoint* is a pair of consecutive points whose plans differ in a parallel
choice (tp, pp, dp, cp, ep, sp, ZeRO stage, recomputation, virtual stages). Each is explained
three ways:

    what changed    the degrees that grew and shrank ("data parallel gives way to tensor parallel")
    why             the previous plan, re-costed at the new point as a Megatron-style
                    configuration: impossible there (a constraint), too big (memory) or slower
                    (speed, with the components that make the difference)
    what it did     the step-time components that changed most from one point to the next

Ranges (``validate.parse_range``): ``A..B`` doubles from A up to B, ``A..B:F`` multiplies by F,
``A,B,C`` lists values.
"""

from __future__ import annotations

from itertools import pairwise

from symtensor.errors import PlanError
from symtensor.hardware import MEMORY_HEADROOM

BREAK_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "sp", "zero", "recompute", "vpp", "cp_comm")
DEGREE_WORDS = {"tp": "tensor parallel", "cp": "context parallel", "dp": "data parallel", "pp": "pipeline parallel",
                "ep": "expert parallel", "etp": "expert tensor parallel", "vpp": "virtual pipeline stages"}


def layout_label(config: dict) -> str:
    """A short name of a plan's choices (its JSON ``config``, read once as a ``Parallelism``):
    ``tp2 dp32 sp zero1`` (``tp2 dp8 cp4 a2a sp zero1``: context parallelism as all-to-alls); ``*`` marks per-op
    heterogeneity."""
    from symtensor.plan.parallelism import Parallelism

    p = Parallelism.from_dict(config)
    degrees = {"tp": p.tp, "pp": p.pp, "dp": p.dp, "cp": p.cp, "ep": p.ep}
    parts = [f"{k}{v}" for k, v in degrees.items() if v > 1 or k == "dp"]
    if p.cp > 1 and p.stack.cp_comm:
        parts.append(p.stack.cp_comm)  # (how context parallelism runs, where the plan or the stack says)
    if p.sp:
        parts.append("sp")
    parts.append(f"zero{p.zero}")
    if p.recompute != "none":
        parts.append(f"rc-{p.recompute}")
    if p.vpp > 1:
        parts.append(f"vpp{p.vpp}")
    return " ".join(parts) + ("*" if config.get("heterogeneous") else "")


def run_sweep(cfg, cluster: str, param: str, grid: list[dict], micro_batch=None, space: str = "symtensor",
              on_point=None, precision: dict | None = None) -> dict:
    """Search a plan at every point of ``grid`` and find the breakpoints.

    Args:
        cfg: the model config.
        cluster: a preset name or cluster file.
        param: the swept parameter (``seq``, ``devices``, ``nodes`` or ``global_batch``).
        grid: per point ``{"value", "devices", "nodes", "seq", "global_batch"}`` (defaults resolved).
        micro_batch: a fixed micro batch, or None for the search's choice.
        on_point: called as ``on_point(index, total, point)`` after each point (progress).
        precision: the search's ``precision``, ``fp8_recipe`` and ``stack`` (``search.search``); default: it chooses.
    """
    points = []
    for i, g in enumerate(grid):
        points.append(_point(cfg, cluster, g, micro_batch, space, precision or {}))
        if on_point is not None:
            on_point(i + 1, len(grid), points[-1])
    good = [p for p in points if "error" not in p]
    if not good:
        raise PlanError(f"no point of the sweep has a valid plan; first error: {points[0]['error']}")
    breakpoints = [explain_breakpoint(cfg, cluster, param, a, b) for a, b in pairwise(good)
                   if _choices(a["config"]) != _choices(b["config"])]
    return {"model": cfg.name, "cluster": cluster, "param": param, "values": [g["value"] for g in grid],
            "points": points, "breakpoints": breakpoints}


def _choices(config: dict) -> tuple:
    return tuple(config.get(k) for k in BREAK_KEYS)


def _point(cfg, cluster: str, g: dict, micro_batch, space: str, precision: dict) -> dict:
    from symtensor.hardware import load_cluster
    from symtensor.plan import layer_types
    from symtensor.search import search

    base = {"value": g["value"], "seq": g["seq"], "global_batch": g["global_batch"]}
    try:
        cl = load_cluster(cluster, devices=g.get("devices"), nodes=g.get("nodes"))
        plan = search(cfg, cl, g["global_batch"], g["seq"], micro_batch=micro_batch, space=space, **precision)
    except PlanError as exc:
        return {**base, "devices": g.get("devices"), "error": str(exc)}
    rep = plan.report.as_dict()
    config = plan.config  # the JSON summary (of any plan, heterogeneous ones too)
    return {**base, "devices": cl.n_devices, "step_time_s": rep["step_time_s"], "tokens_per_s": rep["tokens_per_s"],
            "mfu": rep["mfu"], "memory_gib_per_device": rep["memory_gib_per_device"],
            "capacity_gib": rep["capacity_gib"], "fits": rep["fits"], "breakdown": rep["breakdown"],
            "memory_gib": rep["memory_gib"], "config": config, "layout": layout_label(config),
            "layer_types": [{k: r[k] for k in ("block", "layers", "cuts", "dp", "tp", "cp", "ep")}
                            for r in layer_types(plan)],
            "search_time_s": plan.search_time_s, "notes": list(plan.notes)}


def explain_breakpoint(cfg, cluster: str, param: str, a: dict, b: dict) -> dict:
    """Why the plan at point ``b`` differs from the one at the previous point ``a``."""
    changes = {k: [a["config"].get(k), b["config"].get(k)] for k in BREAK_KEYS
               if a["config"].get(k) != b["config"].get(k)}
    terms = sorted(({"term": k, "delta_s": b["breakdown"].get(k, 0.0) - a["breakdown"].get(k, 0.0)}
                    for k in dict.fromkeys(list(a["breakdown"]) + list(b["breakdown"]))),
                   key=lambda t: -abs(t["delta_s"]))
    kept = keep_config(cfg, cluster, a["config"], b)
    reason, why = breakpoint_reason(kept, b, a["layout"])
    head = headline(changes, b["config"].get("framework", "megatron"))
    moved = ", ".join(f"{t['term']} {t['delta_s']:+.3f} s" for t in terms[:3] if abs(t["delta_s"]) > 5e-4)
    text = (f"{param} {a['value']} -> {b['value']}: {a['layout']} -> {b['layout']} ({head}). {why}"
            + (f" From one point to the next: {moved}." if moved else ""))
    return {"param": param, "between": [a["value"], b["value"]], "from": a["layout"], "to": b["layout"],
            "changes": changes, "headline": head, "reason": reason, "previous_plan_here": kept,
            "term_deltas": terms, "step_time_delta_s": b["step_time_s"] - a["step_time_s"],
            "memory_delta_gib": b["memory_gib_per_device"] - a["memory_gib_per_device"], "explanation": text}


def headline(changes: dict, framework: str = "megatron") -> str:
    """``data parallel gives way to tensor parallel``, plus ZeRO / recomputation / sp moves, and context
    parallelism's kind as ``framework``'s engine runs it (``cost.engine.context_of``: an unstated kind is its own)."""
    from symtensor.cost.engine import context_of

    grew = [DEGREE_WORDS[k] + f" {v[0]}->{v[1]}" for k, v in changes.items() if k in DEGREE_WORDS and v[1] > v[0]]
    shrank = [DEGREE_WORDS[k] + f" {v[0]}->{v[1]}" for k, v in changes.items() if k in DEGREE_WORDS and v[1] < v[0]]
    parts = []
    if grew and shrank:
        parts.append(f"{' and '.join(shrank)} give{'s' if len(shrank) == 1 else ''} way to {' and '.join(grew)}")
    else:
        parts += grew + shrank
    for k, word in (("sp", "sequence parallel"), ("zero", "ZeRO"), ("recompute", "recomputation"),
                    ("cp_comm", "context parallelism's kind")):
        if k in changes:
            parts.append(f"{word} {context_of(framework, changes[k][0])}->{context_of(framework, changes[k][1])}"
                         if k == "cp_comm" else
                         f"{word} {changes[k][0]}->{changes[k][1]}")
    return "; ".join(parts)


def keep_config(cfg, cluster: str, config: dict, point: dict) -> dict:
    """The Megatron-style configuration ``config`` costed at ``point`` (dp fills the devices; the
    fastest micro batch that fits, else the smallest): its step, memory and fit, or why it is
    impossible there."""
    from symtensor.hardware import load_cluster
    from symtensor.plan.parallelism import DEFAULT_FRAMEWORK, Parallelism
    from symtensor.search.megatron import megatron_plan

    cl = load_cluster(cluster, devices=point["devices"])
    n = cl.n_devices
    p = Parallelism.from_dict(config)  # the point's JSON summary, read once
    tp, pp, cp = p.tp, p.pp, p.cp
    if n % (tp * pp * cp):
        return {"valid": False, "error": f"tp*pp*cp = {tp * pp * cp} does not divide the {n} devices"}
    p = p.replace(dp=n // (tp * pp * cp), sp=p.sp and tp > 1, global_batch=point["global_batch"], seq=point["seq"],
                  framework=DEFAULT_FRAMEWORK)
    best, error = None, None
    for mb in (1, 2, 4, 8):
        try:
            rep = megatron_plan(cfg, cl, **p.replace(micro_batch=mb).as_dict()).report
        except PlanError as exc:
            error = error or str(exc)
            continue
        key = (not rep.fits, rep.step_time_s if rep.fits else rep.memory_reserved)
        if best is None or key < best[0]:
            best = (key, mb, rep)
    if best is None:
        return {"valid": False, "error": error}
    _, mb, rep = best
    out = rep.as_dict()
    return {"valid": True, "micro_batch": mb, "step_time_s": out["step_time_s"],
            "memory_gib_per_device": out["memory_gib_per_device"],
            "usable_gib": MEMORY_HEADROOM * out["capacity_gib"],
            "fits": out["fits"], "breakdown": out["breakdown"]}


def breakpoint_reason(kept: dict, b: dict, old: str) -> tuple[str, str]:
    """Why the plan ``old`` of the previous point gave way at point ``b`` (``kept``: it costed
    there, ``keep_config``): (constraint | memory | speed, one sentence)."""
    if not kept["valid"]:
        return "constraint", f"Keeping {old} is impossible here: {kept['error']}."
    if not kept["fits"]:
        return "memory", (f"Keeping {old} needs {kept['memory_gib_per_device']:.1f} GiB per device, more than the "
                          f"{kept['usable_gib']:.1f} GiB usable.")
    slower = kept["step_time_s"] - b["step_time_s"]
    diff = sorted(((k, kept["breakdown"].get(k, 0.0) - b["breakdown"].get(k, 0.0)) for k in b["breakdown"]),
                  key=lambda kv: -abs(kv[1]))
    parts = ", ".join(f"{k} {d:+.3f} s" for k, d in diff[:2] if abs(d) > 5e-4)
    if slower <= 0:
        return "speed", (f"Keeping {old} would fit and take {kept['step_time_s']:.3f} s as a Megatron "
                         "configuration; the new plan's per-op layouts are what it gains on.")
    return "speed", (f"Keeping {old} would take {kept['step_time_s']:.3f} s, {slower:.3f} s slower"
                     + (f" ({parts})" if parts else "") + ".")
