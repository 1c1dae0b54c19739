"""Frozen test round 6: NVIDIA NeMo's published 24.07 performance summary (FP8 on DGX H100; in none of the project's
files, and its rows never compared with a prediction before this round).

    python benchmarks/nemo_perf_runs.py --parse   # (once) writes the frozen test file nemo_perf_runs.csv
    python benchmarks/nemo_perf_runs.py --check   # each row described and evaluated, measured columns unread
    python benchmarks/nemo_perf_runs.py           # the comparison, read once -> benchmarks/results/nemo_perf_runs.*

Source: ``docs/source/performance/performance_summary.md`` of NVIDIA/NeMo at ``NEMO`` (8e3d65dcfe, 2024-09-09, "24.07
perf numbers": the last version before the file was replaced by a link, d31653f792): the pre-training table (GPT-3
5B/20B/175B, Llama 2 7B/13B/70B, Nemotron 8B/22B/340B, Llama 3 8B/70B on 8 to 512 GPUs) and the fine-tuning table
(Llama 2 7B/13B/70B, SFT and LoRA, "inputs are packed to 4096 tokens"), every row "at FP8 precision", container
NeMo 24.07, system DGX-H100. Columns: #-GPUs, GBS, MBS, sequence length, TP, PP, CP, VP (pre-training), the measured
tokens/s/GPU and model TFLOP/s/GPU (``MEASURED``). Earlier versions of the file (4c73f77670, 3a8081fef6 "vboost
numbers") report the same configurations measured again; only the last is taken. Not taken: the same folder's
``performance_long_sequence.md`` (its TFLOP/s need NeMo's FLOP count at 16K-1M tokens, and its recomputation is not
stated).

What the table leaves open is read from the launcher NVIDIA NeMo 24.07 ran these configurations with,
NVIDIA/NeMo-Framework-Launcher at ``LAUNCHER`` (24c3d6bb, 2024-09-06, the last commit before the numbers were
published): ``launcher_scripts/conf/training/<family>/<model>.yaml`` for pre-training (the model's dimensions, dropout,
recomputation, sequence parallelism, ``ub_tp_comm_overlap``, the FP8 settings, the optimizer and its
``grad_sync_dtype``), ``conf/peft/llama/sft.yaml`` for SFT and ``conf/peft/llama/squad.yaml`` for LoRA (its
``lora_tuning``: adapter_dim 32, no ``target_modules``, so NeMo's default ``attention_qkv``: NVIDIA/NeMo@8e3d65dcfe
nemo/collections/nlp/parts/peft_config.py ``get_target_modules``). The table's own TP, PP, CP, VP, MBS, GBS and
sequence win over the yaml's.

How each row is described (chosen before any comparison): Megatron-core (``framework="megatron"``), FP8 with delayed
scaling (the yamls' ``fp8_hybrid``: E4M3 forward, E5M2 backward, amax history), the distributed optimizer as ZeRO 1
(``distributed_fused_adam``) or no sharding (LoRA's ``fused_adam``), sequence parallelism where tp > 1 and the yaml
sets it, TP communication overlap as the yaml's ``ub_tp_comm_overlap`` states, gradients reduced in bf16 where its
``grad_sync_dtype`` says so, the yaml's recomputation, dropout where the yaml's is non-zero. Models: the zoo preset
(GPT-3 20B and 5B as the GPT-3 preset with the yaml's layers, hidden, heads and 4h MLP; Nemotron 8B and 22B as the
Nemotron-4 preset with the yaml's dimensions, multi-head attention (no num_query_groups) and Nemotron-4's 256,000
vocabulary (their yamls name no tokenizer)). SFT is costed as pre-training of every weight at the packed length
(packing's per-document attention not modelled); LoRA as the preset with rank-32 adapters on q, k and v (NeMo's one
adapter on the fused QKV projection, costed as three), base weights frozen. Predicted tokens/s/GPU = GBS x sequence /
step / GPUs; the measured step = GBS x sequence / (tokens/s/GPU x GPUs).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

from symtensor.plan.stack import Stack

from frozen_runs import (
    check_rows,
    compared,
    evaluated,
    read_rows,
    row_table,
    sha256,
    show,
    step_report,
    write_parsed as frozen_write,
)
from results_files import write_results

NEMO = "8e3d65dcfe3504689bfc5b6e67d502780aacad41"
NEMO_MIRROR = Path("/work/.mirror/NVIDIA+NeMo/repo")
DOC = "docs/source/performance/performance_summary.md"
LAUNCHER = "24c3d6bb"
LAUNCHER_MIRROR = Path("/work/.mirror/NVIDIA+NeMo-Framework-Launcher/repo")
RUNS = Path(__file__).parent / "nemo_perf_runs.csv"
MEASURED = ("tokens_per_s_per_gpu", "model_tflops_per_gpu", "step_time_s")
# the doc's model name -> (zoo preset, launcher yaml of its pre-training config)
_T = "training/"
MODELS = {"GPT3-5B": ("gpt3-175b", _T + "gpt3/5b"), "GPT3-20B": ("gpt3-175b", _T + "gpt3/20b"),
          "GPT3-175B": ("gpt3-175b", _T + "gpt3/175b"), "LLAMA2-7B": ("llama2-7b", _T + "llama/llama2_7b"),
          "LLAMA2-13B": ("llama2-13b", _T + "llama/llama2_13b"), "LLAMA2-70B": ("llama2-70b", _T + "llama/llama2_70b"),
          "Nemotron-8B": ("nemotron4-15b", _T + "nemotron/nemotron_8b"),
          "Nemotron-22B": ("nemotron4-15b", _T + "nemotron/nemotron_22b"),
          "Nemotron-340B": ("nemotron4-340b", _T + "nemotron/nemotron_340b"),
          "LLAMA3-8B": ("llama3-8b", _T + "llama/llama3_8b"), "LLAMA3-70B": ("llama3-70b", _T + "llama/llama3_70b")}
PEFT = {"SFT": "peft/llama/sft", "LoRA": "peft/llama/squad"}
FACTS = ("config_file", "layers", "hidden", "ffn", "heads", "query_groups", "dropout", "recompute", "sequence_parallel",
         "tp_comm_overlap", "fp8_hybrid", "fp8_amax_history_len", "fp8_amax_compute_algo", "optimizer",
         "grad_sync_dtype", "lora_dim", "lora_targets")


def _launcher(path: str) -> dict:
    """The model section of a launcher yaml at ``LAUNCHER`` (a training config's ``model``, a PEFT config's
    ``peft.model``)."""
    text = show(LAUNCHER_MIRROR, "NVIDIA/NeMo-Framework-Launcher", LAUNCHER, f"launcher_scripts/conf/{path}.yaml")
    if not text:
        raise SystemExit(f"no launcher_scripts/conf/{path}.yaml at {LAUNCHER}")
    cfg = yaml.safe_load(text)
    return cfg["peft"]["model"] if "peft" in cfg else cfg["model"]


def _facts(path: str, peft: bool) -> dict:
    """The facts of ``FACTS`` one launcher yaml states ("" where it states none)."""
    m = _launcher(path)
    hidden = m.get("hidden_size")
    ffn = m.get("ffn_hidden_size")
    if isinstance(ffn, str):  # ${multiply:4, ${.hidden_size}}
        assert ffn.startswith("${multiply:4"), ffn
        ffn = 4 * hidden
    lora = (m.get("peft") or {}).get("lora_tuning") or {}
    dropout = max(float(m.get("hidden_dropout") or 0), float(m.get("attention_dropout") or 0))
    optim = m.get("optim") or {}
    return {"config_file": f"launcher_scripts/conf/{path}.yaml", "layers": "" if peft else m.get("num_layers"),
            "hidden": "" if peft else hidden, "ffn": "" if peft else ffn,
            "heads": "" if peft else m.get("num_attention_heads"), "query_groups": m.get("num_query_groups") or "",
            "dropout": dropout or "", "recompute": m.get("activations_checkpoint_granularity") or "none",
            "sequence_parallel": bool(m.get("sequence_parallel")), "tp_comm_overlap": bool(m.get("ub_tp_comm_overlap")),
            "fp8_hybrid": m.get("fp8_hybrid", ""), "fp8_amax_history_len": m.get("fp8_amax_history_len", ""),
            "fp8_amax_compute_algo": m.get("fp8_amax_compute_algo", ""), "optimizer": optim.get("name", ""),
            "grad_sync_dtype": optim.get("grad_sync_dtype") or "",
            "lora_dim": lora.get("adapter_dim", "") if (m.get("peft") or {}).get("peft_scheme") == "lora" else "",
            "lora_targets": ",".join(lora.get("target_modules", ())) or ("attention_qkv (NeMo's default)" if lora and
                                                                         m["peft"]["peft_scheme"] == "lora" else "")}


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _number(cell: str) -> str:
    """A measured cell: its number (the 512-GPU 175B row links its TFLOP/s to MLCommons: ``[888](url)``)."""
    return re.sub(r"^\[([\d.]+)\]\(.*\)$", r"\1", cell)


def parse() -> list[dict]:
    """Both tables' rows: the run, the launcher's facts (``FACTS``), the measured columns (``MEASURED``) last."""
    doc = show(NEMO_MIRROR, "NVIDIA/NeMo", NEMO, DOC)
    rows, section = [], ""
    for line in doc.splitlines():
        if line.startswith("### "):
            section = line[4:].strip()
            continue
        if not line.startswith("|") or "---" in line or "#-GPUs" in line:
            continue
        c = _cells(line)
        if section == "Pretraining":
            name, gpus, gbs, mbs, seq, tp, pp, cp, vp, tokens, tflops = c[:11]
            task, preset_yaml = "pretraining", MODELS[name]
            facts = _facts(preset_yaml[1], peft=False)
        else:
            name, task, gpus, gbs, mbs, seq, tp, pp, tokens, tflops = c[:10]
            cp, vp, preset_yaml = "1", "1", MODELS[name]
            facts = _facts(PEFT[task], peft=True)
        step = int(gbs) * int(seq) / (float(tokens) * int(gpus))
        rows.append({"source": f"NVIDIA/NeMo@{NEMO[:10]}:{DOC}", "section": section, "task": task, "model": name,
                     "system": "DGX-H100", "container": "NeMo 24.07", "precision": "fp8", "gpus": gpus, "gbs": gbs,
                     "mbs": mbs, "seq": seq, "tp": tp, "pp": pp, "cp": cp, "vp": vp, "preset": preset_yaml[0],
                     **facts, "tokens_per_s_per_gpu": tokens, "model_tflops_per_gpu": _number(tflops),
                     "step_time_s": f"{step:.4f}"})
    return rows


def _model(r: dict) -> tuple[dict, list[str]]:
    """The overrides of the row's zoo preset (``MODELS``) its launcher yaml's dimensions need, and notes."""
    over, notes = {}, []
    if r["model"] in ("GPT3-5B", "GPT3-20B"):
        over = {"name": r["model"].lower(), "layers": r["layers"], "hidden": r["hidden"], "heads": r["heads"],
                "ffn": r["ffn"]}
        notes.append(f"{r['model']} as the GPT-3 preset with {r['config_file']}'s dimensions")
    elif r["model"] in ("Nemotron-8B", "Nemotron-22B"):
        over = {"name": r["model"].lower(), "layers": r["layers"], "hidden": r["hidden"], "heads": r["heads"],
                "kv_heads": r["query_groups"] or r["heads"], "ffn": r["ffn"]}
        notes.append(f"{r['model']} as the Nemotron-4 preset with {r['config_file']}'s dimensions (vocabulary 256,000 "
                     "assumed: the yaml names no tokenizer)")
    if r["dropout"]:
        over["dropout"] = "true"
        notes.append(f"dropout {r['dropout']}")
    if r["task"] == "LoRA":
        over.update(lora_rank=r["lora_dim"], lora_targets="q,k,v")
        notes.append(f"LoRA rank {r['lora_dim']} on {r['lora_targets']} (one fused adapter, costed as three on q, k, "
                     "v)")
    if r["task"] == "SFT":
        notes.append("SFT costed as pre-training at the packed length (packing not modelled)")
    return {k: str(v) for k, v in over.items()}, notes


def describe(r: dict) -> tuple[dict | None, str, str]:
    """(the keywords of ``api.evaluate``; "", never skipped; how it was described)."""
    over, notes = _model(r)
    gpus, tp, pp, cp, vp = (int(r[k]) for k in ("gpus", "tp", "pp", "cp", "vp"))
    dp = gpus // (tp * pp * cp)
    assert dp * tp * pp * cp == gpus, f"{r['model']}: tp x pp x cp does not divide {gpus}"
    zero = 1 if r["optimizer"] == "distributed_fused_adam" else 0
    sp = tp > 1 and r["sequence_parallel"] == "True"
    stack = {}
    if tp > 1:
        stack["tp_comm_overlap"] = r["tp_comm_overlap"] == "True"
    if r["grad_sync_dtype"] == "bf16":
        stack["grad_reduce_bf16"] = True
    kw = dict(model=r["preset"], cluster="dgx-h100", devices=gpus, tp=tp, pp=pp, cp=cp, dp=dp, sp=sp, zero=zero,
              recompute=r["recompute"], micro_batch=int(r["mbs"]), global_batch=int(r["gbs"]), seq=int(r["seq"]),
              vpp=vp, precision="fp8", fp8_recipe="delayed", framework="megatron", overrides=over or None,
              stack=Stack(**stack))
    said = (f"{over.get('name', r['preset'])}{'*' if over else ''} {r['task']} on {gpus} dgx-h100: tp{tp} pp{pp} "
            f"vpp{vp} cp{cp} dp{dp} {'sp ' if sp else ''}zero{zero} mb{r['mbs']} gb{r['gbs']} seq{r['seq']} "
            f"fp8/delayed recompute {r['recompute']}"
            + (" " + ",".join(f"{k}={v}" for k, v in stack.items()) if stack else ""))
    return kw, "", "; ".join([said] + notes)


def evaluate(r: dict) -> dict:
    return evaluated(*describe(r))


def write_parsed(rows: list[dict]) -> None:
    frozen_write(RUNS, rows)


def compare() -> int:
    out, done = [], []
    for r in read_rows(RUNS, MEASURED, with_measured=True):
        e = evaluate(r)
        res = {"task": r["task"], "model": r["model"], "gpus": r["gpus"],
               "degrees": f"tp{r['tp']} pp{r['pp']} cp{r['cp']} vp{r['vp']}", "mbs": r["mbs"], "gbs": r["gbs"],
               "seq": r["seq"], "measured_tokens_per_s_per_gpu": float(r["tokens_per_s_per_gpu"]),
               "measured_s": float(r["step_time_s"]), "predicted_s": e.get("step_s"), "error": None,
               "inside_band": None, "status": e["status"], "reserved_gib": e.get("reserved_gib"), "why": e["why"],
               "described_as": e["described_as"]}
        if compared(res, e, res["measured_s"]):
            done.append(res)
        out.append(res)
    lines = step_report("Held-out test round 6: NeMo 24.07's FP8 performance summary on DGX H100", "nemo_perf_runs",
                        out, done, lambda x: (x["task"],))
    cols = ["task", "model", "gpus", "degrees", "mbs", "gbs", "seq", "measured_s", "predicted_s", "error", "status",
            "reserved_gib", "inside_band", "why", "described_as"]
    lines += row_table(out, cols, {"measured_s": lambda v: f"{v:.3f}", "predicted_s": lambda v: f"{v:.3f}"})
    write_results("nemo_perf_runs", lines, out)
    return 0


def main(argv: list[str]) -> int:
    if "--parse" in argv:
        rows = parse()
        write_parsed(rows)
        print(f"wrote {len(rows)} rows to {RUNS} (sha256 {sha256(RUNS)})")
        return 0
    if "--check" in argv:
        return check_rows(read_rows(RUNS, MEASURED, with_measured=False), evaluate,
                          lambda r: f"{r['task']:11} {r['model']:13} on {r['gpus']:>4}:")
    return compare()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
