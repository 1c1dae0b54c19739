"""Fuzz plans: random dense and MoE models on 1 to 20,000 devices, each case checked for every
property of issue 14 ("Plans you can trust"); writes benchmarks/results/fuzz_plans.{md,csv}.

    python benchmarks/fuzz_plans.py --cases 2000 [--seed 0] [--jobs 1] [--time-limit SECONDS]
    python benchmarks/fuzz_plans.py --case 0:17          # re-run case 17 of seed 0, print it

The cases and the properties are those of the CI test (``tests/fixtures/fuzzing.py``: one
definition; the test draws the cases through hypothesis, this run through ``random.Random`` seeded
per case, so case ``SEED:I`` is the same whatever ran before it). Per property the report gives the
cases that could check it (a monotone check needs a plan that fits, the grid check a grid best), the
cases that violate it, the kinds of violation, and each violation with its reproduction line.

The results are rewritten every ``--every`` cases and when the run stops (``--time-limit``, Ctrl-C,
SIGTERM): a run cut short still leaves its figures, and the report says how many of the cases ran.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import multiprocessing
import re
import signal
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the shared cases and properties

from fixtures.fuzzing import PROPERTIES, TOLERANCE, CaseResult, check_case, seeded_case  # noqa: E402
from results_files import write_results  # noqa: E402

LISTED = 25  # violations listed per property in the markdown (the csv has them all)
SLOWEST = 10  # the slowest cases listed
FIELDS = ["kind", "property", "checked", "violating_cases", "case", "description", "message", "reproduce"]


class CaseTimeout(BaseException):
    """A case ran past --case-timeout (a BaseException: no property check may swallow it)."""


def _alarm(signum, frame):
    raise CaseTimeout


def run_one(seed: int, index: int, timeout: float) -> tuple[int, CaseResult | str, float]:
    """Case ``index`` checked, or why it was not: it ran past ``timeout`` seconds, or the harness
    itself failed (the library's own failures are ``no_crash`` violations inside the result)."""
    t0 = time.perf_counter()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return index, check_case(seeded_case(seed, index)), time.perf_counter() - t0
    except CaseTimeout:
        return index, f"ran past {timeout:.0f} s", time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - a harness bug: recorded, the run goes on
        return index, f"harness error {type(exc).__name__}: {exc}", time.perf_counter() - t0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _worker(job):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool (SIGTERM, quietly)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    return run_one(*job)


def run_cases(args):
    """(index, result or None, seconds) per case, in completion order."""
    jobs = [(args.seed, i, args.case_timeout) for i in range(args.cases)]
    if args.jobs <= 1:
        for job in jobs:
            yield run_one(*job)
        return
    pool = multiprocessing.get_context("fork").Pool(args.jobs)
    try:
        yield from pool.imap_unordered(_worker, jobs)
    finally:
        pool.terminate()
        pool.join()


def code_version() -> str:
    """Which symtensor the run checks: where it was imported from, the repository's commit, and
    whether src/ had uncommitted changes (other work in progress) when the run started."""
    import subprocess

    import symtensor

    src = Path(symtensor.__file__).resolve().parents[1]
    repo = Path(__file__).resolve().parents[1]

    def git(*a):
        return subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    if src != repo / "src":
        return f"symtensor imported from {src}, not from this checkout (whose HEAD is {head})"
    dirty = git("status", "--porcelain", "--", "src")
    return f"symtensor at commit {head}" + (" with uncommitted changes in src/" if dirty else "")


def kind_of(message: str) -> str:
    """A violation's message without its numbers: what kind of violation it is."""
    text = re.sub(r"\{[^}]*\}", "{...}", message)
    text = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", text)
    return text[:110]


def report(args, done: dict[int, tuple], elapsed: float, stopped: str | None) -> tuple[list[str], list[dict]]:
    results = {i: r for i, (r, _) in done.items() if not isinstance(r, str)}
    unchecked = {i: r for i, (r, _) in done.items() if isinstance(r, str)}
    seconds = [s for _, s in done.values()]
    if stopped == "running":
        state = f"in progress, {len(done)} of {args.cases} cases so far"
    else:
        state = f"stopped ({stopped}) after {len(done)} of {args.cases} cases" if stopped else f"all {args.cases} ran"
    lines = ["# Fuzz plans: the properties of issue 14 on random cases", "",
             f"`python benchmarks/fuzz_plans.py --cases {args.cases} --seed {args.seed}`: {state}, in "
             f"{elapsed / 60:.1f} min ({args.jobs} job{'s' if args.jobs > 1 else ''}; case seconds median "
             f"{statistics.median(seconds) if seconds else 0:.1f}, max {max(seconds, default=0):.1f}); "
             f"{len(unchecked)} case(s) not checked (past --case-timeout {args.case_timeout:.0f} s, or a harness "
             "error)" + "".join(f"; `{args.seed}:{i}` {why}" for i, why in sorted(unchecked.items())[:20]) + ".",
             "Cases and properties: `tests/fixtures/fuzzing.py` (the CI test's, "
             "`tests/integration/test_fuzz_plans.py`); comparisons allow a relative "
             f"{TOLERANCE:g}. Case `S:I` re-runs with `python benchmarks/fuzz_plans.py --case S:I`; "
             f"cluster files are relative to the repository root. Checked: {args.version}.", "",
             "| property | cases checked | cases violating | violations |", "|---|---|---|---|"]
    rows = []
    by_prop = {p: [(i, r, v) for i, r in sorted(results.items()) for v in r.violations if v.prop == p]
               for p in PROPERTIES}
    for p in PROPERTIES:
        checked = sum(p in r.checked for r in results.values())
        cases = len({i for i, _, _ in by_prop[p]})
        lines.append(f"| {p} | {checked} | {cases} | {len(by_prop[p])} |")
        rows.append({"kind": "summary", "property": p, "checked": checked, "violating_cases": cases})
    failing = sum(bool(r.violations) for r in results.values())
    lines += ["", f"{failing} of {len(results)} cases violate at least one property.", ""]
    slow = sorted(results.items(), key=lambda kv: -done[kv[0]][1])[:SLOWEST]
    if slow:
        lines += ["## Slowest cases", "",
                  "Seconds of every check of the case: the plan, the grid best, the reload and export checks and "
                  "the plan on twice the devices.", "", "| case | seconds | case | outcome |", "|---|---|---|---|"]
        lines += [f"| `{args.seed}:{i}` | {done[i][1]:.1f} | {r.case.describe()} | {r.outcome} |" for i, r in slow]
        lines.append("")
    for p in PROPERTIES:
        found = by_prop[p]
        if not found:
            continue
        lines += [f"## {p}: {len({i for i, _, _ in found})} cases", "", "| kind | violations |", "|---|---|"]
        lines += [f"| {k} | {n} |" for k, n in Counter(kind_of(v.message) for _, _, v in found).most_common(12)]
        lines.append("")
        for i, r, v in found[:LISTED]:
            lines += [f"- `{args.seed}:{i}` {r.case.describe()}: {v.message}", f"  `{v.command}`"]
        if len(found) > LISTED:
            lines.append(f"- ... {len(found) - LISTED} more in fuzz_plans.csv")
        lines.append("")
        rows += [{"kind": "violation", "property": p, "case": f"{args.seed}:{i}", "description": r.case.describe(),
                  "message": v.message, "reproduce": v.command} for i, r, v in found]
    return lines, rows


def write(args, done, elapsed, stopped, quiet=False):
    lines, rows = report(args, done, elapsed, stopped)
    with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
        write_results("fuzz_plans", lines, rows, FIELDS)


def replay(spec: str, timeout: float) -> int:
    seed, _, index = spec.partition(":")
    _, result, seconds = run_one(int(seed), int(index), timeout)
    if isinstance(result, str):
        print(f"case {spec}: {result}")
        return 1
    print(f"case {spec}: {result.case.describe()}\n  {result.case.command()}\n  {result.outcome}, "
          f"{seconds:.1f} s; checked {', '.join(p for p in PROPERTIES if p in result.checked)}")
    print(result.report() or "no violation")
    return 1 if result.violations else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (each search forks one more)")
    ap.add_argument("--time-limit", type=float, help="stop after this many seconds and write what ran")
    ap.add_argument("--case-timeout", type=float, default=600, help="seconds one case may take")
    ap.add_argument("--every", type=int, default=20, help="rewrite the results every this many cases")
    ap.add_argument("--case", metavar="SEED:I", help="re-run one case and print its violations")
    args = ap.parse_args()
    if args.case:
        return replay(args.case, args.case_timeout)
    args.version = code_version()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `timeout` and kill stop it like Ctrl-C
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also where the shell started it ignoring Ctrl-C
    t0, done, stopped = time.perf_counter(), {}, None
    cases = run_cases(args)
    try:
        for index, result, seconds in cases:
            done[index] = (result, seconds)
            if len(done) % args.every == 0:
                write(args, done, time.perf_counter() - t0, "running", quiet=True)
            if args.time_limit and time.perf_counter() - t0 > args.time_limit and len(done) < args.cases:
                stopped = f"time limit {args.time_limit:.0f} s"
                break
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        cases.close()
    write(args, done, time.perf_counter() - t0, stopped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
