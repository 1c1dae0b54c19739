"""torchtitan's selective activation checkpointing as stated recomputation (``cost.segment.recompute_share``):
``selective-op`` (its per-op policy: a block keeps the outputs of its 1st, 3rd, ... matmul and of the fused
attention, everything else re-runs in backward) and ``layer:N`` (every N-th block checkpointed whole).

Sources: pytorch/torchtitan@238fa9953e4aec2a62582121564273d7cbb1e9f1 torchtitan/distributed/activation_checkpoint.py
(``_apply_op_sac``: "Saves output of all compute ops, except every second mm"; ``_apply_layer_sac``: a block is
wrapped whole when ``_layer_sac_count % ac_freq == 0``), torchtitan/models/llama3/infra/parallelize.py
(``_op_sac_save_list``: aten.mm, the SDPA kernels, reduce_scatter, max), torchtitan/config/job_config.py
(``ActivationCheckpoint``)."""

import pytest

from symtensor import api
from symtensor.cli import main
from symtensor.cost.train import TrainConfig
from symtensor.errors import PlanError
from symtensor.export import megatron_args, torchtitan_config

SEQ, LAYERS = 4096, 4
H, FFN, HEADS = 4096, 11008, 32  # llama2-7b: 32 heads of 128, no GQA, SwiGLU 11008


def _run(recompute, framework="fsdp2", zero=3):
    return api.evaluate("llama2-7b", "dgx-a100-80g", 8, dp=8, zero=zero, micro_batch=1, global_batch=8, seq=SEQ,
                        recompute=recompute, framework=framework, overrides={"layers": str(LAYERS)})


@pytest.fixture(scope="module")
def runs():
    return {rc: _run(rc).report for rc in ("none", "full", "selective-op", "layer:1", "layer:2", "layer:4")}


def test_op_policy_keeps_the_layer_input_and_the_saved_ops_outputs(runs):
    """Per layer and token, selective-op keeps the block's input (h), the outputs of q_proj (1st matmul, h),
    v_proj (3rd, h: no GQA), the fused attention (h, and its fp32 log-sum-exp per head), gate_proj (5th, ffn)
    and down_proj (7th, h); k_proj, o_proj and up_proj (2nd, 4th, 6th) re-run with the norms, RoPE, SwiGLU
    and residual adds. Between what full recomputation keeps (the input) and what no recomputation keeps."""
    per_layer = SEQ * (2 * (5 * H + FFN) + 4 * HEADS)
    op = runs["selective-op"].memory["activations_layers"]
    assert op == pytest.approx(LAYERS * per_layer, rel=1e-9)
    assert runs["full"].memory["activations_layers"] < op < runs["none"].memory["activations_layers"]
    assert runs["full"].memory_reserved < runs["selective-op"].memory_reserved < runs["none"].memory_reserved


def test_every_nth_layer_keeps_that_share(runs):
    """layer:N keeps 1/N of what full recomputation keeps and (N - 1)/N of what none keeps; layer:1 is full."""
    full, none = runs["full"].memory["activations_layers"], runs["none"].memory["activations_layers"]
    for n in (2, 4):
        assert runs[f"layer:{n}"].memory["activations_layers"] == pytest.approx(full / n + none * (n - 1) / n)
    assert runs["layer:1"].memory == runs["full"].memory
    assert runs["layer:1"].step_time_s == pytest.approx(runs["full"].step_time_s)


def test_recomputed_time(runs):
    """layer:N re-runs 1/N of full's forward; the op policy re-runs the cheap ops and three of seven matmuls,
    never the attention: more than nothing, less than half of full's (the attention and four matmuls kept)."""
    full = runs["full"].breakdown["recompute"]
    for n in (2, 4):
        assert runs[f"layer:{n}"].breakdown["recompute"] == pytest.approx(full / n)
    op = runs["selective-op"].breakdown["recompute"]
    assert 0.2 * full < op < 0.5 * full
    assert runs["none"].step_time_s < runs["selective-op"].step_time_s < runs["full"].step_time_s
    assert runs["layer:4"].step_time_s < runs["layer:2"].step_time_s < runs["full"].step_time_s


