"""Plans you can trust (issue 14): the search costs only layouts the plan loader accepts (one
legality rule, linked and carried dims included), the summary says when a plan is heterogeneous
and what differs, and the exports refuse what their engine cannot run."""

from __future__ import annotations

import pytest

from symtensor import api
from symtensor.errors import PlanError
from symtensor.hardware import load_cluster
from symtensor.layout import refusal
from symtensor.models import load_model_config
from symtensor.plan import load_plan, save_plan
from symtensor.search import megatron_plan

# A small MoE whose expert capacity c = ceil(1.25 * 3 * 4096 / 7) = 2195 is odd: no sequence or
# context cut of the tokens carries to it.
ODD_CAPACITY = ["experts=7", "top_k=3", "capacity_factor=1.25", "layers=2", "hidden=512", "heads=8", "kv_heads=8",
                "ffn=1024", "vocab=32000"]


def test_megatron_layouts_refuse_a_capacity_their_sequence_cut_does_not_divide():
    """tp=4 with sequence parallelism carries the dispatch's cut of s to the capacity c=2195: the
    Megatron layouts were built unchecked, so the grid and the seeds costed them."""
    cfg = load_model_config("tiny-mixtral", ODD_CAPACITY)
    with pytest.raises(PlanError, match=r"tp=4 .*sequence parallelism: op layers\.0\.dispatch: linked dim c=2195"):
        megatron_plan(cfg, load_cluster("dgx-a100-80g", devices=32), tp=4, dp=8, sp=True, global_batch=8,
                      seq=4096)


