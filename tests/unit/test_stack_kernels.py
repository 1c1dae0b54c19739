"""The loss and elementwise kernels a stack states (``Stack.loss``, ``Stack.elementwise``, ``cost.stack_kernels``):
each engine's own by default, and what a stated one moves, keeps and allocates, in the step, the memory and the
exports."""

from __future__ import annotations

import pytest

from symtensor import api
from symtensor.cost.stack_kernels import LOSSES
from symtensor.errors import PlanError
from symtensor.export import megatron_args, torchtitan_config
from symtensor.plan.stack import Stack

RUN = dict(devices=8, micro_batch=2, global_batch=16, seq=4096)  # Llama 3 8B: a 128,256-token vocabulary


def _plan(framework: str, loss: str | None, **kw):
    zero = 3 if framework == "fsdp2" else 1
    return api.evaluate("llama3-8b", "dgx-h100", framework=framework, zero=zero, stack=Stack(loss=loss),
                        **{**RUN, **kw})


@pytest.mark.parametrize("framework, own", [("megatron", "fused"), ("fsdp2", "fp32")])
def test_an_unstated_loss_is_the_engines_own(framework, own):
    """Megatron costs one fused kernel each way, torchtitan's FSDP2 PyTorch's cross-entropy on an fp32 copy: stating
    that kernel changes neither the step nor a byte of memory."""
    default, stated = _plan(framework, None).report, _plan(framework, own).report
    assert stated.step_time_s == default.step_time_s
    assert stated.memory == default.memory


def test_a_stated_loss_moves_keeps_and_allocates_its_own_bytes():
    """Per local logit: the loss backward allocates ``Loss.grad`` bytes (the memory's loss transient), and the step
    moves ``fwd + bwd`` bytes: NeMo AutoModel's cross-entropy on the bf16 logits (fp32_upcast false) is the lightest
    PyTorch one, Megatron-LM's unfused vocab-parallel kernel the heaviest of Megatron's."""
    logits = RUN["seq"] * RUN["micro_batch"] * 128256
    for framework, loss in (("fsdp2", "fp32"), ("fsdp2", "bf16"), ("megatron", "fused"),
                            ("megatron", "vocab-parallel")):
        mem = _plan(framework, loss).report.memory
        assert mem["loss_transient"] == logits * LOSSES[loss].grad
    fp32, bf16 = _plan("fsdp2", "fp32").report, _plan("fsdp2", "bf16").report
    assert bf16.step_time_s < fp32.step_time_s and bf16.memory_reserved < fp32.memory_reserved
    assert _plan("megatron", "vocab-parallel").report.step_time_s > _plan("megatron", "fused").report.step_time_s


def test_megatron_runs_its_own_losses_and_the_exports_launch_the_stated_one():
    """Megatron-core's loss is its fused kernel or the vocab-parallel one: a PyTorch loss is refused in one line; the
    Megatron export passes --cross-entropy-loss-fusion unless the plan states the vocab-parallel kernel (what
    Megatron-LM runs without it), and torchtitan, whose loss is the fp32 one, refuses any other."""
    with pytest.raises(PlanError, match="loss is fused .* or vocab-parallel, not bf16"):
        _plan("megatron", "bf16")
    assert "--cross-entropy-loss-fusion" in megatron_args(_plan("megatron", "fused"))
    assert "--cross-entropy-loss-fusion" not in megatron_args(_plan("megatron", "vocab-parallel"))
    torchtitan_config(_plan("fsdp2", "fp32"))
    with pytest.raises(PlanError, match="torchtitan's loss is PyTorch's cross-entropy on an fp32 copy"):
        torchtitan_config(_plan("fsdp2", "bf16"))
    with pytest.raises(PlanError, match="loss='fp16'; use one of"):
        Stack(loss="fp16")


@pytest.mark.parametrize("framework, own", [("megatron", "fused"), ("fsdp2", "eager")])
def test_unstated_elementwise_kernels_are_the_engines_own(framework, own):
    """Megatron runs Transformer Engine's fused norms, RoPE and SwiGLU, torchtitan's FSDP2 eager PyTorch composites:
    stating them changes nothing."""
    default = _plan(framework, None).report
    stated = api.evaluate("llama3-8b", "dgx-h100", framework=framework, zero=3 if framework == "fsdp2" else 1,
                          stack=Stack(elementwise=own), **RUN).report
    assert (stated.step_time_s, stated.memory) == (default.step_time_s, default.memory)


def test_fused_elementwise_kernels_under_fsdp2():
    """FSDP2 with fused elementwise kernels (NeMo AutoModel's Transformer Engine backends, torch.compile): fewer bytes
    per norm, RoPE and SwiGLU than the eager composites, and SwiGLU no longer keeps the silu's output; the loss stays
    the engine's own unless stated. Megatron refuses eager composites."""
    eager = _plan("fsdp2", None).report
    fused = api.evaluate("llama3-8b", "dgx-h100", framework="fsdp2", zero=3, stack=Stack(elementwise="fused"),
                         **RUN).report
    assert fused.step_time_s < eager.step_time_s and fused.memory["activations"] < eager.memory["activations"]
    assert fused.memory["loss_transient"] == eager.memory["loss_transient"]
    with pytest.raises(PlanError, match="megatron runs Transformer Engine's fused norms"):
        api.evaluate("llama3-8b", "dgx-h100", framework="megatron", zero=1, stack=Stack(elementwise="eager"), **RUN)
    with pytest.raises(PlanError, match="elementwise='te'; use eager or fused"):
        Stack(elementwise="te")


def test_torchtitan_compiles_the_model_where_the_plan_states_fused_elementwise_kernels():
    """torchtitan's blocks run eager composites unless torch.compile fuses them: a plan costed with fused
    elementwise kernels exports [compile] over the model (its loss left eager, as the fsdp2 engine costs it)."""
    fused = api.evaluate("llama3-8b", "dgx-h100", framework="fsdp2", zero=3, stack=Stack(elementwise="fused"), **RUN)
    assert torchtitan_config(fused)["compile"] == {"enable": True, "components": ["model"]}
    assert "compile" not in torchtitan_config(_plan("fsdp2", None))
