"""A held-out test of the cost model on NVIDIA dgxc-benchmarking's published NeMo training step times.

    python benchmarks/dgxc_runs.py --parse   # (once) writes the frozen test file dgxc_runs.csv
    python benchmarks/dgxc_runs.py --check   # each row described and evaluated, measured columns unread
    python benchmarks/dgxc_runs.py           # the comparison (run once, by the lead): benchmarks/results/dgxc_runs.*

Source: the "Expected Performance" tables of the NeMo / Megatron-core workloads of NVIDIA/dgxc-benchmarking, in every
commit from ``FIRST`` (v24.11.1) to ``LAST`` (v25.05.04; later releases dropped the tables), read from the local
mirror. In scope (``WORKLOADS``): GPT-3 175B (``nemo_megatron``), Llama 3.1, Nemotron-4, Grok-1, Llama 4, DeepSeek-V3
and Nemotron-H pretraining; not parsed: the JAX (maxtext, paxml), Hugging Face (hf-llama2, hf-mistral) and
fine-tuning (ft_llama3, llama3/finetuning) stacks. ``--parse`` takes every column of every performance table (one
run: a model, precision, system and GPU count) with its configuration: the table's title ``(TP=.., PP=..)``, the
README's configuration table (Size, Precision, GPUs, SeqLen, Layers, FSDP, TP, PP, CP, EP, ETP, DP, VP, MBS, GBS, GA)
for the same system, size, precision, GPU count (and GBS where the column states one), the per-column rows (Layers,
GBS, PP, VP) where a table has them; and the facts the same commit's launch files state (``commit_facts``): the
container, the FP8 recipe and where it is stated, FP8 parameters, recomputation, dropout, the model's dimensions of a
NeMo 1 config (``*.yaml``), the MoE capacity factor, DeepSeek-V3's recompute modules.

Dedupe: one row per distinct (workload, system, precision, GPU count, configuration, measured values), the earliest
commit that shows it; ``repeats_in`` lists the later commits that repeat it. Excluded (the project holds them): the
Llama 3.1 BF16 rows of ``llama3.1/README.md`` @741c886 (the fit data, ``shared/data/calibration_h100.csv``), GPT-3
175B BF16 of ``nemo_megatron/README_175b.md`` @0b71cfd and Nemotron4 15B BF16 on 16 / 340B BF16 on 256 H100 of
``nemotron/README.md`` @1f6d9f4 (``heldout_runs.csv``); a kept row whose configuration equals one of those (another
release's measurement) says so in ``same_config_as``.

Each row is then described as one SymTensor evaluation (``describe``): the system as a cluster preset, the model as a
zoo preset (or a preset with the overrides its stated dimensions need), dp = gpus / (tp x pp x cp), sequence
parallelism where tp > 1, expert TP as stated (Megatron's default, TP, where not), Megatron's distributed optimizer
(ZeRO 1; NeMo's distributed_fused_adam and mcore_distributed_optim shard the optimizer state the same way) or FSDP
(ZeRO 3), the precision with its FP8 recipe, and the stated stack facts. A row the mapping cannot describe is
skipped with the reason. Nothing in the cost model is changed for this test.

Predicted step vs the measured "Training step time (seconds per step)"; error = measured step / predicted step - 1
(+: optimistic, the throughput convention); a row is inside its band when the measured step lies in the band the
evaluation prints (``plan.document.config_band``).
"""

from __future__ import annotations

import re
import sys
from functools import partial
from pathlib import Path

from symtensor.models.config import PRESETS
from symtensor.plan.stack import Stack

from frozen_runs import (
    check_rows,
    compared,
    evaluated,
    git as frozen_git,
    read_rows,
    row_table,
    sha256,
    show as frozen_show,
    step_report,
    write_parsed as frozen_write,
)
from results_files import write_results

REPO = "NVIDIA/dgxc-benchmarking"
MIRROR = Path("/work/.mirror/NVIDIA+dgxc-benchmarking/repo")
FIRST, LAST = "35a9aec", "6be5ea0"  # the first and last commits with Expected Performance step-time tables
HERE = Path(__file__).resolve().parent
RUNS = HERE / "dgxc_runs.csv"
MEASURED = ("step_time_s", "tokens_per_s", "mfu_pct")  # the tables' measured rows, read once
# workload folder -> its name in the tables; the folders of the NeMo / Megatron-core pretraining workloads
WORKLOADS = {"nemo_megatron": "GPT-3", "llama3.1": "Llama 3.1", "nemotron": "Nemotron-4", "grok1": "Grok-1",
             "llama4": "Llama 4", "deepseek_v3/pretraining": "DeepSeek-V3", "nemotronh": "Nemotron-H"}
