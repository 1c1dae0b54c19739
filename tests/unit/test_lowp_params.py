"""Two stack facts of low-precision training (cost/precision.py): quantized parameters (Megatron-LM's
--fp8-param-gather / --fp4-param-gather: no BF16 weight beside the quantized copies, the data-parallel gather in the
quantized bytes, the optimizer step's cast of its shard) and layers kept in BF16 (--first-last-layers-bf16: those
layers' GEMMs at BF16 rates, no casts, on the stages that hold them). Memory and gather bytes against hand counts,
the BF16 layers' time against their GEMMs' own BF16 and FP8 times, the refusals, the exports and the CLI."""

import json

import pytest

from symtensor import api
from symtensor.cost import precision as P
from symtensor.cost.opcost import stream_fraction
from symtensor.errors import PlanError
from symtensor.plan.parallelism import Parallelism
from symtensor.plan.stack import Stack

# Llama 3 8B's linear GEMM weights (its FP8 GEMMs, ``precision.fp8_gemm``), per layer: q and o 4,096 x 4,096, k and
# v 4,096 x 1,024, gate, up and down 4,096 x 14,336; 32 layers
GEMM_WEIGHTS = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
# tp 1 (no sequence-parallel gathers: every all-gather is the parameters'), dp 16, one micro-batch per step
DP = dict(tp=1, pp=1, micro_batch=1, global_batch=16, seq=4096)


def _pair(cluster: str, zero: int, **kw):
    base = api.evaluate("llama3-8b", cluster, 16, **DP, zero=zero, **kw)
    low = api.evaluate("llama3-8b", cluster, 16, **DP, zero=zero, **kw, stack=Stack(fp8_param_gather=True))
    return base.report, low.report


@pytest.mark.parametrize("cluster, precision, recipe, gathered", [
    ("dgx-h100", "fp8", "tensorwise", 1.0),  # the uint8 parameter buffer: 1 B per element
    ("dgx-h100", "fp8", "delayed", 1.0),
    ("dgx-b200", "fp8", "mxfp8", 2.0),  # MXFP8 gathers BF16 through the gradient buffer
    ("dgx-b200", "fp4", "nvfp4", 0.5),  # NVFP4's packed bytes
])
def test_distributed_optimizer_memory_and_gather(cluster, precision, recipe, gathered):
    """ZeRO 1: the GEMM weights' BF16 copy (2 B each) leaves the parameters, their quantized copies stay (the
    ``fp8_weights`` term, the weights themselves now), and the post-step all-gather moves ``gathered`` bytes per
    GEMM weight element instead of 2."""
    base, low = _pair(cluster, 1, precision=precision, fp8_recipe=recipe)
    assert base.memory["params"] - low.memory["params"] == pytest.approx(2 * GEMM_WEIGHTS)
    assert low.memory["fp8_weights"] == pytest.approx(base.memory["fp8_weights"])
    assert base.comm_bytes["all_gather"] - low.comm_bytes["all_gather"] == pytest.approx((2 - gathered) * GEMM_WEIGHTS)
    assert P.param_gather_bytes(P.RECIPES[recipe]) == gathered


def test_optimizer_step_casts_its_shard():
    """The optimizer step reads its BF16 copy back (2 B), takes its amax (2 B, tensorwise) and writes the FP8
    shard (1 B) per owned GEMM weight element (TE ``quantize_master_weights``), memory-bound at the fused Adam's
    stream rate; delayed scaling takes the amax in the cast (4 B)."""
    for recipe, per in (("tensorwise", 5.0), ("delayed", 3.0)):
        assert P.param_cast_bytes(P.RECIPES[recipe], fsdp=False) == per
        base = api.evaluate("llama3-8b", "dgx-h100", 16, **DP, zero=1, precision="fp8", fp8_recipe=recipe)
        low = api.evaluate("llama3-8b", "dgx-h100", 16, **DP, zero=1, precision="fp8", fp8_recipe=recipe,
                           stack=Stack(fp8_param_gather=True))
        ev = low.evaluator()
        rate = ev.cluster.device.hbm_bandwidth * stream_fraction(ev.eff, "triad")
        extra = low.report.breakdown["optimizer"] - base.report.breakdown["optimizer"]
        assert extra == pytest.approx(GEMM_WEIGHTS / 16 * per / rate)
    assert P.param_cast_bytes(P.RECIPES["mxfp8"], fsdp=False) == 0.0  # (BF16 written, quantized after the gather)


def test_megatron_fsdp_gathers_the_quantized_shard():
    """ZeRO 3 (Megatron-FSDP): the resident shard is FP8 (1 B per GEMM weight element over the 16 shards), every
    per-unit gather moves 1 B per GEMM weight element, the gathered units' transposes are the quantized copies."""
    base, low = _pair("dgx-h100", 3, precision="fp8", fp8_recipe="tensorwise")
    assert base.memory["params"] - low.memory["params"] == pytest.approx(GEMM_WEIGHTS / 16)
    # the gathers per step: the bytes gathered over the parameters' BF16 bytes (all of them, ZeRO 1 keeps them whole)
    gathers = base.comm_bytes["all_gather"] / api.evaluate("llama3-8b", "dgx-h100", 16, **DP, zero=1).report.memory[
        "params"]
    assert low.comm_bytes["all_gather"] == pytest.approx(base.comm_bytes["all_gather"] - gathers * GEMM_WEIGHTS)
    assert low.step_time_s <= base.step_time_s


