"""Every dense zoo model up to 70B, planned data-parallel (Megatron ZeRO 1) or FSDP (FSDP2 ZeRO 3) on 64 A100s
and on 64 H100s (``api.evaluate`` with tp=1 and dp = devices, the fastest of no and full recomputation that
fits, micro-batch chosen by the evaluator), is predicted within the MFU range published for its device and
size class (issue 22, "must show").

MFU is compared in the convention the ranges were published in: causal attention counted in full, 12 L H Q T
per token (llm-foundry's ``attn_flops_per_seq``, torchtitan's "we follow the convention and do not account for
sparsity in causal attention": ``graph.analysis.full_attention_ratio``), not the halved count the tool prints
(Megatron-LM's). Until the sixth session this test compared the halved prediction with the full-count ranges,
which flattered the prediction by 4% (GPT-3 6.7B, 2,048 tokens) to 12.5% (Llama 3 8B, 8,192 tokens).

Each model is planned at the aligned widths the published runs have (``as_published``): GPT-2's vocabulary padded to a
multiple of 128 and GPT-3 13B's hidden 5,140 (the GPT-3 paper's, no multiple of 8) as its 40 heads x 128 = 5,120. At
the stated widths the GH100 runs the LM head, or every layer's GEMMs, on cuBLAS's unaligned kernels (costed since the
seventeenth session at their measured rate, tests/unit/test_engine.py): FSDP2's GPT-3 125M then reads 21.7% on H100
and GPT-3 13B 21.6%, below every published range, as no published run was.

Published ranges (MFU = model FLOPs / (time x devices x dense BF16 peak), per device and size class):
  A100 80GB
    < 2B     42-70.5%  llm-foundry's MPT-125M..1B throughput table on A100-80GB (mosaicml/llm-foundry
                     scripts/train/benchmarking/README.md @061f2c7: 42.6-60.7%); FlashAttention-2's end-to-end GPT-style
                     1.3B on 8 A100 80GB SXM (Dao 2023, arXiv:2307.08691 Table 1, FLOPs 6 N T + 12 L d T^2, attention
                     in full): 196 TFLOP/s at 2k context (62.8%), 220 at 8k (70.5%)
    2.7-8B   45-72.1%  issue 22 quotes 45-55% for the 7B class and "no published A100 run of any size exceeds about
                     56%", but llm-foundry publishes MPT-7B at up to 64.2% and MPT-3B at 63.7% on A100-80GB (seq 2048,
                     no activation checkpointing), torchtitan Llama 3 8B 56.8-58.2% (pytorch/torchtitan @0413364
                     docs/performance.md, local batch 1, selective checkpointing), and FlashAttention-2 GPT-style 2.7B
                     205 TFLOP/s at 2k (65.7%) and 225 at 8k (72.1%, "72% model FLOPs utilization"); the range is the
                     published one
    13-22B   39-62%  llm-foundry MPT-13B 51.7-59.6%, MPT-30B 39.4-56.4%; torchtitan Llama 2 13B 53.8-61.1%
    70B      48-56%  torchtitan Llama 2 70B 50.5-50.8%, Llama 3 70B 51.7%; llm-foundry MPT-70B 48.6-53.3%
  H100 80GB
    < 2B     26-58.7%  published: llm-foundry MPT-760M, 1B on H100-80GB: 26.3-43.2%; Megatron-Core r0.8.0's own 1.7B
                     GPT on 48 H100 at TP 1 (NVIDIA/Megatron-LM@f2e5db402c images/model_table.png: 408.8 TFLOP/s, 41%,
                     its FLOP count attention in full), the one Megatron run of this class found, inside it (read as a
                     held-out row, benchmarks/megatron_readme_runs.py round 5, the model is 33% optimistic on it).
                     Measured (the top, ``measured_h100_top``): this project's GPT-3 350M-1.3B training steps on one
                     H200, the GH100 die of H100 SXM at the same clocks and 700 W (benchmarks/hopper_measure.py, raw
                     and read in benchmarks/results/hopper_runs.md): eager PyTorch 41.9-56.4%, torch.compile'd 1.3B
                     64.1%; at H100's HBM bandwidth (each step's memory-bound kernels slowed by 4,800 / 3,350 GB/s,
                     everything else as measured: a lower bound of the same step on H100) 35.1-49.5% and 58.7%. The
                     published top (45%) is older stacks' (2023 llm-foundry, Megatron-Core r0.8.0), not the device's;
                     the cost model predicts the eager steps within 3.5% (hopper_runs.md)
    2.7-8B   27-63%  llm-foundry MPT-3B/7B 26.8-46.4%; NVIDIA dgxc-benchmarking (NeMo 25.02) Llama 3.1 8B: 12.27 s
                     per 128 x 8,192 tokens on 8 H100s (calibration_h100.csv), 62.6% counted in full (55.6% halved)
    13-22B   30-57%  llm-foundry MPT-13B 31.7-44.3%, MPT-30B 29.9-43.9%; dgxc-benchmarking Nemotron-4 15B 56.7%
                     (its convention unstated: taken as published)
    70B      36-55%  llm-foundry MPT-70B 36.1-42.6%; dgxc-benchmarking Llama 3.1 70B (calibration_h100.csv:
                     14.66 s per 128 x 8,192 tokens on 64 H100s) 54.4% counted in full (50.8% halved)

KNOWN_OUTSIDE lists the (device, model, engine) the cost model v3 predicts above its range, as strict expected
failures. A100: the kernel tables (measured GEMMs at 0.77-0.84 of the A100's peak at these shapes, at its MAMF
burst ceiling; the tensor-parallel calibration rows, 52-56% MFU, are matched at it). The A100's sustained clock
was measured once (1,200 of 1,410 MHz under FlashAttention-2, cost/kernels.py ``A100_SUSTAINED_CLOCK``), but at
it the TP-8 calibration rows come out 9-21% slow, so the model keeps the burst) bound a data-parallel step of a
1.3-22B model at 66-74% MFU counted in full: 7 of the 24 A100 cases lie above their ranges (Megatron's 1.3-7B by
0.2-1.8 points, FSDP2's 13-22B by 4-9 points); the 70B cases (full
recomputation, FSDP traffic) are inside. The cases are planned configurations (no recomputation where it
fits, the evaluator's micro-batch), not the published runs' own: at torchtitan's Llama 3 8B configuration (64 A100,
local batch 1, 8,192 tokens, selective-op checkpointing) the fsdp2 engine predicts 3,235 tokens/s/GPU against 2,973
published (+8.8%; layer checkpointing +8.7%), where the planned case (no checkpointing) reads 67%; at FlashAttention-2's
sizes and context the planned GPT-3 1.3B and 2.7B read 69-73% against its 62.8% and 65.7% at 2k (7-11% above
like for like). The data-parallel mechanisms the model
already costs are small there (GPT-3 6.7B, 64 A100s, ZeRO 1, 16 micro-batches of 2 x 2,048: exposed gradient
reduction with its last bucket 0.3%, the memory-bound Adam step over the local shard 0.01%, host time per
micro-batch 0.7% (fitted, calibration.select_constants), the loss over the logits 0.06% fused in Megatron and
about 0.6% as FSDP2's eager fp32 cross-entropy, 36 B per logit), and no other documented one the shipped rows
can identify closes the 8-20% left (leave-one-source-out on rows that are all tensor-parallel Megatron runs).
What the published data-parallel runs pay beyond that is for a user's own runs to calibrate (``calibrate
--runs``, issue 22 point 4); the error band says so (``cost.bands``: an A100 plan below the calibration
rows' tensor-parallel degree, 8, is widened along ``parallelism``). The A100 question (its sustained clock against
the step's mix of kernels) needs an A100 to measure; on the GH100 it was measured (benchmarks/results/hopper_runs.md):
back-to-back GEMMs hold the SM clock at 1,485 MHz at 700 W, the training steps ran at 1,935-1,965 MHz below it.
H100: the 0.35-1.3B cases (46.7-54.6%) were 2-10 points above the published 26-45% until the sixteenth session, and
are inside the measured top (58.7%). Strict: a change that brings one inside fails here until it is taken off the
list.
"""

