"""Console views of explain, compare and sweep (rich tables); ``console.py`` dispatches to them."""

from __future__ import annotations

from rich.table import Table

from symtensor.hardware import GIB
from symtensor.output import shown  # names, paths and messages from users: text, never markup
from symtensor.report.plan_view import layer_spans, runner_up
from symtensor.report.tables import config_words, mfu_cell


def compact_cuts(cuts: dict, sizes: dict) -> str:
    """``b:ib0xib1xnvlink0`` -> ``b:ib4·nvlink2``: per dim, how many ways each link level cuts it."""
    parts = []
    for d, axes in sorted(cuts.items()):
        per_level: dict = {}
        for a in axes:
            level = a.rstrip("0123456789")
            per_level[level] = per_level.get(level, 1) * sizes.get(a, 1)
        parts.append(f"{d}:" + "·".join(f"{lv}{n}" for lv, n in per_level.items()))
    return " ".join(parts) or "replicated"


def _header(console, out: dict) -> None:
    cfg = out["config"]
    mesh = " x ".join(f"{a['name']}:{a['size']}" for a in out["mesh"])
    console.print(f"[bold]{shown(out['model'])}[/] on {out['devices']} x {shown(out['cluster'])} (mesh {mesh})")
    console.print("plan: " + config_words(cfg, ("micro_steps", "vpp")) + f"   step {out['step_time_s']:.3f} s")
    console.print(f"[dim]{out['units']}; at each mesh axis an op keeps its outer cuts and adds one (or none)[/]")
    if out.get("hybrid_sharding"):
        console.print(out["hybrid_sharding"])
    for said in out.get("assumptions", ()):  # (analysis.explain: what the costing assumes of the run)
        console.print(said, markup=False)


def _cell(lv: dict) -> str:
    text = (lv["chosen"] or "-") + runner_up(lv)
    return text if lv["chosen"] == lv["cheapest"] else f"[red]{text}[/]"


def print_explain(console, out: dict, full: bool) -> None:
    _header(console, out)
    if out.get("precision"):  # what FP8 bought (analysis.explain.fp8_bought)
        console.print(f"{out['precision']['summary']}\n[dim]{out['precision']['note']}[/]")
    sizes = {a["name"]: a["size"] for a in out["mesh"]}
    t = Table(title="terms of each layer type's layout (seconds per step, GiB per device)")
    for col in ("op", "layers", "cuts", "dp", "tp", "cp", "ep", "compute", "comm", "redistr.", "memory"):
        t.add_column(col, justify="right" if col not in ("op", "layers", "cuts") else "left", overflow="fold")
    for lt in out["layer_types"]:
        m = lt["terms"]
        t.add_row(lt["block"], layer_spans(lt["layers"]), compact_cuts(lt["cuts"], sizes),
                  *(str(lt[k]) for k in ("dp", "tp", "cp", "ep")), f"{m['compute_s']:.4f}",
                  f"{m['communication_s']:.4f}", f"{m['redistribution_s']:.4f}", f"{m['memory_bytes'] / GIB:.2f}")
    console.print(t)
    w = Table(title="why: the cut on each mesh axis (next best candidate, + seconds per step); red = not the "
                    "locally cheapest")
    w.add_column("op")
    for a in out["mesh"]:
        w.add_column(f"{a['name']} ({a['level']})")
    for lt in out["layer_types"]:
        w.add_row(lt["block"], *(_cell(lv) for lv in lt["levels"]))
    console.print(w)
    if "memory" in out:
        print_memory(console, out["memory"])
    if "pipeline" in out:
        console.print(f"pipeline: {out['pipeline']['verdict']}", markup=False)
    if "in_flight" in out:
        console.print(f"in flight: {out['in_flight']['verdict']}", markup=False)
    if full:
        for lt in out["layer_types"]:
            print_candidates(console, lt)
    else:
        console.print("[dim]symtensor explain PLAN --op NAME lists every candidate's terms; --formula adds the "
                      "formulas[/]")


def print_memory(console, mem: dict) -> None:
    """The most loaded device's memory, term by term (``analysis.explain.memory_terms``)."""
    t = Table(title=f"memory of the most loaded device: {mem['allocated_gib']:.2f} GiB allocated, "
                    f"{mem['reserved_gib']:.2f} GiB reserved (as nvidia-smi shows), {mem['usable_gib']:.1f} usable: "
                    + ("fits" if mem["fits"] else "does not fit"))
    for col in ("term", "GiB", "formula", "source"):
        t.add_column(col, justify="right" if col == "GiB" else "left", overflow="fold")
    for r in mem["terms"]:
        t.add_row(r["term"].replace("_", " ") + ("" if r["allocated"] else " (reserved)"), f"{r['gib']:.2f}",
                  r["formula"], r["source"])
    console.print(t)


def print_candidates(console, lt: dict) -> None:
    t = Table(title=f"{lt['op']} ({lt['kind']}, layers {layer_spans(lt['layers'])}): candidates per mesh axis")
    for col in ("axis", "cut", "compute s", "comm s", "redistr. s", "total s", "memory GiB", ""):
        t.add_column(col, justify="left" if col in ("axis", "cut", "") else "right")
    for lv in lt["levels"]:
        for cand in lv["candidates"]:
            mark = ("plan" if cand["chosen"] else "") + (" cheapest" if cand["cheapest"] else "")
            t.add_row(f"{lv['axis']} ({lv['level']})", cand["meaning"], f"{cand['compute_s']:.4f}",
                      f"{cand['communication_s']:.4f}", f"{cand['redistribution_s']:.4f}", f"{cand['time_s']:.4f}",
                      f"{cand['memory_bytes'] / GIB:.2f}", mark, style="bold" if cand["chosen"] else "")
        t.add_section()
    console.print(t)
    for lv in lt["levels"]:
        console.print(f"  {lv['axis']}: {lv['verdict']}")
    if "formulas" in lt:
        print_formulas(console, lt["formulas"])


