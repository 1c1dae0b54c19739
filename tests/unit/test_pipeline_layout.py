"""Pipeline layouts: any layer count over any pp x vpp, Megatron's layout string, the balanced
split and where the search and evaluate take it (cost.pipeline, cost.train, api.evaluate)."""

import itertools
import json

import pytest

from symtensor.api import evaluate
from symtensor.cli import main
from symtensor.cost import TrainConfig
from symtensor.cost.pipeline import balanced_split, ends_split, layout_string, parse_layout, rank_seconds
from symtensor.errors import PlanError
from symtensor.export import export
from symtensor.export.megatron import launched_split
from symtensor.hardware import load_cluster
from symtensor.models import PRESETS
from symtensor.search.megatron import configuration
from symtensor.search.pool import EvaluatorPool

KIMI_K2 = ["experts=384", "heads=64", "dense_layers=1", "vocab=163840"]  # DeepSeek-V3's shape, Kimi-K2's counts


def _seconds(weights: list[float], emb: float = 0.0, head: float = 0.0) -> dict[int, float]:
    return {-1: emb, **dict(enumerate(weights)), len(weights): head}


@pytest.mark.parametrize("layout, pp, layers, split", [
    ("Et*3|(tt|)*29,|L", 16, 61, (3,) + (2,) * 29 + (0, 0)),  # Megatron's DeepSeek-V3 example, its MTP stage empty
    ("Et|t|t|tL", 2, 4, (1, 1, 1, 1)),
    ("E|t*4|(t*5|)*2,t*2L", 5, 16, (0, 4, 5, 5, 2)),
])
def test_megatron_layout_strings_parse_as_megatron_reads_them(layout, pp, layers, split):
    assert parse_layout(layout, pp, layers) == split
    with pytest.raises(PlanError, match="not a multiple of pp=3"):
        parse_layout(layout, 3, layers)


@pytest.mark.parametrize("layout, why", [
    ("tE|tL", "the embedding E must come first"),
    ("Et|t", "the loss L must come last"),
    ("Et|tL|L", "the loss L must come last, once"),
    ("Et*3|(tt|)*29,m|L", "no multi-token-prediction"),
    ("Ex|tL", "unknown layer character"),
    ("Et|t*5L", "holds 6 transformer layers, the model 4"),
])
def test_a_layout_megatron_refuses_at_launch_is_refused(layout, why):
    """The checks of Megatron-LM's PipelineParallelLayerLayout.validate_layer_layout."""
    with pytest.raises(PlanError, match=why):
        parse_layout(layout, 2 if layout.count("|") % 2 else 1, 4 if "m" not in layout else 61)


def test_layout_strings_round_trip():
    for split in itertools.product((0, 1, 2, 5), repeat=4):
        if sum(split):
            assert parse_layout(layout_string(split), 2, sum(split)) == split, split


def test_first_and_last_stage_counts_follow_megatron_core():
    """--decoder-first/last-pipeline-num-layers: the middle ranks share the rest evenly, each rank's
    layers in vpp equal chunks; Megatron-core's TransformerConfig refuses the rest."""
    assert ends_split(5, 2, 61, 8) == (5,) + (9,) * 6 + (2,)
    assert ends_split(4, 2, 62, 4, vpp=2) == (2, 14, 14, 1, 2, 14, 14, 1)
    with pytest.raises(PlanError, match="divisible by vpp=2"):
        ends_split(3, 2, 61, 4, vpp=2)
    with pytest.raises(PlanError, match="middle stages must divide evenly"):
        ends_split(3, 2, 61, 8)


def test_the_balanced_split_without_interleaving_is_the_best_cut():
    """Brute force over every cut of 9 layers (a heavy first dense run, a heavy head) into 3 and 4
    stages: the balanced split's slowest rank is the least, to a hundredth of a layer."""
    weights = [0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.2]
    seconds = _seconds(weights, emb=0.1, head=2.0)
    for pp in (3, 4):
        best = min(max(rank_seconds(seconds, cut, pp)) for cut in itertools.product(range(10), repeat=pp)
                   if sum(cut) == 9 and min(cut[1:-1], default=1) > 0)
        got = max(rank_seconds(seconds, balanced_split(seconds, 9, pp), pp))
        assert got <= best + 0.01, (pp, got, best)