import csv
import functools
from pathlib import Path

import pytest

from symtensor import api
from symtensor.errors import PlanError
from symtensor.graph import full_attention_ratio
from symtensor.models import load_model_config
from symtensor.models.builder import padded_vocab

MODELS = ("gpt3-125m", "gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b", "gpt-22b",
          "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "qwen2-7b", "qwen2-72b")
ENGINES = (("megatron", 1), ("fsdp2", 3))
MEASURED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "hopper_runs.csv"


@functools.cache  # (the file is read once for every case)
def measured_h100_top(size: str) -> float:
    """The highest MFU (%, attention in full) of this project's measured GH100 steps of models of ``size`` class
    at H100's HBM bandwidth (``h100_mfu_full``, benchmarks/hopper_runs.py), padded vocabularies only (the model
    pads every vocabulary)."""
    with open(MEASURED) as f:
        rows = [r for r in csv.DictReader(f) if r["h100_mfu_full"] and r["vocab"] == "50304"]
    return max(100 * float(r["h100_mfu_full"]) for r in rows if size_class(r["model"]) == size)


RANGES = {"dgx-a100-80g": {"small": (42, 70.5), "7b": (45, 72.1), "13b": (39, 62), "70b": (48, 56)},
          "dgx-h100": {"small": (26, 45), "7b": (27, 63), "13b": (30, 57), "70b": (36, 55)}}
KNOWN_OUTSIDE = {
    ("dgx-a100-80g", "gpt3-1.3b", "megatron"), ("dgx-a100-80g", "gpt3-2.7b", "megatron"),
    ("dgx-a100-80g", "gpt3-6.7b", "megatron"), ("dgx-a100-80g", "gpt3-13b", "fsdp2"),
    ("dgx-a100-80g", "gpt-22b", "fsdp2"), ("dgx-a100-80g", "llama2-7b", "megatron"),
    ("dgx-a100-80g", "llama2-13b", "fsdp2"),
}


def size_class(model: str) -> str:
    params = {"125m": 0.125, "350m": 0.35, "760m": 0.76, "1.3b": 1.3, "2.7b": 2.7, "6.7b": 6.7, "13b": 13,
              "22b": 22, "7b": 7, "8b": 8, "70b": 70, "72b": 72}[model.rsplit("-", 1)[-1]]
    return "small" if params < 2 else "7b" if params < 10 else "13b" if params < 30 else "70b"


def published_or_measured(cluster: str, size: str) -> tuple[float, float]:
    """The range of ``cluster``'s device and ``size`` class: the published one, its top raised to this project's
    measured GH100 steps where they ran faster (H100 below 2B: the module docstring)."""
    lo, hi = RANGES[cluster][size]
    if cluster == "dgx-h100" and size == "small":
        hi = max(hi, measured_h100_top(size))
    return lo, hi


def test_the_measured_gh100_steps_raise_the_h100_small_range():
    """The measured steps are read as the docstring says: the compiled 1.3B step at H100's bandwidth (58.7%) is the
    top, above the published 45%; the 2.7-8B class keeps its published top (the measured 2.7B, 48.7%, is inside)."""
    assert published_or_measured("dgx-h100", "small") == (26, pytest.approx(58.65, abs=0.01))
    assert published_or_measured("dgx-h100", "7b") == RANGES["dgx-h100"]["7b"]
    assert published_or_measured("dgx-a100-80g", "small") == RANGES["dgx-a100-80g"]["small"]


def as_published(model: str) -> dict:
    """The model overrides that give it the aligned widths every published run of the ranges has (module
    docstring): GPT-2's vocabulary 50,257 padded to 50,304 (llm-foundry pads MPT's to 50,368, FlashAttention-2's
    GPT to 50,304; an engine that runs it unpadded pays cuBLAS's unaligned LM head, tests/unit/test_engine.py) and
    a hidden size no multiple of 8 (GPT-3 13B's 5,140 in the GPT-3 paper) as heads x head dim (5,120, the width of
    every 13B run in the ranges)."""
    cfg = load_model_config(model)
    out = {"vocab": padded_vocab(cfg.vocab)} if cfg.vocab % 8 else {}
    if cfg.hidden % 8:
        out["hidden"] = cfg.heads * cfg.head_dim
    return out


@functools.cache
def planned_mfu(cluster: str, model: str, framework: str, zero: int) -> float | None:
    """MFU (%, causal attention counted in full as the ranges are) of the fastest fitting of no and full
    recomputation, the model at the widths the published runs have (``as_published``), or None when neither
    fits."""
    best = None
    for recompute in ("none", "full"):
        try:
            plan = api.evaluate(model, cluster, 64, tp=1, zero=zero, framework=framework, recompute=recompute,
                                overrides=as_published(model) or None)
        except PlanError:
            continue
        if plan.report.fits and (best is None or plan.report.step_time_s < best.report.step_time_s):
            best = plan
    return None if best is None else 100 * best.report.mfu * full_attention_ratio(best.graph)


def _cases():
    for cluster in RANGES:
        for model in MODELS:
            for framework, zero in ENGINES:
                marks = [pytest.mark.xfail(strict=True, reason="v3 predicts above the published range (module "
                                                               "docstring)")] \
                    if (cluster, model, framework) in KNOWN_OUTSIDE else []
                yield pytest.param(cluster, model, framework, zero, marks=marks, id=f"{cluster}-{model}-{framework}")


@pytest.mark.parametrize("cluster,model,framework,zero", list(_cases()))
def test_data_parallel_mfu_within_the_published_range(cluster, model, framework, zero):
    mfu = planned_mfu(cluster, model, framework, zero)
    if mfu is None:
        assert framework == "megatron" and size_class(model) != "small"  # ZeRO 1 keeps whole weights: too big
        return
    lo, hi = published_or_measured(cluster, size_class(model))
    assert lo <= mfu <= hi, f"{model} on {cluster} ({framework}): {mfu:.1f}% outside {lo}-{hi}%"

