"""How context parallelism runs is a stack fact (``Stack.cp_comm``, Megatron-LM's ``--cp-comm-type``): ``p2p``, ring
attention (Megatron's and torchtitan's own), or ``a2a``, all-to-alls around an attention core cut by heads
(NVIDIA/Megatron-LM@d98e8a64dd transformer_config.py: "a2a: Like DeepSpeed Ulysses, scatter attention heads across
the CP group"; DeepSpeed's only kind). Megatron runs a2a beside its sequence parallelism (Transformer Engine's
all-to-all attention takes the heads of a tensor-parallel rank); the per-op search, held to no kind, may find the
same scheme, and its summary then reads it as a2a."""

import pytest

from symtensor import api
from symtensor.cost import Evaluator
from symtensor.cost.stack import Stack
from symtensor.errors import PlanError
from symtensor.hardware import load_cluster
from symtensor.models import build_graph, load_model_config
from symtensor.plan.document import notes
from symtensor.plan.plan import Plan
from symtensor.search.megatron import configuration, megatron_layouts, train_config

SEQ = 65536
A2A = Stack(cp_comm="a2a")


def _evaluate(framework="megatron", stack=A2A, **kw):
    args = dict(tp=2, cp=4, zero=1, micro_batch=1, global_batch=64, seq=SEQ, recompute="none") | kw
    return api.evaluate("llama3-8b", "dgx-h100", 64, framework=framework, stack=stack, **args)


