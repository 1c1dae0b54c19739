"""The search's quality, end to end: the per-op solver within 2% of the exact optimum
(``search.exact``), whole plans never slower than the best Megatron configuration (the
exhaustive grid through the same cost model) and faster than D-Rec's, and never slower than the
published recipe they are compared with; and searches of random small models on toy clusters valid
or refused in one line (moved from the unit tests: each costs whole searches)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from symtensor import api
from symtensor.errors import PlanError
from symtensor.hardware import MEMORY_HEADROOM, cluster_from_dict, load_cluster
from symtensor.layout import REPLICATED, check_layout
from symtensor.models import ModelConfig, load_model_config
from symtensor.plan.summary import recipe_of
from symtensor.search import drec_plan, recipes, search
from symtensor.search.exact import exact_layouts
from symtensor.search.grid import megatron_grid
from symtensor.search.partition import solve
from symtensor.search.pool import EvaluatorPool

from fixtures.problems import problem as make_problem

# (model, changes, devices, seq, global batch, micro-steps, memory weight in steps per capacity)
SCENARIOS = [
    ("llama2-7b", dict(layers=2), 4, 4096, 16, 4, 1.0),
    ("llama2-7b", dict(layers=2), 4, 4096, 16, 4, 10.0),
    ("llama3-8b", dict(layers=2), 4, 4096, 16, 4, 3.0),       # GQA
    ("llama3-8b", dict(layers=2), 8, 4096, 32, 4, 3.0),
    ("mixtral-8x7b", dict(layers=2), 4, 4096, 16, 4, 3.0),    # MoE
    ("mixtral-8x7b", dict(layers=2), 8, 4096, 32, 4, 3.0),
    ("llama2-7b", dict(layers=2, lora_rank=16), 4, 4096, 16, 4, 3.0),   # LoRA
    ("llama3-8b", dict(layers=2), 4, 32768, 4, 2, 3.0),       # long sequence
    ("qwen2-7b", dict(layers=3), 8, 4096, 32, 4, 3.0),
    ("gpt3-6.7b", dict(layers=2), 8, 2048, 32, 4, 3.0),       # GPT, LayerNorm, biases
    ("tiny-mixtral", dict(layers=3), 4, 128, 16, 2, 3.0),
]


@pytest.mark.parametrize("scenario", SCENARIOS,
                         ids=[f"{s[0]}-{s[2]}dev-{s[3]}seq-lam{s[6]:g}" + ("-lora" if "lora_rank" in s[1] else "")
                              for s in SCENARIOS])
def test_solver_within_2pct_of_exact_optimum(scenario):
    problem = make_problem(*scenario)
    layouts = solve(problem)
    _, optimum = exact_layouts(problem, upper=layouts)
    found = problem.total(layouts)
    assert found >= optimum * (1 - 1e-9), "the oracle must not be beaten"
    assert found <= optimum * 1.02


SMALL_PLANS = [
    ("llama2-7b", dict(layers=4), "dgx-h100", 8, 64, 2048),
    ("llama3-8b", dict(layers=4), "dgx-a100-80g", 16, 64, 4096),
    ("mixtral-8x7b", dict(layers=4), "dgx-h100", 8, 32, 2048),
    ("llama2-7b", dict(layers=4, lora_rank=8), "dgx-a100-80g", 8, 64, 4096),
]


@pytest.mark.parametrize("name, changes, cluster, devices, gb, seq", SMALL_PLANS,
                         ids=[f"{p[0]}{'-lora' if 'lora_rank' in p[1] else ''}-{p[3]}" for p in SMALL_PLANS])
def test_plan_never_worse_than_grid_best_and_better_than_drec(name, changes, cluster, devices, gb, seq):
    cfg = load_model_config(name).replace(**changes)
    cl = load_cluster(cluster, devices=devices)
    grid, _ = megatron_grid(EvaluatorPool(cfg, cl, seq), gb)
    plan = search(cfg, cl, gb, seq)
    # (the grid costs BF16; without --precision the search may take FP8 on H100 as a variant of its best)
    megatron = search(cfg, cl, gb, seq, space="megatron", precision="bf16")
    drec = drec_plan(cfg, cl, gb, seq)
    assert grid.report.fits and plan.report.fits
    assert megatron.report.step_time_s == pytest.approx(grid.report.step_time_s, rel=1e-12)
    assert plan.report.step_time_s <= grid.report.step_time_s * (1 + 1e-9)
    assert plan.report.step_time_s < drec.report.step_time_s


# Larger clusters, where the seeds are a scan of the grid (unimodal chains) rather than the
# exhaustive grid: the cases where a chain stopped too early or interleaving forced recomputation
# (the grid best is dense 70B's tp2 pp8 cp2 without virtual stages).
SCAN_PLANS = [
    ("llama2-70b", "dgx-h100", 64, 1024, 4096),
    ("llama3-8b", "dgx-h100", 64, 32, 131072),
    ("mixtral-8x7b", "dgx-h100", 64, 1024, 4096),
]


@pytest.mark.parametrize("name, cluster, devices, gb, seq", SCAN_PLANS, ids=[f"{p[0]}-{p[4]}" for p in SCAN_PLANS])
def test_large_cluster_scan_never_worse_than_grid_best(name, cluster, devices, gb, seq):
    cfg = load_model_config(name)
    cl = load_cluster(cluster, devices=devices)
    grid, _ = megatron_grid(EvaluatorPool(cfg, cl, seq), gb)
    plan = search(cfg, cl, gb, seq)
    assert grid.report.fits and plan.report.fits
    assert plan.report.step_time_s <= grid.report.step_time_s * (1 + 1e-9)


@pytest.mark.parametrize("model, devices", [("llama3-70b", 64), ("nemotron4-15b", 64), ("nemotron4-15b", 512),
                                             ("nemotron4-340b", 512)])
def test_the_plan_is_never_slower_than_the_recipe_it_is_compared_with(model, devices):
    """LLaMA-3-70B's recipe on 64 H100 runs a virtual pipeline depth the grid does not try (it
    was 1.0006x faster than the searched plan): the guarantee costs the recipe and adopts it. Nemotron-4's
    baselines are NeMo's recipes, and the plans fit and are no slower."""
    plan, base = api.plan_with_baselines(model, "dgx-h100", devices, names=("megatron_recipe",))
    recipe = base["megatron_recipe"]
    assert recipe is not None and recipe.report.fits and plan.report.fits
    assert plan.report.step_time_s <= recipe.report.step_time_s
    assert recipe_of(recipe)[0] != recipes.RULE


