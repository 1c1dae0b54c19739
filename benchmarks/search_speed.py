"""Search speed: how the SymTensor search time grows with operators and with devices.

    python benchmarks/search_speed.py            # writes benchmarks/results/search_speed.{csv,md}

Three measurements on this machine:
  1. the per-op solver (recursive partition + local search) on full graphs of growing depth:
     the operator count grows linearly, the time should too (CPU seconds of this process);
  2. the whole ``symtensor plan`` search (skeleton graphs, outer search) against device counts
     (wall seconds, median of three: the search runs its two halves in two processes);
  3. the issue's three targets, LLaMA-2-7B on 64, LLaMA-3-405B on 16,384, Mixtral-8x22B on 1,024:
     the tool's own ``search_time_s`` in fresh ``symtensor plan`` processes, with the time of each
     phase (Megatron seeds, partition, refinement) and the machine's speed at the time;
  4. a whole ``symtensor plan`` (issue 23: DeepSeek-V3 on 1,024 H100 in at most 2.5 s): the search,
     its guarantees, the baselines and the JSON, wall seconds in a fresh process without Python's
     start-up and the imports.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from symtensor.cost import Evaluator, TrainConfig
from symtensor.hardware import load_cluster
from symtensor.models import build_graph, load_model_config
from symtensor.search import search
from symtensor.search.partition import Problem, solve

from results_files import write_results


def median_time(fn, repeat=3, clock=time.process_time):
    """Median seconds of ``fn()`` on ``clock`` (CPU time of this process by default)."""
    times = []
    for _ in range(repeat):
        t = clock()
        fn()
        times.append(clock() - t)
    return statistics.median(times)


def solver_vs_ops():
    rows = []
    cfg0 = load_model_config("llama3-8b")
    cluster = load_cluster("dgx-h100", devices=64)
    for layers in (2, 4, 8, 16, 32):
        g = build_graph(cfg0.replace(layers=layers), micro_batch=64, seq=4096)
        ev = Evaluator(g, cluster)
        train = TrainConfig(global_batch=512, micro_steps=8, zero=1)
        t = median_time(lambda: solve(Problem(ev, train)), repeat=1)
        rows.append({"measure": "solver vs operators", "model": f"llama3-8b x{layers} layers", "devices": 64,
                     "ops": len(g.ops), "cpu_s": t, "us_per_op": 1e6 * t / len(g.ops)})
    return rows


def plan_vs_devices():
    """Wall seconds (the search forks a second process, whose CPU time this one does not see)."""
    rows = []
    cfg = load_model_config("llama3-8b")
    for n in (8, 64, 512, 4096, 16384):
        cl = load_cluster("dgx-h100", devices=n)
        t = median_time(lambda: search(cfg, cl, max(512, n // 8), 8192), clock=time.perf_counter)
        rows.append({"measure": "plan vs devices", "model": "llama3-8b", "devices": n, "ops": "", "cpu_s": t,
                     "us_per_op": ""})
    return rows


# the targets: LLaMA-2-7B on 64 A100, LLaMA-3-405B on 16,384 H100, Mixtral-8x22B on 1,024 H100
TARGETS = [("llama2-7b", "dgx-a100-80g", 64, 1024, 4096, 0.1), ("llama3-405b", "dgx-h100", 16384, 2048, 8192, 1.0),
           ("mixtral-8x22b", "dgx-h100", 1024, 1024, 4096, 1.0)]
RUNS = 11


def machine_speed() -> float:
    """CPU seconds of a fixed pure-Python workload (dict updates, like the search's memo tables):
    this shared machine's speed drifts by up to 1.8x within minutes, so every target row says
    how fast the machine was around it (about 0.4 s on a quiet machine)."""
    t = time.process_time()
    d: dict = {}
    for i in range(3_000_000):
        d[i & 1023] = d.get(i & 1023, 0) + i
    return time.process_time() - t


def targets():
    """The issue's measure: the tool's own ``search_time_s`` of ``symtensor plan --json``, each
    run a fresh process (cold memo tables, as a user gets them); median and best of RUNS."""
    rows = []
    for name, cluster, n, gb, seq, goal in TARGETS:
        runs, speeds = [], []
        for _ in range(RUNS):
            speeds.append(machine_speed())  # before every run: the machine's speed drifts within seconds
            out = subprocess.run([sys.executable, "-m", "symtensor.cli", "plan", name, "--cluster", cluster,
                                  "--devices", str(n), "--global-batch", str(gb), "--seq", str(seq), "--json",
                                  "--no-baselines"], capture_output=True, text=True, check=True).stdout
            runs.append(json.loads(out))
        runs.sort(key=lambda r: r["search_time_s"])
        med = runs[len(runs) // 2]
        speed = sorted(speeds)[len(speeds) // 2]
        rows.append({"measure": "target", "model": f"{name} ({cluster})", "devices": n, "ops": "",
                     "cpu_s": med["search_time_s"], "us_per_op": "", "best_s": runs[0]["search_time_s"], "goal_s": goal,
                     "met": med["search_time_s"] <= goal, "machine_s": speed,
                     "phases": " ".join(f"{k[:-2]} {v:.3f}" for k, v in med["search_phases_s"].items()),
                     "step_time_s": med["step_time_s"], "mfu": med["mfu"], "evaluations": med["evaluations"]})
    return rows


# the whole plan: (model, cluster, devices, goal s), at the model's default sequence and global batch, with baselines
WHOLE = [("deepseek-v3", "dgx-h100", 1024, 2.5)]
# times one `symtensor plan ... --json` in this fresh process after its imports; prints the wall seconds and the JSON
_WHOLE_RUN = ("import contextlib, io, json, sys, time\n"
              "import symtensor.cli as cli\n"
              "buf = io.StringIO()\n"
              "t = time.perf_counter()\n"
              "with contextlib.redirect_stdout(buf):\n"
              "    cli.main(['plan', *sys.argv[1:], '--json'])\n"
              "print(json.dumps({'wall_s': time.perf_counter() - t, 'plan': json.loads(buf.getvalue())}))\n")


def whole_plans():
    """Issue 23's measure: the wall seconds of a whole ``symtensor plan`` (search, guarantees,
    baselines, JSON) in a fresh process each run, Python's start-up and imports left out; median
    and best of RUNS, with the plan's own ``search_time_s`` and ``guarantees_s``."""
    rows = []
    for name, cluster, n, goal in WHOLE:
        runs, speeds = [], []
        for _ in range(RUNS):
            speeds.append(machine_speed())
            out = subprocess.run([sys.executable, "-c", _WHOLE_RUN, name, "--cluster", cluster, "--devices", str(n)],
                                 capture_output=True, text=True, check=True).stdout
            runs.append(json.loads(out))
        runs.sort(key=lambda r: r["wall_s"])
        med, plan = runs[len(runs) // 2], runs[len(runs) // 2]["plan"]
        phases = f"search {plan['search_time_s']:.3f} guarantees {plan['search_phases_s']['guarantees_s']:.3f}"
        rows.append({"measure": "whole plan", "model": f"{name} ({cluster})", "devices": n, "ops": "",
                     "cpu_s": med["wall_s"], "us_per_op": "", "best_s": runs[0]["wall_s"], "goal_s": goal,
                     "met": med["wall_s"] <= goal, "machine_s": sorted(speeds)[len(speeds) // 2],
                     "phases": phases,
                     "step_time_s": plan["step_time_s"], "mfu": plan["mfu"], "evaluations": plan["evaluations"]})
    return rows


def main() -> int:
    rows = solver_vs_ops() + plan_vs_devices() + targets() + whole_plans()
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[-1]).index(k) if k in rows[-1] else 99)
    lines = ["# Search speed (seconds, this 2-core machine)", "",
             "Solver rows: CPU seconds in one process; device rows: wall seconds of the search (median of 3).",
             "Target rows: the tool's own `search_time_s`",
             "(`symtensor plan --json --no-baselines`, a fresh process each run), median and best of "
             f"{RUNS} runs; `machine s` is the median over the same runs of a fixed",
             "pure-Python workload timed just before each (about 0.4 s when the machine is quiet, up to",
             "1.1 s under other load): search times scale with it. `search_time_s` is the search's;",
             "the `guarantees` phase after it (the exhaustive Megatron grid the plan is compared with, and",
             "plans on fewer devices where they could win: `search.guarantee`) is not in it.",
             "Whole-plan rows: wall seconds of a whole `symtensor plan` (search, guarantees, baselines, JSON;",
             "the model's default sequence and batch) in a fresh process without Python's start-up and imports,",
             f"median and best of {RUNS} runs; its phases are the plan's own `search_time_s` and `guarantees_s`.", "",
             "| measure | model | devices | ops | s | best s | us/op | goal s | met | machine s | phases (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        best = f"{r['best_s']:.3f}" if "best_s" in r else ""
        machine = f"{r['machine_s']:.2f}" if "machine_s" in r else ""
        lines.append(f"| {r['measure']} | {r['model']} | {r['devices']} | {r['ops']} | {r['cpu_s']:.3f} | {best} | "
                     f"{r['us_per_op'] if r['us_per_op'] == '' else round(r['us_per_op'])} | "
                     f"{r.get('goal_s', '')} | {r.get('met', '')} | {machine} | {r.get('phases', '')} |")
    write_results("search_speed", lines, rows, keys)
    return 0


if __name__ == "__main__":
    sys.exit(main())
