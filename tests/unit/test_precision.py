"""FP8 precision (cost/precision.py and its use by the cost model): which ops run in FP8, the GEMM speedup
from the kernel tables, the casts, the memory of FP8 copies, the legality rule, and BF16 left unchanged."""

import pytest

from symtensor import api
from symtensor.cost import TrainConfig, precision as P
from symtensor.errors import PlanError
from symtensor.hardware import load_cluster
from symtensor.models import build_graph, load_model_config

H100 = load_cluster("dgx-h100", devices=8).device
B200 = load_cluster("dgx-b200", devices=8).device
A100 = load_cluster("dgx-a100-80g", devices=8).device


def _ops(model):
    g = build_graph(load_model_config(model), micro_batch=1, seq=64, skeleton=True)
    return {op.block: op for op in g.ops}


def test_what_runs_in_fp8():
    """The layers' linear GEMMs (expert GEMMs included) run in FP8; the LM head, the router, attention,
    norms and the embedding stay BF16."""
    ops = _ops("tiny-qwen3-moe")
    fp8 = {block for block, op in ops.items() if P.fp8_gemm(op)}
    assert {"q_proj", "k_proj", "v_proj", "o_proj", "experts.gate_proj", "experts.down_proj"} <= fp8
    assert not fp8 & {"lm_head", "router", "core", "attn_norm", "embed.word", "loss", "act"}


def test_gemm_shape_and_speedup():
    """(M, N, K) of a projection; the speedup is the FP8/BF16 ratio of the tables: above 1.5 for large
    GEMMs on H100, never below 1, and never above the peak ratio times the best FP8 over the least BF16
    fraction (the floor's bound)."""
    op = _ops("llama3-8b")["gate_proj"]
    sizes = {"b": 1, "s": 8192, "h": 4096, "f": 14336}
    assert P.gemm_shape(op, sizes) == (8192, 14336, 4096)
    big = P.gemm_speedup(op, sizes, H100)
    assert 1.5 < big < 2.0
    small = P.gemm_speedup(op, {"b": 1, "s": 64, "h": 256, "f": 256}, H100)
    assert small >= 1.0
    assert P.floor_speedup(op, sizes, H100) >= big
    # B200 has no FP8 table: it takes H100's ratio (a stated transfer) on its own peaks
    assert 1.0 <= P.gemm_speedup(op, sizes, B200) <= 2.0


def test_casts_by_recipe():
    """Every recipe casts the input forward and the output gradient backward (2 B read, two FP8 copies);
    tensorwise reads once more for the amax, blockwise and MXFP8 add their scales, weights are cast per
    micro-batch only where the engine does not cache them."""
    op = _ops("llama3-8b")["gate_proj"]
    sizes = {"b": 1, "s": 1024, "h": 4096, "f": 14336}
    x, y, w = 1024 * 4096, 1024 * 14336, 4096 * 14336
    tw_fwd, tw_bwd = P.cast_bytes(op, sizes, P.RECIPES["tensorwise"], False)
    assert (tw_fwd, tw_bwd) == (6 * x, 6 * y)
    blk_fwd, _ = P.cast_bytes(op, sizes, P.RECIPES["blockwise"], False)
    assert blk_fwd == pytest.approx(x * (2 + 2 * (1 + 4 / 128)))
    mx_fwd, _ = P.cast_bytes(op, sizes, P.RECIPES["mxfp8"], True)
    assert mx_fwd == pytest.approx((x + w) * (2 + 2 * (1 + 1 / 32)))
    dl_fwd, _ = P.cast_bytes(op, sizes, P.RECIPES["delayed"], False)
    assert 4 * x < dl_fwd < 4 * x + 1e5  # the amax history is a few kilobytes


def test_refusals():
    assert P.refusal("fp8", None, A100).startswith("A100-SXM4-80GB has no FP8 Tensor Cores")
    assert "Blackwell" in P.refusal("fp8", "mxfp8", H100)
    assert P.refusal("fp8", "mxfp8", B200) is None
    assert P.refusal("bf16", "delayed", H100).endswith("needs --precision fp8")
    assert P.default_recipe(H100) == "delayed" and P.default_recipe(B200) == "mxfp8"
    with pytest.raises(PlanError, match="use one of bf16, fp8, fp16, fp4"):
        TrainConfig(global_batch=8, precision="fp6")
    assert TrainConfig(global_batch=8, precision="fp8").fp8 == "delayed"
    assert TrainConfig(global_batch=8).fp8 is None


