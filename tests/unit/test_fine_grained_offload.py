"""Megatron-core's fine-grained activation offloading as a stated fact of the stack (``--offload-modules M,M``,
``Stack.offload_modules``, ``cost.offload``): each named module's input, as the layer saves it for backward, leaves
the device in every layer, and its copies to the host and back cost the step only what they exceed of the layer's
compute, over the device's host link (the layer-level offloading's rule, ``cost.model.offload_seconds``). Megatron
only; Megatron's combination rules refused in one line."""

import json

import pytest

from symtensor import api
from symtensor.cli import main
from symtensor.errors import PlanError
from symtensor.export.megatron import megatron_args
from symtensor.models import load_model_config
from symtensor.plan import Stack

from fixtures.host_links import host_cluster

ARGS = dict(tp=2, zero=1, micro_batch=1, global_batch=64, seq=2048)
MOE = dict(tp=1, ep=8, zero=1, micro_batch=1, global_batch=64, seq=4096)
MIB = 2**20


def _plan(modules, cluster="dgx-a100-80g", model="llama2-7b", args=ARGS, **kw):
    return api.evaluate(model, cluster, 8, **{**args, **kw}, stack=Stack(offload_modules=modules))


def test_memory_drops_by_the_offloaded_inputs_bytes():
    """llama2-7b at tp 2 with sequence parallelism, seq 2048, one micro-batch in flight: core_attn offloads Q, K and V
    (2048 x 4096 / 2 bf16 elements each, 8 MiB), attn_proj the core's output (8 MiB), in each of 32 layers."""
    layers = load_model_config("llama2-7b").layers
    base = _plan(()).report
    per = 2048 * 4096 // 2 * 2  # bytes of one [seq, hidden / tp] bf16 activation
    assert per == 8 * MIB
    for modules, tensors in ((("core_attn",), 3), (("core_attn", "attn_proj"), 4), (("qkv_linear",), 1)):
        off = _plan(modules).report
        drop = tensors * per * layers
        assert off.memory["activations"] == pytest.approx(base.memory["activations"] - drop)
        assert off.memory_peak == pytest.approx(base.memory_peak - drop)
    assert "cpu_offload" not in base.breakdown  # (the default's breakdown is today's)


def test_moe_modules_and_the_fused_norms():
    """In a MoE model, expert_fc1 and moe_act free their inputs; the input norm, fused into linear_qkv under
    Transformer Engine (an IdentityOp), offloads nothing, the MoE layers' pre-MLP norm does."""
    base = _plan((), "dgx-h100", "qwen3-30b-a3b", MOE).report
    acts = {m: _plan((m,), "dgx-h100", "qwen3-30b-a3b", MOE).report.memory["activations"]
            for m in ("expert_fc1", "moe_act", "mlp_norm", "attn_norm")}
    assert acts["attn_norm"] == base.memory["activations"]
    assert all(acts[m] < base.memory["activations"] for m in ("expert_fc1", "moe_act", "mlp_norm"))


def test_tensors_under_the_minimum_size_stay():
    """Megatron's min_offloaded_tensor_size (1M elements): a tiny model's activations are all below it."""
    base = api.evaluate("tiny-llama", "dgx-h100", 8, tp=1, zero=1, micro_batch=1, global_batch=8, seq=128).report
    off = api.evaluate("tiny-llama", "dgx-h100", 8, tp=1, zero=1, micro_batch=1, global_batch=8, seq=128,
                       stack=Stack(offload_modules=("core_attn", "attn_proj"))).report
    assert off.memory["activations"] == base.memory["activations"]
    assert off.breakdown["cpu_offload"] == 0.0


def test_step_grows_only_by_what_the_copies_exceed_the_compute(tmp_path):
    base = _plan(()).report
    fast = _plan(("core_attn",), host_cluster(tmp_path, 10000)).report
    assert fast.breakdown["cpu_offload"] == 0.0 and fast.step_time_s == pytest.approx(base.step_time_s)
    slow = _plan(("core_attn",), host_cluster(tmp_path, 0.05)).report  # 50 MB/s: the copies exceed the compute
    assert slow.breakdown["cpu_offload"] > 0.0
    assert slow.step_time_s == pytest.approx(base.step_time_s + slow.breakdown["cpu_offload"])
    more = _plan(("core_attn", "attn_proj"), host_cluster(tmp_path, 0.05)).report
    assert more.breakdown["cpu_offload"] > slow.breakdown["cpu_offload"]