def test_interleaving_balances_the_ranks_sums():
    """DeepSeek-V3's shape (3 light dense layers, 58 MoE, a head of 1.5 layers) over pp 4 x vpp 8:
    every rank within a layer of the mean, the embedding on virtual stage 0, the head on the last."""
    seconds = _seconds([0.6] * 3 + [1.0] * 58, emb=0.01, head=1.5)
    split = balanced_split(seconds, 61, 4, 8)
    ranks = rank_seconds(seconds, split, 4)
    assert len(split) == 32 and sum(split) == 61
    assert max(ranks) - sum(ranks) / 4 < 1.0
    rule = rank_seconds(seconds, TrainConfig(global_batch=1, pp=4, vpp=8).chunk_layers(61), 4)
    assert max(ranks) < max(rule)


def test_any_layer_count_splits_over_any_pp_times_vpp():
    """61 layers over pp 4 x vpp 8 used to be refused ("61 layers do not split into pp*vpp = 32
    chunks"); the rule's split is as even as possible, the stated one is checked."""
    train = TrainConfig(global_batch=8, micro_steps=8, pp=4, vpp=8)
    assert sum(train.chunk_layers(61)) == 61 and len(train.chunk_layers(61)) == 32
    assert train.stage_layers(61) == tuple(sum(train.chunk_layers(61)[r::4]) for r in range(4))
    with pytest.raises(PlanError, match="must give pp\\*vpp = 32 virtual stages summing to 61"):
        train.replace(layer_split=(2,) * 31).chunk_layers(61)
    with pytest.raises(PlanError, match="exceed the 61 layers"):
        TrainConfig(global_batch=8, pp=16, vpp=4).chunk_layers(61)


def test_the_evaluator_places_virtual_stage_k_on_rank_k_mod_pp():
    from symtensor.search import megatron_plan

    plan = megatron_plan(PRESETS["tiny-llama"].replace(layers=6), load_cluster("dgx-h100", devices=2), pp=2, vpp=3,
                         global_batch=4, seq=64, layer_split=(1, 1, 1, 1, 1, 1))
    stage = plan.evaluator().stage_of(plan.train)
    assert [stage[i] for i in range(6)] == [0, 1, 0, 1, 0, 1] and stage[-1] == 0 and stage[6] == 1


