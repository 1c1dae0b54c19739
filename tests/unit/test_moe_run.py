"""MoE as it is trained today (issue 23 item 4, ``cost.moe``): the token dispatcher (NCCL all-to-all
or DeepEP), routing imbalance (the most-loaded rank of the EP group), capacity and token dropping,
the shared expert overlapped with the dispatch, and the expert state sharded over expert data
parallelism; each in ``evaluate`` and the Megatron export. Directions and magnitudes from the
module's formulas."""

from __future__ import annotations

import math

import pytest

from symtensor.api import evaluate
from symtensor.cost import moe
from symtensor.cost.train import TrainConfig
from symtensor.errors import PlanError
from symtensor.export import megatron_args
from symtensor.hardware import load_cluster
from symtensor.models import build_graph, load_model_config
from symtensor.plan import Stack
from symtensor.search import megatron_plan

TINY = load_model_config("tiny-qwen3-moe")  # experts 8, top_k 2
RUN = {"seq": 4096, "global_batch": 2048, "micro_batch": 1, "recompute": "selective", "zero": 1}


def _qwen(**kw):
    """Qwen3-235B-A22B on 256 H100 as the Megatron MoE model zoo runs it: TP 2, EP 32 over 4 nodes."""
    return evaluate("qwen3-235b-a22b", "dgx-h100", 256, tp=2, ep=32, pp=8, vpp=4, pp_layout="even", **RUN, **kw)


def test_distinct_destinations():
    """A token's top_k experts fall in between 1 and min(k, groups) blocks; with one expert per
    block, exactly k; with 4 nodes of 32 experts each, 4 (1 - C(96, 8) / C(128, 8))."""
    assert moe.distinct(128, 8, 1) == 1.0
    assert moe.distinct(128, 8, 128) == pytest.approx(8.0)
    assert moe.distinct(128, 8, 4) == pytest.approx(4 * (1 - math.comb(96, 8) / math.comb(128, 8)))
    assert moe.distinct(128, 8, 4) < moe.distinct(128, 8, 32) < 8


def test_load_factor_grows_with_ep_and_shrinks_with_tokens():
    """E[max]/mean = 1 + z(n) sqrt(1/mu + cv^2/e): 1 when balanced or on one rank; larger over more
    ranks (same experts per rank), smaller with more tokens per rank; capped by the capacity."""
    routed = TrainConfig(global_batch=8, stack=Stack(moe_routing="aux_loss"))
    assert moe.load_factor(TrainConfig(global_batch=8), 4, 16384, 32) == 1.0
    assert moe.load_factor(routed, 4, 16384, 1) == 1.0
    f8, f32 = moe.load_factor(routed, 4, 16384, 8), moe.load_factor(routed, 4, 16384, 32)
    assert 1.0 < f8 < f32
    assert f32 == pytest.approx(1 + moe.expected_max_normal(32) * math.sqrt(1 / 16384 + moe.AUX_LOSS_CV ** 2 / 4))
    assert moe.load_factor(routed, 4, 512, 32) > moe.load_factor(routed, 4, 65536, 32)
    capped = routed.replace(stack=routed.stack.replace(moe_capacity_factor=1.1))
    assert moe.load_factor(capped, 4, 512, 32) == 1.1
    assert moe.expected_max_normal(1) == 0.0 and 2.0 < moe.expected_max_normal(32) < 2.1


def test_deepep_sends_each_token_once_per_node():
    """DeepEP across 4 nodes moves a token once per remote node holding one of its experts (RDMA at
    43/50 of the NIC), where the all-to-all moves its top_k copies: fewer bytes, less time."""
    cl = load_cluster("dgx-h100", devices=256)
    levels, counts = cl.levels, [8, 4] + [1] * (len(cl.levels) - 2)
    nbytes = 2048 * 8 * 4096 * 2  # 2,048 tokens, top-8 copies, hidden 4,096, bf16
    t = moe.deepep_time(nbytes, counts, levels, 128, 8, cl.device)
    rdma = nbytes / 8 * moe.distinct(128, 8, 4) * 3 / 4 / (levels[1].bandwidth * moe.DEEPEP_RDMA_FRACTION)
    assert t == pytest.approx(rdma + levels[0].latency + levels[1].latency)
    from symtensor.cost.collectives import collective_time
    assert t < collective_time("all_to_all", nbytes, counts, levels)


