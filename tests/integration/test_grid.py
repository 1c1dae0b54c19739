"""The Megatron grid is exhaustive with an exact bound: it returns what costing every variant of
every point returns, and its bound never exceeds a point's cost."""

import pytest

from symtensor.hardware import load_cluster
from symtensor.models import load_model_config
from symtensor.search.grid import _floor_share, _host_share, _mean_bound, megatron_grid, point_bound, virtual_stages
from symtensor.search.pool import EvaluatorPool

# (model, cluster, devices, seq, global batch, overrides): dense and MoE, one node and several,
# plans that fit easily and ones that need recomputation or pipelining
CASES = [
    ("gpt3-1.3b", "dgx-a100-80g", 16, 2048, 32, {}),
    ("llama3-8b", "dgx-h100", 16, 8192, 16, {"layers": 8}),
    ("mixtral-8x7b", "dgx-h100", 8, 1024, 8, {"layers": 2}),
    ("qwen3-30b-a3b", "dgx-h100", 8, 1024, 8, {"layers": 2}),
    ("llama2-70b", "dgx-a100-80g", 16, 4096, 32, {"layers": 4}),
]


def _pool(model, cluster, devices, seq, overrides):
    cfg = load_model_config(model)
    cfg = cfg.replace(**overrides) if overrides else cfg
    return EvaluatorPool(cfg, load_cluster(cluster, devices=devices), seq)


def _brute_force(pool, global_batch):
    """Every variant of every point, the best by the search's order (fits, then time); checks on
    the way that each point's bound is at most the cost of each of its variants: the layer
    costs of one point of an inner grid bound every point of it (they do not depend on the
    pipeline depth or the data-parallel degree around it), with the host's work the step holds
    whatever they cost (``_host_share``) on top."""
    best, checked = None, 0
    e2e = pool.get(1, 1).eff.end_to_end
    assert e2e.microbatch_s > 0  # (the host's share is tested)
    for base in pool.grid(global_batch):
        vpps = virtual_stages(pool.cfg.layers, base["pp"])
        lower = point_bound(pool, base, vpps) + _host_share(e2e, base, vpps)
        for rc in pool.recomputations():
            for vpp in reversed(vpps):
                cand = pool.try_config(**base, recompute=rc, vpp=vpp)
                if cand is None:
                    continue
                assert lower <= cand.report.step_time_s * (1 + 1e-12), (base, rc, vpp)
                checked += 1
                if best is None or cand.key < best.key:
                    best = cand
    assert checked > 20
    return best


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_grid_equals_brute_force(case):
    model, cluster, devices, seq, gb, overrides = case
    best, count = megatron_grid(_pool(model, cluster, devices, seq, overrides), gb)
    brute = _brute_force(_pool(model, cluster, devices, seq, overrides), gb)
    assert best.report.fits == brute.report.fits
    assert best.report.step_time_s == pytest.approx(brute.report.step_time_s, rel=1e-12)
    assert best.megatron == brute.megatron


@pytest.mark.parametrize("case", CASES[:3], ids=[c[0] for c in CASES[:3]])
def test_the_cheaper_tiers_of_the_bound_never_exceed_the_exact_bound(case):
    """The grid visits its points lazily, by bounds that are only tightened when they are the
    lowest left (``search.grid``); that visits them in the exact bound's order only if every
    cheaper tier is at most the exact bound: the step floor's share (tier 0) and the mean stage
    of the layers' compute (tier 1) and of their whole costs (tier 2), on every point of the
    grid, pipelined or not."""
    model, cluster, devices, seq, gb, overrides = case
    pool = _pool(model, cluster, devices, seq, overrides)
    floor, totals, pipelined = _floor_share(pool, gb), {}, 0
    assert floor > 0
    for base in pool.grid(gb):
        vpps = virtual_stages(pool.cfg.layers, base["pp"])
        exact = point_bound(pool, base, vpps)
        m = gb // (base["micro_batch"] * base["dp"])
        assert floor * (1 + (base["pp"] - 1) / (vpps[-1] * m)) <= exact, base
        assert _mean_bound(pool, base, vpps, totals, 0) <= exact and _mean_bound(pool, base, vpps, totals) <= exact
        pipelined += base["pp"] > 1
    assert pipelined > 0


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=[CASES[0][0], CASES[2][0]])
def test_a_grid_told_what_to_beat_is_exact_below_it(case):
    """``beat`` (the guarantee's plan on more devices): a grid whose best is faster finds the
    same best; one whose best is not returns nothing better than it, costing no more; below the
    step floor it costs nothing."""
    model, cluster, devices, seq, gb, overrides = case
    best, count = megatron_grid(_pool(model, cluster, devices, seq, overrides), gb)
    t = best.report.step_time_s
    above, _ = megatron_grid(_pool(model, cluster, devices, seq, overrides), gb, beat=t * 1.001)
    assert (above.megatron, above.layouts, above.report) == (best.megatron, best.layouts, best.report)
    below, fewer = megatron_grid(_pool(model, cluster, devices, seq, overrides), gb, beat=t)
    assert fewer <= count and (below is None or below.key >= best.key)
    pool = _pool(model, cluster, devices, seq, overrides)
    assert megatron_grid(pool, gb, beat=_floor_share(pool, gb) / 2) == (None, 0)


