"""What the console views share: a leaf that ``console`` and ``plan_view`` import (``console``
imports the views, so the views cannot import it)."""

from __future__ import annotations

from rich.table import Table


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
    how = "calibrated" if out["band_calibrated"] else "extrapolated: no calibration runs of this regime"
    return (f"engine {out['framework']}, {out['efficiency_table']} efficiencies; band {lo:.3f}-{hi:.3f} s "
            f"({out['regime']}, {how})")