def test_evaluate_refuses_fp8_without_fp8_tensor_cores():
    with pytest.raises(PlanError, match=r"no FP8 Tensor Cores .*; use --precision bf16"):
        api.evaluate("llama2-7b", "dgx-a100-80g", 8, tp=1, precision="fp8")


CONFIG = dict(tp=2, pp=2, sp=True, micro_batch=1, global_batch=32, seq=4096, zero=1)


def test_fp8_is_faster_and_says_so():
    """FP8 shortens compute (the GEMMs), leaves attention's time alone, holds the FP8 weight copies and
    halves the saved GEMM inputs; the BF16 plan keeps no precision keys in its summary."""
    bf16 = api.evaluate("llama3-8b", "dgx-h100", 16, **CONFIG)
    fp8 = api.evaluate("llama3-8b", "dgx-h100", 16, **CONFIG, precision="fp8")
    assert fp8.report.breakdown["compute"] < 0.8 * bf16.report.breakdown["compute"]
    assert fp8.report.step_time_s < bf16.report.step_time_s
    assert "precision" not in bf16.config and fp8.config["precision"] == "fp8"
    assert fp8.config["fp8_recipe"] == "delayed" and fp8.parallelism.fp8_recipe == "delayed"
    mem_b, mem_f = bf16.report.memory, fp8.report.memory
    assert "fp8_weights" not in mem_b
    assert mem_f["fp8_weights"] == pytest.approx(mem_b["params"])  # 2 B per weight beside the 2 B BF16 weight
    assert mem_f["activations"] < mem_b["activations"]


def test_fp8_op_times():
    """Per op: a projection is faster in FP8 by less than the table speedup (its casts), attention is
    unchanged, and the FP8 op time is memoised apart from the BF16 one."""
    plan = api.evaluate("llama3-8b", "dgx-h100", 16, **CONFIG)
    ev, layouts = plan.evaluator(), plan.op_layouts()
    ops = {op.block: op for op in plan.graph.ops}
    q, core = ops["q_proj"], ops["core"]
    b, f = ev.op_time(q, layouts[q.name]), ev.op_time(q, layouts[q.name], "delayed")
    assert f.fwd_s < b.fwd_s and f.bwd_s < b.bwd_s
    assert ev.op_time(q, layouts[q.name]) is b
    assert ev.op_time(core, layouts[core.name], "delayed") == ev.op_time(core, layouts[core.name])


def test_fp8_step_floor_is_a_floor():
    plan = api.evaluate("llama3-8b", "dgx-h100", 16, **CONFIG, precision="fp8")
    ev = plan.evaluator()
    floor = ev.step_floor(plan.train)
    assert floor < ev.step_floor(plan.train.replace(precision="bf16", fp8_recipe=None))
    assert floor <= plan.report.step_time_s


def test_megatron_export_names_the_recipe():
    """Megatron-LM's --fp8-format / --fp8-recipe (megatron/training/arguments.py): hybrid for the Hopper
    recipes, E4M3 for MXFP8, the amax history the cost model charges for delayed scaling; BF16 adds none."""
    from symtensor.export.megatron import megatron_args

    cfg = dict(tp=2, pp=1, micro_batch=1, global_batch=32, seq=2048, zero=1)
    assert not any("fp8" in a for a in megatron_args(api.evaluate("llama3-8b", "dgx-h100", 16, **cfg)))
    args = megatron_args(api.evaluate("llama3-8b", "dgx-h100", 16, **cfg, precision="fp8"))
    assert args[-5:] == ["--bf16", "--fp8-format hybrid", "--fp8-recipe delayed", "--fp8-amax-history-len 1024",
                         "--fp8-amax-compute-algo max"]
    mx = megatron_args(api.evaluate("llama3-8b", "dgx-b200", 16, **cfg, precision="fp8"))
    assert "--fp8-format e4m3" in mx and "--fp8-recipe mxfp8" in mx
    odd = api.evaluate("llama3-8b", "dgx-h100", 16, **{**cfg, "seq": 2044}, precision="fp8")
    with pytest.raises(PlanError, match="Transformer Engine would refuse this FP8 plan at launch: FP8 GEMMs need"):
        megatron_args(odd)