def test_bf16_layers_cost_their_gemms_in_bf16():
    """One device, one micro-batch: keeping the first and last layer in BF16 adds exactly their GEMMs' BF16 time
    over their FP8 time (the casts included), and their FP8 weight copies leave the memory."""
    kw = dict(tp=1, pp=1, micro_batch=1, global_batch=1, seq=4096, precision="fp8", fp8_recipe="tensorwise")
    fp8 = api.evaluate("llama3-8b", "dgx-h100", 1, **kw)
    kept = api.evaluate("llama3-8b", "dgx-h100", 1, **kw, stack=Stack(bf16_layers=(1, 1)))
    ev, layouts = fp8.evaluator(), fp8.op_layouts()
    gemms = [op for op in ev.graph.ops if op.layer == 0 and P.fp8_gemm(op)]
    per_layer = 0.0
    for op in gemms:
        bf16, low = ev.op_time(op, layouts[op.name], None), ev.op_time(op, layouts[op.name], "tensorwise")
        per_layer += bf16.fwd_s + bf16.bwd_s - low.fwd_s - low.bwd_s
    assert per_layer > 0
    assert kept.report.step_time_s - fp8.report.step_time_s == pytest.approx(2 * per_layer)
    # two layers' weights: their GEMMs' and their norms' (which the FP8 copies charge as an upper bound)
    weights = 2 * sum(ev.tensors[t].numel for op in ev.graph.ops if op.layer == 0 for t in op.inputs
                      if ev.tensors[t].param)
    copies = fp8.report.memory["fp8_weights"] - kept.report.memory["fp8_weights"]
    assert copies == pytest.approx(weights * P.weight_copy_bytes(P.RECIPES["tensorwise"], True))


def test_bf16_layers_slow_the_stage_that_holds_them():
    """Over two pipeline stages, the first two layers in BF16 slow the first stage's time per micro-batch by their
    GEMMs' BF16-over-FP8 time and leave the second's as it was."""
    kw = dict(tp=1, pp=2, micro_batch=1, global_batch=4, seq=4096, precision="fp8", fp8_recipe="tensorwise",
              pp_layout="16,16")
    fp8 = api.evaluate("llama3-8b", "dgx-h100", 2, **kw)
    kept = api.evaluate("llama3-8b", "dgx-h100", 2, **kw, stack=Stack(bf16_layers=(2, 0)))
    ev, layouts = fp8.evaluator(), fp8.op_layouts()
    per_layer = sum(b.fwd_s + b.bwd_s - f.fwd_s - f.bwd_s for b, f in (
        (ev.op_time(op, layouts[op.name], None), ev.op_time(op, layouts[op.name], "tensorwise"))
        for op in ev.graph.ops if op.layer == 1 and P.fp8_gemm(op)))
    first, second = (k - f for k, f in zip(kept.report.stage_times_s, fp8.report.stage_times_s))
    assert first == pytest.approx(2 * per_layer) and second == 0.0


def test_refusals():
    """Where Megatron-LM refuses the facts, and where another engine cannot state them: one line each."""
    run = dict(tp=1, pp=1, micro_batch=1, global_batch=16, seq=4096)
    cases = [
        (dict(zero=1), Stack(fp8_param_gather=True), "but precision is bf16"),
        (dict(zero=0, precision="fp8"), Stack(fp8_param_gather=True), "needs Megatron's distributed optimizer"),
        (dict(zero=1), Stack(bf16_layers=(1, 1)), "nothing to keep"),
        (dict(zero=1, precision="fp8", fp8_recipe="delayed"), Stack(bf16_layers=(1, 1)), "Delayed scaling does not"),
        (dict(zero=1, precision="fp8", fp8_recipe="tensorwise", framework="fsdp2"), Stack(fp8_param_gather=True),
         "are Megatron-LM's"),
        (dict(zero=1, precision="fp8", fp8_recipe="tensorwise"), Stack(bf16_layers=(20, 20)),
         "keeps 40 layers of the model's 32"),
    ]
    for config, stack, match in cases:
        with pytest.raises(PlanError, match=match):
            api.evaluate("llama3-8b", "dgx-h100", 16, **run, **config, stack=stack)
    with pytest.raises(PlanError, match=r"at most layers // pp = 4"):
        api.evaluate("llama3-8b", "dgx-h100", 16, tp=1, pp=8, micro_batch=1, global_batch=16, seq=4096, zero=1,
                     precision="fp8", fp8_recipe="tensorwise", stack=Stack(bf16_layers=(0, 5)))
    with pytest.raises(PlanError, match="--fp4-param-gather under Megatron-FSDP"):
        api.evaluate("llama3-8b", "dgx-b200", 16, **run, zero=3, precision="fp4", stack=Stack(fp8_param_gather=True))
    with pytest.raises(PlanError, match=r"bf16_layers=\(1,\); give two layer counts"):
        Stack(bf16_layers=(1,))
    with pytest.raises(PlanError, match="Delayed scaling does not"):  # (a search whose FP8 points run delayed)
        api.plan("llama3-8b", "dgx-h100", devices=16, global_batch=64, seq=4096, stack=Stack(bf16_layers=(1, 1)))


