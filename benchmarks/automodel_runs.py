"""A held-out test of the cost model on NVIDIA NeMo AutoModel's published training step times (frozen round 4).

    python benchmarks/automodel_runs.py --parse   # (once) writes the frozen test file automodel_runs.csv
    python benchmarks/automodel_runs.py --check   # each row described and evaluated, measured columns unread
    python benchmarks/automodel_runs.py           # the comparison (run once, by the lead): results/automodel_runs.*
    python benchmarks/automodel_runs.py --stated  # the rows with their stated kernels: results/automodel_runs_stated.*

Source: the tables of ``docs/performance-summary.md`` (``.mdx`` since 6255c40a7) of NVIDIA-NeMo/Automodel, in every
commit of that document on the history of ``HEAD`` (36044ad3d), read from the local mirror: the pre-training and the
fine-tuning (LoRA) tables under every system / precision heading. Columns as the document prints them (Model, #GPUs,
GBS, MBS, LBS, GA, Seq Length, TP, PP, CP, EP, VP, FSDP, Kernel Optimizations), then the measured ones kept apart and
last: ``step_time_s`` (Time per Global Step), ``model_tflops_per_gpu``, ``tokens_per_s_per_gpu``. A table with no
system heading (the LoRA table before 8473ee64c) takes the system of the document's note ("989 for BF16 H100"),
recorded as such.

Each row also carries what the benchmark YAML the document links for its model states (``yaml_facts``), read at a
commit that shows the row: the first such commit whose YAML agrees with the row on every batch and parallel size
both state, else the row's first commit with the disagreements listed (``yaml_vs_row``); and three facts of
AutoModel's code at that commit the YAML leaves to it (``code_facts``): whether FSDP2 reshards parameters after
forward, the dtype of the gradient reduce-scatter, and how ``layers_per_stage`` becomes the pipeline's virtual
stages. ``yaml_changes_later`` lists what the linked YAML changed in the later commits that repeat the row.

Dedupe: one row per distinct (section, model, system, precision, every configuration column, measured values), the
earliest commit that shows it; ``repeats_in`` lists the later commits that repeat it; ``same_measurement_as`` names an
earlier row that differs only in the Kernel Optimizations cell (a relabelled measurement).

Each row is then described as one SymTensor evaluation (``describe``): the cluster preset of its system, the zoo
preset of its model (LoRA as the preset's ``lora_rank`` / ``lora_targets`` overrides), PyTorch FSDP2 (``fsdp2``, the
engine nearest AutoModel) at ZeRO 3 where AutoModel reshards after forward and ZeRO 2 (FSDP2 without resharding, the
engine's own meaning) where it does not, the row's degrees (EP from the YAML where the row prints "-"), dp = GPUs /
(tp pp cp), the whole GBS, MBS and sequence, full recomputation where the YAML turns activation checkpointing on,
DeepEP and balanced routing (the fake balanced gate) for MoE rows, the pipeline split AutoModel's layers_per_stage
gives where it is uneven. A row the mapping cannot describe is skipped with the reason. Nothing in the cost model is
changed for this test.

``--stated`` describes each row again with the stack facts added after this round was frozen and read (the loss,
elementwise and attention kernels and the parameters' dtype, ``cost.stack_kernels``), each read from the frozen row's
own columns (``stated_facts``): a post-hoc description, not a held-out score; the frozen comparison stays as it was.

Predicted step vs the measured "Time per Global Step (s)"; error = measured step / predicted step - 1 (+: optimistic,
the throughput convention); a row is inside its band when the measured step lies in the band the evaluation prints
(``plan.document.config_band``).
"""

from __future__ import annotations

import math
import re
import sys
from functools import partial
from pathlib import Path

from symtensor.cost.pipeline import layout_string
from symtensor.errors import PlanError
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

REPO = "NVIDIA-NeMo/Automodel"
MIRROR = Path("/work/.mirror/NVIDIA-NeMo+Automodel/repo")
HEAD = "36044ad3d"  # the mirror's HEAD when the file was frozen; the document's history is read up to it
DOCS = ("docs/performance-summary.md", "docs/performance-summary.mdx")
LINK = "https://github.com/NVIDIA-NeMo/Automodel/tree/main/"
HERE = Path(__file__).resolve().parent
RUNS = HERE / "automodel_runs.csv"
MEASURED = ("step_time_s", "model_tflops_per_gpu", "tokens_per_s_per_gpu")  # the tables' measured columns, read once
# the document's column heads -> the CSV's names
HEADS = {"model": "model", "#gpus": "gpus", "gbs": "gbs", "mbs": "mbs", "lbs": "lbs", "ga": "ga",
         "seq length": "seq", "tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep", "vp": "vp", "fsdp": "fsdp",
         "kernel optimizations": "kernels", "time per global step (s)": "step_time_s",
         "model tflops/sec/gpu": "model_tflops_per_gpu", "tokens/sec/gpu": "tokens_per_s_per_gpu"}
CONFIG = ("gpus", "gbs", "mbs", "lbs", "ga", "seq", "tp", "pp", "cp", "ep", "vp", "fsdp", "kernels")
SYSTEMS = {"DGX-H100": "dgx-h100", "DGX-H200": "dgx-h200", "DGX-B200": "dgx-b200", "GB200": "gb200-nvl72",
           "GB200-NVL72": "gb200-nvl72", "DGX-GB200": "gb200-nvl72", "DGX-B300": "dgx-b300"}


