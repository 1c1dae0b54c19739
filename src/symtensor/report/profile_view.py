"""Console output of ``symtensor profile``, ``clusters --show FILE`` and ``calibrate --cluster FILE``."""

from __future__ import annotations

from rich.table import Table

from symtensor.report.console import _console, _json, _si, progress_bar

POOR_FIT = 0.25  # a curve whose mean |error| exceeds this is shown in red: its law misses the device


def progress(enabled: bool):
    """``on_step(done, total, what)`` for a profile's progress bar on stderr (None when not ``enabled``)."""
    return progress_bar(enabled, "starting the processes")


def _curve_table(summaries: list[dict], title: str) -> Table:
    t = Table(title=title)
    for col in ("curve", "points", "large-size rate", "knee", "mean |error|", "max |error|"):
        t.add_column(col, justify="left" if col == "curve" else "right")
    for s in summaries:
        knee = _si(s["knee"], "FLOP" if s["unit"] == "FLOP/s" else "B") if "attention" not in s["curve"] \
            else f"{s['knee']:.0f} tokens"
        t.add_row(s["curve"], str(s["n"]), _si(s["a"], s["unit"]), knee, f"{100 * s['mean_abs_error']:.1f}%",
                  f"{100 * s['max_abs_error']:.1f}%", style="red" if s["mean_abs_error"] > POOR_FIT else "")
    return t


def profiled(out: dict, as_json: bool) -> int:
    """The written file, its fitted constants and each fit's residuals."""
    if as_json:
        return _json({k: out[k] for k in ("out", "wall_s", "devices", "backend", "curves")}
                     | {"efficiency": out["cluster"]["efficiency"]})
    c = _console()
    c.print(f"wrote {out['out']} in {out['wall_s']:.1f} s ({out['devices']} {out['backend']} processes)")
    c.print(_curve_table(out["curves"], "fitted curves (rate = a x / (x + knee)); errors of the predicted times"))
    c.print(f"show it: symtensor clusters --show {out['out']}; every point: symtensor calibrate --cluster "
            f"{out['out']}")
    return 0


def cluster_file(doc: dict, as_json: bool) -> int:
    """A cluster file: device, levels, efficiency fractions and what was measured."""
    if as_json:
        return _json(doc)
    c = _console()
    dev = doc["device"]
    peaks = ", ".join(f"{k} {v:g}" for k, v in dev["peak_tflops"].items())
    c.print(f"[bold]{doc.get('name', '')}[/bold]: {dev['name']}, peak TFLOP/s {peaks}, HBM {dev['hbm_gbps']:g} GB/s, "
            f"memory {dev['memory_gib']:g} GiB")
    if "source" in dev:
        c.print(f"  device: {dev['source']}")
    t = Table(title="levels (innermost first; bandwidth per device, each way)")
    for col in ("level", "fanout", "GB/s", "latency us", "link efficiency", "source"):
        t.add_column(col)
    for lv in doc["levels"]:
        link = ", ".join(f"{k} {v:.3g}" for k, v in lv.get("link_efficiency", {}).items()) or "-"
        t.add_row(lv["name"], str(lv.get("fanout", "N")), f"{lv['bandwidth_gbps']:g}", f"{lv['latency_us']:g}", link,
                  lv.get("source", ""))
    c.print(t)
    eff = dict(doc.get("efficiency", {}))
    if eff:
        source = eff.pop("source", "the cluster file")
        t = Table(title="efficiency (fractions of the peaks above; knees in FLOPs, tokens, bytes)")
        t.add_column("field")
        t.add_column("value", justify="right")
        for k, v in eff.items():
            t.add_row(k, f"{v:.4g}")
        c.print(t)
        c.print(f"  efficiency: {source}")
    measured = doc.get("measured")
    if measured:
        tables = {k: len(v) for k, v in measured.items() if isinstance(v, list)}
        curves = {lv: len(v) - 1 for lv, v in measured.get("collectives", {}).items()}
        c.print(f"measured {measured.get('date')} on {measured.get('world_size')} x {measured.get('device')} "
                f"({measured.get('backend')}, {measured.get('dtype')}): torch {measured.get('torch')}, CUDA "
                f"{measured.get('cuda')}, NCCL {measured.get('nccl')}")
        c.print("  points: " + ", ".join(f"{k} {n}" for k, n in tables.items())
                + "".join(f", {lv} {n} collective curves" for lv, n in curves.items()))
        if measured.get("note"):
            c.print(f"  {measured['note']}")
    return 0


def cluster_fit(path: str, curves: list, as_json: bool) -> int:
    """Every measured point of a cluster file against the curve the planner uses."""
    if as_json:
        return _json({"cluster": path, "curves": [c.summary() | {"points": [
            {"point": p.label, "measured_s": p.seconds, "predicted_s": c.predicted_s(p), "error": e}
            for p, e in zip(c.points, c.errors())]} for c in curves]})
    t = Table(title=f"{path}: measured vs the planner's curves (predicted seconds)")
    for col in ("curve", "point", "measured s", "predicted s", "error"):
        t.add_column(col, justify="left" if col in ("curve", "point") else "right")
    for curve in curves:
        for p, e in zip(curve.points, curve.errors()):
            t.add_row(curve.name, p.label, f"{p.seconds:.4g}", f"{curve.predicted_s(p):.4g}", f"{100 * e:+.1f}%")
    c = _console()
    c.print(t)
    c.print(_curve_table([cv.summary() for cv in curves], f"per curve (red: mean |error| above {POOR_FIT:.0%})"))
    return 0
