"""Engine facts as data (``cost.engine.Engine``): which state each engine shards at each ZeRO stage,
when it reshards, and that the cost model, the memory and the search's bounds read those facts."""

import pytest

from symtensor.cost.efficiency import PYTORCH_KERNELS
from symtensor.cost.engine import ENGINES, reshards_after_forward, sharded_parameters
from symtensor.cost.train import TrainConfig
from symtensor.hardware import load_cluster
from symtensor.models import load_model_config
from symtensor.search.pool import EvaluatorPool

# (framework, zero) -> (weights, gradients, optimizer state) sharded over the replicas: the ZeRO
# paper's stages (Rajbhandari et al. 2020) under Megatron and DeepSpeed; FSDP2's fully_shard always
# shards weights and reduce-scatters gradients, so its ZeRO 1 is its ZeRO 2.
SHARDED = {
    ("megatron", 0): (False, False, False), ("megatron", 1): (False, False, True),
    ("megatron", 2): (False, True, True), ("megatron", 3): (True, True, True),
    ("deepspeed", 0): (False, False, False), ("deepspeed", 1): (False, False, True),
    ("deepspeed", 2): (False, True, True), ("deepspeed", 3): (True, True, True),
    ("fsdp2", 0): (False, False, False), ("fsdp2", 1): (True, True, True),
    ("fsdp2", 2): (True, True, True), ("fsdp2", 3): (True, True, True),
}


@pytest.mark.parametrize("framework, zero", sorted(SHARDED))
def test_each_engine_shards_what_its_zero_stage_names(framework, zero):
    eng = ENGINES[framework]
    assert tuple(eng.shards(state, zero) for state in range(3)) == SHARDED[(framework, zero)]
    assert sharded_parameters(zero, framework) == SHARDED[(framework, zero)][0]
    # sharded weights are freed after forward at ZeRO 3 only (FSDP2's reshard_after_forward)
    assert eng.reshards(zero) == (zero == 3)
    assert reshards_after_forward(zero, framework) == (zero == 3)


def test_torch_is_fsdp2_and_pytorch_stacks_run_pytorch_kernels():
    assert TrainConfig(global_batch=1, framework="torch").framework == "fsdp2"
    assert sharded_parameters(1, "torch") and not sharded_parameters(1, "megatron")
    assert PYTORCH_KERNELS == ("fsdp2", "deepspeed")


def _costed(framework, zero, lora=False):
    cfg = load_model_config("llama2-7b").replace(layers=2, **({"lora_rank": 8} if lora else {}))
    pool = EvaluatorPool(cfg, load_cluster("dgx-h100", devices=8), 2048, framework=framework)
    return pool.try_config(tp=1, pp=1, dp=8, zero=zero, micro_batch=1, global_batch=16, seq=2048).report


def test_fsdp2_runs_zero1_as_zero2():
    """FSDP2 has no ZeRO 1 (its gradients are reduce-scattered into shards every backward): ZeRO 1
    and 2 cost the same memory and time; under Megatron ZeRO 2 also shards the gradients."""
    one, two = _costed("fsdp2", 1), _costed("fsdp2", 2)
    assert one.memory == two.memory and one.step_time_s == two.step_time_s
    mega_one, mega_two = _costed("megatron", 1), _costed("megatron", 2)
    assert mega_one.memory["grads"] == pytest.approx(8 * mega_two.memory["grads"])


def test_frozen_weights_sharded_by_fsdp2_are_gathered_for_compute():
    """LoRA's frozen base weights are sharded by FSDP2 from ZeRO 1, like the trainable ones, so
    each micro-batch gathers them: at least the bytes the same model gathers without LoRA."""
    base, lora = _costed("fsdp2", 1), _costed("fsdp2", 1, lora=True)
    assert lora.memory["params"] == pytest.approx(base.memory["params"], rel=0.05)
    assert lora.comm_bytes["all_gather"] >= base.comm_bytes["all_gather"] > 0


def op_time(plan, block: str):
    """The costed time of ``plan``'s first op of ``block`` (``cost.model.Evaluator.op_time``)."""
    ev, layouts = plan.evaluator(), plan.op_layouts()
    op = next(op for op in plan.graph.ops if op.block.endswith(block))
    return ev.op_time(op, layouts[op.name])


