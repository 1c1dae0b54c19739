"""Console view of a plan: summary, per-layer-type cuts, memory, breakdown, baselines."""

from __future__ import annotations

from rich.table import Table

from symtensor.output import shown
from symtensor.report.tables import baseline_words, breakdown_table, config_words, mfu_cell, mfu_text, print_prediction


def _cuts(c: dict) -> str:
    return " ".join(f"{d}:{'x'.join(axes)}" for d, axes in sorted(c.items())) or "replicated"


def layer_spans(spans: list[str]) -> str:
    """'0', '1-30', '31' -> '0-31' when they are contiguous layer ranges."""
    nums = []
    for sp in spans:
        if not sp[0].isdigit():
            return ", ".join(spans)
        lo, _, hi = sp.partition("-")
        nums.append((int(lo), int(hi or lo)))
    nums.sort()
    if all(b[0] == a[1] + 1 for a, b in zip(nums, nums[1:])):
        lo, hi = nums[0][0], nums[-1][1]
        return f"{lo}" if lo == hi else f"{lo}-{hi}"
    return ", ".join(spans)


def runner_up(level: dict, unit: str = "") -> str:
    """`` (cut +seconds)``: the next best candidate of an explained mesh axis (``analysis.explain``: one of a
    layer type's ``levels``) and the seconds per step it would add over the chosen cut; '' when there is none."""
    alt = [cand for cand in level["candidates"] if not cand["chosen"]]
    if not alt:
        return ""
    best = next(cand for cand in level["candidates"] if cand["chosen"])
    runner = min(alt, key=lambda cand: cand["time_s"])
    return f" ({runner['cut'] or 'none'} {runner['time_s'] - best['time_s']:+.3g}{unit})"


def print_plan(console, out: dict) -> None:
    cfg = out["config"]
    mesh = " x ".join(f"{a['name']}:{a['size']}" for a in out["mesh"])
    console.print(f"[bold]{shown(out['model'])}[/] on {out['devices']} x {shown(out['cluster'])} (mesh {mesh}"
                  f"{', pipeline over ' + ', '.join(out['pipeline_axes']) if out['pipeline_axes'] else ''})")
    console.print("plan: " + config_words(cfg, ("micro_batch", "micro_steps", "vpp"))
                  + ("  [yellow](heterogeneous)[/]" if cfg["heterogeneous"] else ""))
    for what in cfg.get("differs", ()):
        console.print(f"  [yellow]differs: {shown(what)}[/]")
    console.print(f"step {out['step_time_s']:.3f} s   {out['tokens_per_s']:,.0f} tokens/s   "
                  f"{mfu_text(out)}   found in {out['search_time_s'] * 1000:.0f} ms")
    print_prediction(console, out)
    for note in out["notes"]:
        console.print(f"[red]{shown(note)}[/]")
    t = Table(title="layouts per layer type (dim: mesh axes)")
    for col in ("layers", "op", "kind", "cuts", "dp", "tp", "cp", "ep"):
        t.add_column(col)
    groups: dict = {}  # the same op with the same cuts in several layer runs is one row
    for row in out["layer_types"]:
        key = (row["block"], row["kind"], _cuts(row["cuts"]))
        groups.setdefault(key, (row, []))[1].append(row["layers"])
    for (block, kind, cuts), (row, spans) in groups.items():
        t.add_row(layer_spans(spans), block, kind, cuts, str(row["dp"]), str(row["tp"]), str(row["cp"]), str(row["ep"]))
    console.print(t)
    console.print(breakdown_table("step time breakdown", out["breakdown"], out["step_time_s"]))
    if "baselines" in out:
        b = Table(title="baselines (same cost model)")
        for col in ("baseline", "step s", "MFU", "memory GiB", "fits", "SymTensor speedup", "config"):
            b.add_column(col)
        b.add_row("symtensor", f"{out['step_time_s']:.3f}", mfu_cell(out),
                  f"{out['memory_gib_per_device']:.1f}", str(out["fits"]), "1.00x", "")
        for name, v in out["baselines"].items():
            if v["step_time_s"] is None:
                b.add_row(name, "-", "-", "-", "False", "-", v.get("note", ""))
                continue
            desc = baseline_words(v["config"])
            speed = f"{v['speedup_of_plan']:.2f}x" if v["speedup_of_plan"] else "-"
            if v.get("verdict_of_plan") == "tie within model error":
                speed += " (tie within model error)"
            b.add_row(name, f"{v['step_time_s']:.3f}", mfu_cell(v), f"{v['memory_gib_per_device']:.1f}",
                      str(v["fits"]), speed, desc)
        console.print(b)
    if out.get("plan_file"):
        console.print(f"plan written to {shown(out['plan_file'])}")
