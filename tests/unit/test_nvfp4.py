"""NVFP4 (``--precision fp4``, Transformer Engine's NVFP4BlockScaling; cost/precision.py): the FP4 GEMM rate
follows the stated rule (the FP8 rate x the device's FP4/FP8 peak ratio x TE's measured B300 NVFP4/MXFP8
fraction ratio), what the recipe keeps in BF16 stays at BF16 rates, the casts and memory are NVFP4's bytes, the
refusals are one line, Megatron-LM's flags are its own, and no FP4 GEMM is charged faster than that rule allows."""

import pytest

from symtensor import api
from symtensor.cost import TrainConfig, precision as P
from symtensor.errors import PlanError
from symtensor.hardware import load_cluster
from symtensor.models import build_graph, load_model_config

B200 = load_cluster("dgx-b200", devices=8).device
B300 = load_cluster("dgx-b300", devices=8).device
H100 = load_cluster("dgx-h100", devices=8).device
NVFP4 = P.RECIPES["nvfp4"]
CONFIG = dict(tp=2, pp=2, sp=True, micro_batch=1, global_batch=32, seq=4096, zero=1)


def _ops(model):
    g = build_graph(load_model_config(model), micro_batch=1, seq=64, skeleton=True)
    return {op.block: op for op in g.ops}


def test_the_measured_ratio_and_its_transfer():
    """TE's B300 benchmark (pre-quantized, per layer): MXFP8 7.161 ms, NVFP4 3.764 ms, so on B300 an FP4 GEMM
    runs 1.90x its FP8 rate; other Blackwell devices keep that fraction ratio on their own peaks (B200: 2x)."""
    assert P.fp4_factor(B300) == pytest.approx(7.161 / 3.764)
    assert P.fp4_factor(B200) == pytest.approx(2 * (7.161 / 3.764) / (13125 / 4500))
    op = _ops("llama3-8b")["gate_proj"]
    sizes = {"b": 1, "s": 8192, "h": 4096, "f": 14336}
    for dev in (B200, B300):
        fp8 = P.gemm_speedup(op, sizes, dev)
        assert P.gemm_speedup(op, sizes, dev, NVFP4) == pytest.approx(fp8 * P.fp4_factor(dev))
        assert P.gemm_speedup(op, sizes, dev, P.RECIPES["mxfp8"]) == fp8  # FP8 recipes: unchanged
        assert P.floor_speedup(op, sizes, dev, NVFP4) >= P.gemm_speedup(op, sizes, dev, NVFP4)


def test_fp4_op_times_follow_the_rates():
    """Per op on B300: a projection's FP4 GEMM time is its FP8 GEMM time over ``fp4_factor``, its casts
    (NVFP4's amax pass and copies) memory-bound time on top: an MLP projection is faster in FP4 than in FP8, a
    small one (q_proj at tp 2, 4,096 x 2,048 x 4,096) may not be (its input cast outweighs the GEMM's gain, as
    TE's own benchmark shows for its attention output projection); attention, the LM head and norms cost what
    they cost in BF16."""
    plan = api.evaluate("llama3-8b", "dgx-b300", 16, **CONFIG)
    ev, layouts = plan.evaluator(), plan.op_layouts()
    ops = {op.block: op for op in plan.graph.ops}
    up = ops["gate_proj"]
    bf16, fp8, fp4 = (ev.op_time(up, layouts[up.name], r) for r in (None, "mxfp8", "nvfp4"))
    assert fp4.fwd_s < fp8.fwd_s < bf16.fwd_s and fp4.bwd_s < fp8.bwd_s < bf16.bwd_s
    q = ops["q_proj"]
    fp4 = ev.op_time(q, layouts[q.name], "nvfp4")
    from symtensor.cost.opcost import _roofline, hbm_fraction, local_sizes

    sizes = local_sizes(q, layouts[q.name], ev.mesh)
    run = {r: _roofline(q, sizes, 0.0, ev.cluster.device, ev.eff, ev.grad_operands[q.name], ev.dtype, 0.0,
                        fp8=(P.RECIPES[r], False)) for r in ("mxfp8", "nvfp4")}
    assert run["mxfp8"].fwd_s / run["nvfp4"].fwd_s == pytest.approx(P.fp4_factor(B300))
    hbm = ev.cluster.device.hbm_bandwidth * hbm_fraction(q, ev.eff)
    cast_fwd, _ = P.cast_bytes(q, sizes, NVFP4, False)
    gap = ev.eff.end_to_end.kernel_gap_s
    assert fp4.fwd_s == pytest.approx(run["nvfp4"].fwd_s + cast_fwd / hbm + gap)
    for block in ("core", "lm_head", "attn_norm"):
        op = ops[block]
        assert ev.op_time(op, layouts[op.name], "nvfp4") == ev.op_time(op, layouts[op.name]), block