SYSTEMS = {"H100": "dgx-h100", "H200": "dgx-h200", "B200": "dgx-b200", "GB200": "gb200-nvl72"}
# the project's rows: (path, commit, system, precision, model size or None for all, GPU counts or None for all)
EXCLUDED = (("llama3.1/README.md", "741c886", "H100", "bf16", None, None, "calibration_h100.csv"),
            ("nemo_megatron/README_175b.md", "0b71cfd", "H100", "bf16", None, None, "heldout_runs.csv"),
            ("nemotron/README.md", "1f6d9f4", "H100", "bf16", "15b", (16,), "heldout_runs.csv"),
            ("nemotron/README.md", "1f6d9f4", "H100", "bf16", "340b", (256,), "heldout_runs.csv"))
CONFIG = ("tp", "pp", "cp", "vp", "ep", "etp", "dp", "fsdp", "mbs", "gbs", "ga", "seq", "layers")


git = partial(frozen_git, MIRROR, "dgxc-benchmarking")
show = partial(frozen_show, MIRROR, "dgxc-benchmarking")


def commits() -> list[str]:
    """The commits from FIRST to LAST, oldest first (short hashes)."""
    return git("rev-list", "--reverse", "--abbrev-commit", f"{FIRST}^..{LAST}").split()


# -- the README tables -------------------------------------------------------------------------------------------

def _cells(line: str) -> list[str]:
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") else line
    return [c.strip() for c in line.split("|")]


def _tables(text: str):
    """(line number, system context, heading, header cells, [(line number, cells)]) of each markdown table; the
    system context: the last heading or bold line naming a GPU (H100, GB200, ...)."""
    lines, system, heading, i = text.splitlines(), "", "", 0
    while i < len(lines):
        line = lines[i]
        if (line.startswith("#") or line.startswith("**")) and "|" not in line:
            heading = line.strip("#* ").strip()
            named = re.findall(r"\b(GB200|B200|H200|H100)", line)
            if named:
                system = named[0]
        if "|" in line and i + 1 < len(lines) and re.fullmatch(r"\s*\|?\s*:?-{2,}[-|: ]*", lines[i + 1]):
            body, j = [], i + 2
            while j < len(lines) and "|" in lines[j]:
                body.append((j + 1, _cells(lines[j])))
                j += 1
            yield i + 1, system, heading, _cells(line), body
            i = j
            continue
        i += 1


CONFIG_KEYS = {"size": "size", "model size": "size", "precision": "precision", "gpus": "gpus", "seqlen": "seq",
               "layers": "layers", "fsdp": "fsdp", "tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "etp": "etp",
               "dp": "dp", "vp": "vp", "mbs": "mbs", "gbs": "gbs", "ga": "ga", "seq": "seq"}
MEASURED_ROWS = {"training step time": "step_time_s", "throughput in tokens per second": "tokens_per_s",
                 "model flops utilization": "mfu_pct"}
COLUMN = re.compile(r"(\d+)\s*x?\s*(GB200|B200|H200|H100)\s+GPUs", re.I)


def _value(cell: str) -> str:
    """A configuration cell: an integer as text, or "" (NA, n/a, empty)."""
    cell = cell.strip()
    return cell if re.fullmatch(r"\d+", cell) else ""


def _measured(cell: str) -> str:
    """A measured cell as printed (commas and % dropped), or "" when it is not one number."""
    cell = cell.replace(",", "").replace("%", "").strip()
    return cell if re.fullmatch(r"\d+(?:\.\d+)?", cell) else ""


def _size(text: str) -> str:
    m = re.search(r"(\d+)\s*[bB]\b", text)
    return m.group(1) + "b" if m else ""