def test_megatron_export():
    """Megatron-LM's own spellings (arguments.py, transformer_config.py @d98e8a64): --fp8-param-gather, with MXFP8
    under the distributed optimizer --reuse-grad-buf-for-mxfp8-param-ag; --fp4-param-gather under NVFP4; the BF16
    layers with both counts stated (Megatron's defaults are 1)."""
    from symtensor.export.megatron import megatron_args
    from symtensor.export.torchtitan import torchtitan_config

    run = dict(tp=1, pp=1, micro_batch=1, global_batch=16, seq=4096, zero=1)
    args = megatron_args(api.evaluate("llama3-8b", "dgx-h100", 16, **run, precision="fp8", fp8_recipe="tensorwise",
                                      stack=Stack(fp8_param_gather=True, bf16_layers=(0, 4))))
    assert args[-4:] == ["--fp8-param-gather", "--first-last-layers-bf16", "--num-layers-at-start-in-bf16 0",
                         "--num-layers-at-end-in-bf16 4"]
    mx = megatron_args(api.evaluate("llama3-8b", "dgx-b200", 16, **run, precision="fp8",
                                    stack=Stack(fp8_param_gather=True)))
    assert mx[-2:] == ["--fp8-param-gather", "--reuse-grad-buf-for-mxfp8-param-ag"]
    fp4 = megatron_args(api.evaluate("llama3-8b", "dgx-b200", 16, **run, precision="fp4",
                                     stack=Stack(fp8_param_gather=True)))
    assert fp4[-1] == "--fp4-param-gather" and "--fp8-param-gather" not in fp4
    plain = megatron_args(api.evaluate("llama3-8b", "dgx-h100", 16, **run, precision="fp8"))
    assert not any(a in ("--fp8-param-gather", "--fp4-param-gather") or "bf16-layers" in a or "in-bf16" in a
                   for a in plain)
    with pytest.raises(PlanError):
        torchtitan_config(api.evaluate("llama3-8b", "dgx-h100", 16, **run, precision="fp8", fp8_recipe="tensorwise",
                                       stack=Stack(fp8_param_gather=True)))


def test_cli_round_trip(capsys, tmp_path):
    """The CLI states both facts (either spelling of the gather), the JSON's config names them, and that config
    is the same configuration again; a plan file keeps them."""
    from symtensor.cli import main
    from symtensor.plan import load_plan, save_plan

    base = ["evaluate", "llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--tp", "2", "--global-batch", "32",
            "--seq", "4096", "--zero", "1", "--precision", "fp8", "--fp8-recipe", "tensorwise", "--json"]
    assert main(base + ["--fp8-param-gather", "--first-last-layers-bf16", "1,2"]) == 0
    config = json.loads(capsys.readouterr().out)["config"]
    assert config["fp8_param_gather"] is True and config["bf16_layers"] == [1, 2]
    p = Parallelism.from_dict(config)
    assert p.stack.bf16_layers == (1, 2) and p.stack.fp8_param_gather
    assert main(base + ["--fp4-param-gather"]) == 0  # (the same fact, Megatron's FP4 spelling)
    assert json.loads(capsys.readouterr().out)["config"]["fp8_param_gather"] is True
    with pytest.raises(SystemExit):
        main(base + ["--first-last-layers-bf16", "1"])
    assert "takes N,M" in capsys.readouterr().err
    plan = api.evaluate("llama3-8b", "dgx-h100", 16, tp=2, global_batch=32, seq=4096, zero=1, precision="fp8",
                        fp8_recipe="tensorwise", stack=Stack(fp8_param_gather=True, bf16_layers=(1, 2)))
    save_plan(plan, tmp_path / "p.json")
    again = load_plan(tmp_path / "p.json")
    assert again.train.stack.bf16_layers == (1, 2) and again.train.lowp_params
    assert again.report.step_time_s == pytest.approx(plan.report.step_time_s)


def test_the_search_holds_the_facts_where_they_apply():
    """A search in FP8 holds both facts at every point where they apply (the gather at ZeRO >= 1) and its summary
    names them there."""
    plan = api.plan("llama3-8b", "dgx-h100", devices=16, global_batch=64, seq=4096, precision="fp8",
                    fp8_recipe="tensorwise", space="megatron",
                    stack=Stack(fp8_param_gather=True, bf16_layers=(1, 1)))
    assert plan.config["bf16_layers"] == [1, 1]
    assert plan.config.get("fp8_param_gather", False) == (plan.train.zero >= 1)
