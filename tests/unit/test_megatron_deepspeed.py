"""The Megatron-DeepSpeed engine (``cost.engine``'s ``megatron-deepspeed``: DeepSpeed's pipeline engine with
Megatron's kernels): against megatron on the same configuration, the step differs where the stacks' documented
behaviour differs, in the documented direction, and nowhere else; what DeepSpeed's pipeline engine does not run
is refused in one line.

Sources (each fact's, in cost/engine.py): deepspeedai/DeepSpeed deepspeed/runtime/pipe/engine.py
(PipelineEngine: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism", backward all-reduce disabled,
_exec_reduce_grads after the last backward, BF16_Optimizer's buffered_allreduce_fallback), pipe/schedule.py
(TrainSchedule: SendActivation/RecvActivation/SendGrad/RecvGrad), pipe/p2p.py (blocking dist.send/recv);
microsoft/Megatron-DeepSpeed pretrain_gpt.py (GPTModelPipe), examples_deepspeed run_bf16.sh (bf16, fp32
gradient accumulation)."""

import pytest

from symtensor import api
from symtensor.cost.engine import ENGINES, Unit, exposure
from symtensor.cost.train import TrainConfig
from symtensor.errors import PlanError

SMALL = {"layers": "8"}  # llama2-7b's layers cut to 8: the same shapes, a quick evaluation


def _pair(**kw):
    base = dict(model="llama2-7b", cluster="dgx-a100-80g", devices=32, tp=2, pp=4, zero=1, micro_batch=1,
                global_batch=64, seq=4096, overrides=SMALL)
    base.update(kw)
    return (api.evaluate(**base, framework="megatron").report,
            api.evaluate(**base, framework="megatron-deepspeed").report)


def test_same_kernels_blocking_p2p_and_unhidden_gradient_reduction():
    """Megatron's fused kernels on both: the same compute. The pipeline engine's four blocking transfers per
    micro-batch cost twice Megatron's two batched exchanges; its ReduceGrads after the last backward hides
    nothing, and BF16_Optimizer all-reduces fp32 gradients where Megatron's distributed optimizer
    reduce-scatters behind the cool-down: more data-parallel time, and a slower step."""
    mega, mds = _pair()
    assert mds.breakdown["compute"] == pytest.approx(mega.breakdown["compute"])
    assert mds.breakdown["pp_comm"] == pytest.approx(2 * mega.breakdown["pp_comm"])
    assert mega.breakdown["pp_comm"] > 0
    assert mds.breakdown["dp_comm"] > 2 * mega.breakdown["dp_comm"]
    assert mds.step_time_s > mega.step_time_s
    # the same bytes cross the pipeline; the gradients cross the data-parallel group as an fp32 all-reduce
    assert mds.comm_bytes["send_recv"] == pytest.approx(mega.comm_bytes["send_recv"])
    # (tensor parallelism's reduce-scatters and all-reduces are the same on both): the gradients' fp32
    # reduce-scatter under Megatron is an fp32 all-reduce of the same bytes here; the bf16 gathers are equal
    to_all_reduce = mds.comm_bytes["all_reduce"] - mega.comm_bytes["all_reduce"]
    assert to_all_reduce > 0
    assert to_all_reduce == pytest.approx(mega.comm_bytes["reduce_scatter"] - mds.comm_bytes["reduce_scatter"])
    assert mds.comm_bytes["all_gather"] == pytest.approx(mega.comm_bytes["all_gather"])


def test_reduction_after_backward_is_exposed_whole():
    """Under the pipeline engine the gradients' reduction and the post-step gather add up, whatever compute
    the stage has (Megatron hides its bucketed reduction behind the cool-down's backward)."""
    units = [Unit(4, fwd_s=1.0, bwd_s=2.0, gather_s=0.1, reduce_s=0.3, grad_bytes=1e9)]
    train = TrainConfig(global_batch=8, micro_steps=8, pp=4, zero=1, framework="megatron-deepspeed")
    assert exposure(units, train).seconds == pytest.approx(4 * (0.3 + 0.1))
    hidden = exposure(units, train.replace(framework="megatron")).seconds
    assert hidden < 0.5 * exposure(units, train).seconds


def test_memory_keeps_fp32_gradient_accumulation_and_bf16_gradients():
    """BF16_Optimizer keeps each gradient in bf16 and in its fp32 accumulation buffer, unsharded at ZeRO 1
    (6 bytes per parameter, Megatron's fp32 main gradients 4), and shards fp32 master weights + Adam (12)."""
    mega, mds = _pair()
    assert ENGINES["megatron-deepspeed"].state_bytes == (2, 6, 12)
    assert mds.memory["grads"] == pytest.approx(1.5 * mega.memory["grads"])
    assert mds.memory["optimizer"] == pytest.approx(mega.memory["optimizer"])
    assert mds.memory_reserved > mega.memory_reserved