def test_deepep_on_blackwell_nvlink_runs_at_its_measured_gb200_rows():
    """Inside a GB200 NVL72 domain DeepEP's normal kernels move what DeepEP's measured GB200 rows say (16 ranks at 20
    SMs: dispatch 385.6, combine 328.3 GB/s of algorithm bandwidth, 15/16 of it crossing), not H800's 153/160 of the
    link: 16 ranks at their harmonic mean, by hand."""
    cl = load_cluster("gb200-nvl72", devices=64)
    levels, counts = cl.levels, [16] + [1] * (len(cl.levels) - 1)
    nbytes = 4096 * 8 * 7168 * 2  # 4,096 tokens, top-8 copies, hidden 7,168, bf16
    t = moe.deepep_time(nbytes, counts, levels, 256, 8, cl.device)
    dispatch, combine = (328.80 + 442.47) / 2, (278.34 + 378.32) / 2
    rate = 2 / (1 / dispatch + 1 / combine) * 1e9 * 15 / 16  # bytes/s of the bytes that cross
    crossing = nbytes / 8 * moe.distinct(256, 8, 16) * 15 / 16
    assert t == pytest.approx(crossing / rate + levels[0].latency)
    hopper = moe.deepep_time(nbytes, counts, levels, 256, 8, load_cluster("dgx-h100", devices=8).device)
    assert hopper < t / 2  # H800's fraction of the same link would make it more than twice as fast


def test_deepep_evaluation_cuts_cross_node_dispatch():
    """EP 32 across 4 nodes: DeepEP's ep_comm is less than half the all-to-all's (2.7 of 8 copies
    leave the node), and the step is shorter."""
    a2a, deep = _qwen().report, _qwen(stack=Stack(moe_dispatcher="deepep")).report
    assert deep.breakdown["ep_comm"] < 0.5 * a2a.breakdown["ep_comm"]
    assert deep.step_time_s < a2a.step_time_s


def test_aux_loss_routing_paces_by_the_most_loaded_rank():
    """Dropless auxiliary-loss routing: the expert compute and the all-to-alls grow; a capacity
    factor of 1 drops back to the mean, exactly the balanced step."""
    bal = _qwen().report
    aux = _qwen(stack=Stack(moe_routing="aux_loss")).report
    assert aux.breakdown["ep_comm"] > bal.breakdown["ep_comm"] and aux.breakdown["compute"] > bal.breakdown["compute"]
    assert aux.step_time_s > bal.step_time_s
    dropped = _qwen(stack=Stack(moe_routing="aux_loss", moe_capacity_factor=1.0)).report
    assert dropped.step_time_s == pytest.approx(bal.step_time_s)


def test_shared_expert_overlap_hides_dispatch():
    """Megatron --moe-shared-expert-overlap: the shared expert's GEMMs run beside the dispatch and
    combine, so less ep_comm is exposed and the step is shorter."""
    kw = {"tp": 1, "ep": 8, "micro_batch": 1, "global_batch": 16, "seq": 2048, "overrides": ["shared_ffn=1536"]}
    serial = evaluate("qwen3-30b-a3b", "dgx-h100", 16, **kw).report
    over = evaluate("qwen3-30b-a3b", "dgx-h100", 16, stack=Stack(moe_shared_overlap=True), **kw).report
    assert over.breakdown["ep_comm"] < serial.breakdown["ep_comm"]
    assert over.step_time_s < serial.step_time_s


@pytest.mark.parametrize("kw, message", [
    ({"moe_dispatcher": "nccl"}, "moe_dispatcher='nccl'; use one of alltoall, deepep"),
    ({"moe_routing": "random"}, "moe_routing='random'; use one of balanced, aux_loss"),
    ({"moe_capacity_factor": 0.5}, "moe_capacity_factor=0.5 must be a number >= 1"),
])
def test_bad_moe_options(kw, message):
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace("[", r"\[")):
        evaluate("tiny-qwen3-moe", "dgx-h100", 8, ep=4, global_batch=8, seq=64, stack=Stack(**kw))
    with pytest.raises(PlanError, match="moe_"):
        TrainConfig(global_batch=8, stack=Stack(**kw))


