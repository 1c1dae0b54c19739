"""What an MoE layer keeps for backward, per engine (``cost.moe.saved_scale``, ``Engine.moe_combine_keeps``).

Megatron-core (NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553) keeps per MoE layer and micro-batch, of
the hidden and expert widths: the router's input (the pre-MLP norm output, RouterGatingLinearFunction), the router's
probabilities, the permuted tokens (linear_fc1's input), linear_fc1's output (WeightedSwiGLUFunction's input) and the
activation's output (linear_fc2's input); the unpermutation keeps only its indices, as the probabilities are applied
in the activation. torchtitan's combine keeps an fp32 copy of the experts' output; DeepSpeed's the bf16 one (the
graph's default). The table is tools/notes_moemem.md's."""

import pytest

from symtensor import api
from symtensor.analysis.formula import memory_formula
from symtensor.cost.engine import ENGINES
from symtensor.cost.moe import saved_scale
from symtensor.cost.terms import saved_bytes
from symtensor.layout import REPLICATED
from symtensor.models import PRESETS, build_graph

MOE = "tiny-qwen3-moe"  # h 64, 8 experts, top 2, expert ffn 32, every layer MoE
SEQ = 256
MOE_TENSORS = ("mlp_norm", "gates", "dispatch", "experts.gate_proj", "experts.up_proj", "experts.act",
               "experts.down_proj")


def _layer_saved(model, framework):
    """The saved tensors (name -> bytes on the one device) of layer 0's segment, one micro-batch, no recomputation."""
    plan = api.evaluate(model, "dgx-h100", 1, micro_batch=1, global_batch=1, seq=SEQ, recompute="none",
                        framework=framework)
    ev = plan.evaluator()
    ev.evaluate(plan.op_layouts(), plan.train)
    segs = [s for s in ev._segment_cache.values() if s.in_layer and s.ops[0].layer == 0]
    assert len(segs) == 1
    return segs[0].saved, plan


def _by_hand(framework):
    """The table's sum for one MoE layer of ``MOE`` (bytes): N tokens, T = top_k x N permuted copies."""
    cfg = PRESETS[MOE]
    n, t, h, f = SEQ, cfg.top_k * SEQ, cfg.hidden, cfg.moe_ffn
    megatron = (2 * n * h  # router input: the pre-MLP norm output, bf16
                + 4 * n * cfg.experts  # router probabilities [N, E], fp32 (the graph's gates)
                + 2 * t * h  # permuted tokens, linear_fc1's input
                + 2 * t * 2 * f  # linear_fc1's output (gate and up), WeightedSwiGLU's input
                + 2 * t * f)  # the activation's output, linear_fc2's input
    combine = {"megatron": 0, "fsdp2": 4 * t * h, "deepspeed": 2 * t * h}[framework]  # the experts' output kept
    return megatron + combine


@pytest.mark.parametrize("framework", ["megatron", "fsdp2", "deepspeed"])
def test_moe_layer_saves_the_table(framework):
    saved, _ = _layer_saved(MOE, framework)
    moe = sum(b for name, b in saved.items() if name.startswith("layers.0.") and name[9:] in MOE_TENSORS)
    assert moe == _by_hand(framework)
    assert ("layers.0.experts.down_proj" in saved) == (framework != "megatron")


def test_dense_layers_save_the_same_under_every_engine_rule():
    """The rule touches only the combine: a dense model's saved tensors are each engine's as before (scale 1)."""
    g = build_graph(PRESETS["tiny-llama"], micro_batch=1, seq=SEQ)
    assert all(saved_scale(op, io, i, e) == 1.0 for e in ENGINES.values() for op in g.ops
               for io in ("in", "out") for i in range(3))
    moe = build_graph(PRESETS[MOE], micro_batch=1, seq=SEQ)
    combine = next(op for op in moe.ops if op.kind == "moe_combine")
    assert [saved_scale(combine, "in", i, ENGINES["megatron"]) for i in (0, 1)] == [0.0, 1.0]


@pytest.mark.parametrize("framework, keeps", [("megatron", 0), ("fsdp2", 2), ("deepspeed", 1)])
def test_search_estimate_and_formula_follow_the_engine(framework, keeps):
    """The search's per-op estimate (``terms.saved_bytes``) and ``explain``'s formula count what the segment does."""
    _, plan = _layer_saved(MOE, framework)
    ev = plan.evaluator()
    combine = next(op for op in plan.graph.ops if op.kind == "moe_combine")
    ye = plan.graph.tensors[combine.inputs[0]].nbytes
    gates = plan.graph.tensors[combine.inputs[1]].nbytes
    assert saved_bytes(ev, combine, REPLICATED, plan.train) == keeps * ye + gates
    assert memory_formula(ev, combine, REPLICATED, None, framework)["value_bytes"] == keeps * ye + gates


def test_expert_tp_keeps_the_gathered_tokens():
    """With expert-tensor parallelism Megatron's dispatcher all-gathers the permuted tokens over the ETP group
    (dispatch_postprocess, gather_from_sequence_parallel_region) and the grouped GEMM (TE without SP: explicit expert
    communication) keeps the whole gathered input, not a shard to gather again: twice ETP 1's at ETP 2 (tp 2, ep 2
    on 4 devices: each rank receives the same copies, then gathers its ETP partner's)."""
    out = {}
    for etp in (1, 2):
        plan = api.evaluate(MOE, "dgx-h100", 4, tp=2, ep=2, etp=etp, micro_batch=1, global_batch=2, seq=SEQ,
                            recompute="none", framework="megatron")
        ev = plan.evaluator()
        ev.evaluate(plan.op_layouts(), plan.train)
        seg = next(s for s in ev._segment_cache.values() if s.in_layer and s.ops[0].layer == 0)
        out[etp] = seg.saved["layers.0.dispatch"]
    cfg = PRESETS[MOE]
    assert out[1] == 2 * (cfg.top_k * SEQ // 2) * cfg.hidden  # the SP shard's copies, bf16
    assert out[2] == 2 * out[1]