def parse_readme(commit: str, path: str) -> list[dict]:
    """Every performance-table column of one README at one commit, with its configuration."""
    text, configs, rows = show(commit, path), [], []
    for n, system, heading, header, body in _tables(text):
        keys = [CONFIG_KEYS.get(h.lower()) for h in header]
        if "gpus" in keys and "tp" in keys:
            for line, cells in body:
                conf = {k: c.strip() for k, c in zip(keys, cells, strict=False) if k}
                configs.append({**conf, "system": system or "H100", "line": line})
            continue
        columns = [COLUMN.search(h) for h in header[1:]]
        if not any(columns):
            continue
        title = header[0]
        precision = "fp8" if re.search(r"\bFP8\b", title) else "bf16" if re.search(r"\bBF16\b", title) else ""
        stated = {k.lower(): v for k, v in re.findall(r"\b(TP|PP|CP|VP|EP|MBS|GA|SEQ)\s*=\s*(\d+)", title)}
        per_column, measured = {}, {}
        for _, cells in body:
            label = cells[0].strip().lower()
            kind = next((v for k, v in MEASURED_ROWS.items() if label.startswith(k)), None)
            if kind:
                measured[kind] = cells[1:]
            elif label in ("layers", "gbs", "pp", "vp", "tp", "cp", "mbs"):
                per_column[label] = cells[1:]
        for i, col in enumerate(columns):
            if col is None:
                continue
            gbs = re.search(r"GBS\s*=\s*(\d+)", header[1 + i])
            row = {"source": f"{REPO}@{commit}", "path": path, "line": n, "table": title,
                   "heading": heading, "system": col.group(2).upper(), "size": _size(title) or _size(path),
                   "precision": precision, "gpus": col.group(1),
                   "strong_scaling": "yes" if "strong scaling" in header[1 + i].lower() else ""}
            conf = _config_row(configs, row, gbs.group(1) if gbs else "")
            row["config_line"] = conf.pop("line", "")
            row["size"] = row["size"] or _size(conf.get("size", ""))
            for k in CONFIG:
                row[k] = _value(conf.get(k, ""))
            for k, v in stated.items():
                row[k] = v
            if gbs:
                row["gbs"] = gbs.group(1)
            for k, cells in per_column.items():  # a column's own value; "n/a" there: none (VP of a 1-stage run)
                if i < len(cells) and (_value(cells[i]) or cells[i].strip().lower() in ("n/a", "na")):
                    row[k] = _value(cells[i])
            for k in MEASURED:
                cells = measured.get(k, [])
                row[k] = _measured(cells[i]) if i < len(cells) else ""
            row["cell_notes"] = " ".join(f"{k} cell unparsed" for k in MEASURED
                                         if i < len(measured.get(k, [])) and measured[k][i].strip()
                                         and not row[k] and measured[k][i].strip().lower() not in ("n/a", "na"))
            rows.append(row)
    return rows


def _config_row(configs: list[dict], row: dict, gbs: str) -> dict:
    """The configuration-table row of this run: same system, GPU count, size, precision (and GBS if stated)."""
    found = []
    for c in configs:
        if c.get("gpus") != row["gpus"] or c["system"] != row["system"]:
            continue
        if c.get("size") and row["size"] and not c["size"].lower().startswith(row["size"]):
            continue
        if c.get("precision") and row["precision"].upper() not in c["precision"].upper().split("/"):
            continue
        if gbs and c.get("gbs") and c["gbs"] != gbs:
            continue
        found.append(c)
    return dict(found[0]) if len(found) == 1 else {}


# -- the facts the commit's launch files state -----------------------------------------------------------------

def _files(commit: str, folder: str) -> list[str]:
    return git("ls-tree", "-r", "--name-only", commit, folder + "/").split()


def _yaml(text: str, key: str) -> str:
    m = re.search(rf"^\s+{key}:\s*([^\s#]+)", text, re.M)
    return m.group(1) if m else ""


def _gpu_block(text: str, gpu: str) -> str:
    """The lines of a launch script under its ``GPU_TYPE = "<gpu>"`` branch."""
    parts = re.split(r"^.*GPU_TYPE\s*=+\s*\"?(\w+)\"?.*$", text, flags=re.M)
    for i in range(1, len(parts) - 1, 2):
        if parts[i].lower() == gpu.lower():
            return parts[i + 1]
    return ""


