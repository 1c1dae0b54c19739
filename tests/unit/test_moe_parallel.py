"""Mixture-of-experts parallelism as it is trained today (issue 13): the expert layers' own grid
(Megatron's MoE parallel folding, EP x expert TP over the tp x cp x dp ranks of a stage) in
the Megatron configurations' checks (``check_config``), the Megatron layouts, the grid, the
search's level templates, ``evaluate`` and the Megatron-LM export."""

from __future__ import annotations

import pytest

from symtensor.cli import main
from symtensor.errors import PlanError
from symtensor.export import megatron_args
from symtensor.export.megatron import layer_pattern
from symtensor.hardware import load_cluster
from symtensor.models import build_graph, load_model_config
from symtensor.search import megatron_plan
from symtensor.search.megatron import check_config, configuration, expert_op, grid_points, tp_dim
from symtensor.search.partition import level_templates

QWEN3 = load_model_config("qwen3-235b-a22b")
TINY = load_model_config("tiny-qwen3-moe")  # heads 4, kv_heads 2, head_dim 32, experts 8, top_k 2


def _tiny_plan(**pc):
    return megatron_plan(TINY, load_cluster("dgx-h100", devices=8), global_batch=8, seq=64, **pc)


def test_ep_may_exceed_dp():
    """The Megatron MoE model zoo's Qwen3-235B layouts on 256 H100: EP 32 over TP 2 x DP 16, EP 8
    with DP 4 and PP 32, EP 8 over CP; all were refused while EP had to divide DP."""
    n = 256
    for pc in (dict(tp=2, pp=8, dp=16, ep=32), dict(tp=2, pp=32, dp=4, ep=8), dict(tp=2, pp=8, dp=4, cp=4, ep=8)):
        check_config(QWEN3, n, configuration(dict(sp=True, global_batch=1024, seq=4096, **pc)))


@pytest.mark.parametrize("pc, message", [
    (dict(tp=2, dp=4, ep=8, etp=2), r"ep\*etp = 8\*2 must divide tp\*cp\*dp = 8"),
    (dict(tp=2, dp=4, ep=4, etp=4), r"ep\*etp = 4\*4 must divide tp\*cp\*dp = 8"),
    (dict(tp=2, dp=4, ep=3), r"ep=3 must divide the number of experts \(8\)"),
    (dict(tp=2, dp=4, etp=3), r"etp=3 must divide the expert MLP width 32"),
])
def test_expert_grid_refusals(pc, message):
    with pytest.raises(PlanError, match=message):
        check_config(TINY, 8, configuration(dict(global_batch=8, seq=64, **pc)))


def test_dense_models_have_no_expert_grid():
    with pytest.raises(PlanError, match=r"model tiny-llama has no experts; leave ep and etp at 1"):
        check_config(load_model_config("tiny-llama"), 8, configuration(dict(dp=8, etp=2, global_batch=8, seq=64)))


def test_experts_fold_over_the_tensor_parallel_ranks_first():
    """Megatron orders expert ranks etp fastest, then ep: with expert TP 1 the experts take the tp
    axis and the innermost dp axis; the token ops follow the sequence shard (sequence parallel),
    so each rank dispatches its own tokens: one all-to-all over the four ranks, no gather."""
    plan = _tiny_plan(tp=2, dp=4, ep=4, sp=True)
    lay = plan.layouts
    assert lay["layers.0.q_proj"] == {"b": ("nvlink0", "nvlink1"), "n": ("nvlink2",)}
    assert lay["layers.0.experts.gate_proj"] == {"e": ("nvlink1", "nvlink2"), "b": ("nvlink0",)}
    for op in ("router", "topk", "dispatch"):
        assert lay[f"layers.0.{op}"] == {"b": ("nvlink0", "nvlink1"), "s": ("nvlink2",)}
    assert lay["layers.0.combine"] == {"b": ("nvlink0", "nvlink1"), "c": ("nvlink2",)}
    c = plan.config
    assert (c["tp"], c["dp"], c["ep"], c["etp"], c["heterogeneous"]) == (2, 4, 4, 1, False)


def test_expert_tp_follows_the_expert_grid():
    """etp = tp: the expert GEMMs cut their MLP width over the tp axis, EP takes the next axes."""
    lay = _tiny_plan(tp=2, dp=4, ep=2, etp=2, sp=True).layouts
    assert lay["layers.0.experts.gate_proj"] == {"f": ("nvlink2",), "e": ("nvlink1",), "b": ("nvlink0",)}
    assert lay["layers.0.experts.down_proj"] == {"f": ("nvlink2",), "e": ("nvlink1",), "b": ("nvlink0",)}


