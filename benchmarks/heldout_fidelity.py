"""Held-out fidelity: published training runs the cost model was never fitted on.

    python benchmarks/heldout_fidelity.py      # writes benchmarks/results/heldout_fidelity.{md,csv}

The cost model's constants are fitted only on shared/data/calibration.csv (A100: Korthikanti et al.
2022) and calibration_h100.csv (H100: NeMo Llama 3.1 8B/70B/405B, dgxc-benchmarking llama3.1 @741c886).
Every row here comes from somewhere else and only tests the model (DESIGN.md, "Ground rules for the
cost model"). The rows are transcribed in benchmarks/heldout_runs.csv, each with its repository,
file, commit and table:

    torchtitan         pytorch/torchtitan docs/performance.md: FSDP2 on 64 A100 80GB (version @0413364),
                       Llama 3.1 8B FSDP2 on 8 and 128 Grand Teton H100 (version @eaea6f6), Llama 3.1 405B
                       FSDP2 + TP on 128 H100 (an earlier stored version); benchmarks/
                       asyncTP_llama3_h100_2025-06_torchtitan.md @c720cb8 (vanilla-TP BF16 rows)
    llm-foundry        mosaicml/llm-foundry scripts/train/benchmarking/README.md @061f2c7: MPT 125M..70B,
                       Composer FSDP FULL_SHARD, tables "H100 80GB BF16" and "A100 80GB ... (RoCE)"
    dgxc-benchmarking  NVIDIA/dgxc-benchmarking nemo_megatron/README_175b.md @0b71cfd (GPT-3 175B BF16,
                       128..2048 H100) and nemotron/README.md @1f6d9f4 (Nemotron-4 15B / 340B BF16)

How each run is costed (``symtensor.api.evaluate``, the same call as ``symtensor evaluate``):
  * FSDP FULL_SHARD (torchtitan, Composer) = framework "fsdp2", zero 3; torchtitan's TP is sequence
    parallel; NeMo runs = framework "megatron", zero 1 (distributed optimizer), sequence parallel.
  * Activation checkpointing "full" (torchtitan) or ``True`` (llm-foundry, per block) = recompute
    "full". torchtitan's selective AC is costed by the cost model's own modes for it (``cost.segment``,
    per torchtitan@238fa99's policy): "selective layer" (``selective_ac_option = "2"``, every 2nd block
    whole) = ``layer:2``; "selective op" and plain "selective" (torchtitan's default option, op: each
    block keeps every other matmul's output and SDPA's, re-runs the rest) = ``selective-op``. (Until
    round 3 this script bracketed them between "none" and "full" by a share of full's increment.)
  * Attention kernels, the model's ``attention`` (``--set attention=...``): torchtitan runs SDPA, whose
    order put FlashAttention-2 first on Hopper and A100 until 2025-10-09 (torch's own order before 2025-05-14,
    torchtitan's FLASH_ATTENTION-first list on non-Blackwell devices from then, pytorch/torchtitan 3b85aa31f #1196;
    cuDNN first only since 6a3a9da95 #1776, the fsdp2 engine's own now): every torchtitan source here predates it
    (performance.md @041336434 2024-04-24 and @eaea6f6a2 2025-02-02, the asyncTP benchmark @c720cb872
    2025-06-15), so its rows state ``attention=flash2`` (FlashAttention-2's table whatever the engine, as they
    were costed before round 6). NeMo Transformer Engine's fused attention: ``flash``, the engine's own.
    llm-foundry's MPT yamls set ``attn_config: attn_impl: triton`` (mpt-125m.yaml @2a59782a, the
    benchmark script's ``--attn_impl`` default too), flash-attn's Triton FlashAttention (v1):
    ``attention=flash1`` (``symtensor.cost.efficiency.ATTENTION_KERNELS``: half of FlashAttention-2,
    Dao 2023) describes that stack.
  * Grand Teton H100 (torchtitan: 96 GB HBM2e at 2.4 TB/s, 500 W cap) is a cluster file this script
    writes: the dgx-h100 preset with HBM 2,400 GB/s and 96 GiB; the 500 W power cap is NOT modelled
    (the peak stays 989 TFLOP/s), nor is torch.compile nor Float8 (Float8 rows are not transcribed,
    torch.compile rows are shown apart and kept out of the MAPE).
  * MPT (llm-foundry yamls): GeLU MLP, ffn = 4 x d_model, LayerNorm, ALiBi, vocab 50368, tied
    embeddings. The benchmark's NumParams column equals L(12d^2 + 13d) + (V + seq)d + 2d exactly:
    the benchmarked models carry biases (LayerNorm and linear) and learned position embeddings of
    length seq, so they are costed as the GPT family with max_context = seq (checked per row below).
  * Error = predicted / measured - 1 on tokens/s per GPU (positive: the model is too optimistic).
    The published MFUs use their own FLOP conventions and are not compared.

Each distinct evaluation is costed once (cached); the whole run takes well under a minute.
"""