def test_torchtitan_export_converts_float8():
    """torchtitan's float8 converter (job_config Float8): tensorwise, FP8 all-gather under FSDP, the LM head
    left out; another recipe runs as tensorwise and the note says so."""
    from symtensor.export.torchtitan import torchtitan_config

    plan = api.evaluate("llama3-8b", "dgx-h100", 16, tp=1, zero=3, micro_batch=1, global_batch=32, seq=2048,
                        framework="fsdp2", precision="fp8")
    assert plan.train.fp8_recipe == "tensorwise"  # the PyTorch engines' default (torchao)
    out = torchtitan_config(plan)
    assert out["model"] == {"converters": ["float8"]}
    assert out["float8"] == {"recipe_name": "tensorwise", "enable_fsdp_float8_all_gather": True,
                             "precompute_float8_dynamic_scale_for_fsdp": True, "filter_fqns": ["output"]}
    delayed = api.evaluate("llama3-8b", "dgx-h100", 16, tp=1, zero=3, micro_batch=1, global_batch=32, seq=2048,
                           framework="fsdp2", precision="fp8", fp8_recipe="delayed")
    assert "costed with the delayed recipe" in torchtitan_config(delayed)["_fp8_note"]
    assert "float8" not in torchtitan_config(api.evaluate("llama3-8b", "dgx-h100", 16, tp=1, zero=3, micro_batch=1,
                                                          global_batch=32, seq=2048, framework="fsdp2"))


def test_the_search_chooses_fp8_where_it_wins_and_says_why():
    """Without --precision the search costs BF16 and takes the best point's FP8 variant when it is faster
    (H100, large GEMMs), says what it bought and that FP8 changes the numerics; --precision bf16 keeps
    BF16; on A100 (no FP8) nothing changes; the baselines stay BF16 (the recipes')."""
    kw = dict(devices=16, global_batch=64, seq=4096)
    plan, base = api.plan_with_baselines("llama3-8b", "dgx-h100", names=("megatron_recipe",), **kw)
    assert plan.train.fp8 == "delayed"
    assert any(n.startswith("FP8 GEMMs (delayed scaling) bought") for n in plan.notes)
    assert P.NUMERICS_NOTE in plan.notes
    assert base["megatron_recipe"].train.fp8 is None
    bf16 = api.plan("llama3-8b", "dgx-h100", precision="bf16", **kw)
    assert bf16.train.fp8 is None and plan.report.step_time_s < bf16.report.step_time_s
    assert not any("FP8" in n for n in bf16.notes)
    a100 = api.plan("llama3-8b", "dgx-a100-80g", **kw)
    assert a100.train.fp8 is None
    forced = api.plan("llama3-8b", "dgx-h100", precision="fp8", fp8_recipe="tensorwise", **kw)
    assert forced.train.fp8 == "tensorwise" and P.NUMERICS_NOTE in forced.notes
    with pytest.raises(PlanError, match="no FP8 Tensor Cores"):
        api.plan("llama3-8b", "dgx-a100-80g", precision="fp8", **kw)


def test_explain_says_what_fp8_bought(tmp_path):
    from symtensor.analysis.explain import explain_plan

    plan = api.evaluate("llama3-8b", "dgx-h100", 16, **CONFIG, precision="fp8")
    out = explain_plan(plan)["precision"]
    bf16 = api.evaluate("llama3-8b", "dgx-h100", 16, **CONFIG)
    assert out["bf16_step_time_s"] == pytest.approx(bf16.report.step_time_s)
    assert out["speedup"] == pytest.approx(bf16.report.step_time_s / plan.report.step_time_s)
    assert "in BF16" in out["summary"] and out["note"] == P.NUMERICS_NOTE
    assert "precision" not in explain_plan(bf16)


