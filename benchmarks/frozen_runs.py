"""What every frozen held-out test file shares (``bridge_perf_runs.py``, ``dgxc_runs.py``): its sha256, its rows read
with or without the measured columns (``--check`` never holds them in memory), and the summary line of a comparison.

A test file is parsed once from its source into ``benchmarks/<name>.csv`` and its sha256 recorded; the measured
columns are kept apart from the columns that describe the run, so that a row's mapping is checked with them dropped
before anyone compares predictions with them (once)."""

from __future__ import annotations

import csv
import hashlib
import statistics
import subprocess
from pathlib import Path

from symtensor import api
from symtensor.errors import PlanError
from symtensor.hardware import GIB
from symtensor.plan.document import config_band


def sha256(path: Path) -> str:
    """The sha256 of a frozen test file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git(mirror: Path, name: str, *args: str) -> str:
    """The output of ``git -C mirror args`` (a local mirror of ``name``'s repository, which only ``--parse`` reads);
    a one-line error where the mirror is absent."""
    if not mirror.exists():
        raise PlanError(f"no {name} mirror at {mirror}; --parse reads it (comparisons read the frozen file)")
    return subprocess.run(["git", "-C", str(mirror), *args], check=True, capture_output=True, text=True).stdout


def show(mirror: Path, name: str, commit: str, path: str) -> str:
    """The file ``path`` at ``commit`` of the mirror (``git``), or "" where that commit has none."""
    try:
        return git(mirror, name, "show", f"{commit}:{path}")
    except subprocess.CalledProcessError:
        return ""


def write_parsed(path: Path, rows: list[dict], fields=None, newline: str = "\r\n") -> None:
    """Write a frozen test file (``--parse``): ``rows`` under ``fields`` (default the first row's keys; a cell a row
    lacks is empty), lines ending in ``newline``."""
    fields = list(fields or rows[0])
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, lineterminator=newline)
        w.writeheader()
        w.writerows({k: r.get(k, "") for k in fields} for r in rows)


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


def status_line(out: list[dict]) -> str:
    """How many rows ended in each status (fits, does not fit, skipped, refused), in order of first appearance."""
    statuses: dict[str, int] = {}
    for x in out:
        statuses[x["status"]] = statuses.get(x["status"], 0) + 1
    return "Rows: " + ", ".join(f"{v} {k}" for k, v in statuses.items()) + "."


def nofit_line(nofit: list[dict], note: str = "") -> str:
    """The rows that do not fit, in one sentence (they stay out of the summary table)."""
    row = summary("does not fit", [x["error"] for x in nofit], [x["inside_band"] for x in nofit])
    return f"Rows that do not fit (not in the summary{note}): " + row[2:-2].replace(" | ", ", ")


# how the table of every row writes a comparison's cells (an empty cell where the value is None)
CELLS = {"error": pct, "reserved_gib": lambda v: f"{v:.1f}", "inside_band": lambda v: "yes" if v else "no"}


def row_table(out: list[dict], cols: list[str], cells: dict) -> list[str]:
    """The "Every row" section: one markdown row per result, ``cells`` (column -> format) added to ``CELLS``."""
    fmt = {**CELLS, **cells}
    lines = ["", "## Every row", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for x in out:
        cell = {**x, **{c: "" if x[c] is None else f(x[c]) for c, f in fmt.items()}}
        lines.append("| " + " | ".join(str(cell[c]).replace("|", "\\|") for c in cols) + " |")
    return lines


def evaluated(kw: dict | None, skip: str, said: str) -> dict:
    """A described row's evaluation (``kw``: ``api.evaluate``'s keywords, None where the row is skipped for
    ``skip``; ``said``: the description): status (fits, does not fit, refused, skipped), why, the predicted step,
    the reserved peak and the error band the evaluation prints (``plan.document.config_band``)."""
    out = {"status": "skipped" if kw is None else "", "why": skip, "described_as": said}
    if kw is None:
        return out
    try:
        plan = api.evaluate(**kw)
    except PlanError as e:
        return {**out, "status": "refused", "why": str(e).splitlines()[0]}
    rep = plan.report
    band = config_band(plan.model, plan.cluster, rep.step_time_s, zero=kw["zero"], seq=kw["seq"],
                       framework=kw["framework"], precision=kw["precision"], tp=kw["tp"])
    return {**out, "status": "fits" if rep.fits else "does not fit", "why": "" if rep.fits else rep.overflow,
            "step_s": rep.step_time_s, "reserved_gib": rep.memory_reserved / GIB, "band": band}


def check_rows(rows: list[dict], evaluate, prefix) -> int:
    """``--check``: every row (read without its measured columns) described and evaluated, one line each
    (``prefix(row)``, the status, the reserved peak, the reason or the description), then the status counts."""
    counts: dict[str, int] = {}
    for r in rows:
        e = evaluate(r)
        counts[e["status"]] = counts.get(e["status"], 0) + 1
        extra = f" {e['reserved_gib']:.1f} GiB" if "reserved_gib" in e else ""
        print(f"{prefix(r)} {e['status']}{extra}: {e['why'] or e['described_as']}")
    print(counts)
    return 0


def compared(res: dict, e: dict, measured: float | None) -> bool:
    """Whether row ``res`` of a step-time comparison has both a prediction (``e``, ``evaluated``'s) and a measured
    step; if so it gains its error (measured / predicted - 1, +: optimistic) and whether the measured step lies in
    the evaluation's band."""
    if "step_s" not in e or not measured:
        return False
    res.update(error=measured / e["step_s"] - 1, inside_band=e["band"].contains(measured))
    return True


def step_report(title: str, name: str, out: list[dict], done: list[dict], keys) -> list[str]:
    """The head of the report of a step-time comparison of ``benchmarks/<name>.csv``: what it compares, the status
    counts, the summary of the compared rows that fit, in all and by each group ``keys(row)`` names, and the compared
    rows that do not fit (``done``: the rows ``compared`` filled)."""
    fits = [x for x in done if x["status"] == "fits"]
    runs = Path(__file__).parent / f"{name}.csv"
    lines = [f"# {title}", "",
             f"The rows of `benchmarks/{name}.csv` (sha256 `{sha256(runs)}`; `benchmarks/{name}.md`), described by "
             f"`python benchmarks/{name}.py` and compared once. Error = measured step / predicted step - 1 "
             "(+: optimistic); `inside band`: the measured step lies in the evaluation's band.", "",
             status_line(out), "", "## Summary (rows that fit)", "",
             "| group | rows | MAPE | mean signed error | inside band |", "|---|---:|---:|---:|---:|",
             summary("all", [x["error"] for x in fits], [x["inside_band"] for x in fits])]
    groups: dict[str, list] = {}
    for x in fits:
        for key in keys(x):
            groups.setdefault(key, []).append(x)
    for key in sorted(groups):
        lines.append(summary(key, [x["error"] for x in groups[key]], [x["inside_band"] for x in groups[key]]))
    nofit = [x for x in done if x["status"] != "fits"]
    return lines + (["", nofit_line(nofit)] if nofit else [])
