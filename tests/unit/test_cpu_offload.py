"""Megatron-LM's CPU activation offloading as a stated fact of the stack (``--cpu-offload-layers N``,
``TrainConfig.cpu_offload_layers``, ``cost.engine.CPU_OFFLOAD``): the first N layers' saved activations leave the
device (Transformer Engine keeps at most layers - N sets on it), and each offloaded layer's copy to the host in
forward and back in backward costs the step only what it exceeds of that layer's compute, over the device's host
link (``Device.host_bandwidth``). Megatron only, without pipeline parallelism or recomputation, fewer layers than
the model's (TransformerConfig's refusals)."""

import json

import pytest
import yaml

from symtensor import api
from symtensor.cli import main
from symtensor.errors import PlanError
from symtensor.export.megatron import megatron_args
from symtensor.hardware.cluster import HOST_LINKS, cluster_dict, load_cluster
from symtensor.models import load_model_config
from symtensor.plan import Stack
from symtensor.search.recipes import RECIPES

from fixtures.host_links import host_cluster

ARGS = dict(tp=2, zero=1, micro_batch=1, global_batch=64, seq=2048)


def _plan(n, cluster="dgx-a100-80g", **kw):
    return api.evaluate("llama2-7b", cluster, 8, **{**ARGS, **kw}, stack=Stack(cpu_offload_layers=n))


def test_memory_drops_by_the_offloaded_layers_activations():
    layers = load_model_config("llama2-7b").layers
    base, off = _plan(0).report, _plan(10).report
    per_layer = base.memory["activations_layers"] / layers  # (identical layers, one micro-batch in flight at pp 1)
    assert off.memory["activations"] == pytest.approx(base.memory["activations"] - 10 * per_layer)
    assert off.memory_peak == pytest.approx(base.memory_peak - 10 * per_layer)
    assert off.memory_reserved < base.memory_reserved
    assert "cpu_offload" not in base.breakdown  # (the default's breakdown is today's)


def test_step_grows_only_by_what_the_copies_exceed_the_compute(tmp_path):
    base = _plan(0).report
    fast = _plan(10, host_cluster(tmp_path, 10000)).report  # a layer's activations cross within its compute
    assert fast.breakdown["cpu_offload"] == 0.0 and fast.step_time_s == pytest.approx(base.step_time_s)
    slow = _plan(10, host_cluster(tmp_path, 0.5)).report  # 0.5 GB/s: the copies exceed the compute
    assert slow.breakdown["cpu_offload"] > 0.0
    assert slow.step_time_s == pytest.approx(base.step_time_s + slow.breakdown["cpu_offload"])
    assert _plan(5, host_cluster(tmp_path, 0.5)).report.breakdown["cpu_offload"] < slow.breakdown["cpu_offload"]


def test_host_links_per_preset():
    assert load_cluster("dgx-a100-80g", devices=8).device.host_bandwidth == HOST_LINKS["pcie4"]
    assert load_cluster("dgx-h100", devices=8).device.host_bandwidth == HOST_LINKS["pcie5"]
    assert load_cluster("gb200-nvl72", devices=64).device.host_bandwidth == 450e9  # 900 GB/s bidirectional C2C
    doc = cluster_dict(load_cluster("dgx-h100", devices=8))
    assert doc["device"]["host_gbps"] == pytest.approx(63)


def test_refusals_in_one_line(tmp_path):
    cases = [(dict(framework="fsdp2", zero=3), "use --framework megatron"),
             (dict(pp=2, tp=1, global_batch=64), "no CPU offloading with pipeline parallelism"),
             (dict(recompute="full"), "does not run with activation recomputation")]
    for kw, match in cases:
        with pytest.raises(PlanError, match=match) as exc:
            _plan(4, **kw)
        assert "\n" not in str(exc.value)
    with pytest.raises(PlanError, match="choose at most 31"):
        _plan(32)
    with pytest.raises(PlanError, match="cpu_offload_layers=-1"):
        Stack(cpu_offload_layers=-1)
    doc = cluster_dict(load_cluster("dgx-a100-80g", devices=8))
    del doc["device"]["host_gbps"]
    path = tmp_path / "nohost.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(PlanError, match="add host_gbps"):
        _plan(4, str(path))


def test_export_and_summary():
    plan = _plan(10)
    assert "--cpu-offloading-num-layers 10" in megatron_args(plan)
    assert plan.config["cpu_offload_layers"] == 10
    assert not any("offloading" in a for a in megatron_args(_plan(0)))
    assert "cpu_offload_layers" not in _plan(0).config
    from symtensor.export.torchtitan import torchtitan_config
    with pytest.raises(PlanError, match="no CPU activation offloading"):
        torchtitan_config(plan)


def test_cli_option(capsys):
    argv = ["evaluate", "llama2-7b", "--cluster", "dgx-a100-80g", "--devices", "8", "--tp", "2", "--zero", "1",
            "--micro-batch", "1", "--global-batch", "64", "--json", "--cpu-offload-layers", "6"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["config"]["cpu_offload_layers"] == 6


def test_a_search_holds_it_where_megatron_runs_it():
    plan = api.plan("tiny-llama", "dgx-h100", 8, global_batch=16, seq=128, stack=Stack(cpu_offload_layers=1))
    train = plan.train
    assert train.stack.cpu_offload_layers == (1 if train.pp == 1 and train.recompute == "none" else 0)


def test_llama3_70b_gb200_recipe_states_it():
    row = next(r for r in RECIPES if r.name == "llama3_70b_pretrain_64gpu_gb200_bf16_config")
    assert row.stack.cpu_offload_layers == 20 and row.stack.grad_reduce_bf16


def test_a_plan_file_keeps_the_host_link_it_offloads_over(tmp_path):
    """A plan that offloads activations writes its device's host link into the plan file and loads back with the
    same prediction; a plan that does not keeps the file as it was (no host_bandwidth key)."""
    from symtensor.plan.io import load_plan, save_plan

    for n in (4, 0):
        plan = _plan(n)
        path = tmp_path / f"off{n}.json"
        save_plan(plan, path)
        device = json.loads(path.read_text())["cluster"]["device"]
        assert ("host_bandwidth" in device) == (n > 0)
        again = load_plan(path)
        assert again.train.stack.cpu_offload_layers == n
        assert again.report.step_time_s == pytest.approx(plan.report.step_time_s)
        assert again.report.memory_reserved == pytest.approx(plan.report.memory_reserved)
