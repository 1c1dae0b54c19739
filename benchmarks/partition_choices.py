"""The partitioner's choices against their alternatives: which mesh axes are decided first, and
in which order the operators choose inside a level.

    python benchmarks/partition_choices.py     # writes benchmarks/results/partition_choices.{csv,md}

Per scenario (one outer point: the whole mesh, pp = 1, the nominal micro-batches) every variant
runs the same solver (partition, op moves, block moves, op moves) and is judged twice: by the
decomposed objective it minimises and by the full cost model's step time and memory. The
planner's choice is ``outer`` (slowest links first, D-Rec's order: the cuts that cost the most
communication are decided while every operator is still whole) with ``topological`` operator
order.
"""

from __future__ import annotations

import sys
import time

from symtensor.cost import TrainConfig
from symtensor.hardware import GIB, load_cluster
from symtensor.models import load_model_config
from symtensor.search.megatron import configuration
from symtensor.search.partition import Problem, partition, refine, refine_blocks
from symtensor.search.pool import EvaluatorPool

from results_files import write_results

# (label, model, cluster, devices, global batch, seq, micro-steps); each with the memory weight 0
# (time only) and 1 (one data-parallel step per device memory: memory pressure)
SCENARIOS = [
    ("dense 7B", "llama2-7b", "dgx-h100", 64, 1024, 4096, 16),
    ("GQA 8B, 32K sequence", "llama3-8b", "dgx-h100", 64, 128, 32768, 2),
    ("dense 70B", "llama2-70b", "dgx-h100", 64, 1024, 4096, 16),
    ("MoE 8x7B", "mixtral-8x7b", "dgx-h100", 64, 512, 4096, 8),
    ("non-power-of-two 24", "llama3-8b", "dgx-a100-80g", 24, 384, 8192, 16),
]
WEIGHTS = (0.0, 1.0)
VARIANTS = [(levels, order) for levels in ("outer", "inner") for order in ("topological", "weight", "reverse")]
PLANNER = ("outer", "topological")


def run(label, name, cluster, devices, gb, seq, m, weight):
    cfg = load_model_config(name)
    cl = load_cluster(cluster, devices=devices)
    train = TrainConfig(global_batch=gb, micro_steps=m, zero=1)
    rows = []
    for levels, order in VARIANTS:
        pool = EvaluatorPool(cfg, cl, seq)  # cold memo tables for every variant: fair CPU times
        ev = pool.get(gb // m, 1)
        lam = 0.0
        if weight:  # seconds per byte: `weight` steps of the pure data-parallel plan per device memory
            ref = pool.evaluate(configuration(dict(dp=devices, zero=1, micro_batch=gb // m // devices,
                                                   global_batch=gb, seq=seq)))
            lam = weight * ref.report.step_time_s / cl.device.memory
        problem = Problem(ev, train, lam)
        t = time.process_time()
        layouts = refine(problem, partition(problem, order=order, levels=levels))
        layouts = refine(problem, refine_blocks(problem, layouts))
        cpu = time.process_time() - t
        rep = ev.evaluate(layouts, train, check=True)
        rows.append({"scenario": label, "memory_weight": weight, "levels": levels, "order": order,
                     "objective": problem.total(layouts), "step_time_s": rep.step_time_s,
                     "memory_gib": rep.memory_peak / GIB, "fits": rep.fits, "cpu_s": cpu})
    best = min(r["objective"] for r in rows)
    for r in rows:
        r["objective_vs_best"] = r["objective"] / best
    return rows


def main() -> int:
    rows = [r for sc in SCENARIOS for w in WEIGHTS for r in run(*sc, w)]
    lines = ["# Partition choices: axes outermost or innermost first, operator order", "",
             "Same solver, same outer point (whole mesh, pp = 1, ZeRO-1, no recomputation); objective = the",
             "decomposed cost it minimises, relative to the best variant of the row's scenario; step and",
             "memory from the full cost model; CPU seconds of the solver from cold memo tables.", "",
             "Summary per variant over the scenarios (geometric mean of objective vs best; worst case):", "",
             "| levels | order | mean objective vs best | worst | mean CPU s |", "|---|---|---|---|---|"]
    for levels, order in VARIANTS:
        mine = [r for r in rows if (r["levels"], r["order"]) == (levels, order)]
        gm = 1.0
        for r in mine:
            gm *= r["objective_vs_best"]
        gm **= 1 / len(mine)
        mark = " (planner)" if (levels, order) == PLANNER else ""
        lines.append(f"| {levels}{mark} | {order} | {gm:.4f} | {max(r['objective_vs_best'] for r in mine):.4f} | "
                     f"{sum(r['cpu_s'] for r in mine) / len(mine):.3f} |")
    lines += ["", "| scenario | memory weight | levels | order | objective vs best | step s | memory GiB | fits | "
              "CPU s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['memory_weight']:g} | {r['levels']} | {r['order']} | "
                     f"{r['objective_vs_best']:.4f} | {r['step_time_s']:.3f} | {r['memory_gib']:.1f} | {r['fits']} | "
                     f"{r['cpu_s']:.3f} |")
    write_results("partition_choices", lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
