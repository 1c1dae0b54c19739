"""The Megatron baseline is the published recipe (``search.recipes``): every row cites its source
and runs on its own model, a recipe model gets exactly its recipe's degrees, a model without one
gets NVIDIA's sizing rule and says so, and the rule's EP folding no longer flatters MoE plans."""

import pytest

from symtensor.cost.train import recompute_refusal
from symtensor.errors import PlanError
from symtensor.hardware import load_cluster
from symtensor.models import PRESETS, build_graph, load_model_config, params_active
from symtensor.plan.document import baselines_json
from symtensor.plan.summary import RECIPE_NOTE, megatron_summary, recipe_of
from symtensor.search import recipes
from symtensor.search.baselines import baseline_plans, sizing_rule
from symtensor.search.pool import EvaluatorPool


def _recipe_baseline(model, cluster, devices, global_batch, seq, overrides=None):
    cfg = load_model_config(model)
    cfg = cfg.replace(**overrides) if overrides else cfg
    cl = load_cluster(cluster, devices=devices)
    return baseline_plans(cfg, cl, global_batch, seq, names=("megatron_recipe",))["megatron_recipe"]


def test_every_row_cites_its_source_and_runs_on_its_own_model():
    """Each row names a zoo preset, its recipe, the repository at a commit and the file, and its
    degrees run on its model at its own GPU count (tp divides the heads, ep the experts, pp x vpp
    the layers...): only rows whose stated pipeline layout the planner cannot take yet (the
    pipeline-layout hook) are refused, and they say why."""
    assert len(recipes.RECIPES) >= 30
    assert len({(r.model, r.name, r.gpu, r.path) for r in recipes.RECIPES}) == len(recipes.RECIPES)
    for r in recipes.RECIPES:
        assert r.model in PRESETS and r.name and r.path and "@" in r.repo, r
        assert len(r.repo.split("@")[1]) >= 12 and r.kind in ("pretrain", "performance"), r
        assert r.gpu in ("h100", "b200", "gb200") and r.precision == "bf16", r
        # a recipe's module list is costed as stated (Megatron's --recompute-modules: cost.recompute)
        assert recompute_refusal(r.recompute) is None, r
        assert r.recompute.startswith("modules:") == r.recompute_detail.startswith("selective:"), r
        try:
            c = recipes.scaled(r, load_model_config(r.model), r.devices, r.global_batch, r.seq)
        except PlanError as e:
            assert r.pp_layout and "layers do not split" in str(e), (r.name, str(e))
            continue
        assert (c["tp"], c["pp"], c["cp"], c["ep"], c["vpp"], c["micro_batch"]) == (r.tp, r.pp, r.cp, r.ep, r.vpp,
                                                                                   r.micro_batch), r
    models = {r.model for r in recipes.RECIPES}
    assert {"llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b", "deepseek-v3",
            "qwen2-72b", "qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b", "mixtral-8x22b", "gpt-oss-120b",
            "nemotron4-15b", "nemotron4-340b"} <= models
    assert all(any(r.model == m and r.default for r in recipes.RECIPES) for m in models)


def test_a_recipe_model_on_its_recipe_devices_gets_exactly_the_recipe():
    """Mixtral-8x7B on the 64 H100 of NeMo's recipe, at its sequence and global batch: the
    baseline is the recipe's configuration, and the plan and its JSON name it with its source."""
    r = next(r for r in recipes.RECIPES if r.model == "mixtral-8x7b" and r.default)
    base = _recipe_baseline("mixtral-8x7b", "dgx-h100", r.devices, r.global_batch, r.seq)
    c = megatron_summary(base)
    assert (c["tp"], c["pp"], c["vpp"], c["cp"], c["ep"], c["etp"], c["sp"]) == (r.tp, r.pp, r.vpp, r.cp, r.ep, r.etp,
                                                                              r.sp)
    assert c["dp"] == r.devices // (r.tp * r.pp * r.cp) and c["micro_batch"] == r.micro_batch
    assert c["recompute"] == r.recompute and base.report.fits
    name, note = recipe_of(base)
    assert name == r.name == "mixtral_8x7b.pretrain_recipe" and r.source in note
    entry = baselines_json(base, {"megatron_recipe": base}, _band())["megatron_recipe"]
    assert entry["recipe"] == r.name and r.source in entry["recipe_note"]


