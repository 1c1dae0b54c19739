"""``symtensor explain`` and ``symtensor compare``: their JSON, the consistency of the per-op terms
with the search's objective and of the formulas with the cost model, and their one-line errors."""

import json
import re

import pytest

from symtensor.analysis.explain import dim_on_axis, explain_plan
from symtensor.analysis.formula import collective_formula, compute_formula, memory_formula
from symtensor.analysis.terms import TIME_TERMS, op_terms, problem_of, saved_bytes
from symtensor.cli import main
from symtensor.layout import REPLICATED
from symtensor.plan import load_plan

# LLaMA-3-8B at 16K tokens on 16 H100: memory pressure gives a heterogeneous tp=2 plan (fast to search).
PLAN = ["plan", "llama3-8b", "--cluster", "dgx-h100", "--devices", "16", "--seq", "16384", "--global-batch", "16",
        "--no-baselines"]


def run_json(capsys, argv) -> dict:
    assert main(argv + ["--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return json.loads(out)


@pytest.fixture(scope="module")
def plan_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("plans")
    files = {"symtensor": d / "plan.json", "megatron": d / "megatron.json"}
    assert main(PLAN + ["--out", str(files["symtensor"]), "--json"]) == 0
    assert main(PLAN + ["--space", "megatron", "--out", str(files["megatron"]), "--json"]) == 0
    return {k: str(v) for k, v in files.items()}


@pytest.fixture(scope="module")
def plan(plan_files):
    return load_plan(plan_files["symtensor"])


def test_explain_json_lists_every_axis_and_marks_the_plans_cut(capsys, plan_files, plan):
    out = run_json(capsys, ["explain", plan_files["symtensor"]])
    assert {"model", "config", "mesh", "layer_types", "step_time_s", "units"} <= set(out)
    assert [a["name"] for a in out["mesh"]] == [a.name for a in plan.mesh]
    blocks = {lt["block"] for lt in out["layer_types"]}
    assert {"q_proj", "core", "down_proj", "lm_head", "embed.word"} <= blocks
    layouts = plan.op_layouts()
    for lt in out["layer_types"]:
        final = layouts[lt["op"]]
        assert len(lt["levels"]) == len(plan.mesh)
        assert set(lt["terms"]) >= {"compute_s", "communication_s", "redistribution_s", "memory_bytes", "time_s"}
        for k, lv in enumerate(lt["levels"]):
            chosen = [c for c in lv["candidates"] if c["chosen"]]
            assert len(chosen) == 1 and chosen[0]["cut"] == lv["chosen"] == dim_on_axis(final, k)
            assert sum(c["cheapest"] for c in lv["candidates"]) == 1
            assert any(c["cut"] is None for c in lv["candidates"]), "no cut is always a candidate"
            cheapest = next(c for c in lv["candidates"] if c["cheapest"])
            assert all(cheapest["time_s"] <= c["time_s"] + 1e-12 for c in lv["candidates"])
            for c in lv["candidates"]:
                assert c["time_s"] == pytest.approx(c["compute_s"] + c["communication_s"] + c["optimizer_s"]
                                                    + c["redistribution_s"])
                assert c["memory_bytes"] > 0 or lt["kind"] in ("elementwise", "reshape")
            assert lv["verdict"]


def test_terms_split_the_search_objective(plan):
    """With no memory weight, an op's terms add up to the search's op cost plus its edge costs."""
    problem = problem_of(plan)
    layouts = plan.op_layouts()
    for op in plan.graph.ops:
        lay = layouts.get(op.name, REPLICATED)
        t = op_terms(problem, op, lay, layouts)
        expected = problem.op_cost(op, lay)
        for e, other, is_src in problem.links[op.name]:
            nb = layouts.get(other, REPLICATED)
            expected += problem.edge_cost(e, lay, nb) if is_src else problem.edge_cost(e, nb, lay)
        assert t.time_s == pytest.approx(expected, rel=1e-9, abs=1e-15), op.name
        assert all(getattr(t, k) >= 0 for k in TIME_TERMS)


def _fsdp2_plan(elementwise: str | None, attention: str | None = None):
    """torchtitan's engine (its eager norms, RoPE and SwiGLU composites, or the stated kernels) with a stated loss."""
    from symtensor import api
    from symtensor.plan.stack import Stack

    return api.evaluate("llama3-8b", "dgx-h100", 8, zero=3, micro_batch=1, global_batch=8, seq=2048,
                        framework="fsdp2", overrides={"layers": 2},
                        stack=Stack(loss="bf16", elementwise=elementwise, attention=attention))


@pytest.mark.parametrize("which", ["searched", "fsdp2, eager", "fsdp2, fused", "fsdp2, te attention"])
def test_formulas_evaluate_to_the_cost_models_numbers(plan, which):
    """The formulas explain --formula prints evaluate to the cost model's own numbers, op by op: the memory-bound
    ops at the bytes their kernels move (eager composites, stated kernels: ``opcost.memory_multiples``), attention at
    the stated kernel's table."""
    plan = plan if which == "searched" else _fsdp2_plan(None if which.endswith("eager") else "fused",
                                                        "te" if which.endswith("attention") else None)
    ev, train = plan.evaluator(), plan.train
    layouts = plan.op_layouts()
    for op in plan.graph.ops:
        lay = layouts[op.name]
        f = compute_formula(ev, op, lay, train.fp8, train.stack)
        t = ev.op_time(op, lay, train.fp8, train.stack)
        assert f["value_fwd_s"] == pytest.approx(t.fwd_s, rel=1e-9), op.name
        assert f["value_bwd_s"] == pytest.approx(t.bwd_s, rel=1e-9), op.name
        assert f["value_fwd_flops"] == pytest.approx(t.fwd_flops, rel=1e-9)
        mem = memory_formula(ev, op, lay, train.fp8, train.framework, train.stack.loss)
        assert mem["value_bytes"] == pytest.approx(saved_bytes(problem_of(plan), op, lay), rel=1e-9)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        axes = tuple(range(len(ev.mesh)))
        f = collective_formula(ev, kind, 2**26, axes)
        assert f["value_s"] == pytest.approx(ev.coll_time(kind, 2**26, axes), rel=1e-9)
        assert "m" in f["formula"] and "alpha_" in f["formula"]


def test_explain_op_with_formulas(capsys, plan_files):
    out = run_json(capsys, ["explain", plan_files["symtensor"], "--op", "q_proj", "--formula"])
    assert [lt["block"] for lt in out["layer_types"]] and all(lt["block"] == "q_proj" for lt in out["layer_types"])
    f = out["layer_types"][0]["formulas"]
    assert re.fullmatch(r"2\*b\*d\*h\*n\*s(/.*)?", f["compute"]["fwd_flops"]), f["compute"]["fwd_flops"]
    assert re.search(r"P\*(S_fp8\*)?eta_gemm", f["compute"]["fwd_time_s"])  # (S_fp8: an FP8 plan's speedup)
    out = run_json(capsys, ["explain", plan_files["symtensor"], "--op", "layers.0.core"])
    assert [lt["op"] for lt in out["layer_types"]] == ["layers.0.core"]
    assert main(["explain", plan_files["symtensor"], "--op", "down_proj", "--formula"]) == 0
    text = capsys.readouterr().out
    assert "candidates per mesh axis" in text and "formulas" in text and "seconds      " in text


def test_explain_console(capsys, plan_files):
    assert main(["explain", plan_files["symtensor"]]) == 0
    text = capsys.readouterr().out
    assert "why: the cut on each mesh axis" in text and "q_proj" in text


def test_explain_plan_library_example(plan):
    out = explain_plan(plan, op="core")
    assert out["layer_types"][0]["levels"][0]["axis"] == plan.mesh[0].name


def test_compare_plan_with_itself_is_all_zero(capsys, plan_files):
    out = run_json(capsys, ["compare", plan_files["symtensor"], plan_files["symtensor"]])
    assert out["ops"] == [] and out["config_diff"] == {}
    assert out["step_time_s"]["delta"] == 0
    assert all(v["delta"] == 0 for v in out["breakdown"].values())


def test_compare_two_plan_files(capsys, plan_files):
    out = run_json(capsys, ["compare", plan_files["megatron"], plan_files["symtensor"]])
    assert {"a", "b", "config_diff", "step_time_s", "breakdown", "comm_bytes", "memory_bytes", "ops",
            "summary"} <= set(out)
    st = out["step_time_s"]
    assert st["delta"] == pytest.approx(st["b"] - st["a"])
    # the step is the sum of its components, so their differences add up to the step's
    assert sum(v["delta"] for v in out["breakdown"].values()) == pytest.approx(st["delta"], abs=1e-9)
    assert out["speedup_of_a"] == pytest.approx(st["b"] / st["a"])


def test_compare_plan_with_baseline(capsys, plan_files):
    out = run_json(capsys, ["compare", plan_files["symtensor"], "fsdp"])
    assert out["b"]["source"] == "baseline" and out["b"]["config"]["zero"] == 3
    assert out["config_diff"] and out["ops"], "FSDP is pure data parallelism; the plan uses tensor parallelism"
    for row in out["ops"]:
        assert row["a_cuts"] != row["b_cuts"]
        assert set(row["delta"]) >= {"time_s", "compute_s", "communication_s", "redistribution_s", "memory_bytes",
                                     "comm_bytes"}
        assert row["delta"]["time_s"] == pytest.approx(row["b_terms"]["time_s"] - row["a_terms"]["time_s"])
    mem = out["memory_bytes"]["total"]
    assert mem["delta"] == pytest.approx(mem["b"] - mem["a"])
    assert set(out["comm_bytes"]) <= {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"}
    # a baseline name works on either side
    rev = run_json(capsys, ["compare", "fsdp", plan_files["symtensor"]])
    assert rev["step_time_s"]["delta"] == pytest.approx(-out["step_time_s"]["delta"])
    assert main(["compare", plan_files["symtensor"], "megatron_recipe"]) == 0
    assert "layouts that differ" in capsys.readouterr().out


@pytest.mark.parametrize("argv, match", [
    (["explain", "{missing}"], r"plan file .* does not exist"),
    (["explain", "{plan}", "--op", "q_prj"], r"no op or block 'q_prj'.*Did you mean q_proj"),
    (["compare", "fsdp", "drec"], r"both fsdp and drec are baselines"),
    (["compare", "{plan}", "megatron"], r"'megatron' is neither a plan file nor a baseline name.*megatron_recipe"),
], ids=["missing-plan", "unknown-op", "two-baselines", "unknown-baseline"])
def test_user_errors_are_one_line(capsys, plan_files, tmp_path, argv, match):
    argv = [a.format(plan=plan_files["symtensor"], missing=tmp_path / "none.json") for a in argv]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert re.search(match, err), err