from __future__ import annotations

import csv
import json
import math
import platform
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from symtensor import api
from symtensor.errors import PlanError
from symtensor.hardware import GIB, PRESETS
from symtensor.plan.document import evaluation_json

from results_files import write_results

HERE = Path(__file__).resolve().parent
RUNS = HERE / "heldout_runs.csv"
TFLOPS = 1e12

SOURCES = {
    "torchtitan": "pytorch/torchtitan docs/performance.md (A100 rows @041336434916, H100 rows @eaea6f6a2fa9, 405B 2D "
                  "row: stored version id 17054842945) and benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md "
                  "@c720cb872308",
    "llm-foundry": "mosaicml/llm-foundry scripts/train/benchmarking/README.md @061f2c7ce64e (MPT, FSDP FULL_SHARD)",
    "dgxc-benchmarking": "NVIDIA/dgxc-benchmarking nemo_megatron/README_175b.md @0b71cfda5163 and nemotron/README.md "
                         "@1f6d9f40e411 (NeMo, BF16, DGX H100)",
}

# MPT (layers, d_model, n_heads) from mosaicml/llm-foundry scripts/train/yamls/pretrain/mpt-<size>.yaml
# (125m, 350m @2a59782a; 760m, 30b @39393a21; 1b @06560d59; 3b @34c28fc9; 7b @15fb4ffa; 13b @309f6837;
# 70b @17e6d631); expansion_ratio 4, vocab_size 50368 in every one
MPT = {"mpt-125m": (12, 768, 12), "mpt-350m": (24, 1024, 16), "mpt-760m": (24, 1536, 12), "mpt-1b": (24, 2048, 16),
       "mpt-3b": (32, 2560, 20), "mpt-7b": (32, 4096, 32), "mpt-13b": (40, 5120, 40), "mpt-30b": (48, 7168, 56),
       "mpt-70b": (80, 8192, 64)}
MPT_VOCAB = 50368

# Nemotron-4 (NVIDIA/NeMo nemo/collections/llm/gpt/model/nemotron.py: Nemotron4Config15B / 340B over
# NemotronConfig: LayerNorm, squared ReLU, RoPE, untied embeddings, no linear bias; vocab 256000 as
# shared/data/model_configs.csv)
NEMOTRON = {"nemotron4-15b": dict(layers=32, hidden=6144, heads=48, kv_heads=8, ffn=24576),
            "nemotron4-340b": dict(layers=96, hidden=18432, heads=96, kv_heads=8, ffn=73728)}