@pytest.mark.parametrize("kw, says", [
    (dict(zero=2), "ZeRO 0 or 1"), (dict(zero=3), "--framework deepspeed"), (dict(vpp=2), "--vpp 1"),
    (dict(pp_layout="balanced"), "type:transformer"), (dict(pp_layout="Et*2|t*2|t*2|t*2L"), "type:transformer"),
    (dict(tp=1, cp=2), "--cp 1"), (dict(dp_shard=2), "--dp-shard"),
])
def test_what_the_pipeline_engine_does_not_run_is_refused_in_one_line(kw, says):
    base = dict(tp=2, pp=4, zero=1, micro_batch=1, global_batch=64, seq=4096, overrides=SMALL)
    base.update(kw)
    with pytest.raises(PlanError) as err:
        api.evaluate("llama2-7b", "dgx-a100-80g", 32, framework="megatron-deepspeed", **base)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_plan_does_not_search_under_it():
    with pytest.raises(PlanError, match="evaluate --framework megatron-deepspeed"):
        api.plan("llama2-7b", "dgx-a100-80g", 32, framework="megatron-deepspeed", overrides=SMALL)


def test_rule_split_without_a_stated_layout():
    """An uneven layer count splits by the rule (DeepSpeed partitions by layer count), never the balanced
    split the megatron engine may choose."""
    plan = api.evaluate("llama2-7b", "dgx-a100-80g", 24, tp=2, pp=3, zero=1, micro_batch=1, global_batch=48,
                        seq=4096, overrides={"layers": "10"}, framework="megatron-deepspeed")
    assert plan.train.layer_split is None and not plan.notes


def test_export_launches_pretrain_gpt_with_its_ds_config():
    """The launch form: pretrain_gpt.py's Megatron-DeepSpeed flags and the bf16 ds_config (fp32 gradient
    accumulation: BF16_Optimizer); the batch sizes agree with the data-parallel degree."""
    from symtensor.export import export

    plan = api.evaluate("llama2-7b", "dgx-a100-80g", 32, tp=2, pp=4, zero=1, micro_batch=2, global_batch=64,
                        seq=4096, recompute="full", overrides=SMALL, framework="megatron-deepspeed")
    out = export(plan, "megatron-deepspeed")
    args, ds = out["pretrain_gpt_args"], out["ds_config"]
    for flag in ("--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 4", "--sequence-parallel",
                 "--zero-stage 1", "--checkpoint-activations", "--use-flash-attn-v2", "--bf16", "--deepspeed"):
        assert flag in args
    assert ds["zero_optimization"] == {"stage": 1} and ds["data_types"] == {"grad_accum_dtype": "fp32"}
    assert ds["train_batch_size"] == 64 and ds["train_micro_batch_size_per_gpu"] == 2
    assert "_engine_note" not in out
    # a plan costed under megatron with what the pipeline engine does not run is refused in one line
    inter = api.evaluate("llama2-7b", "dgx-a100-80g", 32, tp=2, pp=4, vpp=2, zero=1, micro_batch=1,
                         global_batch=64, seq=4096, overrides=SMALL)
    with pytest.raises(PlanError, match="Megatron-DeepSpeed would refuse this plan at launch: .*--vpp 1"):
        export(inter, "megatron-deepspeed")


def _fp16_pair(zero):
    """bf16 (BF16_Optimizer) and fp16 (FP16_Optimizer at ZeRO 0, DeepSpeedZeroOptimizer at ZeRO 1) on the same
    Megatron-DeepSpeed configuration."""
    base = dict(model="llama2-7b", cluster="dgx-a100-80g", devices=32, tp=2, pp=2, dp=8, zero=zero, micro_batch=1,
                global_batch=64, seq=4096, overrides=SMALL, framework="megatron-deepspeed")
    return api.evaluate(**base).report, api.evaluate(**base, precision="fp16").report