def commit_facts(commit: str, workload: str, size: str, system: str, precision: str) -> dict:
    """What the commit's launch files of this workload state: the container, the FP8 recipe and where, the FP8
    parameters, recomputation, dropout, a NeMo 1 config's model dimensions, MoE capacity, recompute modules."""
    files = _files(commit, workload)
    facts = {k: "" for k in FACT_KEYS}
    scripts = {f: show(commit, f) for f in files if f.endswith((".sh", ".py", ".yaml"))}
    for f, text in scripts.items():
        m = re.search(r"nemo[:+](\d\d\.\d\d(?:\.\d+)?)", text) or re.search(r"FW_VERSION=(\d\d\.\d\d(?:\.\d+)?)", text)
        if m and not facts["container"]:
            facts["container"] = f"nvcr.io/nvidia/nemo:{m.group(1)} ({f})"
    yamls = [f for f in scripts if f.endswith(".yaml") and re.search(rf"[_-]{size}[._-]", f)]
    if yamls:  # NeMo 1 (NeMo-Framework-Launcher): one config per model size
        cfg = scripts[yamls[0]]
        facts["config_file"] = yamls[0]
        for key, col in (("num_layers", "cfg_layers"), ("hidden_size", "cfg_hidden"), ("ffn_hidden_size", "cfg_ffn"),
                         ("num_attention_heads", "cfg_heads"), ("num_query_groups", "cfg_kv_heads"),
                         ("activation", "cfg_activation"), ("normalization", "cfg_norm"),
                         ("num_moe_experts", "cfg_experts"), ("moe_router_topk", "cfg_top_k"),
                         ("moe_expert_capacity_factor", "moe_capacity_factor"),
                         ("moe_pad_expert_input_to_capacity", "moe_pad_to_capacity"),
                         ("virtual_pipeline_model_parallel_size", "cfg_vp"), ("encoder_seq_length", "cfg_seq"),
                         ("activations_checkpoint_granularity", "recompute_granularity"),
                         ("activations_checkpoint_method", "recompute_method"),
                         ("activations_checkpoint_num_layers", "recompute_num_layers")):
            v = _yaml(cfg, key)
            facts[col] = "" if v in ("null", "None") else v
        drop = [_yaml(cfg, k) for k in ("hidden_dropout", "attention_dropout")]
        facts["dropout"] = ",".join(drop) if any(d not in ("", "0", "0.0") for d in drop) else ""
        if precision == "fp8":
            hist, algo = _yaml(cfg, "fp8_amax_history_len"), _yaml(cfg, "fp8_amax_compute_algo")
            facts["fp8_recipe"] = "delayed"
            facts["fp8_recipe_source"] = (f"{REPO}@{commit}:{yamls[0]} fp8_hybrid, fp8_amax_history_len {hist}, "
                                          f"fp8_amax_compute_algo {algo}: Transformer Engine DelayedScaling")
            said = r"fp8_params\s*[=:]\s*(\$\{?FP8_ENABLED|true)"
            gather = [f for f, t in scripts.items() if re.search(said, t, re.I)]
            facts["fp8_params"] = f"True ({gather[0]})" if gather else ""
    elif precision == "fp8":  # NeMo 2: a recipe script of the commit, or NeMo's scripts/performance
        mixed = [f for f, t in scripts.items() if "bf16_with_fp8_mixed()" in t]
        if mixed:
            facts["fp8_recipe"] = "delayed"
            facts["fp8_recipe_source"] = (f"{REPO}@{commit}:{mixed[0]} bf16_with_fp8_mixed() (NeMo 2: fp8 hybrid, "
                                          "amax history 1024, max: DelayedScaling)")
            if re.search(r"grad_reduce_in_fp32\s*=\s*False", scripts[mixed[0]]):
                facts["grad_reduce_bf16"] = f"True ({mixed[0]}: grad_reduce_in_fp32 = False under fp8)"
        elif any("scripts.performance" in t for t in scripts.values()):
            named = [f for f, t in scripts.items() if re.search(r"fp8_recipe|\s-fr\s", t)]
            facts["fp8_recipe"] = "" if named else "delayed"
            launch = next(f for f, t in scripts.items() if "scripts.performance" in t)
            facts["fp8_recipe_source"] = (f"{REPO}@{commit}:{named[0]} names a recipe" if named else
                                          f"not stated: {REPO}@{commit}:{launch} passes no --fp8_recipe to NeMo's "
                                          "scripts/performance, whose default is 'ds' (delayed scaling; NVIDIA/NeMo "
                                          "scripts/performance/README.md)")
    launch = scripts.get(f"{workload}/launch.sh", "")
    block = _gpu_block(launch, system.lower())
    rm = re.search(r"RM='([\w,]+)'", block)
    aol = re.search(r"AOL=(\d+)", block)
    if rm:
        facts["recompute_modules"] = f"{rm.group(1)} ({workload}/launch.sh)"
    if aol and aol.group(1) != "0":
        facts["offload_layers"] = aol.group(1)
    return facts


