"""Gradients reduced in bf16 (``--grad-reduce-in-bf16``, ``cost.engine.Engine.grad_reduce_bf16``): the
data-parallel reduction's bytes halve under every engine that has it; Megatron's gradient buffer halves too and
its optimizer step copies the owned shard to fp32; FSDP2 keeps fp32 sharded gradients; DeepSpeed reduces bf16
already; the exports state it; an engine or a ZeRO stage without it is a one-line PlanError."""

from __future__ import annotations

import pytest

from symtensor.api import evaluate, plan
from symtensor.cost.train import TrainConfig
from symtensor.errors import PlanError
from symtensor.export import megatron_args
from symtensor.export.torchtitan import torchtitan_config
from symtensor.plan import Stack
from symtensor.plan.document import evaluation_json

RUN = {"micro_batch": 1, "global_batch": 32, "seq": 256}
BF16 = Stack(grad_reduce_bf16=True)


def _eval(**kw):
    return evaluate("tiny-llama", "dgx-a100-80g", 8, **RUN, **kw)


@pytest.mark.parametrize("framework, zero", [("megatron", 1), ("megatron", 0), ("fsdp2", 3), ("fsdp2", 1)])
def test_gradient_reduction_bytes_halve(framework, zero):
    """tp 1: every reduce-scatter (ZeRO) or all-reduce (ZeRO 0) moves gradients; in bf16 half the bytes."""
    kind = "all_reduce" if zero == 0 else "reduce_scatter"
    base = evaluation_json(_eval(framework=framework, zero=zero))["comm_bytes_per_device"][kind]
    half = evaluation_json(_eval(framework=framework, zero=zero, stack=BF16))["comm_bytes_per_device"]
    assert base > 0 and half[kind] == pytest.approx(base / 2)


def test_megatron_keeps_a_bf16_gradient_buffer_and_fsdp2_fp32_shards():
    """Megatron: 2 bytes per gradient (state shrinks, the step allocates 4 bytes per owned parameter); FSDP2:
    the sharded gradients stay fp32, only the unit's reduce buffer halves; DeepSpeed: nothing changes."""
    assert TrainConfig(global_batch=8, stack=Stack(grad_reduce_bf16=True)).grad_bytes == 2
    assert TrainConfig(global_batch=8, framework="fsdp2", zero=3, stack=Stack(grad_reduce_bf16=True)).grad_bytes == 4
    on, off = _eval(zero=1, stack=BF16).report, _eval(zero=1).report
    assert on.memory["grads"] == pytest.approx(off.memory["grads"] / 2)
    assert on.memory["optimizer_transient"] > off.memory["optimizer_transient"] == 0.0
    on, off = _eval(framework="fsdp2", zero=3, stack=BF16).report, _eval(framework="fsdp2", zero=3).report
    assert on.memory["grads"] == off.memory["grads"]
    assert on.memory["engine_buffers"] == pytest.approx(off.memory["engine_buffers"] / 2)
    ds_on, ds_off = _eval(framework="deepspeed", zero=1, stack=BF16), _eval(framework="deepspeed", zero=1)
    assert ds_on.report.step_time_s == ds_off.report.step_time_s


def test_exports_state_the_flag():
    p = _eval(tp=2, zero=1, stack=BF16)
    assert p.config["grad_reduce_bf16"] is True and "--grad-reduce-in-bf16" in megatron_args(p)
    assert "grad_reduce_bf16" not in _eval(tp=2, zero=1).config
    assert "--grad-reduce-in-bf16" not in megatron_args(_eval(tp=2, zero=1))
    t = _eval(framework="fsdp2", zero=3, stack=BF16)
    assert torchtitan_config(t)["training"]["mixed_precision_reduce"] == "bfloat16"
    assert "mixed_precision_reduce" not in torchtitan_config(_eval(framework="fsdp2", zero=3))["training"]


def test_a_plan_changes_and_holds_the_flag():
    """A bandwidth-bound search (ZeRO over the nodes) is faster with bf16 gradients, and says so."""
    kw = dict(seq=2048, global_batch=64, space="megatron")
    base = plan("llama2-7b", "dgx-a100-80g", 32, **kw)
    bf16 = plan("llama2-7b", "dgx-a100-80g", 32, stack=BF16, **kw)
    assert bf16.report.step_time_s < base.report.step_time_s
    assert bf16.config.get("grad_reduce_bf16") is True and "grad_reduce_bf16" not in base.config


def test_engines_without_it_refuse():
    with pytest.raises(PlanError, match="megatron-deepspeed has no bf16 gradient reduction"):
        _eval(framework="megatron-deepspeed", zero=1, stack=BF16)
    with pytest.raises(PlanError, match="only under FSDP"):
        _eval(framework="fsdp2", zero=0, stack=BF16)
    with pytest.raises(PlanError, match="grad_reduce_bf16='yes'"):
        Stack(grad_reduce_bf16="yes")
    # a search holds it where the engine runs it: FSDP2's ZeRO 0 (DDP) reduces as before
    ddp = TrainConfig(global_batch=8, framework="fsdp2", zero=0, stack=Stack(grad_reduce_bf16=True))
    assert not ddp.stack.grad_reduce_bf16
