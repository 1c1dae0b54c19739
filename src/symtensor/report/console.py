"""Console output: rich tables for each command, or one JSON object with ``--json``."""

from __future__ import annotations

import json
from contextlib import contextmanager

from rich.console import Console
from rich.table import Table

from symtensor.hardware import GIB
from symtensor.output import shown  # names and paths from users: printed as text, never as markup
from symtensor.report.tables import breakdown_table, mfu_text, print_prediction


def _console() -> Console:
    return Console(width=120, highlight=False)


def _json(obj) -> int:
    print(json.dumps(obj, indent=2, default=str))
    return 0


def _si(x: float, unit: str = "") -> str:
    for factor, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.2f} {prefix}{unit}"
    return f"{x:.3g} {unit}".strip()


def models(presets: dict, as_json: bool) -> int:
    rows = []
    for name, c in presets.items():
        rows.append({"name": name, "layers": c.layers, "hidden": c.hidden, "heads": c.heads, "kv_heads": c.kv_heads,
                     "ffn": c.ffn, "vocab": c.vocab, "experts": c.experts, "top_k": c.top_k, "source": c.source})
    if as_json:
        return _json(rows)
    t = Table(title="Model zoo (symtensor graph NAME for counts)")
    for col in ("name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts", "top_k"):
        t.add_column(col, justify="left" if col == "name" else "right")
    for r in rows:
        t.add_row(*(str(r[c]) for c in ("name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts",
                                        "top_k")))
    _console().print(t)
    return 0


def clusters(presets: dict, as_json: bool) -> int:
    rows = []
    for name, (dev, levels) in presets.items():
        rows.append({"name": name, "device": dev.name, "peak_bf16_tflops": dev.peak_flops.get("bf16", 0) / 1e12,
                     "hbm_gbps": dev.hbm_bandwidth / 1e9, "memory_gib": dev.memory / GIB,
                     "levels": [{"name": lv.name, "fanout": lv.fanout, "bandwidth_gbps": lv.bandwidth / 1e9,
                                 "latency_us": lv.latency * 1e6, "source": lv.source} for lv in levels],
                     "source": dev.source})
    if as_json:
        return _json(rows)
    t = Table(title="Cluster presets (bandwidth per device, each way)")
    for col in ("name", "device", "bf16 TFLOP/s", "HBM GB/s", "memory GiB", "levels"):
        t.add_column(col)
    for r in rows:
        lv = ", ".join(f"{x['name']} x{x['fanout'] or 'N'} {x['bandwidth_gbps']:.0f} GB/s {x['latency_us']:.0f} us"
                       for x in r["levels"])
        t.add_row(r["name"], r["device"], f"{r['peak_bf16_tflops']:.0f}", f"{r['hbm_gbps']:.0f}",
                  f"{r['memory_gib']:.0f}", lv)
    _console().print(t)
    return 0


def graph(out: dict, as_json: bool) -> int:
    if as_json:
        return _json(out)
    t = Table(title=f"{shown(out['model'])}: training graph (micro batch {out['micro_batch']}, seq {out['seq']})",
              show_header=False)
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("parameters (total)", f"{out['params_total'] / 1e9:.3f} B")
    t.add_row("parameters (active per token)", f"{out['params_active'] / 1e9:.3f} B")
    t.add_row("layers", str(out["layers"]))
    t.add_row("operators", f"{out['ops']} (" + ", ".join(f"{k} {v}" for k, v in out["ops_by_kind"].items()) + ")")
    t.add_row("FLOPs per step (fwd+bwd)", _si(out["flops_per_step"], "FLOP"))
    t.add_row("FLOPs per token", _si(out["flops_per_token"], "FLOP"))
    t.add_row("activations per micro-batch", f"{out['activation_bytes_per_microbatch'] / GIB:.2f} GiB")
    t.add_row("activations per layer", f"{out['activation_bytes_per_layer'] / GIB:.3f} GiB")
    _console().print(t)
    return 0


def evaluation(out: dict, as_json: bool) -> int:
    if as_json:
        return _json(out)
    c = _console()
    cfg = out["config"]
    c.print(f"[bold]{shown(out['model'])}[/] on {out['devices']} x {shown(out['cluster'])}: "
            + " ".join(f"{k}={v}" for k, v in cfg.items()))
    c.print(f"step {out['step_time_s']:.3f} s   {out['tokens_per_s']:,.0f} tokens/s   "
            f"{out['model_tflops_per_device']:.1f} TFLOP/s/device   {mfu_text(out)}")
    print_prediction(c, out)
    c.print(breakdown_table("step time breakdown", out["breakdown"], out["step_time_s"]))
    for note in out.get("notes", ()):
        c.print(f"note: {note}", markup=False)
    return 0