FACT_KEYS = ("container", "config_file", "fp8_recipe", "fp8_recipe_source", "fp8_params", "grad_reduce_bf16",
             "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
             "offload_layers", "dropout", "cfg_layers", "cfg_hidden", "cfg_ffn", "cfg_heads", "cfg_kv_heads",
             "cfg_activation", "cfg_norm", "cfg_experts", "cfg_top_k", "cfg_vp", "cfg_seq", "moe_capacity_factor",
             "moe_pad_to_capacity")
PARSED = ("source", "path", "line", "config_line", "table", "heading", "workload", "system", "size", "precision",
          "gpus", "strong_scaling") + CONFIG + ("repeats_in", "same_config_as", "cell_notes")


def _key(r: dict) -> tuple:
    return (r["workload"], r["system"], r["size"], r["precision"], r["gpus"]) + tuple(r[k] for k in CONFIG) + tuple(
        r[k] for k in MEASURED)


def _same_config(a: dict, b: dict) -> bool:
    """Two runs of one configuration: same workload, system, size, precision, GPUs, and every degree, batch,
    sequence and depth either equal or unstated on one side (NA as 1 for the degrees)."""
    if any(a[k] != b[k] for k in ("workload", "system", "size", "precision", "gpus")):
        return False
    for k in ("tp", "pp", "cp", "vp", "ep", "mbs", "gbs", "seq", "layers"):
        x, y = a[k] or a.get("cfg_" + k, ""), b[k] or b.get("cfg_" + k, "")
        if k in ("pp", "cp", "vp", "ep"):
            x, y = x or "1", y or "1"
        if x and y and x != y:
            return False
    return True


def parse() -> tuple[list[dict], dict]:
    """The frozen rows (deduped, the project's rows excluded) and the counts of what was dropped."""
    found: dict[tuple, dict] = {}
    excluded: dict[tuple, str] = {}
    for commit in commits():
        for workload in WORKLOADS:
            readme = rf"{re.escape(workload)}/README[^/]*\.md"
            readmes = [f for f in _files(commit, workload) if re.fullmatch(readme, f)]
            for path in readmes:
                for r in parse_readme(commit, path):
                    r["workload"] = workload
                    key = _key(r)
                    for ex_path, ex_commit, system, prec, size, gpus, held in EXCLUDED:
                        if (path, commit, r["system"], r["precision"]) == (ex_path, ex_commit, system, prec) and \
                                (size is None or r["size"] == size) and (gpus is None or int(r["gpus"]) in gpus):
                            excluded[key] = held
                    if key in found:
                        if commit not in found[key]["repeats_in"].split():
                            found[key]["repeats_in"] = (found[key]["repeats_in"] + " " + commit).strip()
                        continue
                    r["repeats_in"] = ""
                    r.update(commit_facts(commit, workload, r["size"], r["system"], r["precision"]))
                    found[key] = r
    rows = [r for k, r in found.items() if k not in excluded]
    held = [(found[k], v) for k, v in excluded.items()]
    for r in rows:
        r["same_config_as"] = " ".join(sorted({v for x, v in held if _same_config(r, x)}))
    dropped = {"excluded": len(excluded), "distinct": len(found)}
    return rows, dropped


def write_parsed(rows: list[dict]) -> None:
    frozen_write(RUNS, rows, list(PARSED) + list(MEASURED) + list(FACT_KEYS), newline="\n")


# -- a row as one evaluation -----------------------------------------------------------------------------------