def test_exports_torchtitan_states_its_option_and_megatron_refuses():
    op, layer = _run("selective-op"), _run("layer:2")
    assert torchtitan_config(op)["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert torchtitan_config(layer)["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "2"}
    assert torchtitan_config(_run("full"))["activation_checkpoint"] == {"mode": "full"}


def test_the_planners_selective_runs_in_torchtitan_as_costed():
    """The planner's ``selective`` (Megatron's: the unfused attention core re-run) recomputes nothing under
    the fused attention torchtitan runs, so it costs what no recomputation costs and exports as mode "none";
    it exported mode "selective", which torchtitan runs as every other block checkpointed whole."""
    selective, none = _run("selective"), _run("none")
    assert selective.report.step_time_s == none.report.step_time_s and selective.report.memory == none.report.memory
    assert torchtitan_config(selective)["activation_checkpoint"] == {"mode": "none"}


def test_torchtitan_refuses_selective_recomputation_of_an_unfused_core():
    """With unfused attention the planner's ``selective`` re-runs the S x S core, which torchtitan has no
    policy for (nor unfused attention): a one-line refusal naming the fix."""
    unfused = api.evaluate("llama2-7b", "dgx-a100-80g", 8, dp=8, zero=3, micro_batch=1, global_batch=8, seq=1024,
                           recompute="selective", framework="fsdp2", overrides={"layers": "2", "attention": "unfused"})
    with pytest.raises(PlanError, match=r"no recomputation of the unfused attention core alone .* "
                                        r"--set attention=flash") as err:
        torchtitan_config(unfused)
    assert "\n" not in str(err.value)
    with pytest.raises(PlanError, match="Megatron-LM has no selective-op"):
        megatron_args(_run("selective-op", zero=1))


@pytest.mark.parametrize("framework", ["megatron", "deepspeed", "megatron-deepspeed"])
def test_other_engines_refuse_torchtitans_checkpointing(framework):
    with pytest.raises(PlanError, match="runs under --framework fsdp2"):
        _run("layer:2", framework=framework, zero=1)


@pytest.mark.parametrize("bad", ["layer:0", "layer:x", "layer:", "op", "selective_op"])
def test_bad_modes_are_one_line_errors(bad, capsys):
    with pytest.raises(PlanError) as err:
        TrainConfig(global_batch=8, recompute=bad)
    assert "layer:N" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SystemExit):
        main(["evaluate", "llama2-7b", "--cluster", "dgx-a100-80g", "--devices", "8", "--recompute", bad])
    assert "--recompute" in capsys.readouterr().err


def test_op_local_terms_charge_the_share_of_the_forward_re_run():
    """The op-local terms ``explain`` and the per-op search read (``cost.terms``) charge a layer op's forward
    again for the share backward re-runs, as the evaluator does: half of it under layer:2, all of it under full
    (they charged all of it for any recomputation)."""
    from symtensor.cost import terms

    plan = _run("layer:2")
    ev, layouts = plan.evaluator(), plan.op_layouts()
    op = next(o for o in ev.graph.ops if o.kind == "linear" and 0 <= o.layer < LAYERS)
    cost = {rc: terms.op_cost(ev, op, layouts[op.name], plan.train.replace(recompute=rc))
            for rc in ("none", "layer:2", "full")}
    fwd = cost["full"].compute_s - cost["none"].compute_s
    assert fwd > 0
    assert cost["layer:2"].compute_s - cost["none"].compute_s == pytest.approx(fwd / 2)
    assert (cost["none"].intra_calls, cost["layer:2"].intra_calls, cost["full"].intra_calls) == (1, 1.5, 2)
    assert terms.edge_seconds(1.0, 0.5, 1.5) == pytest.approx(2.0)
