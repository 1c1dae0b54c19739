"""What every frozen held-out test file shares (``bridge_perf_runs.py``, ``dgxc_runs.py``): its sha256, its rows read
with or without the measured columns (``--check`` never holds them in memory), and the summary line of a comparison.

A test file is parsed once from its source into ``benchmarks/<name>.csv`` and its sha256 recorded; the measured
columns are kept apart from the columns that describe the run, so that a row's mapping is checked with them dropped
before anyone compares predictions with them (once)."""

from __future__ import annotations

import csv
import hashlib
import statistics
from pathlib import Path


def sha256(path: Path) -> str:
    """The sha256 of a frozen test file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_rows(path: Path, measured: tuple[str, ...], with_measured: bool) -> list[dict]:
    """The rows of a frozen test file; without ``with_measured``, its ``measured`` columns dropped on reading."""
    with path.open() as f:
        rows = list(csv.DictReader(f))
    if not with_measured:
        for r in rows:
            for k in measured:
                r.pop(k)
    return rows


def pct(v: float) -> str:
    """A signed fraction as a percentage: +1.2%."""
    return f"{100 * v:+.1f}%"


def summary(label: str, errs: list[float], inside: list[bool]) -> str:
    """One markdown row: the group, its rows, MAPE, mean signed error and how many lie inside their band."""
    if not errs:
        return f"| {label} | 0 | - | - | - |"
    return (f"| {label} | {len(errs)} | {100 * statistics.mean(abs(e) for e in errs):.1f}% | "
            f"{pct(statistics.mean(errs))} | {sum(inside)} of {len(inside)} |")