def test_expert_state_shards_over_expert_data_parallelism():
    """Megatron's distributed optimizer shards the experts' state over EDP = dp x cp x tp / (ep x etp)
    and the dense layers' over dp x cp: tp 1, dp 8, ep 4 keeps each expert on 4 ranks, its state on
    EDP 2 of them; optimizer bytes 12 x (dense / 8 + experts / (4 x 2))."""
    plan = megatron_plan(TINY, load_cluster("dgx-h100", devices=8), global_batch=8, seq=64, dp=8, ep=4, zero=1)
    g = build_graph(TINY, micro_batch=8, seq=64)
    expert = sum(t.numel for t in g.params() if ".experts." in t.name)
    dense = sum(t.numel for t in g.params()) - expert
    mem = plan.report.memory
    assert mem["params"] == pytest.approx(2 * (dense + expert / 4))
    assert mem["optimizer"] == pytest.approx(12 * (dense / 8 + expert / 8))


def test_megatron_export_states_the_dispatcher_capacity_and_overlap():
    cl = load_cluster("dgx-h100", devices=8)
    base = dict(global_batch=8, seq=64, dp=8, ep=4)
    assert "--moe-token-dispatcher-type alltoall" in megatron_args(megatron_plan(TINY, cl, **base))
    args = megatron_args(megatron_plan(TINY, cl, moe_dispatcher="deepep", moe_capacity_factor=1.25,
                                       moe_routing="aux_loss", **base))
    for flag in ("--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep",
                 "--moe-expert-capacity-factor 1.25", "--moe-token-drop-policy probs",
                 "--moe-router-load-balancing-type aux_loss"):
        assert flag in args
    shared = load_model_config("tiny-qwen3-moe", ["shared_ffn=32"])
    assert "--moe-shared-expert-overlap" in megatron_args(megatron_plan(shared, cl, moe_shared_overlap=True, **base))


def test_plan_costs_the_moe_options_the_user_runs():
    """``plan`` takes the MoE options as stated facts of the stack: every point of the search (and the
    grid it is guaranteed against) runs with them, the plan carries them, its Megatron export states
    them; without them the search's training keys are today's."""
    from symtensor.api import plan
    from symtensor.plan.parallelism import Parallelism
    from symtensor.search.pool import EvaluatorPool

    run = dict(seq=512, global_batch=64, space="megatron")
    base = plan("tiny-qwen3-moe", "dgx-h100", 16, **run)
    p = plan("tiny-qwen3-moe", "dgx-h100", 16, stack=Stack(moe_dispatcher="deepep", moe_routing="aux_loss"), **run)
    assert (p.train.stack.moe_dispatcher, p.train.stack.moe_routing) == ("deepep", "aux_loss")
    assert (base.train.stack.moe_dispatcher, base.train.stack.moe_routing) == ("alltoall", "balanced")
    assert p.config["moe_routing"] == "aux_loss" and "moe_routing" not in base.config
    assert "--moe-router-load-balancing-type aux_loss" in " ".join(megatron_args(p))
    # the plan's own configuration costed again with the options is what the search reported
    again = megatron_plan(TINY, load_cluster("dgx-h100", devices=16), **Parallelism.from_dict(p.config).as_dict())
    assert again.report.step_time_s == pytest.approx(p.report.step_time_s)
    pool = EvaluatorPool(TINY, load_cluster("dgx-h100", devices=16), 512)
    assert pool.train_keys == EvaluatorPool(TINY, load_cluster("dgx-h100", devices=16), 512,
                                            stack=Stack()).train_keys
    with pytest.raises(PlanError, match="moe_dispatcher='nccl'"):
        Stack(moe_dispatcher="nccl")