git = partial(frozen_git, MIRROR, "NeMo AutoModel")
show = partial(frozen_show, MIRROR, "NeMo AutoModel")


def commits() -> list[tuple[str, str]]:
    """(commit, path) of every commit of the document on HEAD's history, oldest first (9-character hashes)."""
    out = []
    for c in git("log", "--reverse", "--abbrev=9", "--format=%h", HEAD, "--", *DOCS).split():
        path = next(p for p in reversed(DOCS) if show(c, p))
        out.append((c, path))
    return out


# -- the document's tables ---------------------------------------------------------------------------------------

def _cells(line: str) -> list[str]:
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") else line
    return [c.strip() for c in line.split("|")]


def _notes(text: str) -> str:
    """The bullets of the document's notes block (``## Notes``, ``:::{note}`` or ``<Note>``), joined by " / "."""
    lines, out, inside = text.splitlines(), [], False
    for line in lines:
        s = line.strip()
        if s in ("## Notes", ":::{note}", "<Note>"):
            inside = True
            continue
        if inside and (s in ("---", ":::", "</Note>") or s.startswith("#")):
            if out:
                break
            continue
        if inside and s.startswith("- "):
            out.append(s[2:].strip())
    return " / ".join(out)


def _links(text: str) -> list[tuple[str, str]]:
    """(yaml path, the text beside it) of every benchmark configuration the document links."""
    pat = re.compile(r"^\s*-\s*\[`([^`]+)`\]\(" + re.escape(LINK) + r"([^)]+\.yaml)\)\s*-?\s*(.*)$")
    return [(m.group(2), f"{m.group(1)} {m.group(3)}") for m in map(pat.match, text.splitlines()) if m]


def parse_doc(commit: str, path: str) -> list[dict]:
    """Every row of every table of the document at one commit, with its section and system heading."""
    text = show(commit, path)
    lines, rows, section, heading = text.splitlines(), [], "", ""
    note = re.search(r"\((\d+) for (BF16|FP8) (H100|H200|B200|GB200)\)", text)
    notes = _notes(text)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section, heading = line[3:].strip(), ""
        elif re.match(r"#{3,4} ", line) and "System:" in line:
            heading = line.lstrip("#").strip()
        if line.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\s*\|?\s*:?-{2,}[-|: ]*", lines[i + 1]):
            head = [h.lower() for h in _cells(line)]
            unknown = [h for h in head if h not in HEADS]
            if unknown:
                raise PlanError(f"{path}@{commit} line {i + 1}: unknown column(s) {unknown}")
            keys = [HEADS[h] for h in head]
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                cells = _cells(lines[j])
                row = dict(zip(keys, cells, strict=True))
                m = re.search(r"System:\s*([^,]+),\s*Precision:\s*(\S+)", heading)
                if m:
                    system, precision, said = m.group(1).strip(), m.group(2).strip(), "heading"
                elif note:
                    system, precision = f"DGX-{note.group(3)}", note.group(2)
                    said = f"no heading above the table: the document's note ({note.group(0)[1:-1]})"
                else:
                    system, precision, said = "", "", "not stated"
                for k in MEASURED:
                    row[k] = row[k].replace(",", "")
                rows.append({"source": f"{REPO}@{commit}", "path": path, "line": j + 1,
                             "section": "lora" if "lora" in section.lower() else "pretraining",
                             "heading": heading, "system": system, "precision": precision, "system_source": said,
                             **row, "doc_notes": notes, "_links": _links(text), "_commit": commit})
                j += 1
            i = j
            continue
        i += 1
    return rows


# -- the linked YAML -----------------------------------------------------------------------------------------------

FAMILIES = (("deepseek", r"deepseek"), ("kimi", r"kimi"), ("qwen3", r"qwen3"), ("qwen2.5", r"qwen2[._]5"),
            ("gpt-oss", r"gpt-?oss"), ("llama", r"llama"), ("nemotron", r"nemotron"))


def _family(text: str) -> str:
    return next((f for f, pat in FAMILIES if re.search(pat, text.lower())), "")


def _size(text: str) -> str:
    m = re.search(r"(?<![\d.])(\d+)B\b", text)
    return m.group(1) if m else ""


