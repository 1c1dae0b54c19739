"""Export: a Megatron-expressible plan becomes Megatron-LM arguments, a torchtitan config and a
DTensor plan with the same degrees; what an engine cannot express is refused with the reason."""

from __future__ import annotations

import pytest

from symtensor.errors import PlanError
from symtensor.export import dtensor_plan, export, megatron_args, torchtitan_config
from symtensor.hardware import load_cluster
from symtensor.models import PRESETS
from symtensor.plan import config_summary
from symtensor.search import search


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


def test_unknown_format_and_zero2_refused(plan):
    with pytest.raises(PlanError, match="unknown export format 'deepspeed'"):
        export(plan, "deepspeed")
    from dataclasses import replace
    zero2 = replace(plan, train=plan.train.replace(zero=2))
    with pytest.raises(PlanError, match="Megatron-LM has no ZeRO-2"):
        megatron_args(zero2)
