"""FSDP2 under a pipeline, as torch.distributed.pipelining runs it (``Engine.pipeline_sync_once``): a stage's
micro-batches run backward without gradient sync or resharding and each schedule gathers and reduce-scatters the
stage's units once (at ZeRO 3 gathers them again before each backward that follows a forward); and gradient
accumulation as several pipeline schedules per step (``Stack.pp_schedules``: torchtitan and NeMo AutoModel with a
local batch below the step's), each filling and draining the pipeline."""

from __future__ import annotations

import pytest

from symtensor import api
from symtensor.errors import PlanError
from symtensor.export import torchtitan_config
from symtensor.plan.stack import Stack

RUN = dict(devices=8, tp=1, pp=2, micro_batch=1, global_batch=16, seq=4096)  # 4 replicas, 4 micro-batches each


def _fsdp2(zero: int = 2, schedules: int = 1, **kw):
    return api.evaluate("llama3-8b", "dgx-h100", framework="fsdp2", zero=zero,
                        stack=Stack(pp_schedules=schedules), **{**RUN, **kw})


def test_fsdp2_under_a_pipeline_syncs_its_stage_once_per_schedule():
    """Four micro-batches, one schedule: the stage's units are gathered and reduce-scattered once (not per
    micro-batch, as FSDP2 without a pipeline does); two schedules of two: twice. The unsharded gradients accumulate
    until the schedule's reduction (the engine buffers)."""
    one, two = _fsdp2(), _fsdp2(schedules=2)
    no_pp = api.evaluate("llama3-8b", "dgx-h100", framework="fsdp2", zero=2, **{**RUN, "pp": 1, "devices": 4})
    assert two.report.comm_bytes["reduce_scatter"] == pytest.approx(2 * one.report.comm_bytes["reduce_scatter"])
    assert two.report.comm_bytes["all_gather"] == pytest.approx(2 * one.report.comm_bytes["all_gather"])
    # one schedule of four micro-batches reduces once: as each of four schedules of one micro-batch does
    four = _fsdp2(schedules=4)
    assert four.report.comm_bytes["reduce_scatter"] == pytest.approx(4 * one.report.comm_bytes["reduce_scatter"])
    assert one.report.memory["engine_buffers"] > no_pp.report.memory["engine_buffers"]


def test_fsdp2_zero3_under_a_pipeline_regathers_but_reduces_once_per_schedule():
    """Resharding after forward (ZeRO 3), pipelining still runs every backward without resharding or gradient sync:
    a schedule of m = 4 micro-batches gathers each unit m + 1 = 5 times (ZeRO 2: once) and reduce-scatters it once,
    as ZeRO 2 does; each backward leaves the stage gathered until the next forward, so it holds what ZeRO 2 holds, at
    more traffic: never faster."""
    two, three = _fsdp2(zero=2), _fsdp2(zero=3)
    assert three.report.comm_bytes["all_gather"] == pytest.approx(5 * two.report.comm_bytes["all_gather"])
    assert three.report.comm_bytes["reduce_scatter"] == pytest.approx(two.report.comm_bytes["reduce_scatter"])
    assert three.report.memory["gathered_params"] == pytest.approx(two.report.memory["gathered_params"])
    assert three.report.step_time_s >= two.report.step_time_s


def test_each_pipeline_schedule_fills_and_drains_the_pipeline():
    """K schedules per step pay K bubbles; the compute is the step's either way."""
    one, four = _fsdp2(), _fsdp2(schedules=4)
    assert four.report.breakdown["pp_bubble"] == pytest.approx(4 * one.report.breakdown["pp_bubble"])
    assert four.report.breakdown["compute"] == pytest.approx(one.report.breakdown["compute"])
    assert four.report.step_time_s > one.report.step_time_s


def test_pipeline_schedules_are_refused_where_they_do_not_run():
    """One line each: Megatron runs one schedule per step; the micro-batches must split evenly; a search costs one
    schedule per step (as its exports launch). Without a pipeline the fact changes nothing."""
    with pytest.raises(PlanError, match="megatron runs a step's micro-batches as one pipeline schedule"):
        api.evaluate("llama3-8b", "dgx-h100", zero=1, stack=Stack(pp_schedules=2), **RUN)
    with pytest.raises(PlanError, match="4 micro-batches per data-parallel replica do not split into 3 pipeline"):
        _fsdp2(schedules=3)
    with pytest.raises(PlanError, match="plan and sweep search one schedule per step"):
        api.plan("llama3-8b", "dgx-h100", devices=8, framework="fsdp2", stack=Stack(pp_schedules=2))
    with pytest.raises(PlanError, match="pp_schedules=0; use a positive integer"):
        Stack(pp_schedules=0)
    flat = dict(RUN, pp=1, devices=4)
    plain = api.evaluate("llama3-8b", "dgx-h100", framework="fsdp2", zero=2, **flat).report
    stated = api.evaluate("llama3-8b", "dgx-h100", framework="fsdp2", zero=2, stack=Stack(pp_schedules=2),
                          **flat).report
    assert (plain.step_time_s, plain.memory) == (stated.step_time_s, stated.memory)


def test_torchtitan_runs_the_stated_schedules():
    """torchtitan runs global / (local_batch_size x dp) schedules per step: the export's local batch is the rank's
    batch over the plan's schedules, its pipeline micro-batch the plan's."""
    one, two = torchtitan_config(_fsdp2()), torchtitan_config(_fsdp2(schedules=2))
    assert one["training"]["local_batch_size"] == 4 and two["training"]["local_batch_size"] == 2
    assert two["parallelism"]["pipeline_parallel_microbatch_size"] == 1


def test_a_frozen_weight_accumulates_no_gradient_under_a_pipeline():
    """LoRA under FSDP2 and a pipeline: the stage's unsharded gradients until the schedule's reduction (the engine
    buffers) are the adapters' alone; the frozen base weights, which have no gradient, add nothing (until the
    seventeenth session they were counted: 16.9 GiB for Llama 3 70B at TP 2 x PP 4 on 8 H100)."""
    kw = dict(devices=8, tp=2, pp=4, vpp=10, micro_batch=1, global_batch=32, seq=4096, zero=3, recompute="full")
    full, lora = (api.evaluate("llama3-70b", "dgx-h100", framework="fsdp2", overrides=o, **kw)
                  for o in (None, {"lora_rank": 16}))
    adapters = lora.report.memory["engine_buffers"]
    assert adapters < 0.02 * full.report.memory["engine_buffers"]
    assert full.report.memory["engine_buffers"] > 15 * 2**30  # (the whole model's, as before)

