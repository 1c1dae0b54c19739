"""Search speed: how the SymTensor search time grows with operators and with devices.

    python benchmarks/search_speed.py            # writes benchmarks/results/search_speed.{csv,md}

Three measurements, each the median of a few runs on this machine (CPU seconds of this process,
so other load does not inflate them):
  1. the per-op solver (recursive partition + local search) on full graphs of growing depth:
     the operator count grows linearly, the time should too;
  2. the whole ``symtensor plan`` search (skeleton graphs, outer search) against device counts;
  3. the issue's three targets: LLaMA-2-7B on 64, LLaMA-3-405B on 16,384, Mixtral-8x22B on 1,024.
"""

from __future__ import annotations

import csv
import statistics
import sys
import time
from pathlib import Path

from symtensor.cost import Evaluator, TrainConfig
from symtensor.hardware import load_cluster
from symtensor.models import build_graph, load_model_config
from symtensor.search.partition import Problem, solve
from symtensor.search.planner import search

OUT = Path(__file__).parent / "results"


def cpu(fn, repeat=3):
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times)


def solver_vs_ops():
    rows = []
    cfg0 = load_model_config("llama3-8b")
    cluster = load_cluster("dgx-h100", devices=64)
    for layers in (2, 4, 8, 16, 32):
        g = build_graph(cfg0.replace(layers=layers), micro_batch=64, seq=4096)
        ev = Evaluator(g, cluster)
        train = TrainConfig(global_batch=512, micro_steps=8, zero=1)
        t = cpu(lambda: solve(Problem(ev, train)), repeat=1)
        rows.append({"measure": "solver vs operators", "model": f"llama3-8b x{layers} layers", "devices": 64,
                     "ops": len(g.ops), "cpu_s": t, "us_per_op": 1e6 * t / len(g.ops)})
    return rows


def plan_vs_devices():
    rows = []
    cfg = load_model_config("llama3-8b")
    for n in (8, 64, 512, 4096, 16384):
        cl = load_cluster("dgx-h100", devices=n)
        t = cpu(lambda: search(cfg, cl, max(512, n // 8), 8192), repeat=1)
        rows.append({"measure": "plan vs devices", "model": "llama3-8b", "devices": n, "ops": "", "cpu_s": t,
                     "us_per_op": ""})
    return rows


TARGETS = [("llama2-7b", 64, 1024, 4096, 0.1), ("llama3-405b", 16384, 2048, 8192, 1.0),
           ("mixtral-8x22b", 1024, 1024, 4096, 1.0)]


def targets():
    rows = []
    for name, n, gb, seq, goal in TARGETS:
        cfg = load_model_config(name)
        cl = load_cluster("dgx-h100", devices=n)
        plans = []
        t = cpu(lambda: plans.append(search(cfg, cl, gb, seq)), repeat=1)
        p = plans[-1]
        rows.append({"measure": "target", "model": name, "devices": n, "ops": len(p.graph.ops), "cpu_s": t,
                     "us_per_op": "", "search_time_s": p.search_time_s, "goal_s": goal,
                     "met": t <= goal, "step_time_s": p.report.step_time_s, "mfu": p.report.mfu})
    return rows


def main() -> int:
    OUT.mkdir(exist_ok=True)
    rows = solver_vs_ops() + plan_vs_devices() + targets()
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[-1]).index(k) if k in rows[-1] else 99)
    with open(OUT / "search_speed.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    lines = ["# Search speed (CPU seconds, this 2-core machine)", "",
             "| measure | model | devices | ops | CPU s | us/op | goal s | met |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['measure']} | {r['model']} | {r['devices']} | {r['ops']} | {r['cpu_s']:.3f} | "
                     f"{r['us_per_op'] if r['us_per_op'] == '' else round(r['us_per_op'])} | "
                     f"{r.get('goal_s', '')} | {r.get('met', '')} |")
    (OUT / "search_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