def test_refusals_in_one_line():
    cases = [(dict(modules=("attn_proj",)), "attn_proj needs core_attn"),
             (dict(modules=("fused_group_mlp",)), "op fuser"),
             (dict(modules=("router",)), "unknown; use modules of attn_norm"),
             (dict(modules=("core_attn", "core_attn")), "names a module twice")]
    for kw, match in cases:
        with pytest.raises(PlanError, match=match) as exc:
            Stack(offload_modules=kw["modules"])
        assert "\n" not in str(exc.value)
    with pytest.raises(PlanError, match="one CPU offloading at a time"):
        Stack(offload_modules=("core_attn",), cpu_offload_layers=2)
    with pytest.raises(PlanError, match="use --framework megatron"):
        _plan(("core_attn",), framework="fsdp2", zero=3)
    with pytest.raises(PlanError, match="has no MoE layer"):
        _plan(("expert_fc1",))
    with pytest.raises(PlanError, match="recompute module moe"):
        _plan(("moe_act",), "dgx-h100", "qwen3-30b-a3b", MOE, recompute="modules:moe")


def test_canonical_order_export_and_summary():
    plan = _plan(("attn_proj", "core_attn"))
    assert plan.train.stack.offload_modules == ("core_attn", "attn_proj")  # (Megatron's documented order)
    args = megatron_args(plan)
    assert "--fine-grained-activation-offloading" in args and "--offload-modules core_attn attn_proj" in args
    assert plan.config["offload_modules"] == ["core_attn", "attn_proj"]
    assert not any("offload" in a for a in megatron_args(_plan(())))
    assert "offload_modules" not in _plan(()).config
    from symtensor.export.torchtitan import torchtitan_config
    with pytest.raises(PlanError, match="no fine-grained activation offloading"):
        torchtitan_config(plan)


def test_cli_option(capsys):
    argv = ["evaluate", "llama2-7b", "--cluster", "dgx-a100-80g", "--devices", "8", "--tp", "2", "--zero", "1",
            "--micro-batch", "1", "--global-batch", "64", "--json", "--offload-modules", "core_attn,attn_proj"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["config"]["offload_modules"] == ["core_attn", "attn_proj"]


def test_a_plan_file_round_trips(tmp_path):
    """A plan that offloads modules writes them and its host link into the plan file and loads back with the same
    prediction; a plan without keeps the file as it was (no offload_modules, no host_bandwidth key)."""
    from symtensor.plan.io import load_plan, save_plan

    for modules in (("core_attn", "attn_proj"), ()):
        plan = _plan(modules)
        path = tmp_path / f"off{len(modules)}.json"
        save_plan(plan, path)
        doc = json.loads(path.read_text())
        assert ("host_bandwidth" in doc["cluster"]["device"]) == bool(modules)
        assert ("offload_modules" in doc["train"]) == bool(modules)
        again = load_plan(path)
        assert again.train.stack.offload_modules == modules
        assert again.report.step_time_s == pytest.approx(plan.report.step_time_s)
        assert again.report.memory_reserved == pytest.approx(plan.report.memory_reserved)


def test_recomputation_leaves_nothing_to_offload(tmp_path):
    """Under full recomputation a layer's forward saves only its input: no module input to move, no copy to pay;
    under selective recomputation the attention core's inputs (Q, K, V) are still kept, and offloaded."""
    slow = host_cluster(tmp_path, 0.05)
    full, full_off = _plan((), recompute="full").report, _plan(("core_attn",), slow, recompute="full").report
    assert full_off.memory["activations"] == full.memory["activations"] and full_off.breakdown["cpu_offload"] == 0.0
    sel, sel_off = _plan((), recompute="selective").report, _plan(("core_attn",), recompute="selective").report
    layers = load_model_config("llama2-7b").layers
    assert sel_off.memory["activations"] == pytest.approx(sel.memory["activations"] - 3 * 8 * MIB * layers)


def test_a_search_holds_it():
    plan = api.plan("tiny-qwen3-moe", "dgx-h100", 8, global_batch=16, seq=128,
                    stack=Stack(offload_modules=("expert_fc1",)))
    assert plan.train.stack.offload_modules == ("expert_fc1",)
    assert plan.config["offload_modules"] == ["expert_fc1"]
    with pytest.raises(PlanError, match="use --framework megatron"):
        api.plan("tiny-llama", "dgx-h100", 8, global_batch=16, seq=128, framework="fsdp2",
                 stack=Stack(offload_modules=("core_attn",)))