def model_of(row: dict) -> tuple[str, dict]:
    """(zoo preset, overrides) of a run's model."""
    name, seq = row["model"], int(row["seq"])
    if name in MPT:
        layers, hidden, heads = MPT[name]
        return "gpt3-125m", dict(layers=layers, hidden=hidden, heads=heads, kv_heads=heads, ffn=4 * hidden,
                                 vocab=MPT_VOCAB, max_context=seq, tied=True, learned_pos=True, bias=True,
                                 mlp="gelu", norm="layernorm", dropout=False)
    if name in NEMOTRON:
        return "llama3-8b", dict(NEMOTRON[name], vocab=256000, mlp="relu2", norm="layernorm", tied=False,
                                 max_context=seq)
    if name == "gpt3-175b":  # NeMo's gpt3_175b_hydra.yaml: hidden/attention dropout 0.1
        return "gpt3-175b", dict(dropout=True, max_context=seq)
    return name, dict(max_context=max(seq, 8192))  # the Llama zoo presets (Llama 3.1 = Llama 3 shapes)


def mpt_params(row: dict) -> int:
    """NumParams of the llm-foundry benchmark model: L(12d^2 + 13d) + (V + seq)d + 2d."""
    layers, d, _ = MPT[row["model"]]
    return layers * (12 * d * d + 13 * d) + (MPT_VOCAB + int(row["seq"])) * d + 2 * d


def cluster_file(folder: Path, preset: str, name: str, device: dict) -> str:
    """A cluster file of ``preset`` with ``device`` fields changed."""
    dev, levels = PRESETS[preset]
    data = {"name": name,
            "device": {"name": dev.name, "hbm_gbps": dev.hbm_bandwidth / 1e9, "memory_gib": dev.memory / GIB,
                       "peak_tflops": {k: v / TFLOPS for k, v in dev.peak_flops.items()},
                       "source": f"as {preset} ({dev.source})", **device},
            "levels": [{"name": lv.name, **({"fanout": lv.fanout} if lv.fanout else {}),
                        "bandwidth_gbps": lv.bandwidth / 1e9, "latency_us": lv.latency * 1e6,
                        **({"link_efficiency": dict(lv.link_efficiency)} if lv.link_efficiency else {}),
                        "source": f"as {preset} ({lv.source})"}
                       for lv in levels]}
    path = folder / f"{name}.json"
    path.write_text(json.dumps(data, indent=1))
    return str(path)


def cluster_files(folder: Path) -> dict:
    """The clusters the runs ran on, by gpu column: the presets and Grand Teton (torchtitan's
    hardware: dgx-h100 with 96 GB HBM2e at 2.4 TB/s; the 500 W power limit is not modelled, the
    peak stays dgx-h100's)."""
    teton = {"name": "H100-SXM-HBM2e-96GB", "hbm_gbps": 2400, "memory_gib": 96,
             "source": "torchtitan docs/performance.md @eaea6f6: Grand Teton, H100 with 96GB HBM2e at 2.4 TB/s, "
                       "500 W power limit (not modelled: peak as dgx-h100)"}
    return {"a100_80gb": "dgx-a100-80g", "h100_80gb": "dgx-h100",
            "h100_96gb_hbm2e_grand_teton": cluster_file(folder, "dgx-h100", "grand-teton-h100", teton)}


def kernel_of(row: dict) -> str:
    """The attention kernel of a run (``ModelConfig.attention``): llm-foundry's MPT yamls run
    flash-attn's Triton kernel, torchtitan's sources SDPA's FlashAttention-2 (the module docstring), the others
    their engine's own."""
    return {"llm-foundry": "flash1", "torchtitan": "flash2"}.get(row["source"], "flash")


def cluster_of(row: dict, clusters: dict) -> str:
    return clusters[row["gpu"]]


def recompute_of(row: dict) -> str:
    """The recompute the run is costed with (the module docstring)."""
    ac = row["ac_published"].lower()
    if row["source"] == "llm-foundry":
        return "full" if ac == "true" else "none"
    if ac.startswith("full"):
        return "full"
    if ac.startswith("selective"):
        return "layer:2" if "layer" in ac else "selective-op"
    return "none"


