"""What the console views share: a leaf that ``console`` and ``plan_view`` import (``console``
imports the views, so the views cannot import it)."""

from __future__ import annotations

from rich.table import Table

from symtensor.hardware import MEMORY_HEADROOM

# the degrees and choices a config line names, then the keys a config has only where they hold (hybrid sharding's
# shard group, context parallelism's kind where it is not the engine's own)
CONFIG_WORDS = ("tp", "pp", "dp", "cp", "ep", "etp", "sp", "zero", "recompute")
WHERE_HELD = ("dp_shard", "cp_comm")


def config_words(cfg: dict, more: tuple[str, ...] = ()) -> str:
    """``tp=2 pp=1 ... recompute=none`` of a JSON ``config``, then the keys ``more``, then ``WHERE_HELD``'s it has."""
    keys = CONFIG_WORDS + more + tuple(k for k in WHERE_HELD if k in cfg)
    return " ".join(f"{k}={cfg[k]}" for k in keys)


# what a baseline's row names of its config (``baseline_words``)
BASELINE_WORDS = ("tp", "pp", "dp", "cp", "ep", "etp", "recompute", "zero", "micro_batch")


def baseline_words(cfg: dict) -> str:
    """``tp=4 pp=4 ... micro_batch=1``: the ``BASELINE_WORDS`` a baseline's JSON ``config`` has (the console's and
    the HTML report's baselines tables)."""
    return " ".join(f"{k}={cfg[k]}" for k in BASELINE_WORDS if k in cfg)


def mfu_cell(out: dict) -> str:
    """``41.2%``, naming the peak it is of where that is not BF16's (``41.2% (FP8 peak)``): an FP8 or FP4 plan's MFU
    is of its own precision's peak, as NVIDIA's FP8 benchmarks report it (README), lower than the same step's
    against BF16's, so a table of BF16 and FP8 plans says which is which."""
    precision = out.get("config", {}).get("precision", "bf16")
    return f"{100 * out['mfu']:.1f}%" + (f" ({precision.upper()} peak)" if precision in ("fp8", "fp4") else "")


def mfu_text(out: dict) -> str:
    """``MFU 41.2%`` (``mfu_cell``)."""
    return f"MFU {mfu_cell(out)}"


def breakdown_table(title: str, breakdown: dict, total: float) -> Table:
    t = Table(title=title)
    t.add_column("component")
    t.add_column("seconds", justify="right")
    t.add_column("share", justify="right")
    for k, v in breakdown.items():
        if v > 0:
            t.add_row(k, f"{v:.4f}", f"{100 * v / total:.1f}%")
    return t


def prediction_line(out: dict) -> str:
    """The engine, the efficiency table and the error band of a prediction, in one line."""
    lo, hi = out["step_time_band_s"]
    widened = out.get("band_widened")
    if out["band_calibrated"]:
        how = "calibrated"
    elif widened:
        how = f"extrapolated along {', '.join(widened)}: no calibration runs there"
    else:
        how = "extrapolated: no calibration runs of this regime"
    return (f"engine {out['framework']}, {out['efficiency_table']} efficiencies; band {lo:.3f}-{hi:.3f} s "
            f"({out['regime']}, {how})")


def print_prediction(console, out: dict) -> None:
    """The prediction's engine and error band (``prediction_line``, where ``out`` has a band) and its memory
    (``memory_lines``), as the plan and the evaluation show them."""
    if "step_time_band_s" in out:
        console.print(prediction_line(out), markup=False)
    for line in memory_lines(out):
        console.print(line)


def memory_lines(out: dict) -> list[str]:
    """The memory of a plan's or an evaluation's JSON in two lines (rich markup): the allocated peak
    (torch.cuda.max_memory_allocated), the device's reserved peak (what nvidia-smi shows; ``fits`` judges it
    against the usable share of the capacity) and the terms that make it (``cost.memory.TERMS``)."""
    fits = "[green]fits[/]" if out["fits"] else "[red]does not fit[/]"
    cap = out["capacity_gib"]
    terms = out.get("memory_terms_gib", {})
    head = (f"memory {out['memory_gib_per_device']:.1f} GiB allocated, "
            f"{out.get('memory_reserved_gib_per_device', out['memory_gib_per_device']):.1f} GiB reserved "
            f"(as nvidia-smi shows) of {cap:.0f} GiB per device, {MEMORY_HEADROOM * cap:.1f} usable: {fits}")
    parts = ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in terms.items() if v)
    return [head] + ([f"  [dim]{parts} GiB[/]"] if parts else [])