def calibration(results, summary: dict, as_json: bool, extra: dict | None = None) -> int:
    """``symtensor calibrate``: predicted vs published per row, the error per metric, and (``extra``) the
    end-to-end constants, the error per regime in-sample and leave-one-source-out, and the bands' coverage."""
    rows = [{"device": r.row.device, "source": r.row.source, "model": r.row.model, "metric": r.row.metric,
             "gpus": r.row.fields["gpus"], "tp": r.row.fields["tp"], "cp": r.row.fields.get("cp", ""),
             "pp": r.row.fields["pp"], "dp": r.row.fields["dp"], "sp": r.row.fields["sp"],
             "recompute": r.row.fields["recompute"], "measured": r.row.measured, "predicted": r.predicted,
             "error": r.error, "within_tolerance": r.within} for r in results]
    extra = extra or {}
    if as_json:
        return _json({"rows": rows, "summary": summary, "efficiency": {}, **extra})
    t = Table(title="Calibration: predicted vs published (shared/data/calibration.csv, calibration_h100.csv)")
    for col in ("device", "model", "metric", "gpus", "t/p/d", "sp", "recompute", "measured", "predicted", "error"):
        t.add_column(col, justify="right" if col in ("measured", "predicted", "error") else "left")
    for r in rows:
        err = f"{100 * r['error']:+.1f}%" if abs(r["error"]) < 1 and "%" not in r["metric"] else f"{r['error']:+.2f}"
        style = "" if r["within_tolerance"] else "red"
        t.add_row(r["device"], r["model"], r["metric"][:44], r["gpus"], f"{r['tp']}/{r['pp']}/{r['dp']}", r["sp"],
                  r["recompute"][:9],
                  f"{r['measured']:.3f}", f"{r['predicted']:.3f}", err, style=style)
    c = _console()
    c.print(t)
    for k, v in summary.items():
        c.print(f"{k}: mean |error| {v['mean']:.4g}, max {v['max']:.4g} (tolerance {v['tolerance']}, n={v['n']})",
                markup=False)
    if "end_to_end" in extra:
        c.print("end-to-end constants: " + ", ".join(f"{k}={v:.4g}" for k, v in extra["end_to_end"].items()),
                markup=False)
    for title, key in (("in-sample", "in_sample"), ("leave-one-source-out", "leave_one_source_out")):
        for k, v in extra.get(key, {}).items():
            c.print(f"{title} {k}: mean |error| {v['mean']:.4g}, max {v['max']:.4g}, bias {v['bias']:+.4g} "
                    f"(n={v['n']})", markup=False)
    for k, (hit, n) in extra.get("band_coverage", {}).items():
        c.print(f"band coverage (leave-one-source-out) {k}: {hit} of {n} time rows inside their band", markup=False)
    return 0


def own_runs(fitted, path: str, as_json: bool) -> int:
    """``symtensor calibrate --runs``: each run measured, predicted in sample and left out, the
    fitted constants with their ranges, the band, and where the cluster file went."""
    from symtensor.profile.own_runs import FREE

    held = fitted.held_out is not None
    errors, held_errors = fitted.errors(), fitted.errors(held_out=True)
    rows = [{"line": r.line, "model": r.model, "devices": r.devices, "config": r.config, "measured_s": r.step_time_s,
             "predicted_s": p, "error": errors[i],
             "held_out_s": fitted.held_out[i] if held else None,
             "held_out_error": held_errors[i] if held else None,
             "peak_memory_error": fitted.memory_errors[i]}
            for i, (r, p) in enumerate(zip(fitted.runs, fitted.predicted))]
    out = {"rows": rows, "constants": fitted.constants, "ranges": {k: FREE[k][1:3] for k in FREE},
           "band": list(fitted.band), "band_from": "leave-one-out" if held else "in-sample", "cluster_file": path}
    if as_json:
        return _json(out)
    t = Table(title=f"Your runs: predicted vs measured step ({len(rows)} runs)")
    for col in ("line", "model", "devices", "config", "measured s", "fitted s", "error", "left out s", "error ",
                "peak mem"):
        t.add_column(col, justify="left" if col in ("model", "config") else "right")
    for r in rows:
        cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
        mem = "" if r["peak_memory_error"] is None else f"{100 * r['peak_memory_error']:+.1f}%"
        t.add_row(str(r["line"]), r["model"], str(r["devices"]), cfg, f"{r['measured_s']:.3f}",
                  f"{r['predicted_s']:.3f}", f"{100 * r['error']:+.1f}%",
                  "" if r["held_out_s"] is None else f"{r['held_out_s']:.3f}",
                  "" if r["held_out_error"] is None else f"{100 * r['held_out_error']:+.1f}%", mem)
    c = _console()
    c.print(t)
    for k, v in fitted.constants.items():
        section, lo, hi, _ = FREE[k]
        c.print(f"{section}.{k} = {v:.4g} (range {lo:g}..{hi:g})", markup=False)
    lo, hi = fitted.band
    how = "left out one at a time" if held else "in sample, at least +-3% (fewer than 3 runs: no left-out error)"
    c.print(f"band: {100 * lo:+.1f}% .. {100 * hi:+.1f}% ({how}); mean |error| left out: "
            + (f"{100 * sum(abs(r['held_out_error']) for r in rows) / len(rows):.1f}%" if held else "n/a"),
            markup=False)
    c.print(f"wrote {path}: plan with --cluster {path}", markup=False)
    return 0


