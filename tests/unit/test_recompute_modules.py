"""Megatron's module-level selective recomputation stated as ``modules:M,M`` (``cost.recompute``): what each module
frees, what backward re-runs, the refusals, the exports and the recipes that state a module list.

Source: NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/core/transformer/transformer_config.py
(``recompute_modules``), transformer_layer.py (layernorm, mlp), moe/experts.py (moe_act), moe/moe_layer.py (moe,
shared_experts), multi_latent_attention.py (mla_up_proj)."""

import pytest

from symtensor import api
from symtensor.cli import main
from symtensor.cost.model import Evaluator
from symtensor.cost.recompute import modules_of, regions
from symtensor.errors import PlanError
from symtensor.export import megatron_args, torchtitan_config
from symtensor.hardware import load_cluster
from symtensor.layout import REPLICATED
from symtensor.models import load_model_config
from symtensor.plan import Stack
from symtensor.search.baselines import baseline_plans

MOE = "tiny-qwen3-moe"  # 2 layers, both MoE (8 experts, top 2), no shared expert, no MLA


def _run(recompute, model=MOE, **kw):
    kw = {"micro_batch": 1, "global_batch": 2, "seq": 256, **kw}
    return api.evaluate(model, "dgx-h100", kw.pop("devices", 1), recompute=recompute, **kw)


@pytest.fixture(scope="module")
def runs():
    return {rc: _run(rc) for rc in ("none", "modules:moe_act", "modules:layernorm", "modules:layernorm,moe_act",
                                    "modules:moe")}


def _bytes(plan, *shorts):
    """Bytes of the layers' tensors named ``layers.i.<short>`` (one micro-batch, one device)."""
    g = plan.graph
    return sum(t.nbytes for t in g.tensors.values() if t.name.startswith("layers.")
               and t.name.split(".", 2)[2] in shorts)


def _freed(runs, rc):
    return runs["none"].report.memory["activations_layers"] - runs[rc].report.memory["activations_layers"]


def test_memory_drops_by_exactly_the_freed_tensors(runs):
    """moe_act frees the experts' activation output (linear_fc2's input, discarded by CheckpointWithoutOutput);
    layernorm the MoE layer's pre-MLP norm output (the router's input); together both; moe the MoE layer's own saved
    tensors (router probabilities, permuted tokens, fc1 outputs, activation; Megatron's combine keeps no fc2
    output: ``cost.moe.saved_scale``), keeping its input."""
    act, norm = _bytes(runs["none"], "experts.act"), _bytes(runs["none"], "mlp_norm")
    assert act > 0 and norm > 0
    assert _freed(runs, "modules:moe_act") == act
    assert _freed(runs, "modules:layernorm") == norm
    assert _freed(runs, "modules:layernorm,moe_act") == act + norm
    inner = _bytes(runs["none"], "gates", "dispatch", "experts.gate_proj", "experts.up_proj", "experts.act")
    assert _freed(runs, "modules:moe") == inner


def test_recompute_time_is_the_rerun_forward(runs):
    """The recomputation a step pays is the forward of exactly the checkpointed ops, once per micro-batch (one
    device: no collective re-runs); the modules add up."""
    plan = runs["none"]
    ev = Evaluator(plan.graph, plan.cluster, pp=1, framework="megatron")

    def fwd(*shorts):
        return plan.train.micro_steps * sum(ev.op_time(op, REPLICATED, None).fwd_s for op in plan.graph.ops
                                            if op.name.startswith("layers.") and op.name.split(".", 2)[2] in shorts)

    rec = {rc: p.report.breakdown["recompute"] for rc, p in runs.items()}
    assert rec["none"] == 0.0
    assert rec["modules:moe_act"] == pytest.approx(fwd("experts.act"), rel=1e-12)
    assert rec["modules:layernorm"] == pytest.approx(fwd("mlp_norm"), rel=1e-12)
    assert rec["modules:layernorm,moe_act"] == pytest.approx(fwd("experts.act", "mlp_norm"), rel=1e-12)
    assert rec["modules:moe"] == pytest.approx(fwd("router", "topk", "dispatch", "experts.gate_proj",
                                                   "experts.up_proj", "experts.act", "experts.down_proj", "combine"),
                                               rel=1e-12)
    for rc, p in runs.items():  # the step pays it (one device: nothing else changes)
        assert p.report.step_time_s == pytest.approx(runs["none"].report.step_time_s + rec[rc], rel=1e-9)


def test_moe_rerun_repeats_the_dispatch():
    """moe re-runs the MoE layer's forward with its dispatch and combine all-to-alls (ep 4 over 4 devices)."""
    none, moe = (_run(rc, devices=4, ep=4, global_batch=8) for rc in ("none", "modules:moe"))
    assert moe.report.comm_bytes.get("all_to_all", 0) > none.report.comm_bytes.get("all_to_all", 0) > 0


def test_core_attn_is_selective():
    """core_attn is Megatron's default module: today's selective, to the byte (an unfused attention core)."""
    a, b = (_run(rc, model="tiny-llama", overrides={"attention": "unfused", "kv_heads": "4"})
            for rc in ("selective", "modules:core_attn"))
    assert a.report.memory == b.report.memory and a.report.step_time_s == b.report.step_time_s
    assert a.report.memory["activations_layers"] < _run("none", model="tiny-llama", overrides={
        "attention": "unfused", "kv_heads": "4"}).report.memory["activations_layers"]


