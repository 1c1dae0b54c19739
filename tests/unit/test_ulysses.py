"""Context parallelism under the deepspeed engine is DeepSpeed-Ulysses (``cost.engine.Engine.context``): the
attention core cut by heads behind all-to-alls, never ring attention (deepspeedai/DeepSpeed
deepspeed/sequence/layer.py ``DistributedAttention``: ``_SeqAllToAll`` of the query, key and value before the
local attention, of its output after it, and the same four for the gradients in backward)."""

import pytest

from symtensor import api
from symtensor.cost import Evaluator
from symtensor.errors import PlanError
from symtensor.hardware import load_cluster
from symtensor.models import build_graph, load_model_config
from symtensor.plan.document import notes
from symtensor.search.megatron import configuration, megatron_layouts, train_config

SEQ = 65536


def _attention_cores(plan):
    return [op for op in plan.graph.ops if op.kind == "attention"]


def test_cp_under_deepspeed_is_ulysses_with_its_all_to_all_bytes():
    """Llama 3 8B on 64 H100s, tp 2 x cp 4, one 65,536-token sequence per micro-batch: the attention core cuts its
    heads by tp x cp = 8 and not its query sequence; each layer's forward moves the local query, key, value and
    output once by all-to-all and its backward their gradients: 2 (b s/cp) (2 n/tp + 2 g/tp) d bytes of BF16 =
    320 MiB per layer and micro-batch (32 query heads, 8 key/value heads of 128), all of it exposed."""
    plan = api.evaluate("llama3-8b", "dgx-h100", 64, tp=2, cp=4, zero=1, micro_batch=1, global_batch=64, seq=SEQ,
                        framework="deepspeed", recompute="none")
    cfg, mesh = plan.model, plan.mesh
    assert plan.config["cp"] == 4 and plan.config["tp"] == 2 and not plan.config["heterogeneous"]
    for op in _attention_cores(plan):
        cuts = plan.layouts[op.name]  # (dim -> mesh axis names)
        assert "s" not in cuts and mesh.size_of(tuple(cuts["n"])) == 8, op.name
    tokens = SEQ // 4
    per_layer = 2 * tokens * (2 * cfg.heads // 2 + 2 * cfg.kv_heads // 2) * cfg.head_dim * 2
    micro_steps = plan.train.micro_steps
    assert plan.report.comm_bytes["all_to_all"] == pytest.approx(per_layer * cfg.layers * micro_steps, rel=1e-9)
    assert any("DeepSpeed-Ulysses" in n for n in notes(plan))


def test_the_same_degrees_under_megatron_stay_ring_attention():
    plan = api.evaluate("llama3-8b", "dgx-h100", 64, tp=2, cp=4, zero=1, micro_batch=1, global_batch=64, seq=SEQ,
                        framework="megatron", recompute="none")
    assert "all_to_all" not in plan.report.comm_bytes
    for op in _attention_cores(plan):
        assert plan.mesh.size_of(tuple(plan.layouts[op.name]["s"])) == 4


def test_a_stated_ring_attention_is_refused_under_deepspeed():
    """Ring attention's layouts (Megatron's), evaluated under the deepspeed engine: one line naming the rule."""
    cfg = load_model_config("llama3-8b").replace(layers=2)
    cl = load_cluster("dgx-h100", devices=8)
    c = configuration(dict(tp=1, cp=4, dp=2, zero=1, micro_batch=1, global_batch=8, seq=4096, framework="deepspeed"))
    graph = build_graph(cfg, micro_batch=2, seq=4096, skeleton=True)
    ring = megatron_layouts(graph, Evaluator(graph, cl, framework="megatron").mesh, {**c, "framework": "megatron"})
    ev = Evaluator(graph, cl, framework="deepspeed")
    with pytest.raises(PlanError, match="runs no ring attention"):
        ev.evaluate(ring, train_config(c))


def test_plan_under_deepspeed_finds_ulysses_at_long_context_and_never_ring():
    """At 65,536 tokens on 64 H100s the deepspeed search takes context parallelism (as Ulysses: it is faster than
    the best plan without it) and no attention core of the plan cuts its query sequence. Ulysses at its full degree
    (8, the key/value heads) fits without recomputation only under ZeRO-3, which the Megatron grid (ZeRO-1) does not
    cost: the search still finds a plan at least as fast (``seeds.seed_phase``'s recomputed seeds; it took 23.70 s of
    full recomputation at cp 4 before)."""
    plan = api.plan("llama3-8b", "dgx-h100", 64, global_batch=64, seq=SEQ, framework="deepspeed", precision="bf16")
    assert plan.config["cp"] > 1
    zero3 = api.evaluate("llama3-8b", "dgx-h100", 64, tp=1, cp=8, zero=3, micro_batch=1, global_batch=64, seq=SEQ,
                         framework="deepspeed", recompute="none")
    assert zero3.report.fits and plan.report.step_time_s <= zero3.report.step_time_s * (1 + 1e-9)
    for op in _attention_cores(plan):
        assert "s" not in plan.layouts[op.name], op.name
    assert any("DeepSpeed-Ulysses" in n for n in notes(plan))


def test_a_ulysses_plan_exports_to_megatron_as_a2a_and_nowhere_ring():
    """Megatron-LM runs Ulysses as ``--cp-comm-type a2a`` (NVIDIA/Megatron-LM@d98e8a64dd arguments.py;
    transformer_config.py: "a2a: Like DeepSpeed Ulysses, scatter attention heads across the CP group"); torchtitan's
    context parallelism is ring attention only: refused in one line, as the DTensor plan is."""
    from symtensor.export.dtensor import dtensor_plan
    from symtensor.export.megatron import megatron_args
    from symtensor.export.torchtitan import torchtitan_config

    plan = api.evaluate("llama3-8b", "dgx-h100", 64, tp=2, cp=4, zero=1, micro_batch=1, global_batch=64, seq=SEQ,
                        framework="deepspeed", recompute="none")
    args = megatron_args(plan)
    assert "--context-parallel-size 4" in args and "--cp-comm-type a2a" in args
    for export in (torchtitan_config, dtensor_plan):
        with pytest.raises(PlanError, match="runs ring context parallelism.*DeepSpeed-Ulysses"):
            export(plan)
    ring = api.evaluate("llama3-8b", "dgx-h100", 64, tp=2, cp=4, zero=1, micro_batch=1, global_batch=64, seq=SEQ,
                        framework="megatron", recompute="none")
    assert "--cp-comm-type a2a" not in megatron_args(ring)


def test_ulysses_runs_without_megatron_sequence_parallelism():
    """Megatron-DeepSpeed's Ulysses switch "Cannot be combined with --sequence-parallel" (megatron/arguments.py
    ``--ds-sequence-parallel-size``): evaluate leaves sp off under cp > 1 by default and refuses it stated; the
    search's grid points with cp > 1 carry sp off; with cp 1, sp stays the default where tp > 1."""
    plan = api.evaluate("llama3-8b", "dgx-h100", 64, tp=2, cp=4, zero=1, micro_batch=1, global_batch=64, seq=SEQ,
                        framework="deepspeed", recompute="full")
    assert plan.parallelism.sp is False
    with pytest.raises(PlanError, match="does not combine with Megatron's sequence parallelism"):
        api.evaluate("llama3-8b", "dgx-h100", 64, tp=2, cp=4, sp=True, zero=1, micro_batch=1, global_batch=64,
                     seq=SEQ, framework="deepspeed", recompute="full")
    assert api.evaluate("llama3-8b", "dgx-h100", 64, tp=2, cp=1, zero=1, micro_batch=1, global_batch=64, seq=8192,
                        framework="deepspeed", recompute="full").parallelism.sp is True
    from symtensor.search.pool import EvaluatorPool

    pool = EvaluatorPool(load_model_config("llama3-8b"), load_cluster("dgx-h100", devices=64), SEQ,
                         framework="deepspeed")
    points = pool._grid(64)
    assert any(c["cp"] > 1 and c["tp"] > 1 for c in points)
    assert all(not c["sp"] for c in points if c["cp"] > 1)
    assert any(c["sp"] for c in points if c["cp"] == 1)