def regime_of(row: dict) -> str:
    dev = "A100" if row["gpu"].startswith("a100") else "H100"
    if row["framework"] == "fsdp2":
        return f"FSDP{'+TP' if int(row['tp']) > 1 else ''} {dev}"
    return f"Megatron {'3D' if int(row['pp']) > 1 else 'TP+DP'} {dev}"


def device_of(row: dict) -> str:
    return {"a100_80gb": "A100 80GB", "h100_80gb": "H100 80GB (DGX/HGX)",
            "h100_96gb_hbm2e_grand_teton": "H100 96GB HBM2e (Grand Teton)"}[row["gpu"]]


class Costs:
    """``api.evaluate`` once per distinct configuration."""

    def __init__(self):
        self.memo: dict = {}
        self.calls = 0

    def __call__(self, row: dict, cluster: str, recompute: str) -> dict:
        preset, over = model_of(row)
        over = {**over, "attention": kernel_of(row)}  # the stack's attention kernel, as --set names it
        args = dict(devices=int(row["gpus"]), tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]),
                    cp=int(row["cp"]), sp=row["sp"] == "yes", zero=int(row["zero"]), recompute=recompute,
                    micro_batch=int(row["micro_batch"]), global_batch=int(row["global_batch"]), seq=int(row["seq"]),
                    vpp=int(row["vpp"]), framework=row["framework"])
        key = (preset, cluster, tuple(sorted(over.items())), tuple(sorted(args.items())))
        if key not in self.memo:
            self.calls += 1
            try:
                self.memo[key] = evaluation_json(api.evaluate(preset, cluster, overrides=over, **args))
            except PlanError as e:  # a configuration the model refuses: reported, never hidden
                self.memo[key] = {"error": str(e)}
        return self.memo[key]


def predict(rows: list[dict], clusters: dict) -> list[dict]:
    costs, out = Costs(), []
    for r in rows:
        rec = recompute_of(r)
        cl = cluster_of(r, clusters)
        res = costs(r, cl, rec)
        meas = float(r["measured_tokens_per_s_per_gpu"])
        o = {"id": r["id"], "source": r["source"], "regime": regime_of(r), "device": device_of(r),
             "model": r["model"], "gpus": int(r["gpus"]), "config": config_text(r, rec),
             "ac_published": r["ac_published"], "compile": r["compile"], "in_mape": r["compile"] == "no",
             "seq": int(r["seq"]), "recompute": rec, "measured_tok_s_gpu": meas,
             "measured_memory_gib": float(r["measured_memory_gib"]) if r.get("measured_memory_gib") else None}
        if "error" in res:
            o.update(predicted_tok_s_gpu=None, error=None, note=res["error"])
            out.append(o)
            continue
        bd = res["breakdown"]
        step = res["step_time_s"]
        pred = res["tokens_per_s"] / res["devices"]
        meas_step = int(r["global_batch"]) * int(r["seq"]) / (meas * int(r["gpus"]))
        lo, hi = res["step_time_band_s"]
        o.update(predicted_tok_s_gpu=pred, error=pred / meas - 1, predicted_mfu=res["mfu"],
                 step_s=step, measured_step_s=meas_step, band_regime=res["regime"],
                 in_band=lo <= meas_step <= hi, band_calibrated=res["band_calibrated"],
                 fits=res["fits"], memory_gib=res["memory_gib_per_device"],
                 compute_share=(bd.get("compute", 0) + bd.get("recompute", 0)) / step,
                 comm_share=sum(v for k, v in bd.items() if k.endswith("_comm")) / step,
                 bubble_share=bd.get("pp_bubble", 0) / step, note="")
        if r["source"] == "llm-foundry":
            o["params_check"] = mpt_params(r) == int(r["params_published"])
        out.append(o)
    return out, costs.calls