def test_cli_precision_flags(capsys):
    import json

    from symtensor.cli import main

    base = ["evaluate", "llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--tp", "2", "--global-batch", "32",
            "--seq", "2048", "--json"]
    assert main(base + ["--precision", "fp8", "--fp8-recipe", "blockwise"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"]["precision"] == "fp8" and out["config"]["fp8_recipe"] == "blockwise"
    assert main(base + ["--precision", "fp8", "--fp8-recipe", "mxfp8"]) == 2
    assert "needs Blackwell" in capsys.readouterr().err


def test_fp8_is_tried_on_each_fast_bf16_layout_that_could_still_win(monkeypatch):
    """FP8 buys one layout more than another (Llama 3 405B on 16,384 H100: the fastest BF16 layout 1.13x, a
    slower one 1.41x), so the search re-costs in FP8 each of its fastest BF16 layouts (``leaders``) while the
    layout's BF16 step is under the FP8 best's times the most FP8 can buy (the peaks' ratio, 2 on H100, times 4/3
    for a lighter recomputation: no FP8 variant of a slower one can win), not only the first whose variant fits.
    Here three leaders at 1.0, 1.05 and 2.5 s whose FP8 variants take 0.97, 0.7 and 0.3 of them: the second wins
    (0.735 s), the third (2.5 s >= 2.67 x 0.735 s) is not tried."""
    from types import SimpleNamespace as NS

    from symtensor.hardware import load_cluster
    from symtensor.search import outer

    def point(seconds, fp8=None, layouts=None):
        return NS(report=NS(step_time_s=seconds), train=NS(fp8=fp8, recompute="none", pp=1, micro_steps=8),
                  layouts=layouts if layouts is not None else object())

    a, b, c = point(1.0), point(1.05), point(2.5)
    gain = {id(a.layouts): 0.97, id(b.layouts): 0.7, id(c.layouts): 0.3}
    tried = []

    def variants(s, base, recipe, zero_variants):
        tried.append(base)
        v = point(base.report.step_time_s * gain[id(base.layouts)], fp8=recipe, layouts=base.layouts)
        if v.report.step_time_s < s.best.report.step_time_s:
            s.best = v

    monkeypatch.setattr(outer, "_fp8_variants", variants)
    s = NS(pool=NS(fp8_variant="delayed", cluster=load_cluster("dgx-h100", devices=8)), best=a, leaders=[a, b, c])
    note = outer.precision_variant(s)
    assert tried == [a, b] and s.best.layouts is b.layouts
    assert s.best.report.step_time_s == pytest.approx(0.735)
    assert note.startswith("FP8 GEMMs (delayed scaling) bought 1.43x") and "gain less from FP8" in note


def test_fp8_variants_take_the_larger_micro_batch_full_recomputation_lets_fit():
    """FP8 moves the trade between micro-batch size and recomputation (8-bit saved GEMM inputs, cached weight
    copies that do not grow with the batch), so without a pipeline the search re-costs a leader's layouts in FP8
    at each larger micro-batch its BF16 search weighs, under every recomputation that may fit there. Qwen3-30B-A3B
    on 64 H100: ZeRO 3 at micro-batch 4 under full recomputation in FP8 beats every BF16 point, and until the
    eleventh session the plan was the grid's BF16 TP 2 x PP 4 (5.34 s), its FP8 variants costed only at the
    leaders' own micro-batch (1)."""
    point = api.evaluate("qwen3-30b-a3b", "dgx-h100", 64, tp=1, zero=3, micro_batch=4, recompute="full",
                         precision="fp8")
    bf16 = api.evaluate("qwen3-30b-a3b", "dgx-h100", 64, tp=2, pp=4, zero=1, micro_batch=1, recompute="none")
    assert point.report.fits and point.report.step_time_s < bf16.report.step_time_s
    plan = api.plan("qwen3-30b-a3b", "dgx-h100", 64)
    assert plan.train.precision == "fp8"
    assert plan.report.step_time_s <= point.report.step_time_s * (1 + 1e-9)
    assert "micro-batches per step" in plan.notes[0]  # (what FP8 bought names the larger micro-batch)


def test_an_fp8_gain_inside_the_models_fp8_error_is_called_a_tie():
    """``FP8_SPEEDUP_ERROR`` is the median |error| of the model's FP8-over-BF16 GEMM speedup against the speedups
    measured on one H200 (benchmarks/results/hopper_runs.md's FP8 table, recomputed here); a plan's note calls a gain
    below it a tie with BF16 and states a larger one as it is: GPT-3 350M on 8 H100 (FSDP2), whose FP8 plan buys
    1.01x, says tie; Llama 3 8B on 64 H100 (1.32x) does not."""
    import re
    import statistics
    from pathlib import Path

    from symtensor.cost.precision import FP8_SPEEDUP_ERROR, fp8_gain

    text = (Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "hopper_runs.md").read_text()
    rows = re.findall(r"^\| \d+ x \d+ x \d+ \| [^|]+\| [^|]+\| [\d.]+ \| ([\d.]+) \| ([\d.]+) \|$", text, re.M)
    errors = [abs(float(model) / float(measured) - 1) for measured, model in rows]
    assert len(errors) == 8 and statistics.median(errors) == pytest.approx(FP8_SPEEDUP_ERROR, abs=0.002)
    assert fp8_gain(1.32, 1.0) == "1.32x" and "a tie with BF16" in fp8_gain(1.03, 1.0)
    tie = api.plan("gpt3-350m", "dgx-h100", 8, framework="fsdp2")
    win = api.plan("llama3-8b", "dgx-h100", 64)
    said = [n for n in tie.notes if n.startswith("FP8 GEMMs")]
    assert tie.train.fp8 is not None and said and "a tie with BF16" in said[0], tie.notes
    assert not any("a tie with BF16" in n for n in win.notes) and any(n.startswith("FP8 GEMMs") for n in win.notes)