def test_ep_overlap_hides_dispatch_behind_the_paired_micro_batch():
    """--overlap-moe-expert-parallel-comm (combined 1F1B): the layer's expert all-to-alls hide behind the
    paired micro-batch's compute in the steady state, so ep_comm falls and nothing else moves; the share
    paired is all but the pipeline's warm-up; Megatron's refusals; the export states it."""
    deepep = Stack(moe_dispatcher="deepep")
    base, over = _qwen(stack=deepep), _qwen(stack=Stack(moe_dispatcher="deepep", moe_ep_overlap=True))
    assert over.report.breakdown["ep_comm"] < 0.5 * base.report.breakdown["ep_comm"]
    assert over.report.breakdown["compute"] == pytest.approx(base.report.breakdown["compute"])
    assert over.report.step_time_s < base.report.step_time_s
    steady = TrainConfig(global_batch=2048, micro_steps=128, pp=8, vpp=4, stack=Stack(moe_ep_overlap=True))
    assert moe.ep_overlap_share(steady) == pytest.approx(1 - (1 + (7 * 2 + 3 * 8) / 4) / 128)
    assert moe.ep_overlap_share(TrainConfig(global_batch=4, micro_steps=4, stack=Stack(moe_ep_overlap=True))) == 0.75
    args = megatron_args(over)
    assert "--overlap-moe-expert-parallel-comm" in args and "--delay-wgrad-compute" in args
    grid, overlap = dict(tp=2, ep=32, pp=8, vpp=4), Stack(moe_ep_overlap=True)
    for kw, message in ((dict(recompute="full"), "full recomputation"),
                        (dict(stack=Stack(moe_ep_overlap=True, moe_shared_overlap=True)), "exclude"),
                        (dict(vpp=1), "interleaved"), (dict(ep=1), "ep > 1")):
        with pytest.raises(PlanError, match=message):
            evaluate("qwen3-235b-a22b", "dgx-h100", 256, **{**RUN, **grid, "stack": overlap, **kw})


def test_a_search_holds_ep_overlap_only_where_megatron_runs_it():
    """A search that holds --moe-ep-overlap keeps it on the points Megatron runs it on and drops it
    elsewhere (full recomputation, pp > 1 without virtual stages, another engine); a plan without expert
    parallelism does not state it."""
    on = dict(global_batch=64, micro_steps=8, stack=Stack(moe_ep_overlap=True))
    assert TrainConfig(**on).stack.moe_ep_overlap and TrainConfig(pp=2, vpp=2, **on).stack.moe_ep_overlap
    for kw in (dict(recompute="full"), dict(pp=2), dict(framework="fsdp2")):
        assert not TrainConfig(**on, **kw).stack.moe_ep_overlap
    from symtensor.api import plan

    dense = plan("tiny-llama", "dgx-h100", 8, seq=256, global_batch=32, space="megatron",
                 stack=Stack(moe_ep_overlap=True))
    assert "moe_ep_overlap" not in dense.config


def test_ep_overlap_keeps_one_more_layer_in_flight():
    """Megatron's combined 1F1B step runs the forward micro-batch's layer i beside the backward one's layer n - 1 - i
    and releases the backward's layer after each pair (cost.memory.ep_overlap_layer): one micro-batch's activations
    fill as the other's drain, so the stage holds one layer more than 1F1B, not a micro-batch more (until the
    twelfth session the model held a whole extra model chunk: twice the activations without a pipeline). The
    extra warm-up forward before the combined steps is the steady-state forward 1F1B's count already holds; a step
    whose micro-batches are all in flight, or a stage without expert communication, holds none."""
    from symtensor.cost.memory import ep_overlap_layer
    from symtensor.cost.pipeline import Stage, inflight

    run = dict(seq=256, global_batch=64, micro_batch=1, zero=1, tp=1, ep=4, recompute="none")
    off = evaluate("tiny-qwen3-moe", "dgx-h100", 16, **run)
    on = evaluate("tiny-qwen3-moe", "dgx-h100", 16, stack=Stack(moe_ep_overlap=True), **run)
    one_layer = off.report.memory["activations_layers"] / off.model.layers  # (its layers are alike)
    assert on.report.memory["activations"] == pytest.approx(off.report.memory["activations"] + one_layer)
    assert on.report.step_time_s < off.report.step_time_s
    st = Stage()
    st.comm["ep_comm"] = 1.0
    st.layer_saved = [3.0, 5.0, 4.0]  # a dense first layer beside MoE ones: the largest
    piped = TrainConfig(global_batch=2048, micro_steps=128, pp=8, vpp=4, stack=Stack(moe_ep_overlap=True))
    assert ep_overlap_layer(st, piped, inflight(0, piped)) == 5.0
    assert ep_overlap_layer(st, piped.replace(micro_steps=8), 8.0) == 0.0  # every micro-batch in flight already
    assert ep_overlap_layer(Stage(), piped, inflight(0, piped)) == 0.0  # no expert communication