@pytest.mark.parametrize("model, devices, global_batch, want", [
    ("nemotron4-15b", 64, 1024, "nemotron4_15b.pretrain_recipe"),        # NeMo 2's tp4 sp, 8 H100 in the recipe
    ("nemotron4-340b", 768, 2304, "nemotron4_340b.pretrain_recipe"),     # tp8 pp12 vpp8 cp2: 192 divides 768
    ("nemotron4-340b", 512, 1024, "pre_train nemotron4 340b h100 bf16"),  # ... not 512: NeMo's H100 CSV row
])
def test_nemotron4_gets_nvidias_recipe_and_evaluate_agrees(model, devices, global_batch, want):
    """Nemotron-4 on H100: the baseline is NeMo 2's recipe (its pretrain_recipe defaults, or the BF16 row of
    its H100 performance CSV where the library recipe's model-parallel degrees do not divide the devices), with
    its degrees, sequence parallelism and micro batch and dp scaled to the devices; the note names it with
    its source, and ``evaluate`` of the same configuration (Megatron's even split) costs it the same."""
    from symtensor import api

    r = next(r for r in recipes.RECIPES if r.model == model and r.name == want and r.gpu == "h100")
    base = _recipe_baseline(model, "dgx-h100", devices, global_batch, r.seq)
    c = megatron_summary(base)
    assert (c["tp"], c["pp"], c["vpp"], c["cp"], c["sp"], c["micro_batch"], c["recompute"]) == (
        r.tp, r.pp, r.vpp, r.cp, r.sp, r.micro_batch, r.recompute)
    assert c["dp"] == devices // (r.tp * r.pp * r.cp) and c["zero"] == r.zero and base.report.fits
    name, note = recipe_of(base)
    assert name == want and r.source in note
    ev = api.evaluate(model, "dgx-h100", devices, tp=r.tp, pp=r.pp, cp=r.cp, sp=r.sp, zero=r.zero, vpp=r.vpp,
                      micro_batch=r.micro_batch, global_batch=global_batch, seq=r.seq,
                      pp_layout="even" if r.pp > 1 else None)
    assert ev.config["dp"] == c["dp"] and ev.report.step_time_s == base.report.step_time_s


def _band():
    from symtensor.cost.bands import Band

    return Band(0.0, 1e9, "test", False)


def _rule(cfg, cl, global_batch, seq):
    return sizing_rule(EvaluatorPool(cfg, cl, seq), global_batch, params_active(cfg, build_graph(cfg, micro_batch=1,
                                                                                                   seq=128)))


def test_dp_scales_to_the_devices_and_the_micro_batch_to_the_batch():
    """On four times the recipe's devices the recipe keeps its degrees and dp grows fourfold; a
    recipe micro batch that does not divide a replica's batch falls to 1, and the note says so."""
    r = next(r for r in recipes.RECIPES if r.name == "qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config")
    cfg = load_model_config(r.model)
    c = recipes.scaled(r, cfg, 4 * r.devices, 4 * r.global_batch, r.seq)
    assert (c["tp"], c["ep"], c["dp"], c["micro_batch"]) == (r.tp, r.ep, 4 * r.devices, r.micro_batch)
    assert recipes.scaled(r, cfg, 4 * r.devices, 32, r.seq)["micro_batch"] == 1
    with pytest.raises(PlanError, match="does not divide 12 devices"):
        recipes.scaled(next(x for x in recipes.RECIPES if x.model == "llama3-70b"), load_model_config("llama3-70b"),
                       12, 48, 8192)


