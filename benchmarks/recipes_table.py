"""The published recipes the Megatron baseline runs (``search.recipes``), and which one each
plan-quality scenario gets.

    python benchmarks/recipes_table.py   # writes benchmarks/results/recipes.{md,csv}

Table 1 is ``recipes.RECIPES``: model, recipe, source (repository at the commit read, file),
the GPU and GPU count it was written for, its degrees, recomputation, precision, pipeline layout,
micro and global batch, and what the cost model says of it on its own GPUs (the matching preset:
fits, memory, or why it does not run there). Table 2 is the ``megatron_recipe`` baseline of
every scenario of ``benchmarks/plan_quality.py`` and of ``EXTRA`` (MoE and Blackwell cases): the
recipe it used (or the sizing rule, and why), its configuration and step time, beside the sizing
rule's. Only the baselines are costed, not the plans.
"""

from __future__ import annotations

import sys

from plan_quality import SCENARIOS
from symtensor.errors import PlanError
from symtensor.hardware import GIB, load_cluster
from symtensor.models import apply_overrides, build_graph, load_model_config, params_active
from symtensor.plan.summary import megatron_summary, recipe_of
from symtensor.search import recipes
from symtensor.search.baselines import baseline_plans, sizing_rule
from symtensor.search.pool import EvaluatorPool

from results_files import write_results

PRESET = {"h100": "dgx-h100", "b200": "dgx-b200", "gb200": "gb200-nvl72"}  # a recipe's GPU as a cluster preset
# MoE and Blackwell cases of issue 23 beside the plan-quality scenarios (same tuple layout)
EXTRA = [
    ("MoE Qwen3-30B-A3B", "qwen3-30b-a3b", {}, "dgx-h100", 64, 1024, 4096),
    ("MoE Qwen3-235B-A22B", "qwen3-235b-a22b", {}, "dgx-h100", 256, 1024, 4096),
    ("MoE DeepSeek-V3", "deepseek-v3", {}, "dgx-h100", 1024, 4096, 4096),
    ("MoE GPT-OSS-120B", "gpt-oss-120b", {}, "dgx-h100", 64, 512, 4096),
    ("B200 70B", "llama3-70b", {}, "dgx-b200", 64, 256, 8192),
    ("GB200 NVL72 8x7B", "mixtral-8x7b", {}, "gb200-nvl72", 72, 576, 4096),
]


def on_its_own_gpus(r: recipes.Recipe) -> str:
    """The cost model's verdict on recipe ``r`` as written: its GPU count of its GPU's preset, at its
    sequence and global batch."""
    cfg = load_model_config(r.model)
    try:
        cluster = load_cluster(PRESET[r.gpu], devices=r.devices)
        c = recipes.scaled(r, cfg, r.devices, r.global_batch, r.seq)
    except PlanError as e:
        return f"does not run: {e}"
    costed = EvaluatorPool(cfg, cluster, r.seq, stack=r.stack).try_config(**c, balance=False)
    if costed is None:
        return "cannot be laid on the mesh"
    rep = costed.report
    return (f"fits, {rep.memory_reserved / GIB:.1f} GiB reserved, {rep.step_time_s:.3g} s" if rep.fits
            else rep.overflow)


def recipe_rows() -> list[dict]:
    return [{"model": r.model, "recipe": r.name, "kind": r.kind, "gpu": r.gpu, "gpus": r.devices, "seq": r.seq,
             "tp": r.tp, "pp": r.pp, "vpp": r.vpp, "cp": r.cp, "ep": r.ep, "etp": r.etp, "sp": r.sp,
             "recompute": r.recompute_detail, "precision": r.precision, "pp_layout": r.pp_layout or "even",
             "micro_batch": r.micro_batch, "global_batch": r.global_batch, "default": r.default, "zero": r.zero,
             "source": r.source, "notes": r.notes, "on_its_own_gpus": on_its_own_gpus(r),
             "stack": ", ".join(f"{k}={v}" for k, v in r.stack.differing().items()) or "-"} for r in recipes.RECIPES]