def test_qk_norms_follow_the_heads():
    """Qwen3's Q/K norms over the head dim keep the head cut (no all-to-all around them)."""
    lay = _tiny_plan(tp=2, dp=4, sp=True).layouts
    assert lay["layers.0.q_norm"] == lay["layers.0.q_proj"] and lay["layers.0.k_norm"] == lay["layers.0.k_proj"]


def test_a_router_bias_does_not_make_an_expert_op():
    """GPT-OSS's router has a bias over e: only ops whose first input runs over e are expert ops."""
    graph = build_graph(load_model_config("gpt-oss-120b", ["layers=2"]), micro_batch=1, seq=256)
    ops = {op.block: op for op in graph.ops if op.layer == 0}
    assert not expert_op(ops["router"]) and expert_op(ops["experts.gate_proj"]) and expert_op(ops["experts.act"])
    assert tp_dim(ops["router"]) is None


def test_grid_has_ep_beyond_dp_and_expert_tp():
    points = list(grid_points(TINY, 8, 8, 8, 64))
    assert any(p["ep"] > p["dp"] for p in points)
    assert {p["etp"] for p in points if p["tp"] == 2} == {1, 2}
    assert all((p["tp"] * p["cp"] * p["dp"]) % (p["ep"] * p["etp"]) == 0 for p in points)


def test_level_templates_fold_experts_only_where_there_are_experts():
    dense = build_graph(load_model_config("tiny-llama"), micro_batch=2, seq=16, skeleton=True)
    moe = build_graph(TINY, micro_batch=2, seq=16, skeleton=True)
    assert level_templates(dense.ops) == ("data", "tensor", "context", "expert")
    assert level_templates(moe.ops)[-2:] == ("tensor_ep", "context_ep")


def test_search_template_folds_experts_over_a_tensor_parallel_axis():
    """The ``tensor_ep`` level template cuts heads in attention and experts in the expert GEMMs on
    the same mesh axis: the per-op search can put the expert cut on an axis attention uses for TP."""
    from symtensor.cost import TrainConfig
    from symtensor.search.pool import EvaluatorPool

    pool = EvaluatorPool(TINY, load_cluster("dgx-h100", devices=8), 64)
    problem = pool.problem(TrainConfig(global_batch=8, micro_steps=1))
    cuts = {op.block: problem.template_cut(op, problem.root, 2, "tensor_ep").as_dict() for op in problem.ops
            if op.layer == 0}
    assert cuts["core"] == {"n": (2,)} and cuts["experts.gate_proj"] == {"e": (2,)}
    assert cuts["dispatch"] == {"s": (2,)} and cuts["combine"] == {"c": (2,)}


