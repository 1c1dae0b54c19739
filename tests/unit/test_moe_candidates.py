"""Every number of a plan under the MoE options (``cost.moe``) uses them: the per-op partition's candidate costs
(``cost.terms.op_cost``, ``ep_edge_seconds``: an expert op at the most-loaded rank's pace, a dispatch at the
dispatcher's time, as ``cost.segment`` charges them) and the D-Rec baseline (costed with the pool's options)."""

from __future__ import annotations

import pytest

from symtensor import api
from symtensor.cost import Evaluator, TrainConfig, moe
from symtensor.cost.opcost import local_sizes
from symtensor.cost.terms import ep_edge_seconds, op_cost
from symtensor.hardware import load_cluster
from symtensor.models import build_graph, load_model_config
from symtensor.plan import Stack
from symtensor.search.megatron import megatron_layouts
from symtensor.search.partition import Problem


@pytest.fixture(scope="module")
def placed():
    cfg = load_model_config("tiny-qwen3-moe")  # 8 experts, top 2
    graph = build_graph(cfg, micro_batch=16, seq=256, skeleton=True)
    ev = Evaluator(graph, load_cluster("dgx-h100", devices=16))
    layouts = megatron_layouts(graph, ev.mesh, dict(tp=1, pp=1, dp=16, cp=1, ep=8, etp=1, sp=False))
    return cfg, ev, layouts


def test_candidate_op_costs_carry_the_load_factor(placed):
    cfg, ev, layouts = placed
    base, aux = TrainConfig(global_batch=16), TrainConfig(global_batch=16, stack=Stack(moe_routing="aux_loss"))
    experts = [op for op in ev.graph.ops if moe.expert_op(op) and op.name in layouts]
    assert experts
    for op in experts:
        lay = layouts[op.name]
        f = moe.op_load_factor(aux, op, local_sizes(op, lay, ev.mesh), cfg.experts)
        assert f > 1.0
        assert op_cost(ev, op, lay, aux).compute_s == pytest.approx(op_cost(ev, op, lay, base).compute_s * f)
    dense = next(op for op in ev.graph.ops if op.kind == "linear" and not moe.expert_op(op) and op.name in layouts)
    lay = layouts[dense.name]
    assert op_cost(ev, dense, lay, aux).compute_s == op_cost(ev, dense, lay, base).compute_s


def test_partition_edges_charge_the_dispatcher(placed):
    """A dispatch edge across the 2 nodes: DeepEP's time, not the all-to-all's; the partition's edge cost
    follows (``Problem._edge_cost``); other edges and the default options are untouched."""
    _, ev, layouts = placed
    deepep = TrainConfig(global_batch=16, stack=Stack(moe_dispatcher="deepep"))
    base = TrainConfig(global_batch=16)
    moved = 0
    p_on, p_off = Problem(ev, deepep), Problem(ev, base)
    for e, e_off in zip(p_on.edges, p_off.edges):
        if e.src.kind != "moe_dispatch" and e.dst.kind not in ("moe_dispatch", "moe_combine"):
            continue
        lu, lv = layouts.get(e.src.name), layouts.get(e.dst.name)
        if lu is None or lv is None:
            continue
        on, off = p_on._edge_cost(e, lu, lv), p_off._edge_cost(e_off, lu, lv)
        src = ev.out_layout(e.src, lu, e.src_slot, partial=False)
        seconds, colls = ev.edge(src, ev.in_layout(e.dst, lv, e.dst_slot), e.tensor)
        if any(c.kind == "all_to_all" for c in colls):
            assert on != off
            assert ep_edge_seconds(ev, deepep, e.src, e.dst, lu, lv, seconds, colls) != seconds
            moved += 1
        assert ep_edge_seconds(ev, base, e.src, e.dst, lu, lv, seconds, colls) == seconds
    assert moved


def test_drec_baseline_runs_with_the_stack_facts():
    """D-Rec's plan is costed with the plan's MoE options and gradient reduction (before: without them)."""
    stack = Stack(moe_routing="aux_loss", moe_dispatcher="deepep", grad_reduce_bf16=True)
    _, base = api.plan_with_baselines("tiny-qwen3-moe", "dgx-h100", 16, global_batch=64, seq=256,
                                      names=("drec",), stack=stack)
    drec = base["drec"]
    assert drec.train.stack.moe_routing == "aux_loss" and drec.train.stack.moe_dispatcher == "deepep"
    assert drec.train.stack.grad_reduce_bf16