@pytest.mark.parametrize("case", [CASES[0], CASES[2]], ids=[CASES[0][0], CASES[2][0]])
def test_the_grid_split_with_a_forked_child_finds_the_same_best(case):
    """Two processes, each pruning with its own best, find the serial grid's best (the same
    configuration, layouts and costs), costing at least the configurations it costs."""
    model, cluster, devices, seq, gb, overrides = case
    serial, count = megatron_grid(_pool(model, cluster, devices, seq, overrides), gb)
    split, split_count = megatron_grid(_pool(model, cluster, devices, seq, overrides), gb, fork=True)
    assert (split.megatron, split.train, split.layouts, split.report) == (serial.megatron, serial.train,
                                                                          serial.layouts, serial.report)
    assert split_count >= count > 0


def test_a_plan_slower_than_the_grid_best_gives_way_to_it():
    """What the search returns is compared with the exhaustive grid (its seeds are a scan above
    SMALL_GRID points): a slower plan is replaced by the grid's best, which says so."""
    from symtensor import api
    from symtensor.search import megatron_plan
    from symtensor.search.baselines import baseline_plans
    from symtensor.search.guarantee import never_worse_than_grid

    cfg, cl = load_model_config("gpt3-1.3b"), load_cluster("dgx-a100-80g", devices=16)
    grid = baseline_plans(cfg, cl, 64, 2048, names=("megatron_grid_best",))["megatron_grid_best"]
    slow = megatron_plan(cfg, cl, tp=8, dp=2, sp=True, zero=1, global_batch=64, seq=2048, recompute="full")
    assert slow.report.step_time_s > grid.report.step_time_s
    out = never_worse_than_grid(slow, grid)
    assert out.report.step_time_s == grid.report.step_time_s and out.layouts == grid.layouts
    assert any("Megatron grid's best configuration" in n for n in out.notes)
    assert never_worse_than_grid(grid, slow) is grid
    plan, base = api.plan_with_baselines("gpt3-1.3b", "dgx-a100-80g", devices=16, global_batch=64, seq=2048,
                                         names=("megatron_grid_best",))
    assert plan.report.step_time_s <= base["megatron_grid_best"].report.step_time_s


def test_more_devices_never_slower_at_a_fixed_batch():
    """A plan for 2N devices can do what the plan for N does with half of them idle: at a fixed
    global batch the plan's step never gets slower with more devices, and a plan that leaves
    devices idle says so, with the global batch that would use them all."""
    from symtensor import api

    steps = {}
    for n in (2, 4, 8):
        plan, _ = api.plan_with_baselines("tiny-llama", "dgx-h100", devices=n, global_batch=2, seq=64, names=())
        steps[n] = plan.report.step_time_s
        if plan.cluster.n_devices < n:
            used = plan.cluster.n_devices
            assert any(f"uses {used} of the {n} devices" in note and f"global batch of {2 * n // used}" in note
                       for note in plan.notes)
    assert steps[8] <= steps[4] <= steps[2]
    # (v2 also asserted that two sequences leave some of 8 devices idle: with its fitted GEMM knee a tiny
    # kernel gained nothing from a smaller piece. v3 charges each op an idle launch gap per device
    # (EndToEnd.kernel_gap_s), which a pipeline splits over its stages: 8 stages of this 2-layer model's
    # ops now beat one device, and the plan may use all 8.)


def test_the_megatron_space_plan_is_its_grid_baseline():
    """Under ``--space megatron`` the plan is the grid's best, so it is the ``megatron_grid_best``
    baseline (costed once): the same configuration, layouts, time and memory as the baseline
    costed on its own, and the other baselines are still costed."""
    from symtensor import api
    from symtensor.search.baselines import baseline_plans

    plan, base = api.plan_with_baselines("gpt3-1.3b", "dgx-a100-80g", devices=16, global_batch=64, seq=2048,
                                         space="megatron", names=("megatron_grid_best", "fsdp"))
    alone = baseline_plans(load_model_config("gpt3-1.3b"), load_cluster("dgx-a100-80g", devices=16), 64, 2048,
                           names=("megatron_grid_best", "fsdp"))
    assert list(base) == ["megatron_grid_best", "fsdp"]
    for name in base:
        got, want = base[name], alone[name]
        assert got.config == want.config and got.layouts == want.layouts
        assert got.report.step_time_s == want.report.step_time_s
        assert got.report.memory_peak == want.report.memory_peak
        assert got.notes == want.notes and got.search_time_s == want.search_time_s == 0.0
    assert plan.config == base["megatron_grid_best"].config and plan.search_time_s > 0


def test_the_monotone_recursion_stops_where_no_level_below_can_beat_the_plan_above(monkeypatch):
    """GPT-3 1.3B on 128 A100 at a global batch of 16: the plan for 64 devices is slower than the
    one for 128, and no plan on 32 can beat the one for 128 (their step floor is slower), so the
    recursion stops at 64. It went on to 32 while each level compared itself with its own plan
    only (32 devices' floor is below the 64-device plan)."""
    from symtensor.cost import Evaluator, TrainConfig
    from symtensor.models import build_graph
    from symtensor.search import search
    from symtensor.search.guarantee import guaranteed_plan

    cfg = load_model_config("gpt3-1.3b")
    searched = []
    monkeypatch.setenv("SYMTENSOR_SERIAL", "1")  # (every search in this process, to be counted here)

    def run(on, pool=None):
        searched.append(on.n_devices)
        return search(cfg, on, 16, 2048, pool=pool)

    plan, _ = guaranteed_plan(cfg, load_cluster("dgx-a100-80g", devices=128), 16, 2048, "megatron", run)
    assert searched == [128, 64] and plan.cluster.n_devices == 128
    ev = Evaluator(build_graph(cfg, micro_batch=16, seq=2048, skeleton=True), load_cluster("dgx-a100-80g", devices=32))
    assert ev.step_floor(TrainConfig(global_batch=16, micro_steps=1)) >= plan.report.step_time_s