def test_mla_and_dense_modules_select_their_ops():
    """mla_up_proj: the up projections with their latent norms, RoPE and the concatenation (DeepSeek-V3); mlp: the
    dense layers' MLP with its fused norm, never an MoE layer's; layernorm under MLA: every layer's input norm and
    the MoE layers' pre-MLP norm."""
    cfg = load_model_config("deepseek-v3", {"layers": "4", "dense_layers": "2"})
    g = _run("none", model="deepseek-v3", overrides={"layers": "4", "dense_layers": "2"}).graph
    assert cfg.kv_latent and not cfg.is_moe_layer(0) and cfg.is_moe_layer(3)

    def shorts(rc, layer):
        return sorted(n.split(".", 2)[2] for n in regions(g, rc) if n.startswith(f"layers.{layer}."))

    up = ["k_concat", "k_proj", "k_rope", "kv_norm", "q_norm", "q_proj", "q_rope", "v_proj"]
    assert shorts("modules:mla_up_proj", 0) == shorts("modules:mla_up_proj", 3) == up
    assert shorts("modules:mlp", 0) == ["act", "down_proj", "gate_proj", "mlp_norm", "up_proj"]
    assert shorts("modules:mlp", 3) == []
    assert shorts("modules:layernorm", 0) == ["attn_norm"] and shorts("modules:layernorm", 3) == ["attn_norm",
                                                                                                   "mlp_norm"]
    assert shorts("modules:moe,moe_act", 3)[:3] == ["combine", "dispatch", "experts.act"]  # (moe holds moe_act)
    assert set(shorts("modules:shared_experts", 3)) == {"shared_expert.act", "shared_expert.down_proj",
                                                        "shared_expert.gate_proj", "shared_expert.up_proj"}
    none, up_run = (_run(rc, model="deepseek-v3", overrides={"layers": "4", "dense_layers": "2"})
                    for rc in ("none", "modules:mla_up_proj"))
    assert up_run.report.memory["activations_layers"] < none.report.memory["activations_layers"]
    assert up_run.report.breakdown["recompute"] > 0.0


@pytest.mark.parametrize("recompute, kw, says", [
    ("modules:layernorm,moe_ac", {}, "unknown module 'moe_ac'"),
    ("modules:", {}, "unknown module"),
    ("modules:moe_act,moe_act", {}, "names a module twice"),
    ("modules:mla_up_proj", {}, "has no multi-head latent attention"),
    ("modules:shared_experts", {}, "has no shared expert"),
    ("modules:moe_act", {"model": "tiny-llama"}, "has no MoE layer"),
    ("modules:layernorm", {"model": "tiny-llama"}, "fuses its norms"),
    ("modules:mlp", {}, "has no dense MLP"),
    ("modules:moe_act", {"framework": "fsdp2"}, "use --framework megatron"),
    ("modules:moe_act", {"framework": "megatron-deepspeed"}, "use --framework megatron"),
    ("modules:moe_act", {"precision": "fp8", "fp8_recipe": "delayed"}, "delayed scaling"),
    ("modules:moe", {"devices": 4, "ep": 4, "global_batch": 8, "stack": Stack(moe_ep_overlap=True)},
     "--moe-ep-overlap"),
])
def test_refusals_name_the_fix(recompute, kw, says):
    with pytest.raises(PlanError, match="recompute") as err:
        _run(recompute, **kw)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_cli_parses_the_syntax_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", MOE, "--cluster", "dgx-h100", "--devices", "1", "--recompute", "modules:norm"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "unknown module 'norm'" in err and "\n" not in err
    assert main(["evaluate", MOE, "--cluster", "dgx-h100", "--devices", "1", "--seq", "256", "--global-batch", "2",
                 "--recompute", "modules:moe_act,layernorm", "--json"]) == 0


def test_exports(runs):
    """Megatron: --recompute-granularity selective --recompute-modules in its own order; torchtitan has no
    per-module checkpointing (its SAC is per op or per block): refused in one line."""
    args = megatron_args(runs["modules:layernorm,moe_act"])
    assert "--recompute-granularity selective" in args and "--recompute-modules moe_act layernorm" in args
    assert "--recompute-activations" not in args
    assert modules_of("modules:layernorm,moe_act") == ("moe_act", "layernorm")
    with pytest.raises(PlanError, match="no per-module recomputation"):
        torchtitan_config(runs["modules:layernorm,moe_act"])


def test_recipe_baseline_costs_its_modules():
    """GPT-OSS-120B's Megatron-Bridge B200 performance recipe runs --recompute-modules layernorm moe_act: the
    baseline states and costs them (at seq 2048, where it fits; before: the planner's selective, with a note); under
    an engine without them (fsdp2) the planner's selective, and the note says so."""
    cfg, cl = load_model_config("gpt-oss-120b"), load_cluster("dgx-b200", devices=64)
    base = baseline_plans(cfg, cl, 1280, 2048, names=("megatron_recipe",))["megatron_recipe"]
    assert "gpt_oss_120b_pretrain_64gpu_b200_bf16_config" in base.notes[0]
    assert base.train.recompute == "modules:layernorm,moe_act" and "not modelled" not in base.notes[0]
    assert base.report.breakdown["recompute"] > 0.0
    fsdp = baseline_plans(cfg, cl, 1280, 2048, framework="fsdp2", names=("megatron_recipe",))["megatron_recipe"]
    assert "gpt_oss_120b_pretrain_64gpu_b200_bf16_config" in fsdp.notes[0]
    assert fsdp.train.recompute == "selective" and "costed as the planner's selective" in fsdp.notes[0]
