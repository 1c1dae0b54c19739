"""A held-out test of the cost model on NVIDIA Megatron-Bridge's published performance tables.

    python benchmarks/bridge_perf_runs.py --parse   # (once) writes the frozen test file bridge_perf_runs.csv
    python benchmarks/bridge_perf_runs.py --check   # each row described and evaluated, measured columns unread
    python benchmarks/bridge_perf_runs.py           # the comparison: benchmarks/results/bridge_perf_runs.{md,csv}
    python benchmarks/bridge_perf_runs.py --round gb300-b300 [--parse | --check]   # the second round (below)

Two rounds, each its own frozen file (``ROUNDS``): ``h100-b200-gb200`` (``bridge_perf_runs.csv``, every row of both
docs, the DGX-H100, DGX-B200 and DGX-GB200 rows in scope; compared once in the fourth session) and ``gb300-b300``
(``bridge_perf_runs_gb300_b300.csv``: the same docs' DGX-GB300 and DGX-B300 rows with their own recipes' facts, parsed
once the ``gb300-nvl72`` and ``dgx-b300`` presets existed and frozen before the cost model changed again).

Source: ``docs/performance-summary.md`` (the current container) and ``docs/performance-summary-archive.md``
(older containers) of NVIDIA-NeMo/Megatron-Bridge at ``BRIDGE`` (the commit ``search/recipes.py`` cites), read
from its local mirror. ``--parse`` takes every table row of both (its container heading, section and model or
system heading kept; a cell ``a (b)`` is two rows, the second taking every ``(b)``), and the facts the matching
performance recipe states (``src/megatron/bridge/perf_recipes/<family>/<gpu>/*.py``, the function of the row's
model, GPU count, GPU and precision, with the helpers it calls in its own file or its family's ``common.py``):
recomputation, pipeline layout, the MoE dispatcher and EP overlap, CPU offloading, the allocator setting. Those
go in ``bridge_perf_runs.csv``, the frozen test file (its sha256 in ``bridge_perf_runs.md``).

Each row is then described as one SymTensor evaluation (``describe``): the system as a cluster preset, the
model as a zoo preset, the precision and FP8 recipe, its degrees (dp = gpus / (tp x pp x cp), sequence
parallelism where tp > 1, expert TP 1), Megatron's distributed optimizer (ZeRO 1) or Megatron FSDP (ZeRO 3)
where the FSDP column says so, and the recipe's stack facts (``Stack``: gradients reduced in bf16 by
``_benchmark_common``, expandable segments, EP overlap). A row the mapping cannot describe is skipped with the
reason; a configuration the tool refuses or that does not fit is reported as such. Nothing in the cost model
was changed for this test: it is run once and reports what comes out.

Predicted tokens/s/GPU = global batch x sequence / step / GPUs; error = predicted / measured - 1 (+ optimistic).
A row is inside its band when the measured step lies in the band the evaluation prints (``cost.bands``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from symtensor.errors import PlanError
from symtensor.plan.stack import Stack

from frozen_runs import (
    check_rows,
    evaluated,
    nofit_line,
    read_rows as _read_rows,
    row_table,
    sha256 as _sha256,
    status_line,
    summary as _summary,
    write_parsed as frozen_write,
)
from results_files import write_results

BRIDGE = "NVIDIA-NeMo/Megatron-Bridge@067f987df03b"
COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
MIRROR = Path("/work/.mirror/NVIDIA-NeMo+Megatron-Bridge/repo")
DOCS = ("docs/performance-summary.md", "docs/performance-summary-archive.md")
PERF = "src/megatron/bridge/perf_recipes/"
HERE = Path(__file__).resolve().parent
MEASURED = ("tokens_per_s_per_gpu", "model_tflops_per_gpu")  # the doc's last two columns, read once



@dataclass(frozen=True)
class Round:
    """One frozen test: its file, the systems it takes (the doc's system -> (cluster preset, recipe folder)) and
    the name of its results."""

    name: str
    runs: Path
    systems: dict
    results: str


ROUNDS = {r.name: r for r in (
    Round("h100-b200-gb200", HERE / "bridge_perf_runs.csv",
          {"DGX-H100": ("dgx-h100", "h100"), "DGX-B200": ("dgx-b200", "b200"), "DGX-GB200": ("gb200-nvl72", "gb200")},
          "bridge_perf_runs"),
    Round("gb300-b300", HERE / "bridge_perf_runs_gb300_b300.csv",
          {"DGX-GB300": ("gb300-nvl72", "gb300"), "DGX-B300": ("dgx-b300", "b300")}, "bridge_perf_runs_gb300_b300"))}
# the doc's model name (its label in parentheses dropped) -> (zoo preset, recipe function stem, recipe family folder)
MODELS = {"LLAMA3_8B": ("llama3-8b", "llama3_8b", "llama"), "LLAMA3_70B": ("llama3-70b", "llama3_70b", "llama"),
          "LLAMA3.1_405B": ("llama3-405b", "llama31_405b", "llama"),
          "DeepSeekV3": ("deepseek-v3", "deepseek_v3", "deepseek"),
          "GPT OSS 120B": ("gpt-oss-120b", "gpt_oss_120b", "gpt_oss"),
          "Qwen3_30B_a3B": ("qwen3-30b-a3b", "qwen3_30b_a3b", "qwen"),
          "Qwen3_235B_a22B": ("qwen3-235b-a22b", "qwen3_235b_a22b", "qwen"),
          "Kimi_K2": ("kimi-k2", "kimi_k2", "kimi")}
# the doc's precision -> (precision, FP8 recipe, the recipe functions' suffix); "FP8" unqualified is the
# current-scaling recipe: the only non-MX FP8 recipe of every model and GPU those rows name (fp8cs)
PRECISIONS = {"BF16": ("bf16", None, "bf16"), "FP8": ("fp8", "tensorwise", "fp8cs"),
              "FP8-CS": ("fp8", "tensorwise", "fp8cs"), "FP8-DS": ("fp8", "delayed", "fp8ds"),
              "FP8-MX": ("fp8", "mxfp8", "fp8mx"), "MXFP8": ("fp8", "mxfp8", "fp8mx"),
              "NVFP4": ("fp4", "nvfp4", "nvfp4")}
DENSE = {"llama3-8b", "llama3-70b", "llama3-405b"}
LAYERS = {"llama3-8b": 32, "llama3-70b": 80, "llama3-405b": 126}  # block recomputation is only stated for these


def git_show(path: str) -> str:
    if not MIRROR.exists():
        raise PlanError(f"no Megatron-Bridge mirror at {MIRROR}; --parse reads it (comparisons read the frozen file)")
    return subprocess.run(["git", "-C", str(MIRROR), "show", f"{COMMIT}:{path}"], check=True, capture_output=True,
                          text=True).stdout


# -- parsing the tables --------------------------------------------------------------------------------------

def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _variants(cell: str) -> list[str]:
    """``a (b)`` -> [a, b]; a plain cell -> [cell]."""
    m = re.fullmatch(r"(.+?)\s*\((.+)\)", cell)
    return [m.group(1).strip(), m.group(2).strip()] if m else [cell]


def _numbers(cell: str) -> list[str]:
    """The numbers of a measured cell (a footnote marker dropped), commas removed."""
    return [n.replace(",", "") for n in re.findall(r"\d[\d,]*(?:\.\d+)?", re.sub(r"\[\^[^\]]*\]", "", cell))]


KEY = {"System": "system", "Model": "model_name", "#-GPUs": "gpus", "Precision": "precision", "GBS": "gbs",
       "MBS": "mbs", "Sequence Length": "seq", "FSDP": "fsdp", "TP": "tp", "PP": "pp", "CP": "cp", "VP": "vp",
       "EP": "ep", "GA": "ga", "Tokens / sec / GPU": MEASURED[0], "Model TFLOP / sec / GPU": MEASURED[1]}


def parse_doc(path: str) -> list[dict]:
    """Every table row of one doc, with its container, section and heading; a row whose configuration cells hold
    ``a (b)`` alternatives is one row per alternative (variant 0, 1)."""
    rows, container, section, heading, header = [], "", "", "", None
    for n, line in enumerate(git_show(path).splitlines(), 1):
        if line.startswith("## "):
            container, section, heading, header = line[3:].strip(), "", "", None
        elif line.startswith("### "):
            section, heading, header = line[4:].strip(), "", None
        elif line.startswith("#### "):
            heading, header = re.sub(r"\[\^[^\]]*\]", "", line[5:]).strip(), None
        elif line.startswith("|") and header is None:
            header = [KEY[c] for c in _cells(line)]
        elif line.startswith("|") and not set(line) <= set("|-: "):
            cells = dict(zip(header, _cells(line), strict=True))
            notes = sorted(set(re.findall(r"\[\^([^\]]*)\]", line)))
            measured = {k: _numbers(cells.pop(k)) for k in MEASURED}
            kind, _, name = heading.partition(": ")
            cells.setdefault("model_name" if kind == "Model" else "system", name)
            n_var = max([len(_variants(v)) for k, v in cells.items() if k != "model_name"]
                        + [len(v) for v in measured.values()])
            for k, v in measured.items():  # a cell whose count is not the row's: which variant it is, unknown
                if len(v) != n_var:
                    measured[k] = [""] * n_var
                    notes.append(f"{k} ambiguous")
            for i in range(n_var):
                row = {"source": f"{BRIDGE}:{path}", "doc_line": n, "container": container, "section": section,
                       "heading": heading, "variant": i if n_var > 1 else "", "doc_notes": " ".join(notes)}
                for k, v in cells.items():
                    alts = _variants(v) if k != "model_name" else [v]
                    row[k] = alts[i] if len(alts) > 1 else alts[0]
                row.update({k: v[i] for k, v in measured.items()})
                rows.append(row)
        elif not line.startswith("|"):
            header = None
    return rows


# -- the facts of the matching performance recipe --------------------------------------------------------------

def _functions(text: str) -> dict[str, str]:
    """Top-level function name -> its body, of a Python source."""
    parts = re.split(r"^def (\w+)\(", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _inline(name: str, funcs: dict[str, str], depth: int = 0) -> str:
    """Function ``name``'s body with the bodies of the functions of ``funcs`` it calls (its parent config, the
    family's helpers) inlined where it calls them, so that later assignments win."""
    body = funcs[name]
    if depth > 4:
        return body

    def sub(m):
        return _inline(m.group(1), funcs, depth + 1) + m.group(0)

    return re.sub(r"\b(\w+)\(", lambda m: sub(m) if m.group(1) in funcs and m.group(1) != name else m.group(0), body)


def _last(pattern: str, text: str) -> str | None:
    found = re.findall(pattern, text)
    return found[-1] if found else None


# What Megatron-Bridge's ``_perf_precision(dtype)`` (perf_recipes/_common.py) returns of the two low-precision facts
# (training/mixed_precision.py presets at the same commit): quantized weights gathered (fp8_param_gather or
# fp4_param_gather True) for every FP8 and the NVFP4 preset; no layer kept in BF16 (the fp8_cs and fp8_ds branches
# set first_last_layers_bf16 False, the MXFP8 and NVFP4 presets never set it)
PERF_PRECISION_PARAM_GATHER = {"bf16": False, "fp8_cs": True, "fp8_ds": True, "fp8_mx": True, "nvfp4": True}


def _lowp_facts(body: str) -> dict:
    """``param_gather`` and ``bf16_layers`` (``N,M`` or empty) of a recipe body: its last explicit assignment after
    its last ``_perf_precision`` call, else that preset's (``PERF_PRECISION_PARAM_GATHER``); fp8_param/fp4_param set
    the gather too (MixedPrecisionConfig keeps them in sync)."""
    preset = list(re.finditer(r"_perf_precision\(\"(\w+)\"\)", body))
    start = preset[-1].end() if preset else 0
    tail = body[start:]
    gather = _last(r"fp[48]_param(?:_gather)?\s*=\s*(True|False)", tail)
    if gather is None:
        gather = str(PERF_PRECISION_PARAM_GATHER.get(preset[-1].group(1), False)) if preset else ""
    first_last = _last(r"first_last_layers_bf16\s*=\s*(True|False)", tail)
    layers = ""
    if first_last == "True":  # Megatron's defaults: 1 and 1 (transformer_config.py)
        start = _last(r"num_layers_at_start_in_bf16\s*=\s*(\d+)", tail) or "1"
        end = _last(r"num_layers_at_end_in_bf16\s*=\s*(\d+)", tail) or "1"
        layers = f"{start},{end}"
    return {"param_gather": gather, "bf16_layers": layers}


def recipe_facts(model_name: str, section: str, gpu: str, gpus: str, suffix: str) -> dict:
    """The facts the performance recipe ``<stem>_<pretrain|sft>_<gpus>gpu_<gpu>_<suffix>_config`` states, as
    text columns; ``recipe`` empty when Megatron-Bridge has no such function."""
    _, stem, family = MODELS[model_name]
    kind = {"Pre-Training Performance": "pretrain", "SFT Performance": "sft"}.get(section, "")
    name = f"{stem}_{kind}_{gpus}gpu_{gpu}_{suffix}_config"
    folder = f"{PERF}{family}/{gpu}/"
    files = subprocess.run(["git", "-C", str(MIRROR), "ls-tree", "--name-only", COMMIT, folder], check=True,
                           capture_output=True, text=True).stdout.split()
    common = _functions(git_show(f"{PERF}{family}/common.py")) if family else {}
    for path in files:
        funcs = _functions(git_show(path))
        if name not in funcs:
            continue
        body = _inline(name, {**common, **funcs})
        layout = _last(r"pipeline_model_parallel_layout\s*=\s*\"([^\"]+)\"", body)
        dsv3 = "set_deepseek_v3_pipeline_model_parallel_layout(" in body and layout is None
        modules = _last(r"recompute_modules\s*=\s*\[([^\]]*)\]", body)
        alloc = _last(r"\"PYTORCH_CUDA_ALLOC_CONF\":\s*\"([^\"]*)\"", body)
        return {"recipe": f"{name} ({BRIDGE}:{path})",
                "r_tp": _last(r"(?<!expert_)tensor_model_parallel_size\s*=\s*(\d+)", body) or "",
                "r_pp": _last(r"(?<!virtual_)pipeline_model_parallel_size\s*=\s*(\d+)", body) or "",
                "r_vp": _last(r"virtual_pipeline_model_parallel_size\s*=\s*(\w+)", body) or "",
                "r_cp": _last(r"context_parallel_size\s*=\s*(\d+)", body) or "",
                "r_ep": _last(r"expert_model_parallel_size\s*=\s*(\d+)", body) or "",
                "r_etp": _last(r"expert_tensor_parallel_size\s*=\s*(\w+)", body) or "",
                "recompute_granularity": _last(r"recompute_granularity\s*=\s*\"(\w+)\"", body) or "",
                "recompute_method": _last(r"recompute_method\s*=\s*\"(\w+)\"", body) or "",
                "recompute_num_layers": _last(r"recompute_num_layers\s*=\s*(\d+)", body) or "",
                "recompute_modules": ",".join(re.findall(r"\"(\w+)\"", modules)) if modules is not None else "",
                "pp_layout": layout or ("deepseek_v3 table" if dsv3 else ""),
                "dispatcher": (_last(r"moe_token_dispatcher_type\s*=\s*\"(\w+)\"", body) or "") + (
                    "/" + b if (b := _last(r"moe_flex_dispatcher_backend\s*=\s*\"(\w+)\"", body)) else ""),
                "ep_overlap": str(_last(r"overlap_moe_expert_parallel_comm\s*=\s*(True|False)", body) == "True"),
                "force_balance": _last(r"moe_router_force_load_balancing\s*=\s*(True|False)", body) or "",
                "megatron_fsdp": str(_last(r"use_megatron_fsdp\s*=\s*(True|False)", body) == "True"),
                "cpu_offload_layers": (_last(r"cpu_offloading_num_layers\s*=\s*(\d+)", body) or "")
                if _last(r"cpu_offloading\s*=\s*(True|False)", body) == "True" else "",
                "expandable_segments": str(alloc is not None and "expandable_segments:True" in alloc),
                "paged_stash": str(_last(r"moe_paged_stash\s*=\s*(True|False)", body) == "True"),
                "fp8_attention": str(_last(r"fp8_dot_product_attention\s*=\s*(True|False)", body) == "True"),
                "cuda_graph": _last(r"cuda_graph_impl\s*=\s*\"(\w+)\"", body) or "", **_lowp_facts(body)}
    return {"recipe": ""}


RECIPE_KEYS = ("recipe", "r_tp", "r_pp", "r_vp", "r_cp", "r_ep", "r_etp", "recompute_granularity", "recompute_method",
               "recompute_num_layers", "recompute_modules", "pp_layout", "dispatcher", "ep_overlap", "force_balance",
               "megatron_fsdp", "cpu_offload_layers", "expandable_segments", "paged_stash", "fp8_attention",
               "cuda_graph", "param_gather", "bf16_layers")
PARSED = ("source", "doc_line", "container", "section", "heading", "variant", "doc_notes", "system", "model_name",
          "gpus", "precision", "gbs", "mbs", "seq", "fsdp", "tp", "pp", "cp", "vp", "ep", "ga")


def parse(rnd: Round) -> list[dict]:
    """The frozen test rows: every table row of both docs and its recipe's facts (where the row is in scope); the
    second round keeps only its own systems' rows."""
    rows = [r for path in DOCS for r in parse_doc(path)]
    if rnd.name != "h100-b200-gb200":
        rows = [r for r in rows if r["system"] in rnd.systems]
    for r in rows:
        name, prec = _model_name(r["model_name"]), PRECISIONS.get(r.get("precision", ""))
        facts = {}
        if r["system"] in rnd.systems and name in MODELS and prec is not None:
            facts = recipe_facts(name, r["section"], rnd.systems[r["system"]][1], r["gpus"], prec[2])
        r.update({k: facts.get(k, "") for k in RECIPE_KEYS})
    return rows


def _model_name(text: str) -> str:
    return re.sub(r"\s*\(.*\)\s*$", "", text).strip()


# -- a row as one evaluation -----------------------------------------------------------------------------------

# DeepSeek-V3's layout per (pp, vp) (Megatron-Bridge src/megatron/bridge/recipes/deepseek/h100/deepseek_v3.py,
# _get_deepseek_v3_pipeline_layout: decoder layers per virtual stage, the MTP layer dropped, as search.recipes does)
DSV3_LAYOUT = {(4, 1): (16, 16, 16, 13), (8, 1): (8,) * 7 + (5,), (4, 2): (8,) * 7 + (5,),
               (16, 1): (4,) * 15 + (1,), (8, 2): (4,) * 15 + (1,), (4, 4): (4,) * 15 + (1,)}


def _layout_string(split: tuple[int, ...]) -> str:
    stages = [("E" if i == 0 else "") + (f"t*{n}" if n else "") + ("L" if i == len(split) - 1 else "")
              for i, n in enumerate(split)]
    return "|".join(stages)


def _int(text: str, default: int = 1) -> int:
    return int(text) if text and text.isdigit() else default


def describe(r: dict, systems: dict) -> tuple[dict | None, str, str]:
    """(the keywords of ``api.evaluate``, or None; why the row is skipped, or ""; how it was described), for a row of
    the round whose ``systems`` are given."""
    name = _model_name(r["model_name"])
    if r["section"] == "LoRA Performance":
        return None, "LoRA fine-tuning: the recipe's adapter rank and targets not described", ""
    if r["system"] not in systems:
        presets = ", ".join(p for p, _ in systems.values())
        return None, f"system {r['system']}: not in this round ({presets} only)", ""
    if name not in MODELS:
        return None, f"model {r['model_name']}: no zoo preset", ""
    if not r.get("precision"):
        return None, "precision not stated (the 25.09 tables have no Precision column)", ""
    if r["precision"] not in PRECISIONS:
        return None, f"precision {r['precision']}: not modelled (bf16, FP8 current/delayed scaling, MXFP8, NVFP4)", ""
    if "tokendrop" in r["model_name"]:
        return None, "token-dropping MoE run: its capacity factor is not stated", ""
    preset, gpu = systems[r["system"]]
    model = MODELS[name][0]
    precision, fp8_recipe, _ = PRECISIONS[r["precision"]]
    gpus, tp, pp, cp = int(r["gpus"]), _int(r["tp"]), _int(r["pp"]), _int(r["cp"])
    vpp, ep = _int(r["vp"]), _int(r["ep"])
    fsdp = _int(r.get("fsdp", ""), 0)
    notes = []
    if r["precision"] == "FP8":
        notes.append("FP8 as current scaling (fp8cs)")
    if "w/ MTP" in r["model_name"]:
        notes.append("its MTP layer not modelled")
    if r["section"] == "SFT Performance":
        notes.append("SFT costed as pre-training at its sequence (packing not modelled)")
    kw = dict(devices=gpus, tp=tp, pp=pp, cp=cp, dp=gpus // (tp * pp * cp), ep=ep, etp=1, sp=tp > 1,
              zero=3 if fsdp else 1, micro_batch=int(r["mbs"]), global_batch=int(r["gbs"]), seq=int(r["seq"]),
              vpp=vpp, precision=precision, fp8_recipe=fp8_recipe, framework="megatron")
    if fsdp:
        notes.append("Megatron FSDP as ZeRO 3")
    recompute, layout, stack = "none", None, {"grad_reduce_bf16": True}
    if not r["recipe"]:
        notes.append(f"no {gpu} {PRECISIONS[r['precision']][2]} recipe for {gpus} GPUs: no recomputation, "
                     "Megatron's split, alltoall, no EP overlap, allocator default")
    else:
        differ = [f"{k}{r['r_' + k]}" for k in ("tp", "pp", "cp", "ep")
                  if r["r_" + k] and r["r_" + k] != str(kw[k])]
        rv = _int(r["r_vp"], 1) if r["r_vp"] not in ("", "None") else 1
        if r["r_vp"] and rv != vpp:
            differ.append(f"vp{rv}")
        if differ:
            notes.append("recipe degrees differ (" + " ".join(differ) + "): its other facts taken")
        if r["r_etp"] and r["r_etp"] not in ("1", "None"):
            notes.append(f"recipe expert TP {r['r_etp']} not taken (etp 1)")
        if r["recompute_granularity"] == "full":
            n_layers = _int(r["recompute_num_layers"], 0)
            recompute = "full"  # Megatron's block method (the first N layers of a stage) has no counterpart
            per_stage = LAYERS[model] / (pp * vpp)
            if r["recompute_method"] == "block" and n_layers and n_layers < per_stage:
                notes.append(f"block recompute of {n_layers} of {per_stage:g} layers per stage costed as full "
                             "(every layer): pessimistic")
        elif r["recompute_modules"] and r["recompute_granularity"] in ("selective", ""):
            recompute = "modules:" + r["recompute_modules"]
            if not r["recompute_granularity"]:
                notes.append("recompute granularity from the library base config, not read: modules taken as "
                             "selective")
        if r["pp_layout"] == "deepseek_v3 table":
            split = DSV3_LAYOUT.get((pp, vpp))
            layout = _layout_string(split) if split else None
            notes.append("DeepSeek-V3 layout table, MTP dropped" if split
                         else f"no DeepSeek-V3 layout for pp{pp} vp{vpp}: Megatron's split")
        elif r["pp_layout"]:
            layout = r["pp_layout"]
            if differ:
                layout = None
                notes.append("recipe layout not taken (other degrees)")
        if "deepep" in r["dispatcher"]:
            stack["moe_dispatcher"] = "deepep"
        elif "hybridep" in r["dispatcher"]:  # costed since the fifth session (cost.moe, HybridEP's measured rows)
            stack["moe_dispatcher"] = "hybridep"
        elif r["dispatcher"].startswith("flex"):
            notes.append(f"{r['dispatcher']} dispatcher costed as alltoall")
        stack["moe_ep_overlap"] = r["ep_overlap"] == "True" and model not in DENSE
        if stack["moe_ep_overlap"] and pp > 1 and vpp == 1:  # megatron-core refuses it (the recipe's VP differs)
            stack["moe_ep_overlap"] = False
            notes.append("the recipe's EP overlap off: Megatron refuses it with pp > 1 and no VP")
        if r["paged_stash"] == "True":
            notes.append("MoE paged stash (expert activations paged, CPU buffer) not modelled")
        if r["fp8_attention"] == "True":
            notes.append("FP8 attention not modelled (BF16)")
        if r["expandable_segments"] == "True":
            stack["expandable_segments"] = True
        if r["cpu_offload_layers"]:  # modelled since the first round was compared (Stack.cpu_offload_layers)
            stack["cpu_offload_layers"] = int(r["cpu_offload_layers"])
        # the low-precision facts (fifth session; columns of the second round's file only)
        if r.get("param_gather") == "True" and precision != "bf16":
            if precision == "fp4" and fsdp:
                notes.append("the recipe's fp4_param_gather under Megatron FSDP not modelled (BF16 weights)")
            else:
                stack["fp8_param_gather"] = True
        if r.get("bf16_layers") and precision != "bf16":
            stack["bf16_layers"] = tuple(int(x) for x in r["bf16_layers"].split(","))
    kw.update(recompute=recompute, pp_layout=layout, stack=Stack(**stack))
    said = (f"{model} on {gpus} {preset}: tp{tp} pp{pp} vpp{vpp} cp{cp} ep{ep} dp{kw['dp']} "
            f"{'sp ' if kw['sp'] else ''}zero{kw['zero']} mb{kw['micro_batch']} gb{kw['global_batch']} "
            f"seq{kw['seq']} {precision}{'/' + fp8_recipe if fp8_recipe else ''} recompute {recompute}"
            f"{' layout ' + layout if layout else ''}"
            + (" stack " + ",".join(f"{k}={v}" for k, v in Stack(**stack).differing().items())))
    return {"model": model, "cluster": preset, **kw}, "", "; ".join([said] + notes)


def evaluate(r: dict, systems: dict) -> dict:
    """The row's evaluation: predicted step, fits, reserved memory, band; or why it is skipped or refused."""
    kw, skip, said = describe(r, systems)
    out = evaluated(kw, skip, said)
    if "step_s" in out:  # as tokens/s/GPU, the tables' measure
        out["predicted"] = kw["global_batch"] * kw["seq"] / out["step_s"] / kw["devices"]
    return out


# -- files -----------------------------------------------------------------------------------------------------

def read_rows(rnd: Round, with_measured: bool) -> list[dict]:
    return _read_rows(rnd.runs, MEASURED, with_measured)


def sha256(rnd: Round) -> str:
    return _sha256(rnd.runs)


def write_parsed(rnd: Round, rows: list[dict]) -> None:
    frozen_write(rnd.runs, rows, list(PARSED) + list(MEASURED) + list(RECIPE_KEYS))


def check(rnd: Round) -> int:
    """Every row described and evaluated with the measured columns dropped: status counts and reasons."""
    return check_rows(read_rows(rnd, with_measured=False), lambda r: evaluate(r, rnd.systems),
                      lambda r: f"{r['doc_line']:>4} {r['container'][:8]:8} {r['system']:10} "
                                f"{r['model_name'][:22]:22} {r.get('precision', ''):8}")


def compare(rnd: Round) -> int:
    rows = read_rows(rnd, with_measured=True)
    out, done = [], []
    for r in rows:
        e = evaluate(r, rnd.systems)
        measured = float(r[MEASURED[0]]) if r[MEASURED[0]] else None
        res = {"container": r["container"], "section": r["section"], "model": r["model_name"], "system": r["system"],
               "gpus": r["gpus"], "precision": r.get("precision", ""),
               "degrees": f"tp{r['tp']} pp{r['pp']} cp{r['cp']} vp{r['vp']} ep{r['ep']}"
                          + (f" fsdp{r['fsdp']}" if r.get("fsdp") not in ("", "0", None) else ""),
               "gbs": r["gbs"], "mbs": r["mbs"], "seq": r["seq"], "measured": measured, "status": e["status"],
               "predicted": None, "error": None, "inside_band": None, "band_tokens": "", "reserved_gib": None,
               "why": e["why"], "described_as": e["described_as"], "doc_line": f"{r['source']}#L{r['doc_line']}"}
        if "step_s" in e and measured:
            gpus, gbs, seq = int(r["gpus"]), int(r["gbs"]), int(r["seq"])
            measured_step = gbs * seq / (measured * gpus)
            b = e["band"]
            res.update(predicted=e["predicted"], error=e["predicted"] / measured - 1,
                       inside_band=b.contains(measured_step), reserved_gib=e["reserved_gib"],
                       band_tokens=f"{gbs * seq / b.high_s / gpus:.0f}..{gbs * seq / b.low_s / gpus:.0f}")
            done.append((r, res))
        out.append(res)
    write_results(rnd.results, report(rnd, out, done), out)
    return 0


def report(rnd: Round, out: list[dict], done: list[tuple[dict, dict]]) -> list[str]:
    fits = [(r, x) for r, x in done if x["status"] == "fits"]
    lines = ["# Held-out test: Megatron-Bridge's published performance tables", "",
             f"Every table row of `docs/performance-summary.md` and `docs/performance-summary-archive.md` of {BRIDGE} "
             f"(frozen in `benchmarks/{rnd.runs.name}`, sha256 `{sha256(rnd)}`), described as SymTensor "
             "evaluations by `python benchmarks/bridge_perf_runs.py` (module docstring: the mapping, with the "
             "matching performance recipe's recomputation, layout and stack facts) and compared once. Nothing in "
             "the cost model was changed for it. Predicted tokens/s/GPU = global batch x sequence / predicted step "
             "/ GPUs; error = predicted / measured - 1 (+: optimistic). `inside band`: the measured step lies in "
             "the evaluation's error band (`cost.bands`; `band` as tokens/s/GPU).", ""]
    lines += [status_line(out), "",
              "## Summary (rows that fit)", "",
              "| group | rows | MAPE | mean signed error | inside band |", "|---|---:|---:|---:|---:|"]
    errs = [x["error"] for _, x in fits]
    lines.append(_summary("all", errs, [x["inside_band"] for _, x in fits]))
    groups: dict[str, list] = {}
    for r, x in fits:
        fam = "dense" if MODELS[_model_name(r["model_name"])][0] in DENSE else "MoE"
        prec, recipe, _ = PRECISIONS[r["precision"]]
        for key in (f"{r['system']} {recipe or prec}", fam):
            groups.setdefault(key, []).append(x)
    for key in sorted(groups):
        g = groups[key]
        lines.append(_summary(key, [x["error"] for x in g], [x["inside_band"] for x in g]))
    nofit = [x for _, x in done if x["status"] != "fits"]
    if nofit:
        lines += ["", nofit_line(nofit, "; their error is still listed"), ""]
    cols = ["container", "section", "model", "system", "gpus", "precision", "degrees", "gbs", "mbs", "seq",
            "measured", "predicted", "error", "status", "reserved_gib", "inside_band", "band_tokens", "why",
            "described_as"]
    return lines + row_table(out, cols, {"measured": lambda v: f"{v:.0f}", "predicted": lambda v: f"{v:.0f}"})


def main(argv: list[str]) -> int:
    name = argv[argv.index("--round") + 1] if "--round" in argv else "h100-b200-gb200"
    if name not in ROUNDS:
        print(f"round {name!r}; use one of {', '.join(ROUNDS)}")
        return 2
    rnd = ROUNDS[name]
    if "--parse" in argv:
        rows = parse(rnd)
        write_parsed(rnd, rows)
        print(f"wrote {len(rows)} rows to {rnd.runs} (sha256 {sha256(rnd)})")
        return 0
    if "--check" in argv:
        return check(rnd)
    return compare(rnd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
