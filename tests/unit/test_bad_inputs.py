"""The bad-input catalogue: every command, every kind of input, each case one clear line.

Issue "Hardening" tried 315 bad inputs; 39 leaked a traceback, 20 were silently wrong and 5 hung.
Each case here is one of those or an obvious neighbour. It must exit with status 2, print nothing
on stdout and exactly one line on stderr (``error: ...``, no traceback) that holds the case's key
words (what, where, the rule). Cases run ``symtensor.cli.main`` in this process; none starts a
worker process (``run`` cases fail before launching) and none runs a search. A few run the real
entry point, to show that no traceback reaches stderr there either.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from symtensor.cli import main

EVAL = ["evaluate", "llama2-7b", "--cluster", "dgx-h100", "--devices", "16", "--tp", "8"]
PLAN = ["plan", "tiny-llama", "--devices", "8"]
RUN = ["run", "tiny-llama", "--devices", "2"]
GRAPH = ["graph"]

LLAMA = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "vocab_size": 256}
GPT2 = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000}
CLUSTER = {"name": "mini", "device": {"name": "H100", "peak_tflops": {"bf16": 989}, "hbm_gbps": 3350, "memory_gib": 80},
           "levels": [{"name": "nvlink", "fanout": 8, "bandwidth_gbps": 450, "latency_us": 3},
                      {"name": "ib", "bandwidth_gbps": 50, "latency_us": 8}]}


def _set(doc, path, value):
    """A deep copy of ``doc`` with ``a.b.0.c`` (or a tuple of keys) set to ``value`` (``...`` deletes it)."""
    doc = json.loads(json.dumps(doc))
    keys = path.split(".") if isinstance(path, str) else path
    *keys, last = [int(k) if k.isdigit() else k for k in keys]
    node = doc
    for k in keys:
        node = node[k]
    if value is ...:
        del node[last]
    else:
        node[last] = value
    return doc


# name -> content of a config.json (dict, or raw text)
CONFIGS = {
    "tie-false-string": {**LLAMA, "tie_word_embeddings": "false"},
    "tie-true-string": {**GPT2, "tie_word_embeddings": "true"},
    "attention-bias-string": {**LLAMA, "attention_bias": "false"},
    "tie-number": {**LLAMA, "tie_word_embeddings": 0},
    "layers-million": {**LLAMA, "num_hidden_layers": 10**6},
    "layers-float": {**LLAMA, "num_hidden_layers": 2.0},
    "layers-string": {**LLAMA, "num_hidden_layers": "2"},
    "layers-negative": {**LLAMA, "num_hidden_layers": -2},
    "layers-zero": {**LLAMA, "num_hidden_layers": 0},
    "layers-bool": {**LLAMA, "num_hidden_layers": True},
    "layers-null": {**LLAMA, "num_hidden_layers": None},
    "heads-zero": {**LLAMA, "num_attention_heads": 0},
    "kv-heads-not-dividing": {**LLAMA, "num_key_value_heads": 3},
    "vocab-huge": {**LLAMA, "vocab_size": 2**40},
    "hidden-bool": {**LLAMA, "hidden_size": True},
    "hidden-nan": '{"num_hidden_layers": 2, "hidden_size": NaN, "num_attention_heads": 4, '
                  '"intermediate_size": 128, "vocab_size": 256}',
    "hidden-infinity": '{"num_hidden_layers": 2, "hidden_size": Infinity, "num_attention_heads": 4, '
                       '"intermediate_size": 128, "vocab_size": 256}',
    "ffn-list": {**LLAMA, "intermediate_size": [128]},
    "experts-negative": {**LLAMA, "num_local_experts": -8},
    "top-k-above-experts": {**LLAMA, "num_local_experts": 4, "num_experts_per_tok": 8},
    "context-zero": {**LLAMA, "max_position_embeddings": 0},
    "head-dim-string": {**LLAMA, "head_dim": "16"},
    "hidden-act-number": {**LLAMA, "hidden_act": 5},
    "gpt2-n-inner-string": {**GPT2, "n_inner": "256"},
    "gpt2-heads-not-dividing": {**GPT2, "n_head": 3},
    "gpt2-missing-n-head": _set(GPT2, "n_head", ...),
    "llama-missing-vocab": _set(LLAMA, "vocab_size", ...),
    "json-list": [LLAMA],
    "json-string": "\"llama\"",
    "empty-file": "",
    "trailing-comma": '{"num_hidden_layers": 2,}',
    "deeply-nested": "[" * 100_000 + "]" * 100_000,
    "huge-integer": '{"num_hidden_layers": ' + "9" * 5000 + "}",
}

# name -> a cluster file (dict -> JSON, or raw text; the suffix is the name's)
CLUSTERS = {
    "nan-bandwidth.json": '{"device": {"name": "d", "peak_tflops": {"bf16": 989}, "hbm_gbps": 3350, '
                          '"memory_gib": 80}, "levels": [{"name": "nvlink", "fanout": 8, "bandwidth_gbps": NaN, '
                          '"latency_us": 3}, {"name": "ib", "bandwidth_gbps": 50, "latency_us": 8}]}',
    "inf-bandwidth.yaml": "device: {name: d, peak_tflops: {bf16: 989}, hbm_gbps: 3350, memory_gib: 80}\n"
                          "levels:\n  - {name: nvlink, fanout: 8, bandwidth_gbps: .inf, latency_us: 3}\n"
                          "  - {name: ib, bandwidth_gbps: 50, latency_us: 8}\n",
    "nan-latency.yaml": "device: {name: d, peak_tflops: {bf16: 989}, hbm_gbps: 3350, memory_gib: 80}\n"
                        "levels:\n  - {name: nvlink, fanout: 8, bandwidth_gbps: 450, latency_us: .nan}\n"
                        "  - {name: ib, bandwidth_gbps: 50, latency_us: 8}\n",
    "nan-memory.yaml": "device: {name: d, peak_tflops: {bf16: 989}, hbm_gbps: 3350, memory_gib: .nan}\n"
                       "levels:\n  - {name: ib, bandwidth_gbps: 50, latency_us: 8}\n",
    "inf-peak.yaml": "device: {name: d, peak_tflops: {bf16: .inf}, hbm_gbps: 3350, memory_gib: 80}\n"
                     "levels:\n  - {name: ib, bandwidth_gbps: 50, latency_us: 8}\n",
    "nan-hbm.yaml": "device: {name: d, peak_tflops: {bf16: 989}, hbm_gbps: .nan, memory_gib: 80}\n"
                    "levels:\n  - {name: ib, bandwidth_gbps: 50, latency_us: 8}\n",
    "negative-latency.json": _set(CLUSTER, "levels.1.latency_us", -8),
    "negative-bandwidth.json": _set(CLUSTER, "levels.0.bandwidth_gbps", -450),
    "zero-hbm.json": _set(CLUSTER, "device.hbm_gbps", 0),
    "negative-memory.json": _set(CLUSTER, "device.memory_gib", -80),
    "string-peak.json": _set(CLUSTER, "device.peak_tflops.bf16", "989"),
    "bool-peak.json": _set(CLUSTER, "device.peak_tflops.bf16", True),
    "huge-bandwidth.json": _set(CLUSTER, "levels.0.bandwidth_gbps", 1e300),
    "huge-peak.json": _set(CLUSTER, "device.peak_tflops.bf16", 1e307),
    "empty-peaks.json": _set(CLUSTER, "device.peak_tflops", {}),
    "fanout-negative.json": _set(CLUSTER, "levels.0.fanout", -8),
    "fanout-string.json": _set(CLUSTER, "levels.0.fanout", "8"),
    "fanout-zero-inner.json": _set(CLUSTER, "levels.0.fanout", 0),
    "fanout-huge.json": _set(CLUSTER, "levels.0.fanout", 2**40),
    "levels-empty.json": _set(CLUSTER, "levels", []),
    "levels-many.json": _set(CLUSTER, "levels", [{"name": f"l{i}", "fanout": 1, "bandwidth_gbps": 1,
                                                 "latency_us": 1} for i in range(40)]),
    "levels-dict.json": _set(CLUSTER, "levels", {"name": "ib"}),
    "level-name-markup.json": _set(CLUSTER, "levels.0.name", "[red]nvlink"),
    "level-name-escape.json": _set(CLUSTER, "levels.0.name", "nv\u001b[2Jlink"),
    "level-name-number.json": _set(CLUSTER, "levels.0.name", 7),
    "name-too-long.json": _set(CLUSTER, "name", "x" * 300),
    "device-name-empty.json": _set(CLUSTER, "device.name", ""),
    "missing-device.json": _set(CLUSTER, "device", ...),
    "unknown-key.json": _set(CLUSTER, "nodes", 4),
    "unknown-level-key.json": _set(CLUSTER, "levels.0.speed", 4),
    "cluster-list.json": [CLUSTER],
    "bad-yaml.yaml": "device: {name: d\nlevels: [\n",
    "yaml-tag.yaml": "device: !!python/object:os.system {}\nlevels: []\n",
    "alias-bomb.yaml": "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")),
    "binary.yaml": b"\x00\x01\x02\xff" * 64,
    "not-utf8.yaml": b"name: caf\xe9\n",
}


def _plan_template(tmp: Path) -> dict:
    """A small valid plan file (tiny-llama, 8 H100s, searched over the Megatron space)."""
    from symtensor.hardware import load_cluster
    from symtensor.models import PRESETS
    from symtensor.plan import save_plan
    from symtensor.search import search

    path = tmp / "good-plan.json"
    save_plan(search(PRESETS["tiny-llama"], load_cluster("dgx-h100", devices=8), 16, 16, space="megatron"), path)
    return json.loads(path.read_text())


def _plans(good: dict) -> dict:
    """name -> a hand-edited plan file (dict, or raw text)."""
    op = next(iter(good["layouts"]))
    return {
        "plan-list": [good],
        "plan-missing-layouts": _set(good, "layouts", ...),
        "plan-unknown-key": _set(good, "extra", 1),
        "plan-format": _set(good, "format", "symtensor-plan/9"),
        "plan-model-missing-hidden": _set(good, "model.hidden", ...),
        "plan-model-hidden-string": _set(good, "model.hidden", "64"),
        "plan-model-layers-zero": _set(good, "model.layers", 0),
        "plan-model-layers-million": _set(good, "model.layers", 10**6),
        "plan-model-tied-string": _set(good, "model.tied", "false"),
        "plan-model-unknown-key": _set(good, "model.depth", 2),
        "plan-model-string": _set(good, "model", "tiny-llama"),
        "plan-model-capacity-nan": _set(good, "model.capacity_factor", float("nan")),
        "plan-model-targets-string": _set(good, "model.lora_targets", "q"),
        "plan-cluster-devices-zero": _set(good, "cluster.devices", 0),
        "plan-cluster-devices-huge": _set(good, "cluster.devices", 8000000000000296),
        "plan-cluster-bandwidth-nan": _set(good, "cluster.levels.0.bandwidth", float("nan")),
        "plan-cluster-bandwidth-negative": _set(good, "cluster.levels.0.bandwidth", -1.0),
        "plan-cluster-latency-inf": _set(good, "cluster.levels.0.latency", float("inf")),
        "plan-cluster-peak-nan": _set(good, "cluster.device.peak_flops.bf16", float("nan")),
        "plan-cluster-memory-string": _set(good, "cluster.device.memory", "80GiB"),
        "plan-cluster-levels-dict": _set(good, "cluster.levels", {}),
        "plan-cluster-level-name": _set(good, "cluster.levels.0.name", "[bold]x"),
        "plan-cluster-missing-device": _set(good, "cluster.device", ...),
        "plan-train-batch-zero": _set(good, "train.global_batch", 0),
        "plan-train-pp-string": _set(good, "train.pp", "2"),
        "plan-train-unknown-key": _set(good, "train.speed", 1),
        "plan-train-zero-stage": _set(good, "train.zero", 7),
        "plan-train-recompute": _set(good, "train.recompute", "some"),
        "plan-train-split-string": _set(good, "train.layer_split", "1,1"),
        "plan-seq-zero": _set(good, "seq", 0),
        "plan-seq-string": _set(good, "seq", "16"),
        "plan-seq-negative": _set(good, "seq", -16),
        "plan-mesh-dict": _set(good, "mesh", {}),
        "plan-mesh-renamed": _set(good, "mesh.0.name", "ib9"),
        "plan-mesh-size-string": _set(good, "mesh.0.size", "2"),
        "plan-layouts-list": _set(good, "layouts", []),
        "plan-layout-unknown-op": _set(good, ("layouts", "no_such_op"), {"b": []}),
        "plan-layout-unknown-axis": _set(good, ("layouts", op), {"b": ["ib9"]}),
        "plan-layout-axes-string": _set(good, ("layouts", op), {"b": "nvlink1"}),
        "plan-layout-unknown-dim": _set(good, ("layouts", op), {"zz": [good["mesh"][0]["name"]]}),
        "plan-layout-cuts-list": _set(good, ("layouts", op), ["b"]),
        "plan-config-list": _set(good, "config", []),
        "plan-not-json": "plan: yes",
    }


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """Every file a case names: {placeholder: path}."""
    tmp = tmp_path_factory.mktemp("bad")
    out = {"dir": str(tmp), "missing": str(tmp / "no-such-dir" / "x.json")}

    def put(name: str, content, suffix: str = "") -> None:
        path = tmp / (name + suffix)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content if isinstance(content, str) else json.dumps(content))
        out[name] = str(path)

    for name, content in CONFIGS.items():
        put(name, content, ".json")
    for name, content in CLUSTERS.items():
        put(name, content)
    good = _plan_template(tmp)
    out["good-plan"] = str(tmp / "good-plan.json")
    for name, content in _plans(good).items():
        put(name, content, ".json")
    other = _set(good, "model.ffn", 96)  # a tiny-llama plan, but for another MLP width
    other = _set(other, "model.moe_ffn", 96)
    put("plan-other-dims", other, ".json")
    put("binary", b"\x7fELF\x00\x00\x01" * 100)
    put("big", " " * (9 * 2**20) + "{}", ".json")
    (tmp / "adir.json").mkdir()
    out["adir.json"] = str(tmp / "adir.json")
    os.mkfifo(tmp / "fifo.json")
    out["fifo"] = str(tmp / "fifo.json")
    (tmp / "link.json").symlink_to(tmp / "target.json")
    out["link"] = str(tmp / "link.json")
    return out


C = "--cluster"
# (id, argv, key words of the message); {name} is a file of the fixture
CASES = [
    # -- command-line sizes: zero, negative, huge, not a number -----------------------------------
    ("plan-micro-batch-0", PLAN + ["--micro-batch", "0"], ["--micro-batch", "positive integer"]),
    ("plan-micro-batch-neg", PLAN + ["--micro-batch", "-1"], ["--micro-batch", "positive integer", "-1"]),
    ("plan-micro-batch-word", PLAN + ["--micro-batch", "many"], ["--micro-batch", "integer or auto"]),
    ("plan-micro-batch-float", PLAN + ["--micro-batch", "1.5"], ["--micro-batch", "integer or auto"]),
    ("plan-micro-batch-huge", PLAN + ["--micro-batch", str(2**40)], ["--micro-batch", "limit"]),
    ("plan-global-batch-neg", PLAN + ["--global-batch", "-1"], ["--global-batch", "positive integer"]),
    ("plan-global-batch-0", PLAN + ["--global-batch", "0"], ["--global-batch", "positive integer", "got 0"]),
    ("plan-global-batch-huge", PLAN + ["--global-batch", str(10**12)], ["--global-batch", "limit"]),
    ("plan-global-batch-word", PLAN + ["--global-batch", "lots"], ["--global-batch", "invalid int"]),
    ("plan-seq-0", PLAN + ["--seq", "0"], ["--seq", "positive integer", "got 0"]),
    ("plan-seq-neg", PLAN + ["--seq", "-8192"], ["--seq", "positive integer"]),
    ("plan-seq-huge", PLAN + ["--seq", str(2**30)], ["--seq", "limit"]),
    ("plan-seq-float", PLAN + ["--seq", "8192.0"], ["--seq", "invalid int"]),
    ("plan-devices-0", ["plan", "tiny-llama", "--devices", "0"], ["--devices", "positive integer"]),
    ("plan-devices-neg", ["plan", "tiny-llama", "--devices", "-8"], ["--devices", "positive integer"]),
    ("plan-devices-pathological", ["plan", "tiny-llama", "--devices", "8000000000000296"],
     ["--devices", "limit", "1,048,576"]),
    ("plan-devices-big-prime", ["plan", "tiny-llama", "--devices", "1000000007"], ["--devices", "limit"]),
    ("plan-nodes-0", ["plan", "tiny-llama", "--nodes", "0"], ["--nodes", "positive integer"]),
    ("plan-nodes-huge", ["plan", "tiny-llama", "--nodes", "1000000"], ["device count", "limit"]),
    ("plan-devices-and-nodes", ["plan", "tiny-llama", "--devices", "8", "--nodes", "1"], ["not allowed with"]),
    ("plan-partial-node", ["plan", "tiny-llama", "--devices", "12"], ["not a whole number of nvlink groups"]),
    ("plan-space", PLAN + ["--space", "alpa"], ["--space", "invalid choice"]),
    ("plan-unknown-flag", PLAN + ["--fast"], ["unrecognized arguments: --fast"]),
    ("plan-unknown-cluster", PLAN + [C, "dgx-h900"], ["unknown cluster", "dgx-h100"]),
    ("plan-empty-cluster", PLAN + [C, ""], ["--cluster", "empty"]),
    ("plan-empty-model", ["plan", "", "--devices", "8"], ["MODEL", "empty"]),
    ("plan-unknown-model", ["plan", "llama9-8b", "--devices", "8"], ["unknown model", "llama3-8b"]),
    ("plan-torch-no-colon", PLAN + ["--torch", "mymodels"], ["--torch mymodels", "package.module:factory"]),
    ("plan-torch-no-factory", PLAN + ["--torch", "mymodels:"], ["--torch mymodels:", "package.module:factory"]),
    # -- --set overrides ---------------------------------------------------------------------------
    ("set-capacity-nan", PLAN + ["--set", "capacity_factor=nan"], ["capacity_factor", "finite"]),
    ("set-capacity-inf", PLAN + ["--set", "capacity_factor=inf"], ["capacity_factor", "finite"]),
    ("set-capacity-neg", PLAN + ["--set", "capacity_factor=-1"], ["capacity_factor", "positive"]),
    ("set-layers-0", PLAN + ["--set", "layers=0"], ["layers", "positive integer"]),
    ("set-layers-million", PLAN + ["--set", "layers=1000000"], ["layers", "limit of 1,024"]),
    ("set-layers-word", PLAN + ["--set", "layers=many"], ["--set layers=many", "int"]),
    ("set-layers-float", PLAN + ["--set", "layers=2.5"], ["--set layers=2.5", "int"]),
    ("set-unknown-field", PLAN + ["--set", "layerz=4"], ["unknown model field", "layers"]),
    ("set-no-equals", PLAN + ["--set", "layers"], ["key=value"]),
    ("set-bool-word", PLAN + ["--set", "tied=maybe"], ["--set tied=maybe", "bool"]),
    ("set-vocab-huge", PLAN + ["--set", "vocab=100000000"], ["vocab", "limit"]),
    ("set-hidden-neg", PLAN + ["--set", "hidden=-64"], ["hidden", "positive integer"]),
    ("set-heads-not-dividing", PLAN + ["--set", "heads=3"], ["heads=3 must divide hidden=64"]),
    ("set-kv-heads-not-dividing", PLAN + ["--set", "kv_heads=3"], ["kv_heads=3 must divide heads=4"]),
    ("set-top-k-dense", PLAN + ["--set", "top_k=4"], ["top_k=4 exceeds experts=1"]),
    ("set-lora-rank-neg", PLAN + ["--set", "lora_rank=-1"], ["lora_rank", ">= 0"]),
    ("set-lora-target", PLAN + ["--set", "lora_rank=4", "--set", "lora_targets=qkvo"], ["unknown lora target"]),
    ("set-empty-name", PLAN + ["--set", "name="], ["model name", "non-empty"]),
    ("set-family", PLAN + ["--set", "family=bert"], ["family='bert'", "gpt, llama"]),
    ("set-attention-kernel", EVAL + ["--set", "attention=triton"],
     ["attention='triton'", "flash, flash2, flash1, unfused"]),
    ("set-dense-layers", PLAN + ["--set", "dense_layers=9"], ["dense_layers=9"]),
    ("set-rotary-percent", PLAN + ["--set", "rotary_percent=1.5"], ["rotary_percent", "(0, 1]"]),
    ("set-rotary-percent-zero", PLAN + ["--set", "rotary_percent=0"], ["rotary_percent", "positive"]),
    ("set-norm", PLAN + ["--set", "norm=batchnorm"], ["norm='batchnorm'", "rmsnorm, layernorm, layernorm1p"]),
    # -- evaluate ----------------------------------------------------------------------------------
    ("evaluate-tp-0", EVAL[:-1] + ["0"], ["--tp", "positive integer"]),
    ("evaluate-pp-0", EVAL + ["--pp", "0"], ["--pp", "positive integer"]),
    ("evaluate-cp-0", EVAL + ["--cp", "0"], ["--cp", "positive integer"]),
    ("evaluate-ep-0", EVAL + ["--ep", "0"], ["--ep", "positive integer"]),
    ("evaluate-vpp-0", EVAL + ["--vpp", "0"], ["--vpp", "positive integer"]),
    ("evaluate-dp-0", EVAL + ["--dp", "0"], ["--dp", "positive integer"]),
    ("evaluate-tp-neg", EVAL[:-1] + ["-2"], ["--tp", "positive integer"]),
    ("evaluate-tp-huge", EVAL[:-1] + [str(2**40)], ["--tp", "limit"]),
    ("evaluate-tp-word", EVAL[:-1] + ["eight"], ["--tp", "invalid int"]),
    ("evaluate-tp-3", EVAL[:-1] + ["3"], ["tp*pp*cp = 3 does not divide the 16 devices"]),
    ("evaluate-product", EVAL + ["--dp", "4"], ["= 32 but the cluster has 16 devices"]),
    ("evaluate-batch", EVAL + ["--dp", "2", "--global-batch", "7"], ["global batch 7 is not divisible"]),
    ("evaluate-zero", EVAL + ["--zero", "5"], ["--zero", "invalid choice"]),
    ("evaluate-recompute", EVAL + ["--recompute", "some"], ["--recompute", "invalid choice"]),
    ("evaluate-micro-batch-0", EVAL + ["--micro-batch", "0"], ["--micro-batch", "positive integer"]),
    ("evaluate-micro-batch-neg", EVAL + ["--micro-batch", "-4"], ["--micro-batch", "positive integer"]),
    ("evaluate-seq-0", EVAL + ["--seq", "0"], ["--seq", "positive integer"]),
    ("evaluate-no-devices", ["evaluate", "llama2-7b", C, "dgx-h100", "--tp", "8"], ["--nodes", "--devices"]),
    ("evaluate-no-cluster", ["evaluate", "llama2-7b", "--devices", "8"], ["--cluster"]),
    ("evaluate-cluster-missing-file", ["evaluate", "llama2-7b", C, "./nope.yaml", "--devices", "8"],
     ["unknown cluster", "nope.yaml"]),
    # -- graph: model files ------------------------------------------------------------------------
    ("graph-empty-model", GRAPH + [""], ["MODEL", "empty"]),
    ("graph-directory", GRAPH + ["{dir}"], ["is a directory"]),
    ("graph-directory-json", GRAPH + ["{adir.json}"], ["is a directory"]),
    ("graph-binary", GRAPH + ["{binary}"], ["binary file"]),
    ("graph-dev-zero", GRAPH + ["/dev/zero"], ["/dev/zero", "not a regular file"]),
    ("graph-fifo", GRAPH + ["{fifo}"], ["not a regular file"]),
    ("graph-big-file", GRAPH + ["{big}"], ["above the limit of 8,388,608"]),
    ("graph-missing-file", GRAPH + ["{missing}"], ["does not exist"]),
    ("graph-dangling-link", GRAPH + ["{link}"], ["does not exist"]),
    ("graph-micro-batch-0", GRAPH + ["tiny-llama", "--micro-batch", "0"], ["--micro-batch", "positive integer"]),
    ("graph-micro-batch-neg", GRAPH + ["tiny-llama", "--micro-batch", "-3"], ["--micro-batch", "positive integer"]),
    ("graph-seq-0", GRAPH + ["tiny-llama", "--seq", "0"], ["--seq", "positive integer"]),
    ("graph-batch-not-multiple", GRAPH + ["tiny-llama", "--micro-batch", "2", "--global-batch", "3"],
     ["not a multiple of the micro batch 2"]),
    ("graph-not-utf8", GRAPH + ["{not-utf8.yaml}"], ["not UTF-8"]),
]
CONFIG_WORDS = {
    "tie-false-string": ["tie_word_embeddings", "the string 'false'", "without quotes"],
    "tie-true-string": ["tie_word_embeddings", "the string 'true'"],
    "attention-bias-string": ["attention_bias", "the string 'false'"],
    "tie-number": ["tie_word_embeddings", "true or false"],
    "layers-million": ["num_hidden_layers", "limit of 1,024"],
    "layers-float": ["num_hidden_layers", "must be an integer", "2.0"],
    "layers-string": ["num_hidden_layers", "must be an integer", "a string"],
    "layers-negative": ["num_hidden_layers", "positive integer", "-2"],
    "layers-zero": ["num_hidden_layers", "positive integer", "got 0"],
    "layers-bool": ["num_hidden_layers", "must be an integer", "True"],
    "layers-null": ["num_hidden_layers", "must be an integer", "None"],
    "heads-zero": ["num_attention_heads", "positive integer"],
    "kv-heads-not-dividing": ["kv_heads=3 must divide heads=4"],
    "vocab-huge": ["vocab_size", "limit"],
    "hidden-bool": ["hidden_size", "must be an integer"],
    "hidden-nan": ["hidden_size", "must be an integer", "nan"],
    "hidden-infinity": ["hidden_size", "must be an integer", "inf"],
    "ffn-list": ["intermediate_size", "must be an integer"],
    "experts-negative": ["num_local_experts", ">= 0"],
    "top-k-above-experts": ["top_k=8 exceeds experts=4"],
    "context-zero": ["max_position_embeddings", "positive integer"],
    "head-dim-string": ["head_dim", "a string"],
    "hidden-act-number": ["hidden_act", "non-empty string"],
    "gpt2-n-inner-string": ["n_inner", "a string"],
    "gpt2-heads-not-dividing": ["heads=3 must divide hidden=64"],
    "gpt2-missing-n-head": ["missing key(s) n_head"],
    "llama-missing-vocab": ["missing key(s) vocab_size"],
    "json-list": ["expected a JSON object", "list"],
    "json-string": ["expected a JSON object", "str"],
    "empty-file": ["not valid JSON"],
    "trailing-comma": ["not valid JSON", "line 1"],
    "deeply-nested": ["nested too deeply"],
    "huge-integer": ["cannot parse", "digits"],
}
CASES += [(f"config-{name}", GRAPH + ["{" + name + "}"], words) for name, words in CONFIG_WORDS.items()]
CASES += [(f"evaluate-config-{name}", ["evaluate", "{" + name + "}", C, "dgx-h100", "--devices", "8"], words)
          for name, words in list(CONFIG_WORDS.items())[:4]]
CLUSTER_WORDS = {
    "nan-bandwidth.json": ["levels[0]: bandwidth_gbps", "finite", "nan"],
    "inf-bandwidth.yaml": ["levels[0]: bandwidth_gbps", "finite", "inf"],
    "nan-latency.yaml": ["levels[0]: latency_us", "finite"],
    "nan-memory.yaml": ["device: memory_gib", "finite"],
    "inf-peak.yaml": ["device.peak_tflops: bf16", "finite"],
    "nan-hbm.yaml": ["device: hbm_gbps", "finite"],
    "negative-latency.json": ["levels[1]: latency_us", ">= 0", "-8"],
    "negative-bandwidth.json": ["levels[0]: bandwidth_gbps", "positive number", "-450"],
    "zero-hbm.json": ["device: hbm_gbps", "positive number", "got 0"],
    "negative-memory.json": ["device: memory_gib", "positive number"],
    "string-peak.json": ["peak_tflops: bf16", "positive number", "without quotes"],
    "bool-peak.json": ["peak_tflops: bf16", "positive number", "True"],
    "huge-bandwidth.json": ["bandwidth_gbps", "limit of 1e+06"],
    "huge-peak.json": ["peak_tflops: bf16", "limit"],
    "empty-peaks.json": ["peak_tflops must map dtypes"],
    "fanout-negative.json": ["levels[0]: fanout", "positive integer"],
    "fanout-string.json": ["levels[0]: fanout", "positive integer", "'8'"],
    "fanout-zero-inner.json": ["levels[0]: fanout", "positive integer"],
    "fanout-huge.json": ["levels[0]: fanout", "limit"],
    "levels-empty.json": ["levels must be a non-empty list"],
    "levels-many.json": ["40 levels", "limit of 16"],
    "levels-dict.json": ["levels must be a non-empty list"],
    "level-name-markup.json": ["levels[0]: name", "identifier", "[red]nvlink"],
    "level-name-escape.json": ["levels[0]: name", "identifier", "\\x1b"],
    "level-name-number.json": ["levels[0]: name", "non-empty string"],
    "name-too-long.json": ["name is 300 characters", "limit of 256"],
    "device-name-empty.json": ["device.name", "non-empty string"],
    "missing-device.json": ["missing key(s) device"],
    "unknown-key.json": ["unknown key(s) ['nodes']"],
    "unknown-level-key.json": ["levels[0]", "unknown key(s) ['speed']"],
    "cluster-list.json": ["expected a mapping"],
    "bad-yaml.yaml": ["bad-yaml.yaml", "cannot parse"],
    "yaml-tag.yaml": ["yaml-tag.yaml", "cannot parse"],
    "alias-bomb.yaml": ["alias-bomb.yaml", "aliases", "1,000,000"],
    "binary.yaml": ["binary file"],
    "not-utf8.yaml": ["not UTF-8"],
}
CASES += [(f"cluster-{name.split('.')[0]}", ["evaluate", "tiny-llama", C, "{" + name + "}", "--devices", "8"], words)
          for name, words in CLUSTER_WORDS.items()]
CASES += [
    ("cluster-dev-zero", ["plan", "tiny-llama", C, "/dev/zero", "--devices", "8"], ["not a regular file"]),
    ("cluster-directory", ["plan", "tiny-llama", C, "{dir}", "--devices", "8"], ["is a directory"]),
    ("cluster-big", ["plan", "tiny-llama", C, "{big}", "--devices", "8"], ["above the limit of 8,388,608"]),
    ("cluster-alias-bomb-plan", ["plan", "tiny-llama", C, "{alias-bomb.yaml}", "--devices", "8"], ["aliases"]),
    ("clusters-show-dev-zero", ["clusters", "--show", "/dev/zero"], ["not a regular file"]),
    ("clusters-show-alias-bomb", ["clusters", "--show", "{alias-bomb.yaml}"], ["aliases"]),
    ("clusters-show-nan", ["clusters", "--show", "{nan-bandwidth.json}"], ["bandwidth_gbps", "finite"]),
    ("calibrate-cluster-inf", ["calibrate", "--cluster", "{inf-peak.yaml}"], ["peak_tflops", "finite"]),
    ("calibrate-cluster-binary", ["calibrate", "--cluster", "{binary.yaml}"], ["binary file"]),
    ("cluster-nan-sweep", ["sweep", "tiny-llama", C, "{nan-bandwidth.json}", "--devices", "8", "--seq", "16..64"],
     ["finite"]),
]
PLAN_WORDS = {
    "plan-list": ["top level must be an object"],
    "plan-missing-layouts": ["lacks layouts"],
    "plan-unknown-key": ["unknown key(s) ['extra']"],
    "plan-format": ["format 'symtensor-plan/9'", "symtensor-plan/1"],
    "plan-model-missing-hidden": ["model: missing key(s) hidden", "symtensor plan --out"],
    "plan-model-hidden-string": ["model.hidden", "must be an integer", "a string"],
    "plan-model-layers-zero": ["layers", "positive integer"],
    "plan-model-layers-million": ["layers", "limit of 1,024"],
    "plan-model-tied-string": ["model.tied", "the string 'false'"],
    "plan-model-unknown-key": ["model: unknown key(s) ['depth']"],
    "plan-model-string": ["model: expected a mapping"],
    "plan-model-capacity-nan": ["capacity_factor", "finite"],
    "plan-model-targets-string": ["lora_targets", "must be a list"],
    "plan-cluster-devices-zero": ["cluster.devices", "positive integer"],
    "plan-cluster-devices-huge": ["cluster.devices", "limit"],
    "plan-cluster-bandwidth-nan": ["levels[0].bandwidth", "finite"],
    "plan-cluster-bandwidth-negative": ["levels[0].bandwidth", "positive number"],
    "plan-cluster-latency-inf": ["levels[0].latency", "finite"],
    "plan-cluster-peak-nan": ["peak_flops.bf16", "finite"],
    "plan-cluster-memory-string": ["device.memory", "positive number", "without quotes"],
    "plan-cluster-levels-dict": ["cluster.levels must be a list"],
    "plan-cluster-level-name": ["levels[0].name", "identifier"],
    "plan-cluster-missing-device": ["cluster: missing key(s) device"],
    "plan-train-batch-zero": ["global_batch must be a positive integer"],
    "plan-train-pp-string": ["train.pp", "must be an integer", "a string"],
    "plan-train-unknown-key": ["train: unknown key(s) ['speed']"],
    "plan-train-zero-stage": ["zero=7"],
    "plan-train-recompute": ["recompute='some'"],
    "plan-train-split-string": ["train.layer_split", "must be a list"],
    "plan-seq-zero": ["seq must be a positive integer", "got 0"],
    "plan-seq-string": ["seq must be an integer", "a string"],
    "plan-seq-negative": ["seq must be a positive integer"],
    "plan-mesh-dict": ["mesh must be a list"],
    "plan-mesh-renamed": ["does not match the cluster's stage mesh"],
    "plan-mesh-size-string": ["mesh[0].size", "must be an integer"],
    "plan-layouts-list": ["layouts must map op names"],
    "plan-layout-unknown-op": ["op 'no_such_op' is not in the graph"],
    "plan-layout-unknown-axis": ["unknown mesh axis 'ib9'"],
    "plan-layout-axes-string": ["must map dims to lists of mesh axis names"],
    "plan-layout-unknown-dim": ["layout cuts dim 'zz'"],
    "plan-layout-cuts-list": ["must map dims to lists of mesh axis names"],
    "plan-config-list": ["config must be an object"],
    "plan-not-json": ["not valid JSON"],
}
CASES += [(f"explain-{name}", ["explain", "{" + name + "}"], words) for name, words in PLAN_WORDS.items()]
CASES += [(f"export-{name}", ["export", "{" + name + "}", "--to", "megatron"], words)
          for name, words in list(PLAN_WORDS.items())[28:34]]
CASES += [
    ("explain-missing", ["explain", "{missing}"], ["does not exist", "symtensor plan"]),
    ("explain-directory", ["explain", "{dir}"], ["is a directory"]),
    ("explain-dev-zero", ["explain", "/dev/zero"], ["not a regular file"]),
    ("explain-binary", ["explain", "{binary}"], ["binary file"]),
    ("explain-empty", ["explain", ""], ["PLAN", "empty"]),
    ("explain-unknown-op", ["explain", "{good-plan}", "--op", "no_such_op"], ["no_such_op"]),
    ("export-format", ["export", "{good-plan}", "--to", "deepspeed"], ["--to", "invalid choice"]),
    ("export-missing", ["export", "{missing}", "--to", "megatron"], ["does not exist"]),
    ("compare-nan-plan", ["compare", "{good-plan}", "{plan-cluster-bandwidth-nan}"], ["finite"]),
    ("compare-negative-plan", ["compare", "{plan-cluster-bandwidth-negative}", "fsdp"], ["positive number"]),
    ("compare-two-baselines", ["compare", "megatron_recipe", "fsdp"], ["both", "baselines"]),
    ("compare-unknown", ["compare", "{good-plan}", "megatron_best"], ["neither a plan file nor a baseline"]),
    ("compare-empty", ["compare", "", "fsdp"], ["A", "empty"]),
    # -- run: refused before any process starts -----------------------------------------------------
    ("run-devices-0", ["run", "tiny-llama", "--devices", "0"], ["--devices", "positive integer"]),
    ("run-devices-many", ["run", "tiny-llama", "--devices", "100"], ["--devices", "limit of 64"]),
    ("run-steps-0", RUN + ["--steps", "0"], ["--steps", "positive integer", "got 0"]),
    ("run-steps-neg", RUN + ["--steps", "-1"], ["--steps", "positive integer"]),
    ("run-steps-huge", RUN + ["--steps", str(10**7)], ["--steps", "limit"]),
    ("run-timeout-0", RUN + ["--timeout", "0"], ["--timeout", "positive number"]),
    ("run-timeout-nan", RUN + ["--timeout", "nan"], ["--timeout", "finite"]),
    ("run-timeout-inf", RUN + ["--timeout", "inf"], ["--timeout", "finite"]),
    ("run-timeout-neg", RUN + ["--timeout", "-5"], ["--timeout", "positive number"]),
    ("run-timeout-word", RUN + ["--timeout", "soon"], ["--timeout", "invalid float"]),
    ("run-port-huge", RUN + ["--master-port", "70000"], ["--master-port", "limit of 65,535"]),
    ("run-port-0", RUN + ["--master-port", "0"], ["--master-port", "positive integer"]),
    ("run-port-word", RUN + ["--master-port", "http"], ["--master-port", "invalid int"]),
    ("run-big-model", ["run", "llama3-8b", "--devices", "2", "--tp", "3"], ["llama3-8b", "parameters", "limit"]),
    ("run-tp-3", RUN + ["--tp", "3"], ["--tp 3 does not divide the 2 processes"]),
    ("run-tp-0", RUN + ["--tp", "0"], ["--tp", "positive integer"]),
    ("run-pp-not-dividing", ["run", "tiny-llama", "--devices", "3", "--pp", "2"], ["--pp 2 does not divide"]),
    ("run-batch-7", RUN + ["--tp", "1", "--global-batch", "7"], ["try --global-batch 8"]),
    ("run-batch-0", RUN + ["--global-batch", "0"], ["--global-batch", "positive integer"]),
    ("run-seq-0", RUN + ["--seq", "0"], ["--seq", "positive integer"]),
    ("run-seq-long", RUN + ["--seq", "100000"], ["--seq 100000", "800,000 tokens per step", "8,192"]),
    ("run-batch-huge", RUN + ["--global-batch", "100000"], ["1,600,000 tokens per step", "65,536"]),
    ("run-zero-4", RUN + ["--zero", "4"], ["--zero", "invalid choice"]),
    ("run-optimizer", RUN + ["--optimizer", "lbfgs"], ["--optimizer", "invalid choice"]),
    ("run-plan-other-dims", RUN[:2] + ["--devices", "8", "--plan", "{plan-other-dims}"],
     ["another model", "ffn 96 vs 128"]),
    ("run-plan-missing", RUN + ["--plan", "{missing}"], ["does not exist"]),
    ("run-plan-seq-0", RUN + ["--plan", "{plan-seq-zero}"], ["seq must be a positive integer"]),
    ("run-plan-empty", RUN + ["--plan", ""], ["--plan", "empty"]),
    ("run-empty-model", ["run", "", "--devices", "2"], ["MODEL", "empty"]),
    ("run-config-string-bool", ["run", "{tie-false-string}", "--devices", "2"], ["the string 'false'"]),
    # -- output files -------------------------------------------------------------------------------
    ("plan-out-directory", PLAN + ["--out", "{dir}"], ["--out", "is a directory"]),
    ("plan-out-missing-dir", PLAN + ["--out", "{missing}"], ["--out", "does not exist", "create it"]),
    ("plan-out-symlink", PLAN + ["--out", "{link}"], ["--out", "symbolic link", "--force"]),
    ("plan-out-proc", PLAN + ["--out", "/proc/version"], ["--out", "/proc"]),
    ("plan-out-dev-null", PLAN + ["--out", "/dev/null"], ["--out", "not a regular file"]),
    ("plan-out-empty", PLAN + ["--out", ""], ["--out", "empty"]),
    ("report-html-missing-dir", ["report", "--html", "{missing}"], ["--html", "does not exist"]),
    ("report-html-directory", ["report", "--html", "{dir}"], ["--html", "is a directory"]),
    ("report-html-proc", ["report", "--html", "/proc/version"], ["--html", "/proc"]),
    ("report-html-symlink", ["report", "--html", "{link}"], ["--html", "symbolic link"]),
    ("report-sweep-param", ["report", "--sweep", "layers=1..4"], ["--sweep", "PARAM=RANGE"]),
    ("report-sweep-range", ["report", "--sweep", "seq=8..2"], ["--sweep seq", "A <= B"]),
    ("report-micro-batch-0", ["report", "--micro-batch", "0"], ["--micro-batch", "positive integer"]),
    # -- sweep ranges --------------------------------------------------------------------------------
    ("sweep-zero-start", ["sweep", "tiny-llama", "--devices", "8", "--seq", "0..64"], ["--seq", "positive"]),
    ("sweep-reversed", ["sweep", "tiny-llama", "--devices", "8", "--seq", "64..16"], ["--seq", "A <= B"]),
    ("sweep-factor-1", ["sweep", "tiny-llama", "--devices", "8", "--seq", "16..64:1"], ["--seq", "A..B:F"]),
    ("sweep-word", ["sweep", "tiny-llama", "--devices", "8", "--seq", "a..b"], ["--seq", "A..B"]),
    ("sweep-huge-devices", ["sweep", "tiny-llama", "--devices", "8..10000000000"], ["--devices", "limit"]),
    ("sweep-many-points", ["sweep", "tiny-llama", "--devices", "8", "--seq", ",".join(map(str, range(1, 100)))],
     ["--seq", "99 points", "limit of 64"]),
    ("sweep-two-ranges", ["sweep", "tiny-llama", "--devices", "8..16", "--seq", "16..32"], ["one parameter"]),
    ("sweep-nothing", ["sweep", "tiny-llama", "--devices", "8"], ["nothing to sweep"]),
    ("sweep-batch-neg", ["sweep", "tiny-llama", "--devices", "8", "--global-batch=-1,8"],
     ["--global-batch", "positive"]),
    ("sweep-micro-batch-0", ["sweep", "tiny-llama", "--devices", "8", "--seq", "16..32", "--micro-batch", "0"],
     ["--micro-batch", "positive integer"]),
    # -- the command line itself -------------------------------------------------------------------
    ("no-command", [], ["required: command"]),
    ("unknown-command", ["optimise"], ["invalid choice: 'optimise'"]),
    ("explain-no-plan", ["explain"], ["required: plan"]),
    ("models-extra-argument", ["models", "all"], ["unrecognized arguments: all"]),
    ("export-no-format", ["export", "{good-plan}"], ["--to"]),
]


def _ids(cases):
    ids = [c[0] for c in cases]
    assert len(set(ids)) == len(ids), sorted({i for i in ids if ids.count(i) > 1})
    return ids


def test_the_catalogue_is_large_and_distinct():
    """At least 150 distinct bad inputs (the issue's bar), across every command."""
    assert len({json.dumps(c[1]) for c in CASES}) == len(CASES) >= 150
    commands = {c[1][0] for c in CASES if c[1]}
    assert commands >= {"plan", "evaluate", "graph", "explain", "export", "compare", "run", "report", "sweep",
                        "clusters", "calibrate"}


def _fill(text: str, files: dict) -> str:
    """``{name}`` -> the fixture's path of that name."""
    return re.sub(r"\{([\w.-]+)\}", lambda m: files[m.group(1)], text)


def _main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse
        return exc.code


@pytest.mark.parametrize("argv, words", [c[1:] for c in CASES], ids=_ids(CASES))
def test_bad_input_is_one_clear_line(files, capsys, argv, words):
    argv = [_fill(a, files) for a in argv]
    code = _main(argv)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert (code, out) == (2, ""), (code, out, err)
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and "\x1b" not in err
    for word in words:
        assert _fill(word, files) in lines[0], (word, lines[0])


@pytest.mark.parametrize("argv", [
    ["plan", "tiny-llama", "--devices", "8", "--micro-batch", "0"],
    ["graph", "/dev/zero"],
    ["explain", "{plan-model-hidden-string}"],
    ["evaluate", "tiny-llama", "--cluster", "{alias-bomb.yaml}", "--devices", "8"],
], ids=["micro-batch", "dev-zero", "plan-file", "alias-bomb"])
def test_the_entry_point_prints_no_traceback(files, argv):
    argv = [_fill(a, files) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "symtensor.cli", *argv], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == "", proc
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr


# -- what used to be silently wrong -------------------------------------------------------------------
def test_a_real_false_unties_the_head(tmp_path, capsys):
    """``"tie_word_embeddings": false`` gives the LM head its own table (the string "false" used to
    be read as true: 93.6M parameters instead of 126.4M)."""
    path = tmp_path / "config.json"
    config = {"num_hidden_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 2816,
              "vocab_size": 32000}
    counts = {}
    for tied in (False, True):
        path.write_text(json.dumps({**config, "tie_word_embeddings": tied}))
        assert main(["graph", str(path), "--json"]) == 0
        counts[tied] = json.loads(capsys.readouterr().out)["params_total"]
    assert counts[False] - counts[True] == 32000 * 1024  # one more vocabulary x width table


def test_names_print_as_text(tmp_path, capsys):
    """Cluster and device names are not rich markup, and their control characters are escaped."""
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(_set(_set(CLUSTER, "name", "[red]evil\u001b[2J"), "device.name", "[bold]x")))
    assert main(["evaluate", "tiny-llama", "--cluster", str(path), "--devices", "8", "--tp", "2",
                 "--global-batch", "16", "--seq", "64"]) == 0
    out = capsys.readouterr().out
    assert "[red]evil\\x1b[2J" in out and "\x1b" not in out


def test_out_is_atomic_and_follows_a_link_only_with_force(tmp_path, capsys):
    target, link = tmp_path / "target.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to(target)
    argv = ["plan", "tiny-llama", "--devices", "8", "--space", "megatron", "--no-baselines", "--global-batch", "16",
            "--seq", "16", "--json"]
    assert main(argv + ["--out", str(link)]) == 2
    assert "symbolic link" in capsys.readouterr().err and target.read_text() == "old"
    assert main(argv + ["--out", str(link), "--force"]) == 0
    capsys.readouterr()
    assert link.is_symlink() and json.loads(target.read_text())["format"] == "symtensor-plan/1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "target.json"]  # no temporary left