def test_evaluate_describes_deepseek_v3_at_pp4_vpp8_with_its_stated_layout_and_exports_it(capsys):
    """DeepSeek-V3's FSDP2 + EP run on 256 H100 at pp 4 x vpp 8 could not be described; with a
    stated layout it is costed on that split, and Megatron builds exactly that split from the
    export (launched_split: its launch checks), torchtitan from module_fqns_per_model_part."""
    layout = "Et*2|t*3|(t*2|)*27,(t|)*2,L"
    argv = ["evaluate", "deepseek-v3", "--cluster", "dgx-h100", "--devices", "256", "--pp", "4", "--ep", "64",
            "--zero", "1", "--recompute", "full", "--micro-batch", "1", "--global-batch", "1024", "--seq", "4096",
            "--pp-layout", layout, "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    split = parse_layout(layout, 4, 61)
    assert out["config"]["vpp"] == 8 and tuple(out["config"]["layer_split"]) == split
    assert out["step_time_s"] > 0 and out["breakdown"]["ep_comm"] > 0
    plan = evaluate("deepseek-v3", "dgx-h100", devices=256, pp=4, ep=64, zero=1, recompute="full", micro_batch=1,
                    global_batch=1024, seq=4096, pp_layout=layout)
    args = export(plan, "megatron")
    assert f"--pipeline-model-parallel-layout '{layout}'" in args
    assert not any(a.startswith("--num-layers-per-virtual") or a.startswith("--decoder-") for a in args)
    assert launched_split(61, 4, args) == split
    parts = export(plan, "torchtitan")["parallelism"]["module_fqns_per_model_part"]
    assert parts[0][:3] == ["tok_embeddings", "layers.0", "layers.1"] and parts[-1] == ["norm", "output"]


def test_evaluate_balances_deepseek_v3_at_pp4_vpp8_and_says_so():
    """Without a stated layout evaluate costs the balanced split where its slowest rank is faster
    than the rule's (DeepSeek-V3's 1,024-H100 run at pp 4 x vpp 8), and says so in the notes."""
    kw = dict(devices=1024, pp=4, vpp=8, ep=64, zero=1, recompute="full", micro_batch=1, global_batch=2048, seq=4096)
    plan = evaluate("deepseek-v3", "dgx-h100", **kw)
    assert len(plan.train.layer_split) == 32 and sum(plan.train.layer_split) == 61
    assert any("balanced layer split" in n for n in plan.notes)
    even = evaluate("deepseek-v3", "dgx-h100", pp_layout="even", **kw)
    assert even.train.layer_split is None and not even.notes
    assert max(plan.report.stage_times_s) < max(even.report.stage_times_s)
    assert plan.report.step_time_s < even.report.step_time_s


def test_evaluate_describes_a_kimi_k2_like_model_at_pp8_vpp4():
    """Kimi-K2's run (61 layers, 384 experts, one dense layer) at pp 8 x vpp 4 used to be refused;
    its rule split is already as balanced as whole layers allow, so evaluate keeps it."""
    plan = evaluate("deepseek-v3", "dgx-h100", devices=1024, pp=8, vpp=4, ep=64, zero=1, recompute="full",
                    micro_batch=1, global_batch=2048, seq=4096, overrides=KIMI_K2)
    assert plan.model.experts == 384 and plan.train.vpp == 4 and plan.report.step_time_s > 0
    assert plan.train.layer_split is None and not plan.notes
    assert len(plan.train.chunk_layers(61)) == 32


def test_evaluate_keeps_megatrons_even_split_where_balancing_does_not_beat_it():
    """Default behaviour: layers that divide, no stated layout, nothing to gain: the plan is the
    one it was (no split stated, no note)."""
    plan = evaluate("llama2-7b", "dgx-a100-80g", devices=64, tp=2, pp=2, zero=1, micro_batch=1)
    assert plan.train.layer_split is None and not plan.notes and "layer_split" not in plan.config


def test_the_grid_takes_the_balanced_split_where_it_is_faster():
    """A pipelined grid point of a model whose LM head weighs layers (a large vocabulary) runs the
    balanced split, said in its configuration and exported with Megatron's layout."""
    cfg = PRESETS["llama2-7b"].replace(layers=8, vocab=256000)
    pool = EvaluatorPool(cfg, load_cluster("dgx-h100", devices=16), 2048)
    point = dict(tp=8, pp=2, dp=1, sp=True, global_batch=16, seq=2048)
    split, slowest, _ = pool.split_of(configuration(point))
    assert split is not None and split[-1] < split[0]  # layers move off the stage that holds the head
    cand = pool.try_config(**point)
    assert cand.train.layer_split == split and cand.megatron["layer_split"] == split
    rule = pool.try_config(**point, balance=False)
    assert rule.train.layer_split is None and cand.report.step_time_s < rule.report.step_time_s
    plan = pool.plan(cand)
    assert plan.config["layer_split"] == list(split)
    assert launched_split(8, 2, export(plan, "megatron")) == split


def test_a_balanced_split_that_overflows_gives_way_to_the_rules_where_that_fits():
    """The split balances time: the first stage of Llama 3 8B at pp 2 takes a layer more (the head weighs on the
    last) and holds two micro-batches of four in flight, which overflows 80 GB where Megatron's even split fits.
    The grid point is then the rule's, fitting, as ``api.evaluate`` chooses, not dropped as overflowing."""
    pool = EvaluatorPool(PRESETS["llama3-8b"], load_cluster("dgx-h100", devices=8), 4096)
    point = dict(tp=2, pp=2, dp=2, zero=1, micro_batch=4, global_batch=64, seq=4096, recompute="none")
    split = pool.split_of(configuration(pool.held(point)))[0]
    assert split == (17, 15)
    forced = pool.try_config(**point, layer_split=split, balance=False)
    assert not forced.report.fits
    cand, rule = pool.try_config(**point), pool.try_config(**point, balance=False)
    assert cand.report.fits and cand.train.layer_split is None and cand.megatron["layer_split"] is None
    assert cand.report.step_time_s == rule.report.step_time_s
    said = evaluate("llama3-8b", "dgx-h100", 8, **point, sp=cand.megatron["sp"])  # (the same choice, evaluate's)
    assert said.report.step_time_s == rule.report.step_time_s and said.train.layer_split is None


def test_explain_says_why_the_plan_takes_its_split(tmp_path):
    from symtensor.analysis.explain import explain_plan
    from symtensor.search import megatron_plan

    cfg = PRESETS["llama2-7b"].replace(layers=8, vocab=256000)
    plan = megatron_plan(cfg, load_cluster("dgx-h100", devices=16), tp=8, pp=2, sp=True, global_batch=16,
                         seq=2048, layer_split=(5, 3))
    why = explain_plan(plan)["pipeline"]
    assert why["layer_split"] == [5, 3] and why["rule_split"] == [4, 4]
    assert max(why["rank_seconds"]) < max(why["rule_rank_seconds"]) and "balances the pipeline" in why["verdict"]


def _megatron_peak_chunks(pp: int, v: int, m: int, rank: int, weights=None) -> tuple[int, int]:
    """The most model chunks pipeline ``rank`` holds at once, and the most of them that are its last chunk, over a
    whole step of Megatron's interleaved schedule as schedules.py runs it: forwards in ``get_schedule_table``'s
    order (groups of pp micro-batches, each through chunks 0..v-1), ``get_pp_rank_microbatches``' warm-up of
    2 (pp - rank - 1) + (v - 1) pp forwards, then one forward and one backward each step (backwards in the same
    table order, chunks reversed), then the cool-down's backwards. With ``weights`` (per chunk) the first is the
    most the held chunks weigh."""
    weights = weights or [1] * v
    table = []
    for start in range(0, m, pp):
        group = range(start, m) if start + pp >= m else range(start, start + pp)
        table += [(mb, c) for c in range(v) for mb in group]
    warmup = min(2 * (pp - rank - 1) + (v - 1) * pp, m * v)
    held, peak, peak_last, f, b = [], 0, 0, 0, 0

    def forward():
        nonlocal f
        held.append(table[f][1])
        f += 1

    def backward():
        nonlocal b
        held.remove(v - 1 - table[b][1])
        b += 1

    for _ in range(warmup):
        forward()
    while b < m * v:
        if f < m * v:
            forward()
        peak, peak_last = max(peak, sum(weights[c] for c in held)), max(peak_last, held.count(v - 1))
        backward()
    return peak, peak_last


@pytest.mark.parametrize("pp, v, m", [(2, 2, 4), (4, 2, 8), (4, 3, 12), (8, 4, 64), (8, 2, 8), (4, 4, 8), (2, 3, 6)])
def test_interleaved_ranks_hold_what_megatrons_schedule_holds(pp, v, m):
    """Every rank's activations in flight under the interleaved schedule (``pipeline.inflight``, in micro-batches
    of the rank's layers) and its loss's (``pipeline.chunk_inflight``'s last chunk), against a replay of
    Megatron's schedule. Until the twelfth session every rank but the first was counted as under plain 1F1B
    (pp - s micro-batches: the last rank held 1, where Megatron's holds ((v - 1) pp + 1) / v)."""
    from symtensor.cost.pipeline import chunk_inflight, inflight

    train = TrainConfig(global_batch=m, micro_steps=m, pp=pp, vpp=v)
    for rank in range(pp):
        chunks, last = _megatron_peak_chunks(pp, v, m, rank)
        assert inflight(rank, train) == pytest.approx(chunks / v), rank
        assert chunk_inflight(rank, train)[-1] == last, rank
    plain = TrainConfig(global_batch=m, micro_steps=m, pp=pp)
    assert [inflight(s, plain) for s in range(pp)] == [min(m, pp - s) for s in range(pp)]


@pytest.mark.parametrize("pp, v, m", [(2, 2, 4), (4, 2, 8), (4, 3, 12), (8, 4, 64), (4, 4, 8), (2, 3, 6), (4, 3, 5),
                                      (3, 2, 7)])
def test_interleaved_ranks_hold_their_heaviest_chunks_as_megatrons_schedule_does(pp, v, m):
    """Where a rank's model chunks hold unequal activations (uneven layouts: DeepSeek-V3's 61 layers in pp x vpp
    chunks of one and two layers), the most it holds (``pipeline.chunk_inflight`` with the chunks' weights) is the
    replay's weighted peak, which a heavier first chunk reaches later than the first steady step (until the fifteenth
    session every chunk weighed the rank's mean; counted at the first step the first rank of pp 2 x vpp 2 with chunk
    weights 3, 1 held 11 where Megatron's schedule reaches 13). Groups of fewer than pp micro-batches too."""
    from symtensor.cost.pipeline import chunk_inflight

    train = TrainConfig(global_batch=m, micro_steps=m, pp=pp, vpp=v)
    for weights in ([3] + [1] * (v - 1), [1] * (v - 1) + [3], [(c * 7) % 5 + 1 for c in range(v)]):
        for rank in range(pp):
            peak, _ = _megatron_peak_chunks(pp, v, m, rank, weights)
            counts = chunk_inflight(rank, train, weights)
            assert sum(n * w for n, w in zip(counts, weights)) == peak, (rank, weights)
            assert sum(counts) == _megatron_peak_chunks(pp, v, m, rank)[0], rank  # (as many chunks as ever)


def test_an_uneven_interleaved_layout_holds_each_chunks_own_activations():
    """A plan's activation peak under the interleaved schedule counts each model chunk with its own layers
    (``pipeline.held_activations``): a 12-layer model on pp 2 x vpp 2 whose first rank's chunks hold 5 and 1 layers
    holds the replay's weighted peak of 5 and 1 layers a chunk, not 5 chunks of the rank's mean of 3 (the even
    layout's count, the first rank's in both: it holds the most)."""
    from symtensor.api import evaluate

    kw = dict(tp=1, pp=2, vpp=2, global_batch=8, micro_batch=1, seq=128, overrides={"layers": 12})
    even = evaluate("tiny-llama", "dgx-h100", 2, pp_layout="Et*3|t*3|t*3|t*3L", **kw).report.memory
    uneven = evaluate("tiny-llama", "dgx-h100", 2, pp_layout="Et*5|t*3|t|t*3L", **kw).report.memory
    per_layer = even["activations_layers"] / (3 * 5)  # the first rank: 5 chunks of 3 layers at its first step
    peak, _ = _megatron_peak_chunks(2, 2, 8, 0, [5, 1])
    assert peak > 5 * 3  # (the first step's count of the rank's mean: what was charged before)
    assert uneven["activations_layers"] == pytest.approx(per_layer * peak, rel=1e-9)


def test_explain_shows_each_ranks_chunks_in_flight():
    """``explain`` of an interleaved plan says what each rank holds where it holds the most (``analysis.explain
    .in_flight``): the layers of its model chunks, the micro-batches of each then (the replay's weighted peak), and
    the activations the memory terms count."""
    from symtensor.analysis.explain import explain_plan
    from symtensor.api import evaluate
    from symtensor.hardware import GIB

    kw = dict(tp=1, pp=2, vpp=2, global_batch=8, micro_batch=1, seq=128, overrides={"layers": 12})
    plan = evaluate("tiny-llama", "dgx-h100", 2, pp_layout="Et*5|t*3|t|t*3L", **kw)
    out = explain_plan(plan)["in_flight"]
    first = out["ranks"][0]
    assert first["chunk_layers"] == [5, 1] and out["ranks"][1]["chunk_layers"] == [3, 3]
    peak, _ = _megatron_peak_chunks(2, 2, 8, 0, [5, 1])
    assert sum(n * k for n, k in zip(first["micro_batches"], first["chunk_layers"])) == peak
    assert first["activations_gib"] == pytest.approx(plan.report.memory["activations"] / GIB, rel=1e-9)
    assert out["verdict"].startswith("pipeline rank 0 holds the most activations")