def match_yaml(row: dict, links: list[tuple[str, str]]) -> tuple[str, str]:
    """(yaml path, "") of the one linked YAML of the row's model, or ("", why not): same family, same size where
    both state one, fine-tuning (LoRA) or not as the row's table, and the node count where the link states one
    (one stating the row's node count preferred to one stating none)."""
    nodes = -(-int(row["gpus"]) // 8)
    found = []
    for path, said in links:
        text = f"{path} {said}"
        if _family(text) != _family(row["model"]):
            continue
        size = _size(said)
        if size and _size(row["model"]) and size != _size(row["model"]):
            continue
        if (row["section"] == "lora") != bool(re.search(r"lora|peft|fine-?tuning", text, re.I)):
            continue
        n = re.search(r"(\d+)[ _-]?nodes?\b", text)
        if n and int(n.group(1)) != nodes:
            continue
        found.append((path, bool(n)))
    exact = [p for p, stated in found if stated]
    found = exact or [p for p, _ in found]
    if len(found) == 1:
        return found[0], ""
    return "", ("no linked YAML names this model" if not found else "linked YAMLs " + ", ".join(found) +
                " all match")


def _find(tree, key: str, where: str = "") -> list[tuple[str, object]]:
    """(dotted path, value) of every ``key`` in a loaded YAML tree."""
    out = []
    if isinstance(tree, dict):
        for k, v in tree.items():
            here = f"{where}.{k}" if where else str(k)
            if k == key:
                out.append((here, v))
            out += _find(v, key, here)
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out += _find(v, key, f"{where}[{i}]")
    return out


def _text(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else str(v)


def _get(tree, key: str, prefer: str = "") -> str:
    """A key's value, the one under ``prefer`` (a top-level section) first, as text ("" where unstated)."""
    found = sorted(_find(tree, key), key=lambda f: bool(prefer) and not f[0].startswith(prefer + "."))
    return _text(found[0][1]) if found else ""


OTHER_KEYS = ("rope_fusion", "enable_fsdp_optimization", "enable_fsdp_optimizations", "fsdp_optimization_config",
              "wrap_outer_model", "defer_fsdp_grad_sync", "patch_is_packed_sequence", "fp32_upcast", "torch_dtype",
              "dp_replicate_size", "gc_every_steps", "num_nextn_predict_layers", "enable_hf_state_dict_adapter",
              "scale_grads_in_schedule", "force_hf")
YAML_KEYS = ("yaml_model_id", "yaml_gbs", "yaml_lbs", "yaml_tp", "yaml_pp", "yaml_cp", "yaml_ep", "yaml_dp",
             "yaml_pp_microbatch", "yaml_seq", "yaml_num_nodes", "activation_checkpointing", "attn_backend",
             "linear_backend", "rms_norm_backend", "moe_dispatcher", "experts_backend", "fake_balanced_gate",
             "pp_schedule", "layers_per_stage", "round_virtual_stages", "sequence_parallel", "async_tp",
             "torch_compile", "fsdp2_prefetch", "yaml_reshard_after_forward", "lora", "fp8", "optimizer", "loss",
             "yaml_other", "parallelizer")
# the facts whose later changes ``yaml_changes_later`` lists (the batch and parallel sizes are compared with the row)
FACT_CHANGES = ("activation_checkpointing", "attn_backend", "linear_backend", "rms_norm_backend", "moe_dispatcher",
                "experts_backend", "fake_balanced_gate", "pp_schedule", "layers_per_stage", "sequence_parallel",
                "async_tp", "torch_compile", "fsdp2_prefetch", "yaml_reshard_after_forward", "lora", "fp8",
                "optimizer", "yaml_ep", "yaml_gbs", "yaml_lbs", "yaml_pp", "yaml_tp", "yaml_cp")


def yaml_facts(commit: str, path: str) -> dict:
    """What the YAML at ``commit`` states, one column each ("" where it states nothing)."""
    import yaml

    text = show(commit, path)
    tree = yaml.safe_load(text) or {}
    model = tree.get("model", {}) or {}
    facts = {"yaml_model_id": _get(model, "pretrained_model_name_or_path"),
             "yaml_gbs": _get(tree, "global_batch_size"), "yaml_lbs": _get(tree, "local_batch_size"),
             "yaml_tp": _get(tree, "tp_size", "distributed"), "yaml_pp": _get(tree, "pp_size", "distributed"),
             "yaml_cp": _get(tree, "cp_size", "distributed"), "yaml_ep": _get(tree, "ep_size", "distributed"),
             "yaml_dp": _get(tree, "dp_size", "distributed"), "yaml_pp_microbatch": _get(tree, "pp_microbatch_size"),
             "yaml_seq": _get(tree.get("dataset", {}) or {}, "seq_len"), "yaml_num_nodes": _get(tree, "num_nodes"),
             "activation_checkpointing": _get(tree, "activation_checkpointing"),
             "attn_backend": _get(model, "attn") or (_get(model, "attn_implementation") and
                                                     "attn_implementation: " + _get(model, "attn_implementation")),
             "linear_backend": _get(model, "linear"), "rms_norm_backend": _get(model, "rms_norm"),
             "moe_dispatcher": _get(model, "dispatcher") or ("deepep" if _get(model, "enable_deepep") == "true" else
                                                             "enable_deepep false" if _get(model, "enable_deepep")
                                                             else ""),
             "experts_backend": _get(model, "experts"), "fake_balanced_gate": _get(model, "fake_balanced_gate"),
             "pp_schedule": _get(tree, "pp_schedule"), "layers_per_stage": _get(tree, "layers_per_stage"),
             "round_virtual_stages": _get(tree, "round_virtual_stages_to_pp_multiple"),
             "sequence_parallel": _get(tree, "sequence_parallel", "distributed"),
             "async_tp": _get(tree, "enable_async_tensor_parallel"), "torch_compile": _get(tree, "enable_compile"),
             "fsdp2_prefetch": _get(tree, "enable_fsdp2_prefetch"),
             "yaml_reshard_after_forward": _get(tree, "reshard_after_forward")}
    peft = tree.get("peft") or {}
    facts["lora"] = ", ".join(f"{k} {_text(v)}" for k, v in peft.items() if k != "_target_") if peft else ""
    fp8 = [f"{p}: {_text(v)}" for p, v in _walk(tree) if "fp8" in p.lower()]
    facts["fp8"] = "; ".join(fp8)
    facts["optimizer"] = _text((tree.get("optimizer") or {}).get("_target_"))
    facts["loss"] = _text((tree.get("loss_fn") or {}).get("_target_"))
    facts["yaml_other"] = "; ".join(f"{p}: {_text(v)}" for k in OTHER_KEYS for p, v in _find(tree, k))
    moe = ("components.moe.parallelizer" in text or "moe_config:" in text
           or bool(_find(tree.get("distributed") or {}, "moe")))
    facts["parallelizer"] = "moe" if moe else "fsdp2"
    return facts


def _walk(tree, where: str = ""):
    """(dotted path, value) of every leaf of a loaded YAML tree."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _walk(v, f"{where}.{k}" if where else str(k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _walk(v, f"{where}[{i}]")
    else:
        yield where, tree


def _disagree(row: dict, facts: dict) -> list[str]:
    """Where the YAML's batch and parallel sizes differ from the row's (each stated on both sides; the row's
    "-" and the YAML's silence state nothing; the pipeline micro-batch only where the row has PP > 1; the nodes
    as the row's GPUs over 8 per node, rounded up)."""
    pairs = [("gbs", "yaml_gbs", "global_batch_size"), ("lbs", "yaml_lbs", "local_batch_size"),
             ("tp", "yaml_tp", "tp_size"), ("pp", "yaml_pp", "pp_size"), ("cp", "yaml_cp", "cp_size"),
             ("ep", "yaml_ep", "ep_size"), ("seq", "yaml_seq", "seq_len")]
    if row["pp"].isdigit() and int(row["pp"]) > 1:
        pairs.append(("mbs", "yaml_pp_microbatch", "pp_microbatch_size"))
    out = [f"{name} {facts[y]} (row {row[r]})" for r, y, name in pairs
           if row[r].isdigit() and facts[y].isdigit() and int(row[r]) != int(facts[y])]
    if facts["yaml_num_nodes"].isdigit() and int(facts["yaml_num_nodes"]) != -(-int(row["gpus"]) // 8):
        out.append(f"num_nodes {facts['yaml_num_nodes']} (row {row['gpus']} GPUs)")
    return out


# -- what AutoModel's code at the YAML's commit does where the YAML is silent ---------------------------------------

MOE_PAR = "nemo_automodel/components/moe/parallelizer.py"
DENSE_PAR = "nemo_automodel/components/distributed/parallelizer.py"
STAGES = "nemo_automodel/components/distributed/pipelining/functional.py"


def code_facts(commit: str, facts: dict, pp: int) -> dict:
    """FSDP2's reshard_after_forward and the gradient reduce dtype (the YAML's where it states them, else the
    code's default), and the rule that turns ``layers_per_stage`` into virtual stages: each with its source."""
    out = {"reshard_after_forward": "", "reshard_source": "", "grad_reduce_dtype": "", "grad_reduce_source": "",
           "stage_rule": ""}
    if facts["yaml_reshard_after_forward"]:
        out.update(reshard_after_forward=facts["yaml_reshard_after_forward"], reshard_source="the yaml")
    elif facts["parallelizer"] == "moe":
        code = show(commit, MOE_PAR)
        dflt = re.search(r"def parallelize_model\(.*?reshard_after_forward: bool = (True|False)", code, re.S)
        if "reshard_after_forward=not pp_enabled" in code:
            out.update(reshard_after_forward=_text(pp == 1),
                       reshard_source=f"{REPO}@{commit}:{MOE_PAR} fully_shard(reshard_after_forward=not pp_enabled)")
        elif dflt:
            out.update(reshard_after_forward=dflt.group(1).lower(),
                       reshard_source=f"{REPO}@{commit}:{MOE_PAR} parallelize_model(reshard_after_forward: bool = "
                                      f"{dflt.group(1)})")
    else:
        code = show(commit, DENSE_PAR)
        if re.search(r"if pp_enabled:\s*reshard_after_forward = False", code):
            out.update(reshard_after_forward=_text(pp == 1),
                       reshard_source=f"{REPO}@{commit}:{DENSE_PAR} apply_fsdp2_sharding_recursively: False under "
                                      "PP, else every block but the last")
        elif "reshard_after_forward = int(layer_id) < len(module) - 1" in code:
            out.update(reshard_after_forward="true",
                       reshard_source=f"{REPO}@{commit}:{DENSE_PAR} apply_fsdp2_sharding_recursively: every block "
                                      "but the last")
    if facts["parallelizer"] == "moe":
        m = re.search(r"reduce_dtype=torch\.(\w+)", show(commit, MOE_PAR))
        where = f"{REPO}@{commit}:{MOE_PAR} apply_fsdp default MixedPrecisionPolicy"
    else:
        cfg = show(commit, "nemo_automodel/components/distributed/config.py")
        if "class FSDP2Config" in cfg:
            code, where = cfg[cfg.index("class FSDP2Config"):], "nemo_automodel/components/distributed/config.py"
        else:
            code = show(commit, "nemo_automodel/components/distributed/fsdp2.py")
            where = "nemo_automodel/components/distributed/fsdp2.py"
            code = code[code.index("class FSDP2Manager"):] if "class FSDP2Manager" in code else ""
        m = re.search(r"mp_policy.*?reduce_dtype=torch\.(\w+)", code, re.S)
        where = f"{REPO}@{commit}:{where} default MixedPrecisionPolicy (the yaml states none)"
    if m:
        out.update(grad_reduce_dtype=m.group(1), grad_reduce_source=where)
    if pp > 1 and facts["layers_per_stage"]:
        code = show(commit, STAGES)
        if "math.ceil(num_layers / layers_per_stage) + 1" in code:
            out["stage_rule"] = "ceil(layers / layers_per_stage) + 1"
        elif "math.ceil(num_layers / layers_per_stage)" in code:
            out["stage_rule"] = "ceil(layers / layers_per_stage)"
        if out["stage_rule"] and "if stage_idx < extra_layers" in code:
            out["stage_rule"] += (", rounded to a multiple of pp; layers // stages each, the first layers % stages "
                                  "one more")
        elif out["stage_rule"]:
            out["stage_rule"] += " (split rule not recognised)"
    return out


CODE_KEYS = ("reshard_after_forward", "reshard_source", "grad_reduce_dtype", "grad_reduce_source", "stage_rule")


def linked_facts(row: dict, shown: list[tuple[str, list]]) -> dict:
    """The YAML columns of a distinct row, ``shown`` the (commit, links) of every commit that shows it, oldest first."""
    paths = [(c, *match_yaml(row, links)) for c, links in shown]
    out = {"yaml_path": "", "yaml_commit": "", "yaml_vs_row": "", "yaml_note": "", "yaml_changes_later": "",
           **{k: "" for k in YAML_KEYS + CODE_KEYS}}
    usable = [(c, p) for c, p, _ in paths if p]
    if not usable:
        out["yaml_note"] = paths[0][2]
        return out
    pp = int(row["pp"]) if row["pp"].isdigit() else 1
    read = {c: yaml_facts(c, p) for c, p in usable}
    agree = [c for c, _ in usable if not _disagree(row, read[c])]
    chosen = agree[0] if agree else usable[0][0]
    facts = read[chosen]
    out.update(yaml_path=dict(usable)[chosen], yaml_commit=chosen, yaml_vs_row="; ".join(_disagree(row, facts)),
               **facts, **code_facts(chosen, facts, pp))
    first = paths[0][0]
    if chosen != first:
        out["yaml_note"] = (f"the yaml at the row's first commit {first} states " +
                            "; ".join(_disagree(row, read[first])) + f"; {chosen} is the first commit showing the row "
                            "whose linked yaml agrees with it")
    elif not agree:
        out["yaml_note"] = "no commit showing the row links a yaml that agrees with it: the first commit's is read"
    order = [c for c, _, _ in paths]
    later, changes, prev = [c for c, _ in usable if order.index(c) > order.index(chosen)], [], facts
    for c in later:
        now = read[c]
        diff = [f"{k} {prev[k] or '-'} -> {now[k] or '-'}" for k in FACT_CHANGES if now[k] != prev[k]]
        if dict(usable)[c] != out["yaml_path"] and not any("path" in d for d in changes):
            diff.insert(0, f"path -> {dict(usable)[c]}")
        if diff:
            changes.append(f"@{c}: " + ", ".join(diff))
        prev = now
    out["yaml_changes_later"] = "; ".join(changes)
    return out


# -- the frozen file -----------------------------------------------------------------------------------------------

PARSED = ("source", "path", "line", "section", "heading", "system", "precision", "system_source", "model") + CONFIG + (
    "repeats_in", "same_measurement_as", "doc_notes")
FACTS = ("yaml_path", "yaml_commit", "yaml_vs_row", "yaml_note") + YAML_KEYS + CODE_KEYS + ("yaml_changes_later",)


def _key(r: dict) -> tuple:
    return (r["section"], r["model"], r["system"], r["precision"]) + tuple(r[k] for k in CONFIG) + tuple(
        r[k] for k in MEASURED)


def _same_but_kernels(r: dict) -> tuple:
    return tuple(v for k, v in zip(("section", "model", "system", "precision") + CONFIG + MEASURED, _key(r),
                                   strict=True) if k != "kernels")


def parse() -> list[dict]:
    """The frozen rows: one per distinct run, the earliest commit that shows it, with its YAML's facts."""
    found: dict[tuple, dict] = {}
    shown: dict[tuple, list] = {}
    for commit, path in commits():
        for r in parse_doc(commit, path):
            key = _key(r)
            shown.setdefault(key, []).append((commit, r["_links"]))
            if key in found:
                if commit not in found[key]["repeats_in"].split():
                    found[key]["repeats_in"] = (found[key]["repeats_in"] + " " + commit).strip()
                continue
            r["repeats_in"] = ""
            found[key] = r
    rows, seen = [], {}
    for key, r in found.items():
        twin = seen.get(_same_but_kernels(r))
        r["same_measurement_as"] = (f"{twin['source'].split('@')[1]} line {twin['line']} (kernels "
                                    f"'{twin['kernels']}')") if twin else ""
        seen.setdefault(_same_but_kernels(r), r)
        r.update(linked_facts(r, shown[key]))
        rows.append(r)
    return rows


def write_parsed(rows: list[dict]) -> None:
    frozen_write(RUNS, rows, list(PARSED) + list(FACTS) + list(MEASURED), newline="\n")


# -- a row as one evaluation -----------------------------------------------------------------------------------------

# the document's model names -> zoo presets, with what the preset stands for where the yaml names another checkpoint
MODELS = {"DeepSeek V3 671B": ("deepseek-v3", ""),
          "Kimi K2": ("kimi-k2", "Kimi-K2-Base as the kimi-k2 preset (Kimi-K2-Instruct's config.json: the same "
                                 "architecture)"),
          "Qwen3 MoE 30B": ("qwen3-30b-a3b", ""),
          "GPT-OSS 120B": ("gpt-oss-120b", ""),
          "Llama3 70B": ("llama3-70b", "Llama 3.1 / 3.3 70B as the llama3-70b preset (the same dimensions)"),
          "Llama3 70B 2-node": ("llama3-70b", "Llama 3.3 70B as the llama3-70b preset (the same dimensions)"),
          "Llama3 8B": ("llama3-8b", "Llama 3.1 8B as the llama3-8b preset (the same dimensions)")}
SKIPPED = ((r"^Nemotron V3", "Nemotron V3 (Nano / Super / Ultra): hybrid Mamba-2 / attention / MoE layers "
                             "(nemo_automodel/components/models/nemotron_v3), which ModelConfig cannot express"),
           (r"^GPT-OSS 20B", "GPT-OSS 20B: no zoo preset, and its dimensions are stated neither in NVIDIA-NeMo/"
                             "Automodel (the yaml names openai/gpt-oss-20b only) nor in src/symtensor/data"),
           (r"^Qwen2\.5", "Qwen2.5 7B / 32B: no zoo preset, and their dimensions are stated neither in NVIDIA-NeMo/"
                          "Automodel (the yaml names the Hugging Face checkpoint only) nor in src/symtensor/data"))
LORA_ALL = "q,k,v,o,gate,up,down"  # match_all_linear: every linear projection of a layer


def _int(text: str, default: int = 1) -> int:
    return int(text) if text and text.isdigit() else default


def _lora(r: dict) -> tuple[dict, list[str]]:
    """The LoRA overrides (rank, targets) the yaml states, and notes."""
    said = dict(part.split(" ", 1) for part in r["lora"].split(", ") if " " in part)
    if said.get("match_all_linear", "").lower() != "true" or not said.get("dim", "").isdigit():
        raise PlanError(f"LoRA targets or rank not stated as match_all_linear / dim: {r['lora']!r}")
    notes = [f"LoRA rank {said['dim']} on every linear projection (match_all_linear)"]
    if said.get("dropout") and said["dropout"] not in ("0", "0.0"):
        notes.append(f"LoRA dropout {said['dropout']} not modelled")
    if said.get("use_triton", "").lower() == "true":
        notes.append("AutoModel's Triton LoRA kernels not modelled")
    return {"lora_rank": said["dim"], "lora_targets": LORA_ALL}, notes


def _split(layers: int, pp: int, vpp: int, r: dict) -> tuple[str | None, str]:
    """The pipeline layout AutoModel's layers_per_stage gives (``stage_rule``), where it is uneven and its virtual
    stages are the row's pp x VP; else None: (layout or None, note)."""
    if pp == 1 or not r["layers_per_stage"].isdigit() or not r["stage_rule"].endswith("one more"):
        return None, ""
    per = int(r["layers_per_stage"])
    stages = math.ceil(layers / per) + (1 if r["stage_rule"].startswith("ceil(layers / layers_per_stage) + 1")
                                        else 0)
    if stages % pp:
        stages += pp - stages % pp if r["round_virtual_stages"] == "up" else -(stages % pp)
    if stages != pp * vpp:
        return None, (f"layers_per_stage {per} gives {stages} virtual stages by {r['stage_rule'].split(',')[0]}, "
                      f"not pp x VP = {pp * vpp}: the row's VP taken, the evaluator's split")
    base, extra = divmod(layers, stages)
    split = tuple(base + (1 if k < extra else 0) for k in range(stages))
    if len(set(split)) == 1:
        return None, ""
    text = layout_string(split)
    return text, (f"pipeline layout {text}: layers_per_stage {per} under AutoModel's rule at {r['yaml_commit']} "
                  f"({r['stage_rule']})")


def stated_facts(r: dict) -> tuple[dict, list[str]]:
    """The stack facts (``Stack``'s loss, elementwise, attention and param_dtype) the row's own columns state, and
    what each is read from. AutoModel's model backends: ``attn: te`` is Transformer Engine's attention; ``rms_norm:
    te`` with its MoE layers' torch.compile'd SwiGLU (nemo_automodel/components/moe/layers.py ``@torch.compile def
    swiglu``) fused elementwise kernels, as is a compiled model; ``MaskedCrossEntropy`` with ``fp32_upcast: false`` the
    loss on the bf16 logits (its default, true, is the fsdp2 engine's own fp32 one); the parameters are kept in bf16
    where AutoModel builds its own model (a ``backend`` row: ``initialize_weights`` casts it to bf16) or the YAML
    loads it so (``model.torch_dtype: bf16``). FlexAttention (``attn: flex``) has no measured table: the engine's
    own. Under a pipeline, AutoModel runs a schedule per local batch: GBS / (dp x LBS) schedules per step
    (``Stack.pp_schedules``)."""
    facts, notes = {}, []
    if r["attn_backend"] == "te":
        facts["attention"] = "te"
    elif "sdpa" in r["attn_backend"]:  # (a Hugging Face model's attn_implementation: the fsdp2 engine's own)
        facts["attention"] = "sdpa"
    elif r["attn_backend"]:
        notes.append(f"attention {r['attn_backend']}: no measured table, the engine's own costed")
    if r["rms_norm_backend"] == "te" or r["torch_compile"] == "true":
        facts["elementwise"] = "fused"
    if r["loss"].endswith("MaskedCrossEntropy") and "fp32_upcast: false" in r["yaml_other"]:
        facts["loss"] = "bf16"
    elif r["loss"] and not r["loss"].endswith("MaskedCrossEntropy"):
        notes.append(f"loss {r['loss'].rsplit('.', 1)[-1]}: not expressible, the engine's own costed")
    if r["attn_backend"] or "model.torch_dtype: bf16" in r["yaml_other"]:
        facts["param_dtype"] = "bf16"
    dp = int(r["gpus"]) // (int(r["tp"]) * int(r["pp"]) * int(r["cp"]))
    lbs, gbs = _int(r["lbs"], 0), int(r["gbs"])
    if int(r["pp"]) > 1 and lbs and gbs % (dp * lbs) == 0 and gbs // (dp * lbs) > 1:
        facts["pp_schedules"] = gbs // (dp * lbs)  # one pipeline schedule of LBS / MBS micro-batches per LBS
    return facts, notes


def describe(r: dict, stated: bool = False) -> tuple[dict | None, str, str]:
    """(the keywords of ``api.evaluate``, or None; why the row is skipped, or ""; how it was described); ``stated``:
    with the stack facts its columns state (``stated_facts``)."""
    for pat, why in SKIPPED:
        if re.search(pat, r["model"]):
            return None, why, ""
    if r["model"] not in MODELS:
        return None, f"{r['model']}: no model mapping", ""
    if r["system"] not in SYSTEMS:
        return None, f"system {r['system']!r}: no cluster preset", ""
    if r["precision"] != "BF16":
        return None, f"precision {r['precision']!r}: only BF16 rows are mapped", ""
    base, model_note = MODELS[r["model"]]
    cfg = PRESETS[base]
    notes = [model_note] if model_note else []
    gpus, tp, pp, cp, mbs, gbs = (int(r[k]) for k in ("gpus", "tp", "pp", "cp", "mbs", "gbs"))
    seq, vpp = int(r["seq"]), _int(r["vp"])
    if r["ep"].isdigit():
        ep = int(r["ep"])
    elif r["yaml_ep"].isdigit():
        ep = int(r["yaml_ep"])
        notes.append(f"EP '-' in the table: ep_size {ep} of {r['yaml_path']}@{r['yaml_commit']}")
    else:
        ep = 1
        if cfg.is_moe:
            notes.append("EP '-' in the table and not stated by the yaml: 1")
    if gpus % (tp * pp * cp):
        return None, f"tp{tp} x pp{pp} x cp{cp} does not divide {gpus} GPUs", ""
    dp = gpus // (tp * pp * cp)
    if r["fsdp"].isdigit() and int(r["fsdp"]) != dp:
        notes.append(f"the table's FSDP {r['fsdp']} differs from gpus/(tp*pp*cp) = {dp}: the latter taken")
    if r["yaml_vs_row"]:
        notes.append(f"the linked yaml ({r['yaml_path']}@{r['yaml_commit']}) states {r['yaml_vs_row']}: the row's "
                     "values taken")
    lbs, ga = _int(r["lbs"], 0), _int(r["ga"], 0)
    if pp > 1 and ga > 1 and not stated:
        per = lbs // mbs if lbs and lbs % mbs == 0 else lbs / mbs
        notes.append(f"AutoModel runs GA {ga} pipeline schedules of LBS/MBS = {per} micro-batches per step; "
                     f"SymTensor costs one schedule of GBS/(dp*MBS) = {gbs // (dp * mbs)} micro-batches")
    if ga and lbs and dp * lbs * ga != gbs:
        notes.append(f"the table's dp {dp} x LBS {lbs} x GA {ga} = {dp * lbs * ga} is not its GBS {gbs}: GBS taken")
    reshard = r["reshard_after_forward"]
    zero = 2 if reshard == "false" else 3
    if dp > 1:
        notes.append(f"FSDP2 reshard_after_forward {reshard or 'not stated'} "
                     f"({r['reshard_source'] or 'ZeRO 3 assumed'}): ZeRO {zero}")
    recompute = "full" if r["activation_checkpointing"] == "true" else "none"
    if not r["activation_checkpointing"]:
        notes.append("activation checkpointing not stated in the yaml (AutoModel's default: off)")
    overrides = None
    if r["section"] == "lora":
        try:
            overrides, more = _lora(r)
        except PlanError as e:
            return None, str(e), ""
        notes += more
    stack: dict = {}
    if cfg.is_moe:
        stack["moe_routing"] = "balanced"
        notes.append("fake balanced gate: balanced routing")
        if "deepep" in r["kernels"].lower() or r["moe_dispatcher"] == "deepep":
            stack["moe_dispatcher"] = "deepep"
        if r["moe_dispatcher"] and r["moe_dispatcher"] != "deepep":
            notes.append(f"the yaml's dispatcher: {r['moe_dispatcher']}")
        if r["experts_backend"]:
            notes.append(f"experts backend {r['experts_backend']} not modelled")
    if r["grad_reduce_dtype"] == "bfloat16" and dp > 1:
        stack["grad_reduce_bf16"] = True
        notes.append(f"gradients reduce-scattered in bf16 ({r['grad_reduce_source']})")
    sp = tp > 1 and r["sequence_parallel"] == "true"
    layout, said = _split(cfg.layers, pp, vpp, r)
    if said:
        notes.append(said)
    kept = [f"attention {r['attn_backend']}" if r["attn_backend"] else "",
            f"linear {r['linear_backend']}" if r["linear_backend"] else "",
            f"RMSNorm {r['rms_norm_backend']}" if r["rms_norm_backend"] else "",
            "torch.compile" if r["torch_compile"] == "true" else "",
            "async TP" if r["async_tp"] == "true" else ""]
    if stated:
        facts, more = stated_facts(r)
        stack.update(facts)
        notes += more
    elif any(kept):
        notes.append("not modelled (the fsdp2 engine's PyTorch kernels costed): " + ", ".join(k for k in kept if k))
    kw = dict(model=base, cluster=SYSTEMS[r["system"]], devices=gpus, tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, etp=1,
              sp=sp, zero=zero, recompute=recompute, micro_batch=mbs, global_batch=gbs, seq=seq, vpp=vpp,
              framework="fsdp2", precision="bf16", pp_layout=layout, overrides=overrides, stack=Stack(**stack))
    said_kw = (f"{base}{'+lora' if overrides else ''} on {gpus} {kw['cluster']}: tp{tp} pp{pp} vpp{vpp} cp{cp} ep{ep} "
               f"dp{dp} {'sp ' if sp else ''}zero{zero} mb{mbs} gb{gbs} seq{seq} bf16 fsdp2 recompute {recompute}"
               + (" stack " + ",".join(f"{k}={v}" for k, v in kw["stack"].differing().items())
                  if kw["stack"].differing() else ""))
    return kw, "", "; ".join([said_kw] + notes)


def evaluate(r: dict, stated: bool = False) -> dict:
    """The row's evaluation: predicted step, fits, reserved memory, band; or why it is skipped or refused."""
    return evaluated(*describe(r, stated))


# -- modes -----------------------------------------------------------------------------------------------------------

def check() -> int:
    """Every row described and evaluated with the measured columns dropped: status counts and reasons."""
    return check_rows(read_rows(RUNS, MEASURED, with_measured=False), evaluate,
                      lambda r: f"{r['source'][-9:]} {r['section'][:4]} {r['model'][:26]:26} {r['gpus']:>5}")


def compare(stated: bool = False) -> int:
    out, done = [], []
    for r in read_rows(RUNS, MEASURED, with_measured=True):
        e = evaluate(r, stated)
        measured = float(r["step_time_s"]) if r["step_time_s"] else None
        res = {"source": r["source"], "section": r["section"], "model": r["model"], "system": r["system"],
               "gpus": r["gpus"], "degrees": f"tp{r['tp']} pp{r['pp']} cp{r['cp']} ep{r['ep']} vp{r['vp']}",
               "gbs": r["gbs"], "mbs": r["mbs"], "seq": r["seq"], "kernels": r["kernels"],
               "same_measurement_as": r["same_measurement_as"], "measured_s": measured,
               "predicted_s": e.get("step_s"), "error": None, "inside_band": None, "status": e["status"],
               "reserved_gib": e.get("reserved_gib"), "why": e["why"], "described_as": e["described_as"]}
        if compared(res, e, measured):
            done.append(res)
        out.append(res)
    if not stated:
        write_results("automodel_runs", report(out, done), out)
        return 0
    lines = report(out, done)
    lines[0] = "# NeMo AutoModel's training step times, each row with the kernels it states (post-hoc)"
    lines[1:1] = ["", "Not a held-out score: round 4 was frozen and read (`automodel_runs.md`) before the stack facts "
                  "used here existed; the rows are described again with the loss, elementwise and attention kernels "
                  "and the parameters' dtype their own frozen columns state (`python benchmarks/automodel_runs.py "
                  "--stated`, ``stated_facts``), nothing else changed."]
    write_results("automodel_runs_stated", lines, out)
    return 0


def report(out: list[dict], done: list[dict]) -> list[str]:
    def keys(x: dict) -> tuple:
        return (x["section"], x["model"], x["system"],
                "relabelled measurement (same_measurement_as)" if x["same_measurement_as"] else "first labelling")

    lines = step_report("Held-out test: NeMo AutoModel's training step times", "automodel_runs", out, done, keys)
    cols = ["source", "section", "model", "system", "gpus", "degrees", "gbs", "mbs", "seq", "kernels", "measured_s",
            "predicted_s", "error", "status", "reserved_gib", "inside_band", "same_measurement_as", "why",
            "described_as"]
    return lines + row_table(out, cols, {"measured_s": lambda v: f"{v:.3f}", "predicted_s": lambda v: f"{v:.3f}"})


def main(argv: list[str]) -> int:
    if "--parse" in argv:
        rows = parse()
        write_parsed(rows)
        print(f"wrote {len(rows)} rows to {RUNS} (sha256 {sha256(RUNS)}) from {len(commits())} commits of the document")
        return 0
    if "--check" in argv:
        return check()
    return compare("--stated" in argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
