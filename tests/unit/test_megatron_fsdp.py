"""Megatron-FSDP (the megatron engine at ZeRO 3, ``cost.engine``'s docstring): per micro-batch two bf16 gathers
and one reduce-scatter of each unit in the main-gradient dtype; under hybrid sharding the replicas' all-reduce
once per step; an unsharded gradient bucket per unit in memory. Bytes per step of a small model by hand."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from symtensor import api
from symtensor.cost import engine as engine_mod
from symtensor.cost.engine import Unit, exposure
from symtensor.cost.train import TrainConfig
from symtensor.plan import Stack

TINY = dict(seq=64, global_batch=32, micro_batch=1)  # 8 ranks: 4 micro-batches per step


def tiny(framework="megatron", zero=3, devices=8, **kw):
    return api.evaluate("tiny-llama", "dgx-h100", devices, framework=framework, zero=zero, **{**TINY, **kw})


def n_params(plan, prefix=""):
    return sum(math.prod(t.shape) for name, t in plan.graph.tensors.items() if t.param and name.startswith(prefix))


def test_bytes_per_step_by_hand():
    """tp 1, dp 8, 4 micro-batches: every micro-batch gathers each unit twice in bf16 (forward, and once for
    backward) and reduce-scatters its gradients in fp32 (Megatron's main_grad under --bf16): per step
    4 x 2 x 2P gathered and 4 x 4P reduced; --grad-reduce-in-bf16 halves the reduction only."""
    p = tiny()
    P, m = n_params(p), 4
    assert p.train.micro_steps == m
    assert p.report.comm_bytes["all_gather"] == pytest.approx(m * 2 * 2 * P)
    assert p.report.comm_bytes["reduce_scatter"] == pytest.approx(m * 4 * P)
    b = tiny(stack=Stack(grad_reduce_bf16=True))
    assert b.report.comm_bytes["reduce_scatter"] == pytest.approx(m * 2 * P)
    assert b.report.comm_bytes["all_gather"] == p.report.comm_bytes["all_gather"]


def test_hybrid_sharding_all_reduces_across_replicas_once_per_step():
    """16 ranks, shards of 8, 2 replicas: Megatron-FSDP all-reduces each unit's accumulated fp32 shard across
    the replicas on the last micro-batch only (4P / 8 bytes per step); FSDP2 after every reduce-scatter."""
    mega, fsdp = tiny(devices=16, dp_shard=8), tiny("fsdp2", devices=16, dp_shard=8)
    P, m = n_params(mega), mega.train.micro_steps
    assert m == 2
    assert mega.report.comm_bytes["all_reduce"] == pytest.approx(4 * P / 8)
    assert fsdp.report.comm_bytes["all_reduce"] == pytest.approx(m * 4 * P / 8)
    assert mega.report.comm_bytes["reduce_scatter"] == pytest.approx(m * 4 * P)


def test_replicate_once_costs_the_all_reduce_in_the_last_micro_batch():
    """One unit of 1 ms compute per direction, 4 micro-batches, a 10 ms reduce-scatter and a 20 ms all-reduce
    across replicas: once per step, the step exposes 3 micro-batches without the all-reduce and one with it."""
    train = TrainConfig(global_batch=4, micro_steps=4, zero=3, framework="megatron", dp_replicate=2)
    u = Unit(1, 0.001, 0.001, 0.0, 0.030, 1e6, replicate_s=0.020)
    once = exposure([u], train, ends=False, share=0.0)
    assert once.seconds == pytest.approx(3 * (0.010 - 0.001) + (0.030 - 0.001))
    assert once.calls == {"all_gather": 8, "reduce_scatter": 4, "replicate": 1}
    every = exposure([u], replace(train, framework="fsdp2"), ends=False, share=0.0)
    assert every.seconds == pytest.approx(4 * (0.030 - 0.001)) and "replicate" not in every.calls


def test_unit_gradient_bucket_in_memory_where_gradients_are_sharded():
    """Megatron-FSDP's sharded gradient buffer reduce-scatters each unit out of an unsharded bucket in the
    main-gradient dtype: the largest unit's (a layer here), fp32, or bf16 under --grad-reduce-in-bf16, at ZeRO 3
    (optim_grads_params) and ZeRO 2 (optim_grads). ZeRO 1 (the distributed optimizer's contiguous buffer, whose
    buckets are views) allocates none."""
    p = tiny()
    layer = n_params(p, "layers.0.")
    assert layer > n_params(p, "embed.")
    assert p.report.memory["engine_buffers"] == pytest.approx(4 * layer)
    assert tiny(stack=Stack(grad_reduce_bf16=True)).report.memory["engine_buffers"] == pytest.approx(2 * layer)
    assert tiny(zero=2).report.memory["engine_buffers"] == pytest.approx(4 * layer)
    assert tiny(zero=1).report.memory["engine_buffers"] == 0.0


def test_the_rules_change_nothing_where_they_do_not_apply(monkeypatch):
    """Without hybrid sharding the megatron ZeRO 3 step is the one without ``replicate_once``; ZeRO 1 under
    hybrid sharding too (one reduction per step either way); with it the step is shorter."""
    cases = ({}, {"zero": 1, "devices": 16, "dp_shard": 8}, {"devices": 16, "dp_shard": 8})
    before = [tiny(**k).report.step_time_s for k in cases]
    monkeypatch.setitem(engine_mod.ENGINES, "megatron", replace(engine_mod.ENGINES["megatron"], replicate_once=False))
    after = [tiny(**k).report.step_time_s for k in cases]
    assert before[:2] == after[:2]
    assert before[2] < after[2]