def test_a_model_without_a_recipe_gets_the_sizing_rule_and_says_so():
    """GPT-3 1.3B has no published Megatron-Bridge or NeMo recipe, and a LoRA Llama is not the
    model the recipes pretrain: both get the sizing rule, whose note says why; so does a model
    whose recipes' degrees the device count does not allow, or whose recipe does not fit."""
    cfg, cl = load_model_config("gpt3-1.3b"), load_cluster("dgx-a100-80g", devices=16)
    base = baseline_plans(cfg, cl, 64, 2048, names=("megatron_recipe",))["megatron_recipe"]
    rule = _rule(cfg, cl, 64, 2048)
    assert recipe_of(base) == (recipes.RULE, f"{recipes.RULE} (no published recipe for gpt3-1.3b)")
    assert {k: megatron_summary(base)[k] for k in ("tp", "pp", "dp", "recompute")} == {
        k: rule.megatron[k] for k in ("tp", "pp", "dp", "recompute")}
    lora = _recipe_baseline("llama3-8b", "dgx-a100-80g", 8, 64, 2048, {"lora_rank": 16})
    assert recipe_of(lora)[0] == recipes.RULE and "differs from the preset" in recipe_of(lora)[1]
    few = _recipe_baseline("llama3-405b", "dgx-h100", 8, 64, 8192)
    name, note = recipe_of(few)
    assert name == recipes.RULE and "llama31_405b_pretrain_1024gpu_h100_bf16_config" in note
    assert "does not divide 8 devices (nor does the other recipe of llama3-405b)" in note
    assert any(n.startswith(RECIPE_NOTE) for n in few.notes)
    odd = _recipe_baseline("llama3-70b", "dgx-h100", 24, 384, 8192)
    assert recipe_of(odd)[0] == recipes.RULE and "does not divide 24 devices (nor do the other 2" in recipe_of(odd)[1]
    big = _recipe_baseline("qwen2-72b", "dgx-h100", 256, 1024, 4096)  # TP 8 PP 4 without SP or recomputation
    assert recipe_of(big)[0] == recipes.RULE and "qwen2_72b_pretrain_32gpu_h100_bf16_config" in recipe_of(big)[1]
    assert "does not fit" in recipe_of(big)[1]


def test_qwen3_moe_on_64_h100_no_longer_folds_ep_64_across_infiniband():
    """The sizing rule folds EP as wide as the experts allow: 64 ranks over 8 nodes, every
    dispatch over InfiniBand, a baseline that flattered the planner. The published recipe
    (Megatron-Bridge's default Qwen3-30B-A3B pretrain recipe) runs EP 16."""
    cfg, cl = load_model_config("qwen3-30b-a3b"), load_cluster("dgx-h100", devices=64)
    rule = _rule(cfg, cl, 1024, 4096)
    assert rule.megatron["ep"] == 64  # what the rule does (why the baseline is the recipe)
    base = _recipe_baseline("qwen3-30b-a3b", "dgx-h100", 64, 1024, 4096)
    c = megatron_summary(base)
    assert (c["tp"], c["pp"], c["ep"], c["etp"], c["dp"]) == (1, 1, 16, 1, 64)
    assert recipe_of(base)[0] == "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"


