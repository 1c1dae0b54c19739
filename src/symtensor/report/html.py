"""One self-contained HTML page for a plan: plots (inline SVG) and the tables of ``symtensor plan``.

Sections: the plan's summary; step time by component vs the baselines; memory per device vs
capacity; the per-layer layout map and the layouts table; why each layer type's cuts won (from
``analysis.explain``); the sweep's curves, points and breakpoints. Nothing is fetched: no scripts,
styles, fonts or images from elsewhere. One short inline script marks, on ``<body>``, how many
plots have a rendered size (``data-plots-rendered``) and where they are (``data-plot-boxes``: x, y,
width, height per plot), and on ``<html>`` any script error (``data-errors``); the headless-browser
test reads them.
"""

from __future__ import annotations

import html
from pathlib import Path

from symtensor.hardware import MEMORY_HEADROOM
from symtensor.report import plots
from symtensor.report.plan_view import layer_spans, runner_up
from symtensor.report.tables import baseline_words, config_words, mfu_cell, mfu_text

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1280px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; margin-bottom: .2em; } \
h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .8em 0; font-size: 13px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.summary { background: #f7f9fc; border: 1px solid #dde4ee; padding: .8em 1em; border-radius: 6px; }
.ok { color: #1a7f37; font-weight: 600; } .bad { color: #c62828; font-weight: 600; }
figure.plot { margin: 1em 0; overflow-x: auto; } figure.plot svg { max-width: 100%; height: auto; }
nav a { margin-right: 1em; } code { background: #f2f2f2; padding: 0 3px; border-radius: 3px; }
"""

# Runs after the page is parsed; it fetches nothing. Test hooks: plots with a size, script errors.
SCRIPT_HEAD = ("<script>window.addEventListener('error', function (e) {"
               " document.documentElement.setAttribute('data-errors', String(e.message)); });</script>")
SCRIPT_END = ("<script>(function () { var n = 0, boxes = [];"
              " document.querySelectorAll('figure.plot svg').forEach(function (s) {"
              " var r = s.getBoundingClientRect(); if (r.width > 50 && r.height > 50) n++;"
              " boxes.push([r.left, r.top + window.scrollY, r.width, r.height].map(Math.round).join(',')); });"
              " document.body.setAttribute('data-plots-rendered', String(n));"
              " document.body.setAttribute('data-plot-boxes', boxes.join(';')); })();</script>")


def _e(x) -> str:
    return html.escape(str(x))


def table(headers: list[str], rows: list[list], numeric: set[int] = frozenset(), caption: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td class='num'>{_e(c)}</td>" if i in numeric else f"<td>{_e(c)}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    cap = f"<caption>{_e(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(svg: str, name: str, caption: str) -> str:
    return f"<figure class='plot' id='plot-{name}'>{svg}<figcaption>{_e(caption)}</figcaption></figure>"


def _cuts(c: dict) -> str:
    return " ".join(f"{d}:{'x'.join(axes)}" for d, axes in sorted(c.items())) or "replicated"


def summary_section(p: dict) -> str:
    cfg = p["config"]
    mesh = " x ".join(f"{a['name']}:{a['size']}" for a in p["mesh"])
    fits = "<span class='ok'>fits</span>" if p["fits"] else "<span class='bad'>does not fit</span>"
    choices = config_words(cfg, ("micro_batch", "micro_steps", "vpp"))
    notes = "".join(f"<p class='bad'>{_e(n)}</p>" for n in p.get("notes", []))
    return (f"<div class='summary'><p><b>{_e(p['model'])}</b> on {p['devices']} x {_e(p['cluster'])} "
            f"(mesh {_e(mesh)})</p><p>plan: {_e(choices)}"
            + (f" <i>(heterogeneous: {_e('; '.join(cfg.get('differs', ())) or 'ops differ')})</i>"
               if cfg.get("heterogeneous") else "") + "</p>"
            f"<p>step <b>{p['step_time_s']:.3f} s</b>, {p['tokens_per_s']:,.0f} tokens/s, "
            f"{_e(mfu_text(p))}, found in {1000 * p['search_time_s']:.0f} ms</p>"
            f"<p>memory {p['memory_gib_per_device']:.1f} GiB of {p['capacity_gib']:.0f} GiB per device: {fits}</p>"
            f"{notes}</div>")


def _entries(p: dict) -> list[dict]:
    """The plan and each baseline that has a configuration, for the bar plots."""
    out = [{"label": "symtensor", "breakdown": p["breakdown"], "step_time_s": p["step_time_s"], "fits": p["fits"],
            "memory_gib": p["memory_gib"], "memory_gib_per_device": p["memory_gib_per_device"]}]
    for name, b in p.get("baselines", {}).items():
        if b.get("step_time_s") is not None and "breakdown" in b:
            out.append({"label": name, **b})
    return out


def time_section(p: dict) -> str:
    entries = _entries(p)
    rows = [[k, f"{v:.4f}", f"{100 * v / p['step_time_s']:.1f}%"] for k, v in p["breakdown"].items() if v > 0]
    base = [["symtensor", f"{p['step_time_s']:.3f}", mfu_cell(p), f"{p['memory_gib_per_device']:.1f}",
             p["fits"], "1.00x", ""]]
    for name, b in p.get("baselines", {}).items():
        if b.get("step_time_s") is None:
            base.append([name, "-", "-", "-", False, "-", b.get("note", "")])
            continue
        desc = baseline_words(b["config"])
        speed = f"{b['speedup_of_plan']:.2f}x" if b.get("speedup_of_plan") else "-"
        base.append([name, f"{b['step_time_s']:.3f}", mfu_cell(b), f"{b['memory_gib_per_device']:.1f}",
                     b["fits"], speed, desc])
    return ("<section id='time'><h2>Step time vs baselines</h2>"
            + _figure(plots.breakdown_plot(entries), "breakdown",
                      "Seconds per step by component; every bar is costed by the same model.")
            + table(["component", "seconds", "share"], rows, {1, 2}, "step time breakdown (SymTensor plan)")
            + table(["baseline", "step s", "MFU", "memory GiB", "fits", "SymTensor speedup", "config"], base,
                    {1, 2, 3, 5}, "baselines (same cost model)") + "</section>")


def memory_section(p: dict) -> str:
    entries = _entries(p)
    cap = p["capacity_gib"]
    parts = ("params", "grads", "optimizer", "activations", "recompute_transient")
    rows = [[e["label"]] + [f"{e['memory_gib'].get(k, 0.0):.2f}" for k in parts] + [f"{e['memory_gib_per_device']:.2f}"]
            for e in entries]
    return ("<section id='memory'><h2>Memory per device</h2>"
            + _figure(plots.memory_plot(entries, cap, MEMORY_HEADROOM * cap), "memory",
                      f"Peak stage memory by part (allocated); capacity {cap:.0f} GiB, usable "
                      f"{100 * MEMORY_HEADROOM:.0f}% for the reserved peak (fragmentation, CUDA context and NCCL "
                      "buffers added).")
            + table(["plan"] + list(parts) + ["total"], rows, set(range(1, 7)), "GiB per device") + "</section>")


def layout_section(p: dict, layers: int) -> str:
    groups: dict = {}
    for r in p["layer_types"]:
        groups.setdefault((r["block"], r["kind"], _cuts(r["cuts"])), (r, []))[1].append(r["layers"])
    rows = [[layer_spans(spans), block, kind, cuts, r["dp"], r["tp"], r["cp"], r["ep"]]
            for (block, kind, cuts), (r, spans) in groups.items()]
    return ("<section id='layouts'><h2>Layouts</h2>"
            + _figure(plots.layout_map(p["layer_types"], layers), "layout-map",
                      "Each cell is one op of one layer; the color names its parallel degrees and cut dims.")
            + table(["layers", "op", "kind", "cuts (dim: mesh axes)", "dp", "tp", "cp", "ep"], rows, {4, 5, 6, 7},
                    "layouts per layer type") + "</section>")


def why_section(ex: dict) -> str:
    """One row per layer type, one column per mesh axis: the plan's cut and its margin over the
    next best candidate (the full verdict on hover)."""
    axes = [f"{a['name']} ({a['level']})" for a in ex["mesh"]]
    body = []
    for lt in ex["layer_types"]:
        cells = []
        for lv in lt["levels"]:
            margin = runner_up(lv, " s")
            style = "" if lv["chosen"] == lv["cheapest"] else " class='bad'"
            cells.append(f"<td title='{_e(lv['verdict'])}'{style}>{_e((lv['chosen'] or '-') + margin)}</td>")
        body.append(f"<tr><td>{_e(lt['block'])}</td><td>{_e(layer_spans(lt['layers']))}</td>{''.join(cells)}</tr>")
    head = "".join(f"<th>{_e(h)}</th>" for h in ["op", "layers"] + axes)
    return ("<section id='why'><h2>Why these cuts</h2><p>Per layer type (rows) and mesh axis (columns, outermost "
            "first): the dim the plan cuts on that axis and, in brackets, the next best candidate and how many "
            "seconds per step it would add (over the layers the op stands for, given the outer axes' cuts). Red: "
            "not the locally cheapest cut, taken for memory or by a coordinated move (hover for the verdict). "
            "<code>symtensor explain PLAN --op NAME</code> lists every candidate's compute, communication, "
            "redistribution and memory.</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></section>")


def sweep_section(sw: dict) -> str:
    pts = [p for p in sw["points"] if "error" not in p]
    param = sw["param"]
    others = [k for k in ("seq", "devices", "global_batch") if k != param]
    rows = [[p["value"]] + [p[k] for k in others] + [f"{p['step_time_s']:.3f}", mfu_cell(p),
                                                     f"{p['memory_gib_per_device']:.1f}", p["fits"], p["layout"]]
            for p in pts]
    errors = "".join(f"<p class='bad'>{_e(param)}={_e(p['value'])}: {_e(p['error'])}</p>"
                     for p in sw["points"] if "error" in p)
    bps = "".join(f"<li>{_e(b['explanation'])}</li>" for b in sw["breakpoints"]) or "<li>none: one plan throughout</li>"
    body = _figure(plots.sweep_plot(sw), "sweep", "Dotted lines mark breakpoints; labels name each point's plan "
                   "(* = per-op heterogeneous).") if pts else ""
    headers = [param] + [k.replace("_", " ") for k in others] + ["step s", "MFU", "memory GiB", "fits", "plan"]
    return (f"<section id='sweep'><h2>Sweep over {_e(param)}</h2>" + body
            + table(headers, rows, set(range(6))) + errors + f"<h3>Breakpoints</h3><ol>{bps}</ol></section>")


def render(data: dict) -> str:
    """The page for ``data = {"plan": <symtensor plan JSON with baseline breakdowns>, "layers": L,
    "explain": <analysis.explain output or None>, "sweep": <analysis.sweep output or None>}``."""
    p = data["plan"]
    title = f"SymTensor plan: {p['model']} on {p['devices']} x {p['cluster']}"
    sections = [summary_section(p), time_section(p), memory_section(p), layout_section(p, data["layers"])]
    links = [("time", "step time"), ("memory", "memory"), ("layouts", "layouts")]
    if data.get("explain"):
        sections.append(why_section(data["explain"]))
        links.append(("why", "why"))
    if data.get("sweep"):
        sections.append(sweep_section(data["sweep"]))
        links.append(("sweep", "sweep"))
    nav = "<nav>" + "".join(f"<a href='#{i}'>{_e(t)}</a>" for i, t in links) + "</nav>"
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{CSS}</style>{SCRIPT_HEAD}</head><body><h1>{_e(title)}</h1>{nav}" + "".join(sections)
            + "<footer><p>Generated by symtensor; every number comes from its symbolic cost model.</p></footer>"
            + SCRIPT_END + "</body></html>")


def write(path: str | Path, data: dict) -> Path:
    """The page, written atomically (a temporary file renamed over ``path``; no symbolic link)."""
    from symtensor.output import write_atomic

    return write_atomic(path, render(data), "--html")
