"""The search: the memory weight, D-Rec's recursion, the bounds that prune the search, plan validity
and plan files, the orbit memo. (The solver against the exact optimum, plans against the
Megatron grid and random searches on toy clusters: tests/integration/test_search_quality.py.)"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from symtensor.cost import Evaluator, TrainConfig
from symtensor.errors import PlanError
from symtensor.hardware import MEMORY_HEADROOM, load_cluster
from symtensor.layout import check_layout
from symtensor.models import PRESETS, build_graph, load_model_config
from symtensor.plan import load_plan, save_plan
from symtensor.search import partition, search
from symtensor.search.partition import Problem, solve
from symtensor.search.pool import EvaluatorPool

from fixtures.problems import problem as make_problem


def test_memory_weight_changes_the_plan():
    """lambda = 0 gives pure data parallelism; a memory weight makes weights sharded somewhere."""
    cheap = make_problem("llama3-8b", dict(layers=2), 8, 4096, 32, 4, 0.0)
    dear = make_problem("llama3-8b", dict(layers=2), 8, 4096, 32, 4, 10.0)
    plain, sharded = solve(cheap), solve(dear)

    def state(problem, layouts):
        mem = problem.ev.evaluate(layouts, problem.train).memory
        return mem["params"] + mem["grads"] + mem["optimizer"]

    assert state(dear, sharded) < 0.8 * state(cheap, plain)
    assert cheap.total(plain) <= cheap.total(sharded)  # without the weight, the sharded plan is no faster


def test_drec_problem_runs_the_same_recursion():
    from symtensor.search.drec import drec_layouts

    problem = make_problem("llama2-7b", dict(layers=2), 8, 4096, 32, 4, 0.0)
    layouts = drec_layouts(problem.ev, problem.train)
    for op in problem.ev.graph.ops:
        check_layout(op, layouts[op.name], problem.ev.mesh)


def test_a_point_that_fits_only_with_its_balanced_split_is_not_refused():
    """Fuzz case 16:170 (``benchmarks/fuzz_plans.py --case 16:170`` before the fix): an 8-layer DeepSeek-V3 shape (3
    dense layers first) on 48 H100s, 16 a node, at 32,768 tokens. Its grid point tp 4 pp 3 dp 2 cp 2 ep 4 runs with
    the balanced split 4, 2, 2 (``EvaluatorPool.split_of``) and fits at 2.21 s, while its state under the rule's
    split overflows; ``static_fits`` judged the rule's split only, so the guarantee's grid (bounded by the search's
    3.71 s) refused every point and the plan stayed 1.7x slower than the grid best."""
    from symtensor.search.grid import megatron_grid

    dims = dict(layers=8, hidden=6144, heads=12, kv_heads=12, head_dim=192, ffn=22720, vocab=9724, experts=256,
                top_k=4, moe_ffn=5760)
    cfg = load_model_config("deepseek-v3", [f"{k}={v}" for k, v in dims.items()])
    pool = EvaluatorPool(cfg, load_cluster("tests/fixtures/clusters/h100-node16.json", devices=48), 32768)
    point = dict(tp=4, pp=3, dp=2, cp=2, ep=4, etp=4, sp=True, zero=1, micro_batch=1, global_batch=32, seq=32768)
    costed = pool.try_config(**point, recompute="none")
    assert costed.report.fits and costed.train.layer_split == (4, 2, 2)
    assert pool.may_fit(**point)
    best, _ = megatron_grid(pool, 32, beat=3.7)
    assert best is not None and best.report.step_time_s <= costed.report.step_time_s * (1 + 1e-9)


def test_a_pipelined_point_takes_the_split_balanced_by_time_where_faster():
    """The per-op search costs its pipelined points with the rule's split; ``outer.split_variant`` re-costs the best
    with the split that balances its ranks (the embedding and the 128K-vocabulary head as work on the first and last
    stages): Llama 3 8B cut to 8 layers on 8 H100s, tp 2 pp 4, goes from 2,2,2,2 to 1,3,3,1, 1.21x, and says so."""
    from symtensor.search.outer import OuterSearch, split_variant

    pool = EvaluatorPool(load_model_config("llama3-8b", ["layers=8"]), load_cluster("dgx-h100", devices=8), 4096)
    point = pool.try_config(tp=2, pp=4, dp=1, cp=1, ep=1, etp=1, sp=True, zero=0, micro_batch=1, global_batch=16,
                            seq=4096, recompute="none", balance=False)
    assert point.train.chunk_layers(8) == (2, 2, 2, 2)
    best, note = split_variant(OuterSearch(pool, 16), point)
    assert best.train.layer_split == (1, 3, 3, 1) and best.report.fits
    assert best.report.step_time_s < point.report.step_time_s / 1.2
    assert "Et|(t*3|)*2,tL" in note and "instead of Megatron's rule" in note
    same, none = split_variant(OuterSearch(pool, 16), best)  # a stated split stays
    assert same is best and none is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["llama2-7b", "llama3-8b", "mixtral-8x7b", "gpt3-1.3b", "qwen2-7b"]),
       lora=st.booleans(), devices=st.sampled_from([8, 16, 24, 64]), index=st.integers(0, 10**6),
       zero=st.integers(0, 3), framework=st.sampled_from(["megatron", "fsdp2", "deepspeed"]))
def test_static_lower_bound_never_exceeds_the_exact_sum(name, lora, devices, index, zero, framework):
    """The arithmetic bound that refuses grid points before any graph is built must never refuse
    one whose parameters, gradients and optimizer state would fit, under every engine (FSDP2
    shards parameters from ZeRO 1)."""
    from dataclasses import replace

    from symtensor.search.megatron import configuration, grid_points, train_config

    cfg = load_model_config(name).replace(layers=4, **({"lora_rank": 8} if lora else {}))
    cl = load_cluster("dgx-h100", devices=devices)
    points = [p for p in grid_points(cfg, devices, 8, 4 * devices, 2048)
              if p["pp"] == 1 or framework != "deepspeed"]  # (the deepspeed engine runs no pipeline)
    point = points[index % len(points)]
    pc = configuration(dict(point, zero=zero if point["dp"] > 1 else 0, framework=framework))
    bound = EvaluatorPool(cfg, cl, 2048, framework=framework).static_lower_bound(pc)
    # a device whose usable memory is just below the bound cannot hold the exact state either
    small = replace(cl, device=replace(cl.device, memory=bound / MEMORY_HEADROOM * (1 - 1e-9)))
    try:
        ev, layouts = EvaluatorPool(cfg, small, 2048, framework=framework).layouts(pc)
    except PlanError:  # layouts the legality rule refuses (DeepSpeed-Ulysses' heads by tp x cp): no search costs them
        assume(False)
    assert bound > 0 and not ev.static_fits(layouts, train_config(pc))


def test_fsdp2_zero1_point_that_fits_is_not_refused():
    """Under FSDP2 the parameters are sharded from ZeRO 1 (``Engine.sharded_from``): llama2-70b on
    64 H100s, tp=1 pp=8 dp=8 at ZeRO 1 with full recomputation fits (67.6 GiB of 80), so the grid's
    arithmetic bound must not refuse the point (it did with parameters counted replicated, in
    fp32: 72.3 GiB of state per device)."""
    pool = EvaluatorPool(load_model_config("llama2-70b"), load_cluster("dgx-h100", devices=64), 4096,
                         framework="fsdp2")
    point = dict(tp=1, pp=8, dp=8, cp=1, ep=1, etp=1, sp=False, zero=1, micro_batch=1, global_batch=64, seq=4096)
    assert pool.try_config(**point, recompute="full").report.fits
    assert pool.may_fit(**point)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["llama2-7b", "llama3-8b", "mixtral-8x7b", "gpt3-1.3b", "qwen2-7b"]),
       lora=st.booleans(), devices=st.sampled_from([8, 16, 24, 64]), index=st.integers(0, 10**6),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_step_floor_never_exceeds_a_step(name, lora, devices, index, recompute):
    """The step floor that ends the recomputation variants of a point is a lower bound of every
    plan's step time, whatever its layouts, pipeline, micro-batches and ZeRO stage."""
    from symtensor.search.megatron import configuration, grid_points, train_config

    cfg = load_model_config(name).replace(layers=4, **({"lora_rank": 8} if lora else {}))
    cl = load_cluster("dgx-h100", devices=devices)
    pool = EvaluatorPool(cfg, cl, 2048)
    points = list(grid_points(cfg, devices, 8, 4 * devices, 2048))
    pc = configuration(dict(points[index % len(points)], recompute=recompute))
    ev, layouts = pool.layouts(pc)
    train = train_config(pc)
    step = ev.evaluate(layouts, train, check=False).step_time_s
    floor = ev.step_floor(train)
    assert 0 < floor <= step
    # the same for every micro-batch count (the FLOPs of a step do not depend on it)
    other = pool.get(train.graph_batch * 2, 1) if (train.micro_steps % 2 == 0) else None
    if other is not None:
        half = TrainConfig(global_batch=train.global_batch, micro_steps=train.micro_steps // 2, recompute=recompute)
        assert other.step_floor(half) == pytest.approx(floor, rel=1e-12)


def test_the_step_floor_counts_the_activations_memory_traffic():
    """A small model is memory-bound: its norms, activations and attention move more bytes than
    its FLOPs take time, and no layout avoids moving them (a FLOP-only floor let the monotone
    guarantee recurse through levels that could not win). tiny-llama on 8 H100: the
    floor is 18x the FLOPs at peak, where FLOPs alone at the best GEMM rate gave about 4x."""
    cfg, cl = load_model_config("tiny-llama"), load_cluster("dgx-h100", devices=8)
    ev = Evaluator(build_graph(cfg, micro_batch=64, seq=256, skeleton=True), cl, pp=1)
    flops_at_peak = ev.model_flops_per_microstep / (8 * cl.device.flops(ev.dtype))
    assert ev.step_floor(TrainConfig(global_batch=64, micro_steps=1)) > 10 * flops_at_peak


@pytest.mark.parametrize("name, changes, devices, seq", [
    ("llama2-7b", {}, 64, 4096), ("mixtral-8x7b", dict(layers=4), 16, 4096),
    ("llama3-8b", dict(layers=4, lora_rank=16), 8, 8192), ("gpt3-6.7b", dict(layers=4), 24, 2048)])
def test_without_pipeline_activations_scale_with_the_micro_batch(name, changes, devices, seq):
    """What lets consider_batches skip a variant at a larger micro-batch whose memory follows to be
    over the capacity: with one micro-batch in flight, the peak memory of fixed layouts,
    recomputation and ZeRO stage is parameters + gradients + optimizer state + the gathered
    parameters of ZeRO-3 units (the same at every micro-batch) plus a part proportional to the
    micro-step batch; the device's reserved peak likewise (``cost.memory``: ``fixed`` + the batch times
    ``scaled``, the activations and transients with their fragmentation)."""
    cfg = load_model_config(name).replace(**changes)
    cl = load_cluster("dgx-h100", devices=devices)
    pool = EvaluatorPool(cfg, cl, seq)
    gb = 16 * devices
    base = Problem(pool.get(gb // 16, 1), TrainConfig(global_batch=gb, micro_steps=16), 0.0)
    layouts = solve(base)
    for rc in ("none", "selective", "full"):
        for zero in (1, 3):
            reports = [pool.get(gb // m, 1).evaluate(layouts, TrainConfig(global_batch=gb, micro_steps=m,
                                                                          recompute=rc, zero=zero))
                       for m in (16, 8, 4, 2, 1)]
            mem = reports[0].memory  # fixed: parameters, gradients, optimizer, gathered units, buffers, NCCL
            state = mem["static"] + mem["engine_buffers"] + mem["workspace"]
            for k, rep in zip((1, 2, 4, 8, 16), reports):
                assert rep.memory_peak == pytest.approx(state + k * (reports[0].memory_peak - state), rel=1e-9)
                assert rep.memory_reserved == pytest.approx(mem["fixed"] + k * mem["scaled"], rel=1e-9)


def test_selective_recomputation_equals_none_without_unfused_attention():
    """Why the search leaves selective recomputation out for fused-attention models: it re-runs
    only ops marked ``core`` (unfused attention), so without them its plans cost and hold exactly
    what the same plans without recomputation do; with them it is kept."""
    cfg = load_model_config("llama2-7b").replace(layers=4)
    pool = EvaluatorPool(cfg, load_cluster("dgx-h100", devices=8), 4096)
    ev = pool.get(8, 1)
    layouts = solve(Problem(ev, TrainConfig(global_batch=64, micro_steps=8), 0.0))
    none, sel = (ev.evaluate(layouts, TrainConfig(global_batch=64, micro_steps=8, recompute=rc))
                 for rc in ("none", "selective"))
    assert (sel.step_time_s, sel.memory_peak) == (none.step_time_s, none.memory_peak)
    assert pool.recomputations() == ("none", "full")
    unfused = EvaluatorPool(load_model_config("gpt3-1.3b").replace(layers=2, attention="unfused"),
                            load_cluster("dgx-h100", devices=8), 2048)
    unfused.get(8, 1)
    assert unfused.recomputations() == ("none", "selective", "full")


def test_plan_file_round_trip(tmp_path):
    cfg = PRESETS["tiny-llama"]
    cl = load_cluster("dgx-h100", devices=8)
    plan = search(cfg, cl, 16, 64)
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    again = load_plan(path)
    assert again.report.step_time_s == pytest.approx(plan.report.step_time_s, rel=1e-12)
    assert again.layouts == plan.layouts
    data = json.loads(path.read_text())
    data["cluster"]["devices"] = 16
    path.write_text(json.dumps(data))
    with pytest.raises(PlanError, match="does not match the cluster's stage mesh"):
        load_plan(path)
    data["layouts"]["nope"] = {}
    path.write_text(json.dumps(data | {"cluster": json.loads(json.dumps(data["cluster"])) | {"devices": 8}}))
    with pytest.raises(PlanError, match="op 'nope' is not in the graph"):
        load_plan(path)


def test_nothing_fits_says_why():
    """405B parameters on 8 A100s (80 GB) cannot fit: their bf16 weights alone need 810 GB. The
    search returns the least-memory plan and says so, instead of failing or pretending."""
    plan = search(load_model_config("llama3-405b"), load_cluster("dgx-a100-80g", devices=8), 8, 8192)
    assert not plan.report.fits
    assert any(n.startswith("nothing fits: the least memory any plan reached is ") and "GiB usable" in n
               for n in plan.notes)


class _Recording(Problem):
    """Records every (op, layout) and (edge, layouts) the search costs; memo keys stay orbits."""

    def __init__(self, *args):
        super().__init__(*args)
        self.seen_ops, self.seen_edges, self.seen_legal = {}, {}, {}

    def op_cost(self, op, layout):
        self.seen_ops[(op.name, layout)] = op
        return super().op_cost(op, layout)

    def edge_cost(self, e, lu, lv):
        self.seen_edges[(id(e), lu, lv)] = e
        return super().edge_cost(e, lu, lv)

    def legal(self, op, layout):
        self.seen_legal[(op.name, layout)] = op
        return super().legal(op, layout)


class _Direct(Problem):
    """The same costs, declared position-dependent: the search memoises them by uid, not by orbit."""

    SYMMETRIC_COSTS = False


@pytest.mark.parametrize("model,changes,cluster,devices,train", [
    ("llama2-7b", dict(layers=2), "dgx-h100", 32,
     TrainConfig(global_batch=64, micro_steps=2, zero=1, recompute="selective")),
    ("tiny-mixtral", dict(layers=2), "dgx-a100-80g", 24,
     TrainConfig(global_batch=48, micro_steps=2, pp=2, zero=2)),
    ("llama3-8b", dict(layers=2, lora_rank=8), "dgx-h100", 16,
     TrainConfig(global_batch=32, micro_steps=2, zero=1, recompute="full")),
])
def test_orbit_memo_is_exact(model, changes, cluster, devices, train):
    """Costs memoised per orbit of the mesh's symmetry (interchangeable axes) are bit-identical to
    the costs of each layout computed on its own, and so is legality."""
    cfg = PRESETS[model].replace(**changes)
    graph = build_graph(cfg, micro_batch=train.graph_batch, seq=256, skeleton=True)
    cl = load_cluster(cluster, devices=devices)
    ev, direct_ev = Evaluator(graph, cl, pp=train.pp), Evaluator(graph, cl, pp=train.pp)
    relabelled = 0
    for lam in (0.0, 1e-9):  # a second problem reads what the first memoised
        rec = _Recording(ev, train, lam)
        solve(rec)
        direct = _Direct(direct_ev, train, lam)
        twin = {id(e): d for e, d in zip(rec.edges, direct.edges)}
        for (_, layout), op in rec.seen_ops.items():
            assert rec.op_cost(op, layout).hex() == direct.op_cost(op, layout).hex()
        for (_, lu, lv), e in rec.seen_edges.items():
            assert rec.edge_cost(e, lu, lv).hex() == direct.edge_cost(twin[id(e)], lu, lv).hex()
        for (_, layout), op in rec.seen_legal.items():
            assert rec.legal(op, layout) == partition.legal(op, layout, ev.mesh)
        # layouts that shared an orbit with another layout of the same op
        by_op: dict = {}
        for name, layout in rec.seen_ops:
            by_op.setdefault(name, set()).add((layout.uid, rec.orbits.op(layout)))
        relabelled += sum(len(pairs) - len({o for _, o in pairs}) for pairs in by_op.values())
    assert relabelled > 0  # the symmetry was used