def _show(out: dict, as_json: bool, view: str, *args) -> int:
    """One JSON object, or the named printer of ``plan_view`` / ``analysis_view`` (imported late:
    they are only needed for their command)."""
    if as_json:
        return _json(out)
    from symtensor.report import analysis_view, plan_view

    printer = getattr(plan_view, view, None) or getattr(analysis_view, view)
    printer(_console(), out, *args)
    return 0


def plan(out: dict, as_json: bool) -> int:
    return _show(out, as_json, "print_plan")


def explain(out: dict, as_json: bool, full: bool = False) -> int:
    """``symtensor explain``: per layer type the terms and the winning cut per mesh axis; ``full``
    lists every candidate (with the formulas when ``out`` has them)."""
    return _show(out, as_json, "print_explain", full)


def compare(out: dict, as_json: bool) -> int:
    return _show(out, as_json, "print_compare")


def sweep(out: dict, as_json: bool) -> int:
    return _show(out, as_json, "print_sweep")


def html_report(out: dict, as_json: bool) -> int:
    if as_json:
        return _json(out)
    c = _console()
    p = out["plan"]
    c.print(f"[bold]{shown(p['model'])}[/] on {p['devices']} x {shown(p['cluster'])}: step {p['step_time_s']:.3f} s, "
            f"{mfu_text(p)}, {p['memory_gib_per_device']:.1f} GiB per device")
    if out.get("sweep"):
        c.print(f"sweep over {out['sweep']['param']}: {len(out['sweep']['points'])} points, "
                f"{len(out['sweep']['breakpoints'])} breakpoints")
    c.print(f"report written to {shown(out['html'])}")
    return 0


@contextmanager
def progress_bar(enabled: bool, first: str):
    """A context manager yielding ``on_step(done, total, what)`` that drives a progress bar on
    stderr (None when ``enabled`` is false, e.g. stderr is not a terminal); ``first`` is shown
    until the first step."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    if not enabled:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(first, total=None)
        yield lambda done, total, what: progress.update(task, total=total, completed=done, description=what)


@contextmanager
def sweep_progress(enabled: bool):
    """A context manager yielding ``on_point(index, total, point)`` that drives a progress bar on
    stderr (None when ``enabled`` is false, e.g. stderr is not a terminal)."""
    with progress_bar(enabled, "searching plans") as on_step:
        yield None if on_step is None else (
            lambda i, n, point: on_step(i, n, f"{point['value']}: {point.get('layout') or 'no plan'}"))


def _mesh_roles(spec: dict) -> str:
    """The run's mesh as the plan names its axes (``runtime.lower``), each with its roles:
    ``loopback0:2 (dp) x loopback1:2 (tp, ep)``."""
    roles = {axis: [] for axis in spec["mesh"]}
    for role, axes in (("pp", [spec["pp_axis"]]), ("dp", spec["dp_axes"]), ("fsdp", spec["fsdp_axes"]),
                       ("tp", [spec["tp_axis"]]), ("ep", spec["ep_axes"])):
        for axis in axes:
            if axis in roles:
                roles[axis].append(role)
    return " x ".join(f"{axis}:{size} ({', '.join(roles[axis]) or '-'})" for axis, size in spec["mesh"].items())


def run(out: dict, as_json: bool) -> int:
    if as_json:
        return _json(out)
    c = _console()
    cfg = out["config"]
    c.print(f"[bold]{shown(out['model'])}[/] on {out['devices']} processes "
            f"({'NCCL' if out.get('device') == 'cuda' else 'gloo'}): "
            + " ".join(f"{k}={cfg[k]}" for k in ("tp", "pp", "dp", "ep", "etp", "sp", "zero")))
    c.print(f"mesh {_mesh_roles(out['spec'])}")
    if out["reference_losses"] is None:  # a GPU run: no single-process reference
        c.print(f"losses {[f'{x:.6f}' for x in out['losses']]}")
    else:
        ok = "[green]match[/]" if out["numerics_ok"] else "[red]differ[/]"
        c.print(f"losses {[f'{x:.6f}' for x in out['losses']]} vs one process "
                f"{[f'{x:.6f}' for x in out['reference_losses']]}: {ok} (max |loss diff| {out['loss_max_abs_diff']:.2e}"
                f", max |param diff| {out['param_max_abs_diff']:.2e})")
    t = Table(title="bytes per device per step: cost model vs measured (TorchDispatchMode)")
    for col in ("collective", "predicted", "measured", ""):
        t.add_column(col, justify="right" if col in ("predicted", "measured") else "left")
    for r in out["bytes"]:
        t.add_row(r["kind"], f"{r['predicted_bytes']:,.0f}", f"{r['measured_bytes']:,.0f}",
                  "ok" if r["ok"] else "[red]MISMATCH[/]")
    c.print(t)
    if "predicted_step_s" in out:
        c.print(f"step time: measured {out['measured_step_s']:.4f} s (median after the first step), predicted "
                f"{out['predicted_step_s']:.4f} s on {out['cluster']}; peak memory: measured "
                f"{out['measured_memory_gib']:.2f} GiB allocated, predicted {out['predicted_memory_gib']:.2f} GiB")
    return 0