def config_text(r: dict, rec: str) -> str:
    parts = [f"tp{r['tp']}", f"pp{r['pp']}", f"dp{r['dp']}"] + ([f"vpp{r['vpp']}"] if r["vpp"] != "1" else [])
    return " ".join(parts + [f"mb{r['micro_batch']}", f"gb{r['global_batch']}", f"seq{r['seq']}", rec,
                             f"zero{r['zero']}", r["framework"]])


def mape(rows: list[dict]) -> float:
    errs = [abs(r["error"]) for r in rows if r.get("error") is not None]
    return 100 * sum(errs) / len(errs) if errs else math.nan


def bias(rows: list[dict]) -> float:
    errs = [r["error"] for r in rows if r.get("error") is not None]
    return 100 * sum(errs) / len(errs) if errs else math.nan


def fastest(rows: list[dict]) -> list[dict]:
    """Per comparable group (source, device, model, GPU count) with two or more runs: is the
    measured-fastest run (tokens/s per GPU) the predicted-fastest; pairwise order agreement over
    the pairs the model tells apart (a pair costed within 0.1% is a tie)."""
    groups = defaultdict(list)
    for r in rows:
        if r["in_mape"] and r.get("predicted_tok_s_gpu") is not None:
            groups[(r["source"], r["device"], r["model"], r["gpus"])].append(r)

    def meas(r):
        return r["measured_tok_s_gpu"]

    def pred(r):
        return r["predicted_tok_s_gpu"]

    def same(a, b):
        return abs(pred(a) / pred(b) - 1) < 1e-3

    out = []
    for (src, dev, model, gpus), g in sorted(groups.items()):
        if len(g) < 2:
            continue
        m = max(g, key=meas)
        top = max(g, key=pred)
        pairs = [(a, b) for i, a in enumerate(g) for b in g[i + 1:] if meas(a) != meas(b)]
        decided = [(a, b) for a, b in pairs if not same(a, b)]
        agree = sum((meas(a) > meas(b)) == (pred(a) > pred(b)) for a, b in decided)
        best = [r for r in g if same(r, top)]  # the runs costed as fast as the fastest
        verdict = "no" if m not in best else "yes" if len(best) == 1 else "tie"
        out.append({"source": src, "device": dev, "model": model, "gpus": gpus, "runs": len(g),
                    "measured_fastest": m["id"], "predicted_fastest": top["id"], "verdict": verdict,
                    "pairs_agree": f"{agree}/{len(decided)}", "pairs_tied": len(pairs) - len(decided)})
    return out


def src_commit() -> str:
    def git(*a):
        return subprocess.run(["git", *a], cwd=HERE.parent, capture_output=True, text=True).stdout.strip()
    head = git("log", "-1", "--format=%H", "--", "src")
    dirty = git("status", "--porcelain", "--", "src")
    return head + (" (src/ has uncommitted changes: the working tree was costed)" if dirty else "")


def fmt(v, spec=".0f", pct=False):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{100 * v:+.1f}%" if pct else format(v, spec)