def test_evaluate_qwen3_235b_with_ep_over_tp_and_dp(capsys):
    """EP 32 over TP 2 x DP 16 with 8 pipeline stages of 4 virtual chunks: 94 layers and the
    embedding and loss slots make 96 = 8 x 4 x 3 (cost.train.chunks_fit)."""
    import json

    argv = ["evaluate", "qwen3-235b-a22b", "--cluster", "dgx-h100", "--devices", "256", "--tp", "2", "--pp", "8",
            "--ep", "32", "--vpp", "4", "--zero", "1", "--recompute", "full", "--micro-batch", "1",
            "--global-batch", "1024", "--seq", "4096", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    c = out["config"]
    assert (c["tp"], c["pp"], c["dp"], c["ep"], c["etp"], c["vpp"]) == (2, 8, 16, 32, 1, 4)
    assert out["breakdown"]["ep_comm"] > 0 and out["fits"]


def test_megatron_export_of_an_moe_plan():
    args = " ".join(megatron_args(megatron_plan(QWEN3, load_cluster("dgx-h100", devices=256), tp=2, pp=8, dp=16,
                                                ep=32, vpp=4, sp=True, zero=1, global_batch=1024, seq=4096)))
    for flag in ("--expert-model-parallel-size 32", "--expert-tensor-parallel-size 1", "--num-experts 128",
                 "--moe-router-topk 8", "--moe-ffn-hidden-size 1536", "--qk-layernorm", "--kv-channels 128",
                 "--num-virtual-stages-per-pipeline-rank 4", "--account-for-embedding-in-pipeline-split"):
        assert flag in args, flag
    ds = " ".join(megatron_args(megatron_plan(load_model_config("deepseek-v3"), load_cluster("dgx-h100", devices=1024),
                                              tp=2, pp=16, dp=32, ep=64, sp=True, zero=1, global_batch=1024, seq=4096)))
    for flag in ("--multi-latent-attention", "--q-lora-rank 1536", "--kv-lora-rank 512", "--qk-head-dim 128",
                 "--qk-pos-emb-head-dim 64", "--v-head-dim 128", "--moe-shared-expert-intermediate-size 2048",
                 "--moe-layer-freq '([0]*3+[1]*58)'", "--expert-model-parallel-size 64"):
        assert flag in ds, flag
    oss = " ".join(megatron_args(megatron_plan(load_model_config("gpt-oss-120b"), load_cluster("dgx-h100", devices=64),
                                               tp=2, dp=32, ep=64, sp=True, zero=1, global_batch=512, seq=4096)))
    for flag in ("--window-size 128,0", "--window-attn-skip-freq '([1,0])*18'", "--softmax-type learnable"):
        assert flag in oss, flag
    assert "--disable-bias-linear" not in oss


def test_layer_pattern():
    assert layer_pattern([0, 0, 0, 1, 1]) == "([0]*3+[1]*2)"
    assert layer_pattern([1, 0] * 3) == "([1,0])*3"
    assert layer_pattern([1, 1, 1]) == "([1]*3)"


def test_expert_and_dense_state_shard_over_what_expert_parallelism_leaves():
    """Megatron's distributed optimizer shards the dense weights over DP x CP (``intra_dp_cp_group``,
    megatron/core/optimizer/__init__.py) and the experts over the expert data-parallel ranks (ETP x EP x EDP =
    TP x CP x DP), so context parallelism changes neither shard. Until the tenth session the experts' token
    slots were not data-parallel axes (an expert op whose batch of 1 cannot be cut runs its tokens cut along
    ``c``: Qwen3-235B at 128K tokens over CP 8 kept its experts' optimizer state whole, 41 GiB a device), and an
    axis carrying expert parallelism counted as tensor-parallel for the dense weights (Mixtral at CP 8, EP over
    the CP ranks, sharded the dense state over DP alone)."""
    from symtensor import api

    def optimizer(model, n, **kw):
        return api.evaluate(model, "dgx-h100", n, zero=1, micro_batch=1, recompute="full", **kw).report.memory[
            "optimizer"]

    mixtral = [optimizer("mixtral-8x7b", 64, seq=4096 * cp, cp=cp, ep=8, global_batch=64) for cp in (1, 8)]
    assert mixtral[1] == pytest.approx(mixtral[0], rel=1e-9)
    qwen = [optimizer("qwen3-235b-a22b", 256, seq=4096 * cp, cp=cp, tp=4, pp=8, vpp=4, ep=8, global_batch=256,
                      pp_layout="Ett|(ttt|)*30ttL") for cp in (1, 8)]
    assert qwen[1] == pytest.approx(qwen[0], rel=1e-9)
    # a rank's experts (128 / EP 8 of each of the 12 layers of its stage, three matrices each) at 12 B per
    # parameter (fp32 master weight, Adam's two moments) over EDP = 256 / (EP 8 x PP 8) = 4, and less than a
    # fifth more for the dense weights sharded over DP x CP
    experts = QWEN3.experts // 8 * 12 * 3 * QWEN3.hidden * QWEN3.moe_ffn
    assert experts * 12 / 4 < qwen[1] < experts * 12 / 4 * 1.2


@pytest.mark.parametrize("tp, cp, ep, etp", [(1, 1, 8, 1), (2, 1, 8, 2), (1, 2, 4, 2), (1, 4, 8, 2), (2, 2, 2, 1)])
def test_the_optimizer_state_is_held_once_across_the_cluster(tp, cp, ep, etp):
    """Under ZeRO 1 without a pipeline every parameter's optimizer state lives on exactly one device of its
    data-parallel group: the devices together hold 12 B per parameter, whatever the expert grid folds onto.
    Expert TP over two context-parallel ranks (tp 1, cp 2, etp 2) used to take those ranks for tensor-parallel
    ones of the dense weights too, whose state then sat on twice the devices (3.5% more in all)."""
    from symtensor import api

    plan = api.evaluate("mixtral-8x7b", "dgx-h100", 64, tp=tp, cp=cp, ep=ep, etp=etp, zero=1, micro_batch=1,
                        global_batch=64, seq=4096 * cp, recompute="full")
    total = build_graph(load_model_config("mixtral-8x7b"), micro_batch=1, seq=128).params_total()
    assert plan.report.memory["optimizer"] * 64 == pytest.approx(12 * total, rel=0.002)