@pytest.mark.parametrize("model, device, seq, n, want", [
    ("llama3-8b", "H100-SXM5-80GB", 8192, 64, "llama3_8b_pretrain_2gpu_h100_bf16_config"),
    ("llama3-8b", "H100-SXM5-80GB", 32768, 64, "llama3_8b_pretrain_32gpu_h100_bf16_64k_config"),
    ("llama3-8b", "H100-SXM5-80GB", 12288, 64, "llama3_8b_pretrain_16gpu_h100_bf16_16k_config"),
    ("llama3-8b", "H100-SXM5-80GB", 4096, 64, "llama3_8b_pretrain_2gpu_h100_bf16_config"),
    ("llama3-8b", "H100-SXM5-80GB", 131072, 64, "llama3_8b_pretrain_64gpu_h100_bf16_128k_config"),
    ("llama3-8b", "H100-SXM5-80GB", 262144, 64, "llama3_8b_pretrain_64gpu_h100_bf16_128k_config"),
    ("llama3-405b", "H100-SXM5-80GB", 8192, 16384, "llama31_405b_pretrain_1024gpu_h100_bf16_config"),
    ("llama3-405b", "H100-SXM5-80GB", 131072, 256, "llama31_405b_pretrain_256gpu_h100_bf16_config"),
    ("llama3-70b", "B200-SXM-180GB", 8192, 64, "llama3_70b_pretrain_64gpu_b200_bf16_config"),
    ("llama3-70b", "H200-SXM-141GB", 8192, 64, "llama3_70b_pretrain_32gpu_h100_bf16_config"),
    ("llama3-70b", "A100-SXM4-80GB", 8192, 64, "llama3_70b_pretrain_32gpu_h100_bf16_config"),
    ("deepseek-v3", "H100-SXM5-80GB", 4096, 256, "deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config"),
    ("deepseek-v3", "H100-SXM5-80GB", 4096, 1024, "deepseek_v3_pretrain_1024gpu_h100_bf16_config"),  # (library)
    ("mixtral-8x22b", "H100-SXM5-80GB", 4096, 1024, "mixtral_8x22b.pretrain_recipe"),
    ("mixtral-8x22b", "H100-SXM5-80GB", 8192, 256, "mixtral_8x22b.pretrain_recipe"),
    ("mixtral-8x22b", "H100-SXM5-80GB", 65536, 256, "pre_train mixtral 8x22b h100 bf16"),
    ("nemotron4-15b", "H100-SXM5-80GB", 4096, 64, "nemotron4_15b.pretrain_recipe"),
    ("nemotron4-15b", "H100-SXM5-80GB", 16384, 64, "nemotron4_15b_16k.pretrain_recipe"),
    ("nemotron4-15b", "B200-SXM-180GB", 4096, 64, "pre_train nemotron4 15b b200 bf16"),
    ("nemotron4-340b", "H100-SXM5-80GB", 4096, 512, "nemotron4_340b.pretrain_recipe"),
    ("nemotron4-340b", "GB200-B200-186GB", 4096, 128, "pre_train nemotron4 340b gb200 bf16"),
])
def test_the_recipe_written_for_the_gpu_and_sequence_comes_first(model, device, seq, n, want):
    """The library recipes and the cluster's GPU's benchmark configurations, in the order of
    ``recipes.candidates``: the cluster's GPU (H200 takes H100's), then the
    recipe sequence nearest the plan's (the longer of two as near), then the library recipe, the nearest GPU
    count and the family default."""
    got = recipes.candidates(model, device, seq, n)
    assert got[0].name == want and got[0].model == model
    assert got[0].kind == "pretrain" or not any(r.kind == "pretrain" and r.name == want for r in got)
    gpu = recipes.gpu_of(device)
    assert set(got) == {r for r in recipes.RECIPES if r.model == model and (r.kind == "pretrain" or r.gpu == gpu)}


def test_a_recipe_without_a_layout_runs_megatrons_own_split():
    """A recipe that states no pipeline layout runs Megatron's split (even, or the embedding and loss as
    layer slots), not the planner's balanced one: LLaMA-3-70B's tp4 pp4 vpp5 recipe on 64 H100 puts 4
    layers in each of its 20 chunks (it was costed as 4, 5, 4, 6, 5, ..., 1, 1, 1, 0)."""
    cfg, cl = load_model_config("llama3-70b"), load_cluster("dgx-h100", devices=64)
    base = baseline_plans(cfg, cl, 1024, 8192, names=("megatron_recipe",))["megatron_recipe"]
    assert (base.config["pp"], base.config["vpp"]) == (4, 5)
    assert base.train.layer_split is None
    assert base.train.chunk_layers(cfg.layers) == (4,) * 20