def test_megatron_a2a_cuts_the_core_by_heads_and_moves_the_ulysses_bytes_beside_sequence_parallelism():
    """Llama 3 8B on 64 H100s, tp 2 x cp 4 with Megatron's sequence parallelism: the attention core cuts its heads by
    tp x cp = 8 and not its query sequence; per layer and micro-batch its forward moves the local query, key, value
    and output by all-to-all and its backward their gradients, 2 (b s/cp)(2 n/tp + 2 g/tp) d x 2 bytes (BF16), the
    bytes DeepSpeed-Ulysses moves at the same degrees (without sequence parallelism, which it does not run)."""
    plan = _evaluate()
    cfg, mesh = plan.model, plan.mesh
    c = plan.config
    assert (c["tp"], c["cp"], c["sp"], c["cp_comm"], c["heterogeneous"]) == (2, 4, True, "a2a", False)
    for op in (op for op in plan.graph.ops if op.kind == "attention"):
        cuts = plan.layouts[op.name]
        assert "s" not in cuts and mesh.size_of(tuple(cuts["n"])) == 8, op.name
    per_layer = 2 * (SEQ // 4) * (2 * cfg.heads // 2 + 2 * cfg.kv_heads // 2) * cfg.head_dim * 2
    expected = per_layer * cfg.layers * plan.train.micro_steps
    assert plan.report.comm_bytes["all_to_all"] == pytest.approx(expected, rel=1e-9)
    ulysses = _evaluate("deepspeed", stack=None, sp=False)
    assert ulysses.report.comm_bytes["all_to_all"] == pytest.approx(expected, rel=1e-9)
    assert any("--cp-comm-type a2a" in n for n in notes(plan))
    ring = _evaluate(stack=None)
    assert "all_to_all" not in ring.report.comm_bytes and "cp_comm" not in ring.config
    assert ring.report.step_time_s != plan.report.step_time_s


def test_a_kind_the_engine_does_not_run_is_refused_in_one_line():
    with pytest.raises(PlanError, match="fsdp2 engine runs context parallelism as ring attention .p2p. only"):
        _evaluate("fsdp2", zero=3)
    with pytest.raises(PlanError, match="deepspeed engine runs context parallelism as DeepSpeed-Ulysses .a2a. only"):
        _evaluate("deepspeed", stack=Stack(cp_comm="p2p"), sp=False)
    with pytest.raises(PlanError, match="megatron-deepspeed engine runs no context parallelism"):
        api.evaluate("llama3-8b", "dgx-h100", 8, framework="megatron-deepspeed", stack=Stack(cp_comm="p2p"))
    with pytest.raises(PlanError, match="cp_comm='ring'; use one of p2p, a2a"):
        Stack(cp_comm="ring")
    with pytest.raises(PlanError, match="all-to-all context parallelism cuts the attention heads by tp x cp"):
        _evaluate(tp=4, cp=4)  # 8 key/value heads do not split 16 ways


def test_exports_megatron_runs_it_as_a2a_torchtitan_refuses_it():
    from symtensor.export.megatron import megatron_args
    from symtensor.export.torchtitan import torchtitan_config

    plan = _evaluate()
    args = megatron_args(plan)
    assert "--context-parallel-size 4" in args and "--cp-comm-type a2a" in args and "--sequence-parallel" in args
    with pytest.raises(PlanError, match="runs ring context parallelism.*--cp-comm-type p2p"):
        torchtitan_config(_evaluate(zero=1, tp=1, cp=4))
    assert "--cp-comm-type" not in megatron_args(_evaluate(stack=None))


def test_the_search_held_to_a2a_never_cuts_a_core_by_sequence():
    plan = api.plan("llama3-8b", "dgx-h100", 64, global_batch=32, seq=131072, precision="bf16", stack=A2A)
    assert plan.config["cp"] > 1 and plan.config["cp_comm"] == "a2a"
    for op in (op for op in plan.graph.ops if op.kind == "attention"):
        assert "s" not in plan.layouts[op.name], op.name


def test_a_searched_ulysses_layout_reads_as_a2a_and_costs_the_same_as_stated():
    """Layouts of Megatron's a2a costed under the megatron engine with no kind stated, as the per-op search may find
    them (it is held to none): the summary reads cp 4 with cp_comm a2a and no difference, and the configuration it
    reads costs the same step when evaluated as stated."""
    cfg = load_model_config("llama3-8b").replace(layers=2)
    cl = load_cluster("dgx-h100", devices=16)
    c = configuration(dict(tp=2, cp=4, dp=2, sp=True, zero=1, micro_batch=1, global_batch=8, seq=8192,
                           cp_comm="a2a"))
    graph = build_graph(cfg, micro_batch=2, seq=8192, skeleton=True)
    ev = Evaluator(graph, cl)
    layouts = megatron_layouts(graph, ev.mesh, c)
    free = train_config({**c, "cp_comm": None})
    plan = Plan.of(cfg, cl, free, 8192, graph, ev.mesh, ev.pp_axes, layouts, ev.evaluate(layouts, free))
    summary = plan.config
    assert (summary["cp"], summary["tp"], summary.get("cp_comm"), summary["heterogeneous"]) == (4, 2, "a2a", False)
    stated = ev.evaluate(megatron_layouts(graph, ev.mesh, c), train_config(c))
    assert stated.step_time_s == pytest.approx(plan.report.step_time_s, rel=1e-12)
    assert plan.parallelism.train.context == "a2a"


def test_the_sweep_names_the_kind_and_breaks_on_it():
    from symtensor.analysis.sweep import headline, layout_label

    config = {"tp": 2, "dp": 8, "cp": 4, "sp": True, "zero": 1, "global_batch": 64, "seq": SEQ}
    assert layout_label({**config, "cp_comm": "a2a"}) == "tp2 dp8 cp4 a2a sp zero1"
    assert layout_label(config) == "tp2 dp8 cp4 sp zero1"
    assert headline({"cp_comm": [None, "a2a"]}) == "context parallelism's kind p2p->a2a"
    # an unstated kind is the engine's own: DeepSpeed's is all-to-all
    assert headline({"cp_comm": ["p2p", None]}, "deepspeed") == "context parallelism's kind p2p->a2a"


def test_the_cli_states_and_prints_the_kind(capsys):
    from symtensor.cli import main

    argv = ["evaluate", "llama3-8b", "--cluster", "dgx-h100", "--devices", "64", "--tp", "2", "--cp", "4", "--seq",
            str(SEQ), "--global-batch", "64", "--micro-batch", "1", "--zero", "1", "--cp-comm-type", "a2a"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "cp_comm=a2a" in out and "--cp-comm-type a2a" in out  # (the config line, the note)
    with pytest.raises(SystemExit) as exc:  # a kind it does not know: one line naming the choices, status 2
        main(argv[:-1] + ["ring"])
    assert exc.value.code == 2 and "invalid choice: 'ring' (choose from 'p2p', 'a2a')" in capsys.readouterr().err
