"""Plan quality over the zoo: SymTensor vs the Megatron recipe, the Megatron grid best, FSDP, D-Rec.

    python benchmarks/plan_quality.py [--quick]   # writes benchmarks/results/plan_quality.{csv,md}

Every plan is costed by the same model; a speedup is the baseline's step time over SymTensor's
(a baseline that does not fit has no speedup). The recipe is the model's published Megatron-Bridge
or NeMo recipe with dp scaled to the devices, or NVIDIA's sizing rule where none runs (``recipe``
names which; the table of recipes: ``benchmarks/results/recipes.md``). The SymTensor plan is ``symtensor plan``'s
(``api.plan_with_baselines``: never worse than the grid best, monotone in devices); ``search s``
is the search's own time, ``guarantees s`` the time after it (the exhaustive grid, plans on fewer
devices where they could win, the other baselines). ``--quick`` skips the largest clusters.

Every plan and baseline of the table is BF16 (the recipes' own precision): the speedups compare
layouts, not number formats. ``with FP8`` is the plan ``symtensor plan`` returns without
``--precision`` (the search may take FP8 where the device has it), and its speedup over the BF16 plan.
"""

from __future__ import annotations

import sys

from symtensor import api
from symtensor.plan.summary import recipe_of

from results_files import write_results

# (label, model, overrides, cluster, devices, global batch, seq)
SCENARIOS = [
    ("small cluster", "llama2-7b", {}, "dgx-a100-80g", 8, 256, 4096),
    ("dense 7B", "llama2-7b", {}, "dgx-h100", 64, 1024, 4096),
    ("dense 13B", "llama2-13b", {}, "dgx-h100", 64, 1024, 4096),
    ("dense 70B", "llama2-70b", {}, "dgx-h100", 64, 1024, 4096),
    ("GQA 8B", "llama3-8b", {}, "dgx-h100", 64, 512, 8192),
    ("long context 32K", "llama3-8b", {}, "dgx-h100", 64, 128, 32768),
    ("long context 128K", "llama3-8b", {}, "dgx-h100", 64, 32, 131072),
    ("LoRA 70B", "llama2-70b", {"lora_rank": 16}, "dgx-a100-80g", 16, 128, 4096),
    ("LoRA 8B", "llama3-8b", {"lora_rank": 16}, "dgx-a100-80g", 8, 128, 8192),
    ("non-power-of-two 24", "llama3-70b", {}, "dgx-h100", 24, 384, 8192),
    ("non-power-of-two 96", "llama2-13b", {}, "dgx-a100-80g", 96, 1536, 4096),
    ("Qwen2 72B", "qwen2-72b", {}, "dgx-h100", 256, 1024, 4096),
    ("MoE 8x7B", "mixtral-8x7b", {}, "dgx-h100", 64, 1024, 4096),
    ("MoE 8x22B 256", "mixtral-8x22b", {}, "dgx-h100", 256, 512, 8192),
    ("MoE 8x22B", "mixtral-8x22b", {}, "dgx-h100", 1024, 2048, 4096),
    ("405B", "llama3-405b", {}, "dgx-h100", 16384, 2048, 8192),
]
LARGE = 1024


def run(label, name, overrides, cluster, devices, gb, seq):
    sets = [f"{k}={v}" for k, v in overrides.items()]
    plan, base = api.plan_with_baselines(name, cluster, devices=devices, global_batch=gb, seq=seq, overrides=sets,
                                         precision="bf16")
    free = api.plan(name, cluster, devices=devices, global_batch=gb, seq=seq, overrides=sets)
    row = {"scenario": label, "model": plan.model.name + (" (LoRA)" if plan.model.lora_rank else ""),
           "cluster": cluster, "devices": devices, "seq": seq, "global_batch": gb,
           "search_s": round(plan.search_time_s, 3), "guarantees_s": round(plan.search_phases_s["guarantees_s"], 3),
           "symtensor_step_s": plan.report.step_time_s, "symtensor_mfu": plan.report.mfu,
           "symtensor_fits": plan.report.fits, "symtensor_config": _cfg(plan),
           "default_step_s": free.report.step_time_s, "default_precision": free.train.precision,
           "fp8_speedup": plan.report.step_time_s / free.report.step_time_s}
    for key, b in base.items():
        ok = b is not None and b.report.fits
        row[f"{key}_step_s"] = b.report.step_time_s if ok else None
        row[f"speedup_vs_{key}"] = b.report.step_time_s / plan.report.step_time_s if ok else None
        if key != "drec":
            row[f"{key}_config"] = _pc(b.config) if b is not None else ""
    recipe = base.get("megatron_recipe")  # the published recipe it ran (benchmarks/results/recipes.md), or the rule
    row["megatron_recipe"] = (recipe_of(recipe) or ("",))[0] if recipe is not None else ""
    return row


def _pc(c: dict) -> str:
    return (f"tp{c['tp']} pp{c['pp']} dp{c['dp']} cp{c['cp']} ep{c['ep']} mb{c['micro_batch']} {c['recompute']} "
            f"vpp{c['vpp']}")


def _cfg(plan) -> str:
    c = plan.config
    het = " heterogeneous" if c["heterogeneous"] else ""
    return (f"tp{c['tp']} pp{c['pp']} dp{c['dp']} cp{c['cp']} ep{c['ep']} mb{c['micro_batch']} {c['recompute']} "
            f"zero{c['zero']} vpp{c['vpp']}{het}")


def _fp8(r) -> str:
    if r["default_precision"] != "fp8":
        return "-"
    return f"{r['default_step_s']:.3f} s ({r['fp8_speedup']:.2f}x)"


def _x(v) -> str:
    return "-" if v is None else f"{v:.2f}x"


def main(argv) -> int:
    quick = "--quick" in argv
    rows = []
    for sc in SCENARIOS:
        if quick and sc[4] > LARGE:
            continue
        print("...", sc[0], flush=True)
        rows.append(run(*sc))
    lines = ["# Plan quality (same cost model for every plan)", "",
             "| scenario | model | devices | seq | SymTensor step s | MFU | vs recipe | vs grid best | vs FSDP | "
             "vs D-Rec | SymTensor plan | grid best | recipe | search s | guarantees s | with FP8 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['scenario']} | {r['model']} | {r['devices']} | {r['seq']} | {r['symtensor_step_s']:.3f} | "
                     f"{100 * r['symtensor_mfu']:.1f}% | {_x(r['speedup_vs_megatron_recipe'])} | "
                     f"{_x(r['speedup_vs_megatron_grid_best'])} | {_x(r['speedup_vs_fsdp'])} | "
                     f"{_x(r['speedup_vs_drec'])} | {r['symtensor_config']} | {r['megatron_grid_best_config']} | "
                     f"{r['megatron_recipe']} | {r['search_s']} | {r['guarantees_s']} | {_fp8(r)} |")
    write_results("plan_quality", lines, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