@pytest.mark.parametrize("zero", [0, 1])
def test_fp16_keeps_fp16_gradients_and_reduces_them_in_fp16(zero):
    """FP16 accumulates the gradients in the fp16 weights' own dtype (2 bytes, not bf16's 2 + 4 of fp32
    accumulation), keeps the same fp32 master + Adam state and flattens the owned gradients to fp32 for the
    step (4 bytes per owned parameter, transient); it reduces in fp16 (communication_data_type): an all-reduce
    of half bf16's fp32 bytes at ZeRO 0, a reduce to the partitions' owners (a reduce-scatter's bytes) at
    ZeRO 1, where BF16_Optimizer all-reduces fp32. The compute is the same."""
    bf16, fp16 = _fp16_pair(zero)
    assert fp16.breakdown["compute"] == bf16.breakdown["compute"]
    assert fp16.memory["grads"] == pytest.approx(bf16.memory["grads"] / 3)
    assert fp16.memory["optimizer"] == pytest.approx(bf16.memory["optimizer"])
    assert bf16.memory["optimizer_transient"] == 0
    assert fp16.memory["optimizer_transient"] == pytest.approx(fp16.memory["optimizer"] * 4 / 12)
    # (under sequence parallelism tensor parallelism all-reduces only the norm weights' gradients, in the
    # gradients' dtype too: a few KB beside the data-parallel reduction)
    fewer = bf16.comm_bytes["all_reduce"] - fp16.comm_bytes["all_reduce"]
    if zero == 0:  # the same all-reduce, fp16 for fp32
        assert fp16.comm_bytes["all_reduce"] == pytest.approx(bf16.comm_bytes["all_reduce"] / 2, rel=1e-3)
        assert fp16.comm_bytes["reduce_scatter"] == bf16.comm_bytes["reduce_scatter"]
    else:  # the fp32 all-reduce becomes an fp16 reduce-scatter of the same elements: half its bytes
        assert fp16.comm_bytes["reduce_scatter"] - bf16.comm_bytes["reduce_scatter"] == pytest.approx(fewer / 2,
                                                                                                      rel=1e-3)
        assert fp16.comm_bytes["all_reduce"] < 1e-3 * bf16.comm_bytes["all_reduce"]
    assert fp16.breakdown["dp_comm"] < bf16.breakdown["dp_comm"]


def test_fp16_pays_the_loss_scale_check():
    """Every step the loss scaler scans the gradients for inf/nan (all of them at ZeRO 0, FP16_Optimizer's
    ``float(x.float().sum())``; the owned partition at ZeRO 1) and all-reduces a one-byte flag: more optimizer
    time than bf16, more at ZeRO 0 (a scan of every gradient) than at ZeRO 1 (its 1/dp partition)."""
    extra = {z: _fp16_pair(z)[1].breakdown["optimizer"] - _fp16_pair(z)[0].breakdown["optimizer"] for z in (0, 1)}
    assert extra[0] > extra[1] > 0
    fp16 = ENGINES["megatron-deepspeed"].fp16
    assert (fp16.overflow_scan_bytes, fp16.overflow_flags) == ((10, 28), (1, 2))
    assert ENGINES["megatron-deepspeed"].overflow_flags == (0, 0)


def test_fp16_exports_as_megatron_deepspeed_runs_it_and_elsewhere_is_refused():
    from symtensor.export import export

    base = dict(model="llama2-7b", cluster="dgx-a100-80g", devices=32, tp=2, pp=2, dp=8, zero=1, micro_batch=1,
                global_batch=64, seq=4096, overrides=SMALL, precision="fp16")
    plan = api.evaluate(**base, framework="megatron-deepspeed")
    out = export(plan, "megatron-deepspeed")
    assert "--fp16" in out["pretrain_gpt_args"] and "--bf16" not in out["pretrain_gpt_args"]
    assert out["ds_config"]["fp16"] == {"enabled": True, "loss_scale": 0}
    assert "bf16" not in out["ds_config"] and "data_types" not in out["ds_config"]
    for fmt in ("megatron", "torchtitan", "dtensor"):
        with pytest.raises(PlanError, match=r"does not run fp16 as this plan is costed .*--precision bf16") as err:
            export(plan, fmt)
        assert "\n" not in str(err.value)
    for framework in ("megatron", "fsdp2", "deepspeed"):
        with pytest.raises(PlanError, match="modelled for megatron-deepspeed only, not " + framework):
            api.evaluate(**base, framework=framework)


def test_a_qkv_only_bias_is_refused_not_dropped():
    """Megatron-DeepSpeed biases every linear layer or none (--disable-bias-linear, no --add-qkv-bias): Qwen2's
    QKV-only bias cannot be built, so the export is refused in one line instead of training a model without it."""
    from symtensor.export import export

    plan = api.evaluate("qwen2-7b", "dgx-a100-80g", 16, tp=2, pp=2, zero=1, micro_batch=1, global_batch=32,
                        seq=4096, overrides={"layers": "4"}, framework="megatron-deepspeed")
    with pytest.raises(PlanError, match="cannot build qwen2-7b's QKV-only bias .* --to megatron"):
        export(plan, "megatron-deepspeed")