# Nemotron-4 (NeMo 1 configs of the same repository): squared-ReLU MLP (2 matrices), LayerNorm (layernorm1p, the same
# cost), no biases, RoPE on half the head dim, untied embeddings, 8 query groups; vocabulary 256,000
# (nemotron_2_256k.model); 340B also in shared/data/model_configs.csv
NEMOTRON4 = {"15b": dict(layers=32, hidden=6144, heads=48, kv_heads=8, ffn=24576,
                         source=f"{REPO}@35a9aec:nemotron/nemotron4-15b-synth.yaml"),
             "340b": dict(layers=96, hidden=18432, heads=96, kv_heads=8, ffn=73728,
                          source=f"{REPO}@35a9aec:nemotron/nemotron4-340b-synth.yaml")}
# Grok-1 as dgxc-benchmarking runs it (grok1_314b.yaml, "grok-1-proxy"): 64 layers, hidden 6144, 48 heads, 8 query
# groups, FFN 32768 per expert, 8 experts top-2, RMSNorm, no biases, gated GeLU (fast-geglu: 3 matrices, costed as
# SwiGLU's), the Llama 3 tokenizer (meta-llama/Meta-Llama-3-70B: 128,256)
GROK1 = dict(layers=64, hidden=6144, heads=48, kv_heads=8, ffn=32768, experts=8, top_k=2, vocab=128256,
             source=f"{REPO}@35a9aec:grok1/grok1_314b.yaml")
MODELS = {("nemo_megatron", "175b"): "gpt3-175b", ("llama3.1", "8b"): "llama3-8b",
          ("llama3.1", "70b"): "llama3-70b", ("llama3.1", "405b"): "llama3-405b",
          ("deepseek_v3/pretraining", "671b"): "deepseek-v3"}
SKIPPED = {"llama4": "Llama 4 Maverick: no zoo preset, and its interleaved MoE / shared-expert / chunked-attention "
                     "dimensions are not stated in this repository (not sourced in this round)",
           "nemotronh": "Nemotron-H: hybrid Mamba-2 layers, which ModelConfig cannot express"}


def _int(text: str, default: int = 1) -> int:
    return int(text) if text and text.isdigit() else default


def _model(r: dict) -> tuple[str, dict, list[str]]:
    """(base preset, overrides, notes) of the row's model."""
    w, size, notes = r["workload"], r["size"], []
    over: dict = {}
    if w == "nemotron":
        # the zoo preset (NeMo 2's Nemotron4Config, the same dimensions as this repository's NeMo 1 configs); the
        # reading built the same model as llama3-8b's preset with these dimensions (head_dim following them): every
        # prediction is unchanged, only the description names the preset
        notes.append(f"Nemotron-4 {size} as the nemotron4-{size} preset (= {NEMOTRON4[size]['source']})")
        base = f"nemotron4-{size}"
    elif w == "grok1":
        dims = dict(GROK1)
        notes.append(f"Grok-1 as {dims.pop('source')} (GeGLU costed as SwiGLU)")
        if not r["config_file"]:
            notes.append("NeMo 2 run: Grok-1 dimensions of the NeMo 1 config assumed")
        base = "mixtral-8x7b"
        over = dict(name="grok1-314b", max_context=8192, **dims)
    else:
        base = MODELS[(w, size)]
    cfg = PRESETS[base].replace(**{k: v for k, v in over.items()}) if over else PRESETS[base]
    stated = {"layers": r["cfg_layers"], "hidden": r["cfg_hidden"], "ffn": r["cfg_ffn"], "heads": r["cfg_heads"],
              "kv_heads": r["cfg_kv_heads"]}
    for k, v in stated.items():  # a NeMo 1 config's dimensions where they differ from the preset's
        if v and int(v) != getattr(cfg, k) and k != "layers":
            over[k] = int(v)
            notes.append(f"{k} {v} as {r['config_file']} states (preset {getattr(cfg, k)})")
    layers = _int(r["layers"], 0) or _int(r["cfg_layers"], 0)
    if layers and layers != cfg.layers:
        over["layers"] = layers
        notes.append(f"{layers}-layer proxy")
    if r["dropout"]:
        over["dropout"] = True
        notes.append(f"dropout {r['dropout']} ({r['config_file']})")
    return base, over, notes