def test_what_stays_bf16():
    """The recipe's GEMMs are FP8's: the layers' linear and expert GEMMs; the LM head, router, attention core,
    norms and embedding stay BF16."""
    ops = _ops("tiny-qwen3-moe")
    fp4 = {block for block, op in ops.items() if P.fp8_gemm(op)}
    assert {"q_proj", "o_proj", "experts.gate_proj", "experts.down_proj"} <= fp4
    assert not fp4 & {"lm_head", "router", "core", "attn_norm", "embed.word", "loss"}


def test_casts_and_memory_bytes():
    """Per element: an amax read (2 B), the cast's read (2 B) and two E2M1 copies with an E4M3 scale per 16
    (2 x 0.5625 B); cached weights 1.125 B each; the saved GEMM input its column-wise copy, 0.5625 of 2 B."""
    op = _ops("llama3-8b")["gate_proj"]
    sizes = {"b": 1, "s": 1024, "h": 4096, "f": 14336}
    x, y = 1024 * 4096, 1024 * 14336
    assert P.cast_bytes(op, sizes, NVFP4, False) == (5.125 * x, 5.125 * y)
    assert P.weight_copy_bytes(NVFP4, True) == 1.125 and P.weight_copy_bytes(NVFP4, False) == 0.0
    assert NVFP4.saved_fraction == pytest.approx(0.28125)
    bf16 = api.evaluate("llama3-8b", "dgx-b200", 16, **CONFIG)
    fp8 = api.evaluate("llama3-8b", "dgx-b200", 16, **CONFIG, precision="fp8")
    fp4 = api.evaluate("llama3-8b", "dgx-b200", 16, **CONFIG, precision="fp4")
    mem = fp4.report.memory
    assert mem["fp8_weights"] == pytest.approx(bf16.report.memory["params"] * 1.125 / 2)
    assert mem["activations"] < fp8.report.memory["activations"] < bf16.report.memory["activations"]
    assert fp4.report.step_time_s < fp8.report.step_time_s < bf16.report.step_time_s
    assert fp4.config["precision"] == "fp4" and fp4.config["fp8_recipe"] == "nvfp4"
    # MFU is over the peak of the GEMMs' precision (FP4's)
    assert fp4.report.peak_flops == B200.flops("fp4")


def test_refusals():
    """Off Blackwell, under another engine, with an FP8 recipe name, or nvfp4 under fp8: one line each."""
    assert P.refusal("fp4", None, B200) is None and P.refusal("fp4", "nvfp4", B300, "megatron") is None
    assert P.refusal("fp4", None, H100) == (
        "NVFP4 needs Blackwell's FP4 Tensor Cores (presets dgx-b200, gb200-nvl72, dgx-b300, gb300-nvl72), which "
        "H100-SXM5-80GB lacks; use --precision fp8")
    assert "not the FP8 recipe 'mxfp8'" in P.refusal("fp4", "mxfp8", B200)
    assert P.refusal("fp8", "nvfp4", B200).startswith("the nvfp4 recipe scales FP4 GEMMs; use --precision fp4")
    for framework in ("fsdp2", "deepspeed", "megatron-deepspeed"):
        assert "use --framework megatron" in P.refusal("fp4", None, B200, framework)
    assert TrainConfig(global_batch=8, precision="fp4").fp8 == "nvfp4"
    with pytest.raises(PlanError, match="which Megatron-LM runs; use --framework megatron"):
        TrainConfig(global_batch=8, precision="fp4", framework="fsdp2")
    with pytest.raises(PlanError, match="NVFP4 needs Blackwell's FP4 Tensor Cores"):
        api.evaluate("llama3-8b", "dgx-h100", 16, **CONFIG, precision="fp4")
    with pytest.raises(PlanError, match="NVFP4 needs Blackwell"):
        api.plan("llama3-8b", "dgx-h100", devices=16, global_batch=64, seq=4096, precision="fp4")