def print_formulas(console, f: dict) -> None:
    c = f["compute"]
    console.print("  [bold]formulas[/] (symbols: dims, p_<dim> cut factors, P peak FLOP/s, eta efficiencies, "
                  "K GEMM knee, H HBM bytes/s, m message bytes, alpha/B latency/bandwidth per level)")
    console.print(f"    forward FLOPs  {c['value_fwd_flops']:<10.4g} = {c['fwd_flops']}")
    console.print(f"    backward FLOPs {'':<10} = {c['bwd_flops']}")
    console.print(f"    forward s      {c['value_fwd_s']:<10.4g} = {c['fwd_time_s']}")
    console.print(f"    backward s     {c['value_bwd_s']:<10.4g} = {c['bwd_time_s']}")
    console.print(f"    saved bytes    {f['memory']['value_bytes']:<10.4g} = {f['memory']['saved_bytes']}")
    for coll in f["collectives"]:
        group = " x ".join(f"{k}:{v}" for k, v in coll["group"].items())
        console.print(f"    {coll['kind']} over {group} ({coll['why']}), m = {coll['symbols']['m']:.4g} bytes:")
        console.print(f"      seconds      {coll['value_s']:<10.4g} = {coll['formula']}")


def _gib(x: float) -> str:
    return f"{x / GIB:+.2f}" if x else "0"


def print_compare(console, out: dict) -> None:
    for side in ("a", "b"):
        s = out[side]
        cfg = s["config"]
        console.print(f"[bold]{side.upper()}[/]: {shown(s['label'])} ({s['source']}): "
                      + config_words(cfg, ("micro_steps",))
                      + f"  step {s['step_time_s']:.3f} s, {s['memory_gib_per_device']:.1f} GiB, "
                      + ("fits" if s["fits"] else "[red]does not fit[/]"))
    console.print(f"[bold]{shown(out['summary'])}[/]")
    for note in out["notes"]:
        console.print(f"[yellow]{shown(note)}[/]")
    t = Table(title="step time by component (seconds)")
    for col in ("component", "A", "B", "B - A"):
        t.add_column(col, justify="left" if col == "component" else "right")
    for k, v in out["breakdown"].items():
        if v["a"] or v["b"]:
            t.add_row(k, f"{v['a']:.4f}", f"{v['b']:.4f}", f"{v['delta']:+.4f}")
    st = out["step_time_s"]
    t.add_row("[bold]step[/]", f"{st['a']:.4f}", f"{st['b']:.4f}", f"{st['delta']:+.4f}")
    console.print(t)
    b = Table(title="GiB per device: communication per step, memory")
    for col in ("what", "A", "B", "B - A"):
        b.add_column(col, justify="left" if col == "what" else "right")
    for k, v in out["comm_bytes"].items():
        b.add_row(f"comm {k}", f"{v['a'] / GIB:.2f}", f"{v['b'] / GIB:.2f}", _gib(v["delta"]))
    b.add_section()
    for k, v in out["memory_bytes"].items():
        b.add_row(f"memory {k}", f"{v['a'] / GIB:.2f}", f"{v['b'] / GIB:.2f}", _gib(v["delta"]))
    console.print(b)
    o = Table(title=f"layouts that differ ({out['ops_differing']} ops): B - A of each op's terms "
                    "(seconds per step, GiB per device)")
    for col in ("op", "layers", "cuts", "time", "compute", "comm", "redistr.", "memory"):
        o.add_column(col, justify="left" if col in ("op", "layers", "cuts") else "right", no_wrap=True)
    sa = {a["name"]: a["size"] for a in out["a"]["mesh"]}
    sb = {a["name"]: a["size"] for a in out["b"]["mesh"]}
    for r in out["ops"]:
        d = r["delta"]
        o.add_row(r["block"], layer_spans(r["layers"]),
                  f"A {compact_cuts(r['a_cuts'], sa)}\nB {compact_cuts(r['b_cuts'], sb)}",
                  f"{d['time_s']:+.3f}", f"{d['compute_s']:+.3f}", f"{d['communication_s']:+.3f}",
                  f"{d['redistribution_s']:+.3f}", _gib(d["memory_bytes"]))
    console.print(o)


def print_sweep(console, out: dict) -> None:
    param = out["param"]
    console.print(f"[bold]{shown(out['model'])}[/] on {shown(out['cluster'])}: plans across {param} "
                  f"({len(out['points'])} points, {len(out['breakpoints'])} breakpoints)")
    t = Table(title="one plan per point (* = per-op heterogeneous layouts)")
    for col in (param, "devices", "global batch", "step s", "tokens/s", "MFU", "memory GiB", "fits", "plan"):
        t.add_column(col, justify="left" if col == "plan" else "right")
    for p in out["points"]:
        if "error" in p:
            t.add_row(str(p["value"]), "", "", "", "", "", "", "", f"[red]{shown(p['error'])}[/]")
            continue
        t.add_row(str(p["value"]), str(p["devices"]), str(p["global_batch"]), f"{p['step_time_s']:.3f}",
                  f"{p['tokens_per_s']:,.0f}", mfu_cell(p), f"{p['memory_gib_per_device']:.1f}",
                  "yes" if p["fits"] else "[red]no[/]", p["layout"])
    console.print(t)
    if not out["breakpoints"]:
        console.print("no breakpoint: the same parallel choices throughout")
    for i, b in enumerate(out["breakpoints"], 1):
        console.print(f"[bold]breakpoint {i}[/] ({b['reason']}): {shown(b['explanation'])}")