def describe(r: dict) -> tuple[dict | None, str, str]:
    """(the keywords of ``api.evaluate``, or None; why the row is skipped, or ""; how it was described)."""
    if r["workload"] in SKIPPED:
        return None, SKIPPED[r["workload"]], ""
    if r["system"] not in SYSTEMS:
        return None, f"system {r['system']}: no cluster preset", ""
    if (r["workload"], r["size"]) not in MODELS and r["workload"] not in ("nemotron", "grok1"):
        return None, f"{r['workload']} {r['size']}: no model mapping", ""
    if not r["precision"]:
        return None, "precision not stated in the table title", ""
    if r["precision"] == "fp8" and not r["fp8_recipe"]:
        return None, "FP8 recipe not stated: " + r["fp8_recipe_source"], ""
    missing = [k for k in ("tp", "mbs", "gbs") if not r[k]] + ([] if r["seq"] or r["cfg_seq"] else ["seq"])
    if missing:
        return None, "configuration not stated: " + ", ".join(missing), ""
    base, over, notes = _model(r)
    gpus, tp, pp, cp = int(r["gpus"]), _int(r["tp"]), _int(r["pp"]), _int(r["cp"])
    vpp, ep, fsdp = _int(r["vp"]), _int(r["ep"]), _int(r["fsdp"], 0)
    if gpus % (tp * pp * cp):
        return None, f"tp{tp} x pp{pp} x cp{cp} does not divide {gpus} GPUs", ""
    dp = gpus // (tp * pp * cp)
    if r["dp"] and int(r["dp"]) != dp:
        notes.append(f"the table's DP {r['dp']} differs from gpus/(tp*pp*cp) = {dp}: the latter taken")
    gbs, mbs = int(r["gbs"]), int(r["mbs"])
    if gbs % (mbs * dp) and r["ga"] and int(r["ga"]) * mbs * dp != gbs:  # a typo the row's own GA shows
        notes.append(f"GBS {gbs} not a multiple of MBS x DP; the row's GA {r['ga']} x MBS {mbs} x DP {dp} taken")
        gbs = int(r["ga"]) * mbs * dp
    moe = ep > 1 or r["workload"] == "grok1" or base == "deepseek-v3"
    etp = _int(r["etp"], 0) or (tp if moe else 1)
    if moe and not r["etp"]:
        notes.append(f"expert TP not stated: Megatron's default (= TP {tp})")
    precision = r["precision"]
    kw = dict(devices=gpus, tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=etp, sp=tp > 1, zero=3 if fsdp else 1,
              micro_batch=mbs, global_batch=gbs, seq=int(r["seq"] or r["cfg_seq"]), vpp=vpp,
              precision=precision, fp8_recipe=r["fp8_recipe"] if precision == "fp8" else None, framework="megatron",
              overrides={k: str(v) if not isinstance(v, bool) else str(v) for k, v in over.items()} or None)
    if fsdp:
        notes.append("FSDP as ZeRO 3")
    if not r["seq"]:
        notes.append(f"sequence {r['cfg_seq']} from {r['config_file']}")
    if r["cfg_vp"] and r["vp"] and r["cfg_vp"] != r["vp"]:  # the title repeats an older value; the config ran
        vpp = _int(r["cfg_vp"])
        kw["vpp"] = vpp
        notes.append(f"the table states VP {r['vp']}, {r['config_file']} (what launch.sh runs) VP {vpp}: the latter "
                     "taken")
    recompute = "none"
    if r["recompute_granularity"] == "selective":
        recompute = "selective"
    elif r["recompute_granularity"] == "full":
        recompute = "full"
        notes.append(f"full recompute ({r['recompute_method']} {r['recompute_num_layers']}) costed on every layer")
    elif r["recompute_modules"]:
        recompute = "modules:" + r["recompute_modules"].split()[0]
    elif not r["config_file"]:
        notes.append("recomputation not stated in the commit (NeMo 2 recipe defaults not read): none")
    if r["offload_layers"]:
        notes.append(f"activation offload of {r['offload_layers']} layers not modelled")
    if base == "deepseek-v3":
        notes.append("MTP not modelled; pipeline split not stated: the tool's default")
    if r["strong_scaling"]:
        notes.append("strong-scaling table")
    stack = {}
    if precision == "fp8" and r["fp8_params"]:
        stack["fp8_param_gather"] = True
    if precision == "fp8" and r["grad_reduce_bf16"]:
        stack["grad_reduce_bf16"] = True
    if r["moe_capacity_factor"]:
        stack["moe_capacity_factor"] = float(r["moe_capacity_factor"])
        if r["moe_pad_to_capacity"] == "true":
            notes.append("expert inputs padded to capacity: costed as capacity-bounded routing")
    kw.update(recompute=recompute, stack=Stack(**stack))
    said = (f"{kw['overrides'] and over.get('name') or base}{'*' if over else ''} on {gpus} {SYSTEMS[r['system']]}: "
            f"tp{tp} pp{pp} vpp{vpp} cp{cp} ep{ep} etp{etp} dp{dp} {'sp ' if kw['sp'] else ''}zero{kw['zero']} "
            f"mb{kw['micro_batch']} gb{kw['global_batch']} seq{kw['seq']} {precision}"
            f"{'/' + r['fp8_recipe'] if precision == 'fp8' else ''} recompute {recompute}"
            + (" stack " + ",".join(f"{k}={v}" for k, v in kw["stack"].differing().items()) if stack else ""))
    return {"model": base, "cluster": SYSTEMS[r["system"]], **kw}, "", "; ".join([said] + notes)


