"""Where the benchmarks write what they measured: ``benchmarks/results/<name>.md`` (a markdown
report, also printed) and ``<name>.csv`` (one row per measurement)."""

from __future__ import annotations

import csv
from pathlib import Path

OUT = Path(__file__).parent / "results"


def write_results(name: str, lines: list[str], rows: list[dict] | None = None, fields: list[str] | None = None):
    """Write the report ``lines`` and, when given, the ``rows`` (columns ``fields``, default the
    keys of the first row); print the report."""
    OUT.mkdir(exist_ok=True)
    if rows:
        with open(OUT / f"{name}.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields or list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    (OUT / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