def scenario_rows() -> list[dict]:
    rows = []
    for label, name, overrides, cluster, devices, gb, seq in SCENARIOS + EXTRA:
        cfg = apply_overrides(load_model_config(name), {k: str(v) for k, v in overrides.items()})
        cl = load_cluster(cluster, devices=devices)
        b = baseline_plans(cfg, cl, gb, seq, names=("megatron_recipe",))["megatron_recipe"]
        rule = sizing_rule(EvaluatorPool(cfg, cl, seq), gb, params_active(cfg, build_graph(cfg, micro_batch=1,
                                                                                             seq=min(seq, 128))))
        used = recipe_of(b) if b is not None else ("none", "no valid configuration")
        c = megatron_summary(b) if b is not None else None
        rows.append({"scenario": label, "model": name, "cluster": cluster, "devices": devices, "seq": seq,
                     "global_batch": gb, "recipe": used[0], "note": used[1], "config": _config(c),
                     "fits": b is not None and b.report.fits, "step_s": None if b is None else b.report.step_time_s,
                     "sizing_rule": _config(rule and rule.megatron),
                     "rule_step_s": None if rule is None or not rule.report.fits else rule.report.step_time_s})
    return rows


def _config(c: dict | None) -> str:
    return "" if c is None else (f"tp{c['tp']} pp{c['pp']} vpp{c['vpp']} dp{c['dp']} cp{c['cp']} ep{c['ep']} "
                                 f"mb{c['micro_batch']} {c['recompute']}")


def _md(rows: list[dict], cols: list[str]) -> list[str]:
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(str(r[c]).replace("|", "\\|") for c in cols) + " |")
    return out


def main(argv) -> int:
    rows = recipe_rows()
    scen = scenario_rows()
    lines = ["# The published recipes the Megatron baseline runs", "",
             "`search/recipes.py`: Megatron-Bridge library recipes (`pretrain`; each family's default "
             "`<model>_pretrain_config` marked) and NVIDIA's BF16 performance configurations (`performance`), "
             f"{len(rows)} rows of {len({r['model'] for r in rows})} zoo models. `megatron_recipe` takes, of the "
             "library recipes and the cluster GPU's performance rows, the first (the cluster's GPU, then the "
             "sequence, library before performance, the nearest GPU count, the default) whose degrees run on the "
             "devices, with dp = devices / (tp x pp x cp) at the plan's global batch; NVIDIA's sizing rule where "
             "none runs or it does not fit, and the plan's note says which and why. Sources are "
             f"`repository@commit:path` ({recipes.BRIDGE}, {recipes.NEMO}). Precision and stated pipeline layouts "
             "are recorded and costed as stated (a layout string as its layer split, DeepSeek-V3's MTP layer not "
             "modelled). `on its own GPUs`: the cost model on the recipe as written (its GPU count of its GPU's "
             "preset, its sequence and global batch, and the stack facts its launch states, `stack`: the "
             "performance recipes' bf16 gradient reduction, expandable segments, MoE overlap and CPU activation "
             "offloading); as a baseline a recipe runs the plan's stack.", ""]
    lines += _md(rows, ["model", "recipe", "kind", "gpu", "gpus", "seq", "tp", "pp", "vpp", "cp", "ep", "etp", "sp",
                        "recompute", "precision", "pp_layout", "micro_batch", "global_batch", "stack",
                        "source", "on_its_own_gpus", "notes"])
    lines += ["", "## The Megatron baseline of each plan-quality scenario", "",
              "What `megatron_recipe` runs in `benchmarks/plan_quality.py`'s scenarios, then in MoE and Blackwell "
              "cases of issue 23 (the baseline alone; `plan_quality.md` has the speedups), beside what NVIDIA's "
              "sizing rule, the baseline before the recipes, runs there (`-`: does not fit).", ""]
    lines += _md([{**r, "step_s": _s(r["step_s"]), "rule_step_s": _s(r["rule_step_s"])} for r in scen],
                 ["scenario", "model", "cluster", "devices", "seq", "global_batch", "recipe", "config", "fits",
                  "step_s", "sizing_rule", "rule_step_s", "note"])
    write_results("recipes", lines, rows)
    return 0


def _s(v) -> str:
    return "-" if v is None else f"{v:.3f}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