def _assert_valid(plan):
    layouts = plan.op_layouts()
    for op in plan.graph.ops:
        check_layout(op, layouts.get(op.name, REPLICATED), plan.mesh)  # every cut divides, no axis twice
    assert plan.mesh.size() * plan.pipeline.size() == plan.cluster.n_devices
    assert plan.pipeline.size() == plan.train.pp
    rep = plan.report
    if rep.fits:
        assert rep.memory_peak <= rep.memory_reserved <= MEMORY_HEADROOM * rep.capacity
    assert rep.step_time_s > 0 and all(v >= 0 for v in rep.breakdown.values())


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(1, 4), width=st.sampled_from([32, 64, 96, 128]), heads=st.sampled_from([2, 4, 8]),
       kv_div=st.sampled_from([1, 2]), experts=st.sampled_from([1, 4]), fanout=st.sampled_from([2, 3, 4, 8]),
       nodes=st.integers(1, 3), seq=st.sampled_from([32, 64, 96]), batch=st.sampled_from([6, 8, 12, 16, 24]))
def test_fuzzed_plans_are_valid(layers, width, heads, kv_div, experts, fanout, nodes, seq, batch):
    cfg = ModelConfig(name="fuzz", layers=layers, hidden=width, heads=heads, kv_heads=heads // kv_div, ffn=2 * width,
                      vocab=256, experts=experts, top_k=min(2, experts), max_context=seq)
    cluster = cluster_from_dict({
        "device": {"name": "toy", "peak_tflops": {"bf16": 100}, "hbm_gbps": 1000, "memory_gib": 0.01},
        "levels": [{"name": "fast", "fanout": fanout, "bandwidth_gbps": 100, "latency_us": 2},
                   {"name": "slow", "bandwidth_gbps": 10, "latency_us": 10}]}, fanout * nodes)
    try:
        plan = search(cfg, cluster, batch, seq)
    except PlanError as exc:  # a refusal must say why, never crash
        assert str(exc)
        return
    _assert_valid(plan)