def test_exports():
    """Megatron-LM: --fp4-format e2m1 --fp4-recipe nvfp4 (transformer_config.py ``fp4``, ``fp4_recipe``), no FP8
    flag; torchtitan refuses (its nvfp4 converter runs torchao's kernels, not the recipe costed)."""
    from symtensor.export.megatron import megatron_args
    from symtensor.export.torchtitan import torchtitan_config

    plan = api.evaluate("llama3-8b", "dgx-b200", 16, **CONFIG, precision="fp4")
    args = megatron_args(plan)
    assert args[-3:] == ["--bf16", "--fp4-format e2m1", "--fp4-recipe nvfp4"]
    assert not any("fp8" in a for a in args)
    odd = api.evaluate("llama3-8b", "dgx-b200", 16, **{**CONFIG, "seq": 2044}, precision="fp4")
    with pytest.raises(PlanError, match="refuse this NVFP4 plan at launch"):
        megatron_args(odd)
    with pytest.raises(PlanError, match="torchtitan does not run fp4 as this plan is costed"):
        torchtitan_config(plan)


def test_explain_says_what_fp4_bought():
    from symtensor.analysis.explain import explain_plan

    plan = api.evaluate("llama3-8b", "dgx-b300", 16, **CONFIG, precision="fp4")
    out = explain_plan(plan)["precision"]
    fp8 = plan.evaluator().evaluate(plan.op_layouts(), plan.train.replace(precision="fp8", fp8_recipe="mxfp8"))
    assert out["precision"] == "fp4" and out["fp8_step_time_s"] == pytest.approx(fp8.step_time_s)
    assert out["fp8_speedup"] > 1 and out["speedup"] > out["fp8_speedup"]
    assert "in FP8 (mxfp8 scaling" in out["summary"] and out["note"] == P.NUMERICS_NOTE_FP4


def test_the_search_does_not_choose_fp4_by_itself():
    """FP4 is opt-in: without --precision a Blackwell search may choose FP8 (MXFP8), never FP4; asked, it plans
    in FP4 with the FP4 numerics note."""
    kw = dict(devices=16, global_batch=64, seq=4096)
    auto = api.plan("llama3-8b", "dgx-b200", **kw)
    assert auto.train.precision != "fp4"
    fp4 = api.plan("llama3-8b", "dgx-b200", precision="fp4", **kw)
    assert fp4.train.fp8 == "nvfp4" and P.NUMERICS_NOTE_FP4 in fp4.notes


def test_no_fp4_gemm_is_charged_faster_than_the_rule_allows():
    """The kernel-table bound (tests/unit/test_kernel_bounds.py) for FP4: every FP4 GEMM's charged time is at
    least its FLOPs at the FP4 peak times the best FP8 fraction the model charges any GEMM (H100's measured FP8
    ceiling times B200's best BF16 row over H100's at the same shape, bounded by 1) times ``FP4_OVER_FP8``."""
    from symtensor.cost.opcost import local_sizes
    from symtensor.graph import kind_of

    for cluster in ("dgx-b200", "dgx-b300"):
        plan = api.evaluate("llama3-8b", cluster, 16, **CONFIG, precision="fp4")
        ev, layouts = plan.evaluator(), plan.op_layouts()
        peak = ev.cluster.device.flops("fp4")
        for op in plan.graph.ops:
            if not P.fp8_gemm(op) or op.name not in layouts:
                continue
            t = ev.op_time(op, layouts[op.name], "nvfp4")
            flops = kind_of(op.kind).fwd_flops(local_sizes(op, layouts[op.name], ev.mesh), dict(op.attrs))
            assert t.fwd_s >= flops / (peak * P.FP4_OVER_FP8), op.name