def report(res: list[dict], groups: list[dict], skipped: list[str], calls: int, seconds: float, commit: str):
    lines = ["# Held-out fidelity: published runs the cost model was not fitted on", "",
             f"Written by `python benchmarks/heldout_fidelity.py` against src/ at {commit}.",
             "Rows: `benchmarks/heldout_runs.csv` (repository, file, commit and table per row). Constants are fitted "
             "only on `shared/data/calibration.csv` and `calibration_h100.csv`; nothing here is fitted.",
             "Error = predicted / measured - 1 of tokens/s per GPU (positive = the model is too optimistic). "
             "Sources:", ""]
    lines += [f"- **{k}**: {v}" for k, v in SOURCES.items()]
    lines += ["", "## MAPE per regime and device", "",
              "Regimes: FSDP = FSDP FULL_SHARD (fsdp2 engine, ZeRO 3); Megatron = NeMo / Megatron-core with the "
              "distributed optimizer. torch.compile rows are kept out (not modelled; shown below).", "",
              "| regime | device | runs | MAPE | mean signed error | max abs error | measured within band |",
              "|---|---|---:|---:|---:|---:|---:|"]
    by = defaultdict(list)
    for r in res:
        if r["in_mape"] and r.get("error") is not None:
            by[(r["regime"], r["device"])].append(r)
    for (reg, dev), g in sorted(by.items()):
        inb = sum(r["in_band"] for r in g)
        lines.append(f"| {reg} | {dev} | {len(g)} | {mape(g):.1f}% | {bias(g):+.1f}% | "
                     f"{100 * max(abs(r['error']) for r in g):.1f}% | {inb}/{len(g)} |")
    allg = [r for g in by.values() for r in g]
    lines.append(f"| **all** | | {len(allg)} | {mape(allg):.1f}% | {bias(allg):+.1f}% | "
                 f"{100 * max(abs(r['error']) for r in allg):.1f}% | {sum(r['in_band'] for r in allg)}/{len(allg)} |")
    lines += ["", "Band: the step-time band `evaluate` prints for the prediction (its regime's calibration residuals; "
              "uncalibrated regimes doubled). 'within band' counts measured step times inside it.", ""]

    lines += ["## MAPE per source", "", "| source | regime | runs | MAPE | mean signed error |",
              "|---|---|---:|---:|---:|"]
    bs = defaultdict(list)
    for r in allg:
        bs[(r["source"], r["regime"])].append(r)
    for (s, reg), g in sorted(bs.items()):
        lines.append(f"| {s} | {reg} | {len(g)} | {mape(g):.1f}% | {bias(g):+.1f}% |")

    lines += ["", "## Signed error by what the run does (all MAPE rows)", "",
              "| slice | runs | mean signed error | MAPE |", "|---|---:|---:|---:|"]
    fsdp = lambda r: r["regime"].startswith("FSDP")  # noqa: E731
    small = ("mpt-125m", "mpt-350m", "mpt-760m", "mpt-1b")
    slices = [
        ("FSDP, recompute none", lambda r: fsdp(r) and r["recompute"] == "none"),
        ("FSDP, recompute full", lambda r: fsdp(r) and r["recompute"] == "full"),
        ("FSDP, seq <= 2048", lambda r: fsdp(r) and r["seq"] <= 2048),
        ("FSDP, seq 4096..16384", lambda r: fsdp(r) and 4096 <= r["seq"] <= 16384),
        ("FSDP, seq >= 32768", lambda r: fsdp(r) and r["seq"] >= 32768),
        ("FSDP, model < 3B", lambda r: fsdp(r) and r["model"] in small),
        ("FSDP, model >= 3B", lambda r: fsdp(r) and r["model"] not in small),
        ("FSDP, more than 8 GPUs", lambda r: fsdp(r) and r["gpus"] > 8),
        ("model says it does not fit", lambda r: not r["fits"]),
    ]
    for dev in ("A100", "H100"):
        for lo, hi in ((0, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (16384, 16384), (32768, 65536)):
            slices.append((f"llm-foundry {dev}, seq {lo}..{hi}" if lo != hi else f"llm-foundry {dev}, seq {lo}",
                           lambda r, dev=dev, lo=lo, hi=hi: r["source"] == "llm-foundry" and dev in r["device"]
                           and lo <= r["seq"] <= hi))
    for name, f in slices:
        g = [r for r in allg if f(r)]
        if g:
            lines.append(f"| {name} | {len(g)} | {bias(g):+.1f}% | {mape(g):.1f}% |")

    lines += ["", "## Is the measured-fastest run predicted fastest?", "",
              "Per group of runs of one model on one GPU count from one source (tokens/s per GPU); 'tie' = the "
              "model costs the fastest runs the same.", "",
              "| source | device | model | GPUs | runs | measured fastest | predicted fastest | same? | "
              "pairwise order | "
              "pairs the model ties |", "|---|---|---|---:|---:|---|---|---|---:|---:|"]
    for g in groups:
        lines.append(f"| {g['source']} | {g['device']} | {g['model']} | {g['gpus']} | {g['runs']} | "
                     f"{g['measured_fastest']} | {g['predicted_fastest']} | {g['verdict']} | {g['pairs_agree']} | "
                     f"{g['pairs_tied']} |")
    n_yes = sum(g["verdict"] == "yes" for g in groups)
    n_tie = sum(g["verdict"] == "tie" for g in groups)
    tot = [int(x) for g in groups for x in g["pairs_agree"].split("/")]
    lines += ["", f"{n_yes} of {len(groups)} groups: the measured-fastest run is predicted fastest; {n_tie} ties; "
              f"pairwise order right in {sum(tot[0::2])} of {sum(tot[1::2])} pairs the model tells apart "
              f"({sum(g['pairs_tied'] for g in groups)} pairs costed the same).", ""]

    lines += ["## Worst rows (MAPE rows, by |error|)", "", "| id | regime | config | measured | predicted | error |",
              "|---|---|---|---:|---:|---:|"]
    for r in sorted(allg, key=lambda r: -abs(r["error"]))[:12]:
        lines.append(f"| {r['id']} | {r['regime']} | {r['config']} | {r['measured_tok_s_gpu']:.0f} | "
                     f"{r['predicted_tok_s_gpu']:.0f} | {fmt(r['error'], pct=True)} |")

    for (src, reg) in sorted({(r["source"], r["regime"]) for r in res}):
        g = [r for r in res if r["source"] == src and r["regime"] == reg]
        lines += ["", f"## {src}: {reg}", "",
                  "| id | model | GPUs | config | AC published | measured tok/s/GPU | predicted | error | "
                  "fits | compute / comm / bubble share |",
                  "|---|---|---:|---|---|---:|---:|---:|---|---|"]
        for r in g:
            shares = (f"{100 * r['compute_share']:.0f} / {100 * r['comm_share']:.0f} / {100 * r['bubble_share']:.0f}%"
                      if r.get("predicted_tok_s_gpu") is not None else r.get("note", ""))
            tag = " (torch.compile, not in MAPE)" if not r["in_mape"] else ""
            lines.append(f"| {r['id']}{tag} | {r['model']} | {r['gpus']} | {r['config']} | {r['ac_published']} | "
                         f"{r['measured_tok_s_gpu']:.6g} | {fmt(r.get('predicted_tok_s_gpu'))} | "
                         f"{fmt(r.get('error'), pct=True)} | {r.get('fits', '-')} | {shares} |")

    comp = [r for r in res if not r["in_mape"] and r.get("error") is not None]
    if comp:
        lines += ["", f"torch.compile rows (kept out of the MAPE): {len(comp)}, MAPE {mape(comp):.1f}%, mean signed "
                  f"error {bias(comp):+.1f}%."]
    mem = [r for r in res if r.get("measured_memory_gib") and r.get("memory_gib") is not None]
    if mem:
        lines += ["", "## Peak memory where the source publishes it (torchtitan H100 Tables 1 and 3)", "",
                  "| id | AC published | recompute as costed | measured GiB | predicted GiB | "
                  "model says fits (96 GiB) |",
                  "|---|---|---|---:|---:|---|"]
        for r in mem:
            lines.append(f"| {r['id']} | {r['ac_published']} | {r['recompute']} | {r['measured_memory_gib']:.1f} | "
                         f"{r['memory_gib']:.1f} | {r['fits']} |")
    mp = [r for r in res if "params_check" in r]
    lines += ["", "## Transcription checks", "",
              f"- llm-foundry: {sum(r['params_check'] for r in mp)} of {len(mp)} rows' NumParams equal "
              "L(12d^2 + 13d) + (V + seq)d + 2d for the yaml dims (biases, LayerNorm biases, tied embeddings, learned "
              "positions of length seq); every row's GlobalBatchSize = MicroBatchSize x GradAccum x GPUs, "
              "GlobalBatchSize (T) = GlobalBatchSize x SeqLen and Throughput (T/s) = (T/s/GPU) x GPUs within rounding "
              "(checked when the rows were transcribed).",
              "- symtensor pads the vocabulary to a multiple of 128 (50368 -> 50432, GPT-2's 50257 -> 50304): a "
              "+0.1% (MPT) embedding/LM-head difference, negligible.",
              "", "## Skipped (not transcribed)", ""]
    lines += [f"- {s}" for s in skipped]
    refused = [r for r in res if r.get("predicted_tok_s_gpu") is None]
    if refused:
        lines += ["", "Refused by the model (reported, no prediction):"]
        lines += [f"- {r['id']}: {r['note']}" for r in refused]
    lines += ["", f"{len(res)} runs, {calls} distinct evaluations, {seconds:.1f} s on {platform.machine()} "
              f"(Python {platform.python_version()})."]
    return lines


SKIPPED = [
    "torchtitan docs/performance.md @eaea6f6: every Float8 row (Table 1-3 '+ Float8', Tables 2, 4, 5, 6: FSDP+CP, "
    "2D, 3D and 4D runs all use Float8 on nn.Linear): the cost model has no FP8 GEMM rate; Tables 2 and 6 would "
    "also need torchtitan's CP.",
    "torchtitan 405B 2D (stored version 17054842945): the Float8 and Float8 + Async TP rows (177, 185 WPS).",
    "torchtitan asyncTP benchmark @c720cb8: the float8 rows and the Async TP column (async TP is a torchtitan/"
    "torch.compile feature the fsdp2 engine does not model).",
    "torchtitan docs/performance.md, another stored version (id 17196116852) reports the same A100 runs with "
    "8B selective layer 2876 and 70B full 323 WPS (an earlier measurement); only the @041336 version is used.",
    "llm-foundry: the 'H100 80GB FP8' table (FP8 not modelled) and the 'A100 40GB' table (a device without a "
    "preset or a calibrated table; outside the two tables asked for).",
    "NVIDIA NeMo docs/source/performance/performance_summary.md (24.07) and Megatron-Bridge docs/performance-"
    "summary.md: their DGX-H100 rows are FP8 (or MoE GPT-OSS / DeepSeek BF16 runs with EP, outside this test); each is "
    "a frozen round of its own since (benchmarks/nemo_perf_runs.py, bridge_perf_runs.py).",
    "dgxc-benchmarking: the FP8 columns of the GPT-3 175B and Nemotron-4 tables, and the GB200 tables.",
]


def main() -> int:
    t0 = time.perf_counter()
    rows = list(csv.DictReader(RUNS.open()))
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "duplicate run ids in heldout_runs.csv"
    with tempfile.TemporaryDirectory() as tmp:
        res, calls = predict(rows, cluster_files(Path(tmp)))
    groups = fastest(res)
    seconds = time.perf_counter() - t0
    commit = src_commit()
    lines = report(res, groups, SKIPPED, calls, seconds, commit)
    fields = ["id", "source", "regime", "device", "model", "gpus", "config", "ac_published", "compile", "in_mape",
              "seq", "recompute", "measured_tok_s_gpu", "predicted_tok_s_gpu", "error",
              "measured_memory_gib", "memory_gib", "fits",
              "predicted_mfu", "step_s", "measured_step_s", "band_regime", "band_calibrated", "in_band",
              "compute_share", "comm_share", "bubble_share", "params_check", "note"]
    out = [{k: (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r.get(k, "")) for k in fields} for r in res]
    write_results("heldout_fidelity", lines, out, fields)
    return 0


if __name__ == "__main__":
    sys.exit(main())