def test_a_searched_moe_plan_reloads(tmp_path):
    """The search wrote plans its own loader refused ("op layers.0.dispatch: linked dim c=2195 is
    not divisible by its cut 4"): the Megatron seed tp=4 sp cut the odd capacity."""
    p = api.plan("tiny-mixtral", "dgx-a100-80g", devices=32, global_batch=8, seq=4096, overrides=ODD_CAPACITY)
    ops = {op.name: op for op in p.graph.ops}
    assert all(refusal(ops[n], lay, p.mesh) is None for n, lay in p.op_layouts().items())
    save_plan(p, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json").layouts == p.layouts


def test_candidates_are_exactly_the_legal_layouts():
    """``partition.candidates`` (axis by axis) generates every layout the one rule accepts and no
    other, on a mesh with a non-power-of-two level and an MoE whose capacity c=75 is odd. One
    layer: tiny-mixtral's two layers are the same ops (kinds, dims, shapes, attributes), so the
    second only repeated the check of the first."""
    from symtensor.cost import Evaluator
    from symtensor.layout import OpLayout
    from symtensor.models import build_graph
    from symtensor.search.exact import all_layouts
    from symtensor.search.partition import candidates

    cfg = load_model_config("tiny-mixtral", ["experts=6", "top_k=3", "capacity_factor=1.25", "heads=6",
                                             "kv_heads=3", "hidden=96", "layers=1"])
    graph = build_graph(cfg, micro_batch=6, seq=100, skeleton=True)
    mesh = Evaluator(graph, load_cluster("dgx-h100", devices=24)).mesh
    for op in graph.ops:
        frontier, seen = [OpLayout.family()], {}
        for axis in range(len(mesh)):
            frontier = list({c.uid: c for lay in frontier for c in candidates(op, lay, axis, mesh)}.values())
            seen.update((c.uid, c) for c in frontier)
        assert all(refusal(op, lay, mesh) is None for lay in seen.values()), op.name
        assert set(seen) == {lay.uid for lay in all_layouts(op, mesh)}, op.name


# The example: 24 H100 and a global batch of 8. The layers are data parallel over one
# node's 8 devices and the LM head and loss cut the vocabulary over the 3 nodes; the summary said
# tp=1 dp=8 heterogeneous=False and no note said the other 16 devices repeat the layers' work.
REPEATED = dict(devices=24, global_batch=8, seq=2048, overrides=["layers=2"])


@pytest.fixture(scope="module")
def repeated():
    return api.plan("llama3-8b", "dgx-h100", **REPEATED)


def test_a_plan_whose_devices_repeat_work_is_heterogeneous_and_says_what_differs(repeated):
    c = repeated.config
    assert (c["tp"], c["dp"], c["heterogeneous"]) == (1, 8, True)
    assert "tp*pp*dp*cp = 1*1*8*1 = 8, not the 24 devices" in c["differs"]
    assert any("use 8 of the 24 devices of a stage: x3 repeated work" in d for d in c["differs"])
    assert any(d.startswith("lm_head, loss: ") and "(the summary's dp=8 tp=1)" in d for d in c["differs"])


def test_the_notes_say_devices_repeat_work_with_the_batch_that_uses_them(repeated):
    from symtensor.plan.document import plan_json

    notes = plan_json(repeated)["notes"]
    assert any("repeat work" in n and "--global-batch 24" in n for n in notes), notes
    assert plan_json(repeated)["config"]["differs"] == repeated.config["differs"]


def test_megatron_configurations_are_not_heterogeneous():
    """The vocabulary ops (embedding, LM head, loss) now count in the summary's grid: Megatron cuts
    them by tp, dp and cp like the layers, so a Megatron plan stays homogeneous, experts included."""
    for model, devices, degrees in (("llama3-8b", 64, dict(tp=8, pp=2, cp=2)), ("gpt3-1.3b", 16, dict(tp=2, pp=2)),
                                    ("qwen3-30b-a3b", 64, dict(tp=2, pp=2, cp=2, ep=16))):
        c = api.evaluate(model, "dgx-h100", devices=devices, micro_batch=1, **degrees).config
        assert (c["heterogeneous"], c["differs"]) == (False, []), (model, c["differs"])


def test_evaluate_names_the_capacity_in_one_line(capsys):
    """``evaluate --tp 4`` (sequence parallel) on the odd capacity: one line with the rule, through
    ``--micro-batch auto`` too (it said only "no micro batch size is valid")."""
    from symtensor.cli import main

    argv = ["evaluate", "tiny-mixtral", *[a for kv in ODD_CAPACITY for a in ("--set", kv)], "--cluster",
            "dgx-a100-80g", "--devices", "32", "--tp", "4", "--global-batch", "8", "--seq", "4096"]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert "op layers.0.dispatch: linked dim c=2195 is not divisible by its cut 4" in err


def test_a_plan_file_keeps_its_clusters_measured_and_fitted_constants(tmp_path):
    """A plan made on a profiled or calibrated cluster file (a level's measured link efficiency, measured
    efficiency fractions, fitted end-to-end constants, the band of the user's runs) is re-costed on the same
    constants when read back, so explain, compare, export and run see the plan's own numbers. Until the tenth
    session a plan file kept only the device and the levels' bandwidth and latency: read back, a plan on such a
    file was costed on the shipped constants."""
    import yaml

    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump({
        "name": "mine", "device": {"name": "H100", "peak_tflops": {"bf16": 989}, "hbm_gbps": 3350, "memory_gib": 80},
        "levels": [{"name": "nvlink", "fanout": 8, "bandwidth_gbps": 450, "latency_us": 3,
                    "link_efficiency": {"all_gather": 0.5, "reduce_scatter": 0.5}},
                   {"name": "ib", "bandwidth_gbps": 25, "latency_us": 12}],
        "efficiency": {"link": 0.6, "source": "a test"}, "end_to_end": {"step_s": 0.2, "microbatch_s": 0.01},
        "band": {"low": -0.1, "high": 0.2}}))
    plan = api.evaluate("llama3-8b", str(mine), 16, tp=2, global_batch=32, seq=4096, zero=1)
    shipped = api.evaluate("llama3-8b", "dgx-h100", 16, tp=2, global_batch=32, seq=4096, zero=1)
    assert plan.report.step_time_s > shipped.report.step_time_s * 1.05
    save_plan(plan, tmp_path / "p.json")
    again = load_plan(tmp_path / "p.json")
    assert again.report.step_time_s == pytest.approx(plan.report.step_time_s, rel=1e-12)
    assert again.cluster.levels == plan.cluster.levels and again.cluster.band == (-0.1, 0.2)
    assert dict(again.cluster.efficiency) == {"link": 0.6} and dict(again.cluster.end_to_end)["step_s"] == 0.2