def evaluate(r: dict) -> dict:
    """The row's evaluation: predicted step, fits, reserved memory, band; or why it is skipped or refused."""
    return evaluated(*describe(r))


# -- modes -----------------------------------------------------------------------------------------------------

def check() -> int:
    """Every row described and evaluated with the measured columns dropped: status counts and reasons."""
    return check_rows(read_rows(RUNS, MEASURED, with_measured=False), evaluate,
                      lambda r: f"{r['source'][-7:]} {r['workload'][:13]:13} {r['size']:5} {r['system']:5} "
                                f"{r['gpus']:>5} {r['precision']:4}")


def compare() -> int:
    out, done = [], []
    for r in read_rows(RUNS, MEASURED, with_measured=True):
        e = evaluate(r)
        measured = float(r["step_time_s"]) if r["step_time_s"] else None
        res = {"source": r["source"], "path": r["path"], "workload": WORKLOADS[r["workload"]], "size": r["size"],
               "system": r["system"], "gpus": r["gpus"], "precision": r["precision"],
               "fp8_recipe": r["fp8_recipe"] if r["precision"] == "fp8" else "",
               "degrees": f"tp{r['tp']} pp{r['pp']} cp{r['cp']} vp{r['vp']} ep{r['ep']}",
               "gbs": r["gbs"], "mbs": r["mbs"], "seq": r["seq"], "same_config_as": r["same_config_as"],
               "measured_s": measured, "predicted_s": e.get("step_s"), "error": None, "inside_band": None,
               "status": e["status"], "reserved_gib": e.get("reserved_gib"), "why": e["why"],
               "described_as": e["described_as"]}
        if compared(res, e, measured):
            done.append(res)
        out.append(res)
    write_results("dgxc_runs", report(out, done), out)
    return 0


def report(out: list[dict], done: list[dict]) -> list[str]:
    def keys(x: dict) -> tuple:
        return (x["precision"] + (f"/{x['fp8_recipe']}" if x["fp8_recipe"] else ""), f"{x['workload']} {x['size']}",
                x["system"], "same configuration as a project row" if x["same_config_as"] else "new configuration")

    lines = step_report("Held-out test: dgxc-benchmarking's NeMo training step times", "dgxc_runs", out, done, keys)
    cols = ["source", "workload", "size", "system", "gpus", "precision", "degrees", "gbs", "mbs", "seq",
            "measured_s", "predicted_s", "error", "status", "reserved_gib", "inside_band", "same_config_as", "why",
            "described_as"]
    return lines + row_table(out, cols, {"measured_s": lambda v: f"{v:.3f}", "predicted_s": lambda v: f"{v:.3f}"})


def main(argv: list[str]) -> int:
    if "--parse" in argv:
        rows, dropped = parse()
        write_parsed(rows)
        print(f"wrote {len(rows)} rows to {RUNS} (sha256 {sha256(RUNS)}); {dropped['distinct']} distinct runs, "
              f"{dropped['excluded']} excluded as the project's")
        return 0
    if "--check" in argv:
        return check()
    return compare()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