def test_a_recipe_layout_string_is_costed_as_stated():
    """A recipe that states Megatron's --pipeline-model-parallel-layout runs that split, not the planner's
    balanced one: DeepSeek-V3's tp2 pp16 ep64 library recipe (``Et*4|(t*4|)*14tmL``) puts 4 layers on
    each of its first 15 stages and 1 on the last, whose multi-token-prediction layer the zoo's model does
    not have (the note says so)."""
    r = next(r for r in recipes.RECIPES if r.name == "deepseek_v3_pretrain_1024gpu_h100_bf16_config"
             and r.kind == "pretrain")
    cfg = load_model_config("deepseek-v3")
    assert recipes.layout_split(r, cfg) == (4,) * 15 + (1,)
    assert recipes.scaled(r, cfg, 1024, 4096, 4096)["layer_split"] == (4,) * 15 + (1,)
    assert "multi-token-prediction" in recipes.MTP_NOTE
    slots = next(r for r in recipes.RECIPES if r.pp_layout and r.layout_string is None)
    assert recipes.layout_split(slots, load_model_config(slots.model)) is None  # the planner's own "slots" rule


def test_a_layout_string_that_does_not_give_the_recipes_stages_is_refused():
    r = next(r for r in recipes.RECIPES if r.layout_string)
    wrong = recipes.Recipe(**{**{f: getattr(r, f) for f in r.__slots__}, "vpp": 2})
    with pytest.raises(PlanError, match="stages, not pp x vpp"):
        recipes.layout_split(wrong, load_model_config(r.model))


def test_performance_recipes_carry_the_stack_their_launch_states():
    """Megatron-Bridge's performance recipes reduce gradients in bf16 (``_benchmark_common``) and run the allocator
    with expandable segments (their ``env_vars``; not the Megatron-FSDP row with CPU offloading), Qwen3-235B on H100
    also overlaps the expert-parallel communication, the Qwen3 MoE recipes that set the flex dispatcher's HybridEP
    backend run it; the library recipes state no stack fact but that dispatcher. NeMo 2's Nemotron-4 performance
    rows state what its launch does: bf16 gradient reduction, expandable segments on every GPU but B200."""
    from symtensor.plan.stack import Stack

    perf = [r for r in recipes.RECIPES if r.kind == "performance" and r.repo == recipes.BRIDGE]
    assert perf and all(r.stack.grad_reduce_bf16 for r in perf)
    assert [r.name for r in perf if not r.stack.expandable_segments] == ["llama3_70b_pretrain_64gpu_gb200_bf16_config"]
    qwen = next(r for r in perf if r.name == "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config")
    assert qwen.stack.moe_ep_overlap
    hybrid = sorted(r.name for r in recipes.RECIPES if r.stack.moe_dispatcher == "hybridep")
    assert hybrid == ["qwen3_235b_a22b_pretrain_256gpu_gb200_bf16_config",
                      "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", "qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config",
                      "qwen3_30b_a3b_pretrain_8gpu_gb200_bf16_config"]
    assert all(r.stack in (Stack(), Stack(moe_dispatcher="hybridep")) for r in recipes.RECIPES if r.kind == "pretrain")
    # NeMo 2's performance launch of Nemotron-4: bf16 gradient reduction, expandable segments but on B200
    nemo = [r for r in recipes.RECIPES if r.kind == "performance" and r.model.startswith("nemotron4")]
    assert len(nemo) == 6 and all(r.stack.grad_reduce_bf16 for r in nemo)
    assert all(r.stack.expandable_segments is (None if r.gpu == "b200" else True) for r in nemo)
