"""Export: a Megatron-expressible plan becomes Megatron-LM arguments, a torchtitan config and a
DTensor plan with the same degrees; what an engine cannot express is refused with the reason."""

from __future__ import annotations

import math

import pytest

from symtensor import api
from symtensor.errors import PlanError
from symtensor.export import FORMATS, dtensor_plan, export, megatron_args, torchtitan_config
from symtensor.hardware import load_cluster
from symtensor.models import PRESETS
from symtensor.plan import config_summary
from symtensor.search import search

from fixtures.fuzzing import activation_checkpoint_problems


@pytest.fixture(scope="module")
def plan():
    cfg = PRESETS["llama3-70b"].replace(layers=8)
    return search(cfg, load_cluster("dgx-h100", devices=64), 256, 4096, space="megatron")


def test_megatron_args_carry_the_plan(plan):
    c = config_summary(plan)
    args = " ".join(megatron_args(plan))
    assert f"--tensor-model-parallel-size {c['tp']}" in args
    assert f"--pipeline-model-parallel-size {c['pp']}" in args
    assert f"--context-parallel-size {c['cp']}" in args
    assert "--num-query-groups 8" in args and "--swiglu" in args
    assert ("--sequence-parallel" in args) == c["sp"]


def test_torchtitan_and_dtensor_degrees_multiply_to_the_devices(plan):
    t = torchtitan_config(plan)["parallelism"]
    product = 1
    for key in ("data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                "context_parallel_degree", "pipeline_parallel_degree"):
        product *= t[key]
    assert product == 64
    d = dtensor_plan(plan)
    size = 1
    for v in d["mesh"].values():
        size *= v
    assert size == 64


def test_unknown_format_refused(plan):
    with pytest.raises(PlanError, match="unknown export format 'deepspeed'"):
        export(plan, "deepspeed")


def test_a_megatron_export_refuses_a_dp_that_does_not_divide_the_global_batch(plan):
    """Megatron-LM asserts global batch % (micro batch x dp) at launch: refused, with the nearest
    exportable plan."""
    from dataclasses import replace

    batch = plan.train.global_batch + plan.train.micro_steps  # (as many micro-steps, one more sequence each)
    odd = replace(plan, train=plan.train.replace(global_batch=batch))
    for fmt in ("megatron", "torchtitan"):
        with pytest.raises(PlanError, match=rf"would refuse this plan at launch: global batch {batch} is not "
                                            r"divisible by micro_batch\*dp = \d+\*\d+.*; the nearest exportable plan: "
                                            r"symtensor plan llama3-70b --set layers=8 --cluster dgx-h100 "
                                            r"--devices 64"):
            export(odd, fmt)


@pytest.fixture(scope="module")
def repeated():
    """24 H100 at a global batch of 8: the layers use 8 devices, the other 16 repeat their work."""
    from symtensor import api

    return api.plan("llama3-8b", "dgx-h100", devices=24, global_batch=8, seq=2048, overrides=["layers=2"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_export_refuses_a_plan_whose_degrees_are_not_the_world_size(repeated, fmt):
    """The torchtitan export gave degrees multiplying to 8 on 24 devices, the Megatron export a dp
    that does not divide the batch; the nearest exportable plan is the Megatron space at the
    batch that lets every device take its share (none runs 24 devices at 8)."""
    with pytest.raises(PlanError, match=r"heterogeneous: tp\*pp\*dp\*cp = 1\*1\*8\*1 = 8, not the 24 devices .*"
                                        r"nearest exportable plan: symtensor plan llama3-8b --set layers=2 --cluster "
                                        r"dgx-h100 --devices 24 --seq 2048 --global-batch 24 --space megatron"):
        export(repeated, fmt)


def test_the_export_command_refuses_in_one_line(repeated, tmp_path, capsys):
    from symtensor.cli import main
    from symtensor.plan import save_plan

    save_plan(repeated, tmp_path / "plan.json")
    code = main(["export", str(tmp_path / "plan.json"), "--to", "torchtitan"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "") and len(err.splitlines()) == 1 and err.startswith("error: torchtitan takes one")


def test_the_suggested_plan_exports(repeated):
    """The command the refusal names finds a plan every engine takes."""
    from symtensor import api

    fixed = api.plan("llama3-8b", "dgx-h100", devices=24, global_batch=24, seq=2048, overrides=["layers=2"],
                     space="megatron")
    assert not fixed.config["heterogeneous"]
    assert math.prod(torchtitan_config(fixed)["parallelism"][k] for k in (
        "data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
        "context_parallel_degree", "pipeline_parallel_degree")) == 24


def test_torchtitan_refuses_expert_parallelism_it_cannot_borrow():
    """torchtitan's EP borrows cp (x tp with expert TP 1) and FSDP ranks; a ZeRO-0 plan exports as
    DDP (no FSDP ranks), so EP 8 over TP 2 x DP 8 would fail its ParallelDims check. The same
    degrees at ZeRO-3 export."""
    from symtensor import api

    degrees = dict(tp=2, pp=4, ep=8, micro_batch=1, global_batch=64, seq=1024)
    plan = api.evaluate("mixtral-8x7b", "dgx-h100", devices=64, **degrees)
    with pytest.raises(PlanError, match=r"torchtitan would refuse this plan at launch: its expert parallelism "
                                        r"borrows cp x tp = 2 .* ep=8 must be a multiple of 2 dividing 2; the nearest "
                                        r"exportable configuration: symtensor evaluate mixtral-8x7b .* --zero 3"):
        torchtitan_config(plan)
    assert megatron_args(plan)
    sharded = api.evaluate("mixtral-8x7b", "dgx-h100", devices=64, zero=3, **degrees)
    assert torchtitan_config(sharded)["parallelism"]["data_parallel_shard_degree"] == 8


def test_megatron_takes_an_uneven_pipeline_split_with_the_first_and_last_stages_apart():
    """80 layers over 3 stages (27, 27, 26) exported with no split argument, so Megatron-LM
    asserted num_layers % pp at launch; 13 layers over 8 (1, 2 x 5, 1, 1), which no first/last
    pair gives, runs as its --pipeline-model-parallel-layout (it used to be refused)."""
    from symtensor.cost import TrainConfig
    from symtensor.export.megatron import launched_split, pipeline_args
    from symtensor.search import megatron_plan
    from symtensor.search.megatron import check_config, configuration

    plan = megatron_plan(PRESETS["llama3-70b"], load_cluster("dgx-h100", devices=24), tp=8, pp=3, dp=1, sp=True,
                         global_batch=8, seq=2048)
    args = " ".join(megatron_args(plan))
    assert "--decoder-first-pipeline-num-layers 27 --decoder-last-pipeline-num-layers 26" in args
    split = TrainConfig(global_batch=8, micro_steps=8, pp=8).stage_layers(13)
    assert pipeline_args(13, 8, 1, split) == ["--pipeline-model-parallel-layout 'Et|(t*2|)*5,t|tL'"]
    assert launched_split(13, 8, pipeline_args(13, 8, 1, split)) == split
    check_config(PRESETS["llama2-7b"].replace(layers=13), 8, configuration(dict(pp=8, global_batch=8, seq=1024)))


def test_an_export_refuses_a_tp_that_does_not_divide_the_mlp():
    """Megatron-LM and torchtitan cut the MLP width by tp: a summary whose tp does not divide it
    (the plan cut another model dim) would not launch (fuzz case 0:18, ffn 27321 with tp 2)."""
    from dataclasses import replace

    from symtensor.search import megatron_plan

    plan = megatron_plan(PRESETS["tiny-llama"], load_cluster("dgx-h100", devices=8), tp=2, dp=4, sp=True,
                         global_batch=8, seq=64)
    odd = replace(plan, model=plan.model.replace(ffn=27))
    for fmt in FORMATS:
        with pytest.raises(PlanError, match=r"would refuse this plan at launch: tp=2 must divide the MLP width 27"):
            export(odd, fmt)


def _zero(zero: int, pp: int = 1):
    from symtensor import api

    return api.evaluate("llama3-8b", "dgx-h100", devices=16, pp=pp, dp=16 // pp, zero=zero, micro_batch=1,
                        global_batch=64, seq=2048, framework="fsdp2")


def test_torchtitan_runs_a_zero1_plan_as_fsdp2_without_resharding_not_as_ddp():
    """torchtitan has no ZeRO-1: the export wrote data_parallel_replicate_degree (DDP), which keeps
    the whole optimizer state on every rank (about 129 GiB for this plan, predicted 60). It runs as
    FSDP2 over dp without resharding after forward (ZeRO-2), which the fsdp2 engine costs with the
    same step and no more memory, and says so."""
    plan = _zero(1)
    out = torchtitan_config(plan)
    p = out["parallelism"]
    assert (p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"]) == (1, 16)
    assert p["fsdp_reshard_after_forward"] == "never"
    assert "torchtitan has no ZeRO-1" in out["_zero_note"] and "ZeRO-2" in out["_zero_note"]
    ran = _zero(2)  # what the exported config runs
    assert torchtitan_config(ran)["parallelism"] == p and "_zero_note" not in torchtitan_config(ran)
    assert ran.report.step_time_s == pytest.approx(plan.report.step_time_s)
    assert ran.report.memory_peak <= plan.report.memory_peak
    assert _zero(0).report.memory_peak > plan.report.capacity >= plan.report.memory_peak  # DDP would not fit


@pytest.mark.parametrize("zero, pp, expected", [(0, 1, (16, 1, "default")), (2, 1, (1, 16, "never")),
                                                 (3, 1, (1, 16, "always")), (3, 2, (1, 8, "always"))])
def test_torchtitan_reshards_after_forward_exactly_at_zero3(zero, pp, expected):
    """The fsdp2 engine regathers in backward at ZeRO 3 only; torchtitan's "default" policy reshards
    without pipeline parallelism and not with it (torchtitan/distributed/fsdp.py), so the export
    names the policy: "always" at ZeRO 3, "never" at ZeRO 2."""
    p = torchtitan_config(_zero(zero, pp))["parallelism"]
    assert (p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"],
            p["fsdp_reshard_after_forward"]) == expected


@pytest.mark.parametrize("zero, expected", [(0, ("replicate", False, None)), (1, ("fully_shard", True, False)),
                                             (2, ("fully_shard", True, False)), (3, ("fully_shard", True, True))])
def test_dtensor_shards_each_zero_stage_as_the_fsdp2_engine_costs_it(zero, expected):
    """The DTensor plan wrote fully_shard at ZeRO 3 only: a ZeRO-1/2 plan, which the fsdp2 engine
    costs as FSDP2 without resharding after forward (state sharded over dp, one gather per
    micro-batch), ran as DDP with every rank keeping the whole state (the ZeRO-0 plan of these
    degrees does not fit). It writes fully_shard with reshard_after_forward False at ZeRO 1/2 and
    True at ZeRO 3, and says that ZeRO 1 runs as ZeRO 2."""
    plan = _zero(zero)
    d = dtensor_plan(plan)
    assert (d["data_parallel"], d["fully_shard"], d["reshard_after_forward"]) == expected
    assert d["data_parallel_axes"] == ["dp"] and d["mesh"] == {"dp": 16}
    assert ("_zero_note" in d) == (zero == 1)
    if zero in (1, 2):
        assert _zero(0).report.memory_peak > plan.report.capacity >= plan.report.memory_peak  # DDP would not fit


def test_torchtitan_refuses_a_zero0_plan_with_context_parallelism(capsys):
    """torchtitan applies FSDP2 over its dp_shard_cp mesh whenever cp > 1 (ParallelDims.fsdp_enabled),
    even at data_parallel_shard_degree 1: the export wrote DDP (data_parallel_replicate_degree 8, cp 2)
    for a ZeRO-0 plan, which torchtitan would run sharded over 16 ranks. It refuses in one line with
    the nearest exportable configuration, the same degrees at ZeRO-1, which exports as the FSDP2 over
    dp x cp that the cost model shards ZeRO's state over."""
    import json
    import shlex

    from symtensor import api
    from symtensor.cli import main

    degrees = dict(dp=8, cp=2, micro_batch=1, global_batch=64, seq=4096, framework="fsdp2")
    plan = api.evaluate("llama3-8b", "dgx-h100", devices=16, zero=0, **degrees)
    with pytest.raises(PlanError, match=r"torchtitan would not run this plan as it is costed: with context parallelism "
                                        r"\(cp=2\) it shards the parameters with FSDP over dp x cp = 16 ranks .*DDP.*; "
                                        r"the nearest exportable configuration: symtensor evaluate llama3-8b .*--cp 2 "
                                        r".*--zero 1 .*--framework fsdp2") as refused:
        torchtitan_config(plan)
    assert len(str(refused.value).splitlines()) == 1
    d = dtensor_plan(plan)  # DDP over dp x cp, as the plan costs it
    assert (d["data_parallel"], d["data_parallel_axes"]) == ("replicate", ["dp", "cp"])
    command = str(refused.value).split("exportable configuration: ")[1].split(" (")[0]
    assert main(shlex.split(command)[1:] + ["--json"]) == 0  # the suggestion is a command that runs
    assert json.loads(capsys.readouterr().out)["config"]["zero"] == 1
    p = torchtitan_config(api.evaluate("llama3-8b", "dgx-h100", devices=16, zero=1, **degrees))["parallelism"]
    degrees = (p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"], p["context_parallel_degree"])
    assert degrees == (1, 8, 2)


@pytest.mark.parametrize("zero, pp, noted", [(0, 2, True), (0, 1, False), (1, 2, False), (3, 2, False)])
def test_torchtitan_says_when_ddp_beside_other_parallelism_depends_on_its_version(zero, pp, noted):
    """A ZeRO-0 plan exports as DDP (data_parallel_replicate_degree). Beside a pipeline (or TP, EP)
    torchtitan versions whose parallelize checks ``world_mesh.ndim > 1`` raise "DDP has not
    supported > 1D parallelism" at launch; newer ones check the dp_replicate mesh only. The export
    says so, with the FSDP2 plan that launches on either; pure DDP and FSDP2 need no note."""
    out = torchtitan_config(_zero(zero, pp))
    assert ("_ddp_note" in out) == noted
    if noted:
        note = out["_ddp_note"]
        assert "DDP has not supported > 1D parallelism" in note and "world_mesh.ndim > 1" in note
        assert f"--pp {pp}" in note and "--zero 1" in note and len(note.splitlines()) == 1


@pytest.mark.parametrize("recompute", ["none", "selective", "full", "selective-op", "layer:2"])
def test_torchtitan_launches_every_recomputation_the_plan_can_carry(recompute):
    """The planner's ``selective`` exported as mode "selective" without selective_ac_option, which torchtitan
    runs as its default "2" (every other block checkpointed whole): a launchable section for every mode now,
    by torchtitan's own check (``_apply_ac_to_transformer_block``) and stating its option."""
    plan = api.evaluate("llama2-7b", "dgx-a100-80g", 8, dp=8, zero=3, micro_batch=1, global_batch=8, seq=4096,
                        recompute=recompute, framework="fsdp2", overrides={"layers": "4"})
    assert activation_checkpoint_problems(torchtitan_config(plan)["activation_checkpoint"]) == []


def test_the_launch_check_catches_a_selective_mode_without_its_option():
    assert activation_checkpoint_problems({"mode": "selective"}) != []
    assert activation_checkpoint_problems({"mode": "selective", "selective_ac_option": "0"}) != []
    assert activation_checkpoint_problems({"mode": "memory_budget"}) != []
    assert activation_checkpoint_problems({"mode": "selective", "selective_ac_option": "op"}) == []


def _megatron_zero3(**config):
    from symtensor.search import megatron_plan

    return megatron_plan(PRESETS["tiny-llama"], load_cluster("dgx-h100", devices=8),
                         **{"tp": 2, "dp": 4, "sp": True, "zero": 3, "global_batch": 8, "seq": 64, **config})


def test_a_megatron_zero3_plan_exports_as_megatron_fsdp_and_would_launch():
    """ZeRO 3 under the megatron engine is Megatron-FSDP (optim_grads_params) with the fsdp_dtensor checkpoint
    format arguments.py asserts beside it, the distributed optimizer Megatron-FSDP v1 runs, and the gradient dtype
    the plan is costed with stated (Megatron-FSDP's own default is bf16); hybrid sharding as optimizer instances."""
    from fixtures.fuzzing import _megatron_problems

    plan = _megatron_zero3()
    args = megatron_args(plan)
    for flag in ("--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
                 "--ckpt-format fsdp_dtensor", "--use-distributed-optimizer", "--megatron-fsdp-main-grads-dtype fp32"):
        assert flag in args
    assert "--grad-reduce-in-bf16" not in args and _megatron_problems(plan, args) == []
    bf16 = _megatron_zero3(grad_reduce_bf16=True)
    args = megatron_args(bf16)
    assert "--grad-reduce-in-bf16" in args and "--megatron-fsdp-main-grads-dtype bf16" in args
    assert _megatron_problems(bf16, args) == []
    hybrid = _megatron_zero3(dp_shard=2)
    args = megatron_args(hybrid)
    assert "--num-distributed-optimizer-instances 2" in args and _megatron_problems(hybrid, args) == []
    zero1 = megatron_args(_megatron_zero3(zero=1))  # ZeRO 1 stays the distributed optimizer alone
    assert "--use-distributed-optimizer" in zero1 and not any("fsdp" in a for a in zero1)


def test_the_launch_check_catches_a_megatron_fsdp_export_that_would_not_launch():
    """The harness's Megatron-FSDP rules (arguments.py at d98e8a6) fail on arguments that break them: no
    fsdp_dtensor checkpoint format, a ZeRO stage or gradient dtype other than the plan's."""
    from fixtures.fuzzing import _megatron_problems

    plan = _megatron_zero3()
    args = megatron_args(plan)
    assert any("fsdp_dtensor" in p for p in _megatron_problems(plan, [a for a in args if "ckpt-format" not in a]))
    optim = [a.replace("optim_grads_params", "optim") for a in args]
    assert any("run ZeRO 1, the plan is ZeRO 3" in p for p in _megatron_problems(plan, optim))
    auto = [a for a in args if "main-grads-dtype" not in a]
    assert any("reduces gradients in bf16, the plan in fp32" in p for p in _megatron_problems(plan, auto))


def test_megatron_exports_zero2_as_megatron_fsdp_optim_grads():
    """A megatron ZeRO-2 plan (gradients and optimizer state sharded, a reduce-scatter per micro-batch, the weights
    replicated) is Megatron-FSDP's optim_grads; the launch check accepts it and says which stage it runs."""
    from dataclasses import replace

    from fixtures.fuzzing import _megatron_problems

    plan = _megatron_zero3()
    zero2 = replace(plan, train=plan.train.replace(zero=2))
    args = megatron_args(zero2)
    assert "--data-parallel-sharding-strategy optim_grads" in args and "--use-megatron-fsdp" in args
    assert not _megatron_problems(zero2, args)
    assert any("run ZeRO 3, the plan is ZeRO 2" in p for p in _megatron_problems(zero2, megatron_args(plan)))


@pytest.mark.parametrize("stack", [
    dict(),
    dict(moe_dispatcher="hybridep", moe_routing="aux_loss", moe_capacity_factor=1.25, moe_shared_overlap=True),
    dict(moe_ep_overlap=True, grad_reduce_bf16=True, expandable_segments=False, cpu_offload_layers=3),
    dict(fp8_param_gather=True, bf16_layers=(1, 2), expandable_segments=True),
    dict(offload_modules=("core_attn", "attn_proj", "expert_fc1"))])
def test_the_evaluate_command_an_export_suggests_states_the_whole_configuration(plan, stack):
    """``export.common.evaluate_command`` (what a torchtitan refusal tells the user to evaluate instead) parses back,
    through the CLI's own parser, to the configuration it was made from: degrees, the stated layer split and every
    stack fact (``stack_flags``)."""
    import shlex

    from symtensor.cli import build_parser, stack_of
    from symtensor.export.common import evaluate_command
    from symtensor.plan import Parallelism, Stack

    p = Parallelism(tp=2, pp=2, dp=16, micro_batch=1, global_batch=256, seq=4096, recompute="selective",
                    layer_split=(3, 5), precision="fp8", fp8_recipe="tensorwise", stack=Stack(**stack))
    argv = shlex.split(evaluate_command(plan, p))[1:]  # (the command without its program name)
    args = build_parser().parse_args(argv)
    assert stack_of(args) == p.stack
    assert (args.tp, args.pp, args.dp, args.global_batch, args.recompute, args.fp8_recipe) == \
        (2, 2, 16, 256, "selective", "tensorwise")
    assert api.stated_split(args.pp_layout, plan.model, args.pp, args.vpp) == (1, (3, 5))


def test_megatron_builds_nemotron_as_it_is_not_as_llama():
    """Nemotron-4 (NeMo 2's Nemotron4Config: LayerNorm with a zero-centred gamma, squared ReLU, RoPE over half of each
    head) exports with Megatron-LM's flag for each part (NVIDIA/Megatron-LM@d98e8a64dd arguments.py --normalization,
    --squared-relu, --rotary-percent; transformer_config.py --apply-layernorm-1p), not LLaMA's RMSNorm and SwiGLU;
    Megatron-DeepSpeed, whose LLaMA path has none of them, refuses in one line; a LLaMA export keeps its flags."""
    nemotron = api.evaluate("nemotron4-15b", "dgx-h100", 64, tp=2)
    args = megatron_args(nemotron)
    for flag in ("--normalization LayerNorm", "--apply-layernorm-1p", "--squared-relu", "--rotary-percent 0.5",
                 "--position-embedding-type rope", "--disable-bias-linear"):
        assert flag in args
    assert "--swiglu" not in args and "--normalization RMSNorm" not in args
    with pytest.raises(PlanError, match="Megatron-DeepSpeed cannot build nemotron4-15b .*squared-ReLU") as e:
        export(nemotron, "megatron-deepspeed")
    assert "\n" not in str(e.value)
    llama = megatron_args(api.evaluate("llama3-8b", "dgx-h100", 8))
    assert "--normalization RMSNorm" in llama and "--swiglu" in llama
    assert not any(a.startswith(("--rotary-percent", "--apply-layernorm-1p", "--squared-relu")) for a in llama)


@pytest.mark.parametrize("model, native", [("llama3-8b", "llama3"), ("qwen3-30b-a3b", "qwen3"),
                                           ("deepseek-v3", "deepseek_v3"), ("gpt-oss-120b", "gpt_oss"),
                                           ("mixtral-8x7b", None), ("gpt3-1.3b", None), ("nemotron4-15b", None),
                                           ("qwen2-7b", None)])
def test_torchtitan_says_when_it_has_no_model_of_the_architecture(model, native):
    """torchtitan's own models (pytorch/torchtitan@b5bcd76 torchtitan/models/) build LLaMA, Qwen3, DeepSeek-V3 and
    GPT-OSS; a Mixtral, GPT-3, Nemotron-4 or Qwen2 (QKV biases) job goes through its Hugging Face backend, and the
    export says so instead of handing over a parallelism config as if torchtitan built the model it costs."""
    from symtensor.export.torchtitan import native_model

    assert native_model(PRESETS[model]) == native
    devices = 64 if PRESETS[model].is_moe or model == "nemotron4-15b" else 8
    cfg = torchtitan_config(api.evaluate(model, "dgx-h100", devices, zero=3, framework="fsdp2",
                                         ep=8 if PRESETS[model].is_moe else 1))
    assert ("_model_note" in cfg) == (native is None)
    if native is None:
        assert "transformers_modeling_backend" in cfg["_model_note"] and model in cfg["_model_note"]


@pytest.mark.parametrize("pp", [1, 2])
def test_torchtitan_runs_a_pipeline_plan_as_one_schedule_of_its_micro_batches(pp):
    """torchtitan runs global / (local_batch_size x dp) accumulation steps, under pipeline parallelism each one
    whole schedule of local_batch_size / pipeline_parallel_microbatch_size micro-batches (default size 1;
    torchtitan@238fa99 train.py, distributed/pipeline_parallel.py). The export wrote local_batch_size = the
    micro-batch for every plan, so a pipeline plan costed as one schedule of m micro-batches launched as m
    schedules, a pipeline bubble each, of micro-batches of one sequence. Without a pipeline the micro-batches
    are accumulation steps, as costed."""
    from fixtures.fuzzing import _torchtitan_problems

    plan = _zero(3, pp)
    c = config_summary(plan)
    out = torchtitan_config(plan)
    t, p = out["training"], out["parallelism"]
    steps = t["global_batch_size"] // (t["local_batch_size"] * c["dp"])
    if pp == 1:
        assert t["local_batch_size"] == c["micro_batch"] and "pipeline_parallel_microbatch_size" not in p
    else:
        assert steps == 1 and p["pipeline_parallel_microbatch_size"] == c["micro_batch"]
        assert t["local_batch_size"] // c["micro_batch"] == c["global_batch"] // (c["dp"] * c["micro_batch"]) > 1
        assert _torchtitan_problems(plan, out) == []
        old = {**out, "training": {**t, "local_batch_size": c["micro_batch"]},
               "parallelism": {k: v for k, v in p.items() if k != "pipeline_parallel_microbatch_size"}}
        assert any("pipeline schedules" in b for b in _torchtitan_problems(plan, old))