def test_an_unpadded_vocabulary_is_costed_unaligned_where_the_engine_does_not_pad(capsys):
    """The graph is built with the vocabulary padded to a multiple of 128, as Megatron-LM pads it; under an engine of
    PyTorch models (torchtitan, Hugging Face under DeepSpeed) GPT-2's 50,257 tokens stay unpadded and the LM head runs
    on cuBLAS's unaligned kernels: on the GH100 costed at their measured rate (cost.kernels.GH100_ALIGNMENT, 0.15-0.21
    of the aligned rate for an odd width), and said, in evaluate's JSON, plan's notes and explain; not under
    Megatron's engines, nor for a vocabulary that is a multiple of 8. Where no unaligned rate was measured (A100)
    the head is costed aligned and the note says so."""
    import json

    from symtensor import api
    from symtensor.analysis.explain import explain_plan
    from symtensor.cli import main
    from symtensor.plan.document import description_notes

    assert main(["evaluate", "gpt3-1.3b", "--cluster", "dgx-h100", "--devices", "8", "--framework", "fsdp2",
                 "--zero", "3", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    said = [n for n in notes if n.startswith("vocabulary 50,257 (no multiple of 8) runs unpadded")]
    assert said and "costed at cuBLAS's unaligned rate measured on the GH100" in said[0]
    plan = api.plan("gpt3-350m", "dgx-h100", 8, framework="deepspeed")
    assert explain_plan(plan)["assumptions"][0].startswith("vocabulary 50,257 (no multiple of 8) runs unpadded")
    for quiet in (api.evaluate("gpt3-1.3b", "dgx-h100", 8, zero=1),
                  api.evaluate("gpt3-1.3b", "dgx-h100", 8, zero=1, framework="megatron-deepspeed"),
                  api.evaluate("llama3-8b", "dgx-h100", 8, zero=3, framework="fsdp2")):
        assert not any(n.startswith(("vocabulary", "hidden", "FFN")) for n in description_notes(quiet))
    a100 = description_notes(api.evaluate("gpt3-1.3b", "dgx-a100-80g", 8, zero=3, framework="fsdp2"))
    assert any(n.startswith("vocabulary 50,257") and "costed at aligned rates" in n for n in a100)

    # the cost: the head's GEMMs at the measured odd-width rate on H100, the rest of the step unchanged
    fsdp, padded = (op_time(api.evaluate("gpt3-1.3b", "dgx-h100", 8, zero=3, framework="fsdp2", overrides=o),
                            "lm_head") for o in (None, {"vocab": 50304}))
    assert fsdp.fwd_s == pytest.approx(padded.fwd_s / 0.1528, rel=0.02)  # (the TN rows' mean ratio)
    same, padded = (op_time(api.evaluate("gpt3-1.3b", "dgx-a100-80g", 8, zero=3, framework="fsdp2", overrides=o),
                            "lm_head") for o in (None, {"vocab": 50304}))
    assert same.fwd_s == pytest.approx(padded.fwd_s)


def test_a_width_no_multiple_of_8_is_costed_at_the_measured_unaligned_rate():
    """GPT-3 13B as the GPT-3 paper states it (hidden 5,140, 4 x an odd number) runs its layers' GEMMs on cuBLAS's
    unaligned kernels: on the GH100 (H100, H200) at the rate measured for that class (0.35 of the aligned rate:
    cost.kernels.GH100_ALIGNMENT), under every engine (none pads a model's hidden size), and the plan says so; on
    A100 (no unaligned measurement) at aligned rates, said as such; not on Ascend (no cuBLAS)."""
    from symtensor import api
    from symtensor.plan.document import description_notes

    for framework in ("megatron", "fsdp2"):
        notes = description_notes(api.evaluate("gpt3-13b", "dgx-h100", 8, zero=3 if framework == "fsdp2" else 1,
                                               framework=framework))
        assert any(n.startswith("hidden 5,140 no multiple of 8") and "measured on the GH100" in n for n in notes)
    slow = api.evaluate("gpt3-13b", "dgx-h100", 8, zero=1, recompute="full")
    aligned = api.evaluate("gpt3-13b", "dgx-h100", 8, zero=1, recompute="full", overrides={"hidden": 5120})
    down = [op_time(p, "down_proj") for p in (slow, aligned)]
    assert down[0].fwd_s / down[1].fwd_s == pytest.approx(5140 / 5120 / 0.3594, rel=0.03)  # (class 4, TN)
    assert slow.report.step_time_s > 2 * aligned.report.step_time_s
    a100 = description_notes(api.evaluate("gpt3-13b", "dgx-a100-80g", 8, zero=1))
    assert any(n.startswith("hidden 5,140") and "costed at aligned rates" in n for n in a100)
    ascend = description_notes(api.evaluate("gpt3-13b", "ascend-910b", 16, zero=1))  # (no cuBLAS there)
    assert not any(n.startswith("hidden") for n in ascend)
