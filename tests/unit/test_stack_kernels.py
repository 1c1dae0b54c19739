"""The loss, elementwise and attention kernels and the parameter dtype a stack states (``Stack.loss``,
``Stack.elementwise``, ``Stack.attention``, ``Stack.param_dtype``, ``cost.stack_kernels``): each engine's own by
default, and what a stated one moves, keeps and allocates, in the step, the memory and the exports."""

from __future__ import annotations

import pytest

from symtensor import api
from symtensor.cost import Evaluator
from symtensor.cost.efficiency import efficiency_for
from symtensor.cost.opcost import table_attention_kernel
from symtensor.cost.stack_kernels import LOSSES, runnable
from symtensor.errors import PlanError
from symtensor.export import megatron_args, torchtitan_config
from symtensor.hardware import load_cluster
from symtensor.plan.document import evaluation_json
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


def _evaluate(framework: str, cluster: str = "dgx-h100", **stack):
    return api.evaluate("llama3-8b", cluster, framework=framework, zero=3 if framework == "fsdp2" else 1,
                        stack=Stack(**stack), **RUN)


@pytest.mark.parametrize("framework, own", [("megatron", "te"), ("fsdp2", "sdpa"), ("deepspeed", "sdpa"),
                                           ("megatron-deepspeed", "fa2")])
def test_an_unstated_attention_kernel_is_the_engines_own(framework, own):
    """Megatron runs Transformer Engine's attention (cuDNN's on Hopper), torchtitan's FSDP2 and DeepSpeed's Hugging
    Face models PyTorch's SDPA (cuDNN's first on Hopper too), Megatron-DeepSpeed flash-attn's FlashAttention-2:
    stating that kernel changes nothing."""
    default, stated = _evaluate(framework).report, _evaluate(framework, attention=own).report
    assert (stated.step_time_s, stated.memory) == (default.step_time_s, default.memory)


def test_a_stated_attention_kernel_runs_at_its_own_table():
    """Each stated kernel prices attention at its measured table on the device (``stack_kernels.ATTENTION``): TE's and
    SDPA's (torch >= 2.11, torchtitan) are cuDNN's on H100 and FlashAttention-2 on A100, fa2 FlashAttention-2 on both,
    FA3 Hopper's only. On H100 FSDP2 with FlashAttention-2 (SDPA on an older torch) runs a slower step than with its
    own (cuDNN's, as TE's: NeMo AutoModel's ``attn: te`` costs the same), and the search's floor under the stated
    kernel stays below the step it charges."""
    h100, a100 = (efficiency_for(load_cluster(c, devices=8), "fsdp2") for c in ("dgx-h100", "dgx-a100-80g"))
    for stated in ("te", "sdpa", None):
        assert table_attention_kernel(h100, None, stated) == ("cudnn", 1.0)
        assert table_attention_kernel(a100, None, stated) == ("fa2", 1.0)
    assert table_attention_kernel(h100, None, "fa2") == table_attention_kernel(a100, None, "fa2") == ("fa2", 1.0)
    assert table_attention_kernel(h100, None, "fa3") == ("fa3", 1.0)
    te, fa2 = _evaluate("fsdp2", attention="te"), _evaluate("fsdp2", attention="fa2")
    assert te.report.step_time_s == _evaluate("fsdp2").report.step_time_s < fa2.report.step_time_s
    assert evaluation_json(te)["attention_kernel"] == "te"  # the prediction names the kernel it was costed with
    assert evaluation_json(_evaluate("fsdp2"))["attention_kernel"] == "flash"
    cluster = load_cluster("dgx-h100", devices=8)
    ev = Evaluator(te.graph, cluster, eff=efficiency_for(cluster, "fsdp2"))
    assert ev.step_floor(te.train) <= te.report.step_time_s


def test_attention_kernels_a_stack_or_device_does_not_run_are_refused():
    """One line each: a kernel without a measured table on the device (FlashAttention-3 on A100), a kernel Megatron
    or Megatron-DeepSpeed does not run, a name no stack uses, and torchtitan's export of a kernel other than its
    SDPA."""
    with pytest.raises(PlanError, match="attention fa3 has no measured kernel table on A100"):
        _evaluate("fsdp2", "dgx-a100-80g", attention="fa3")
    with pytest.raises(PlanError, match="megatron runs Transformer Engine's attention, not sdpa"):
        _evaluate("megatron", attention="sdpa")
    with pytest.raises(PlanError, match="megatron-deepspeed runs flash-attn's FlashAttention-2 .*, not sdpa"):
        _evaluate("megatron-deepspeed", attention="sdpa")
    with pytest.raises(PlanError, match="attention='flex'; use one of te, sdpa, fa2, fa3"):
        Stack(attention="flex")
    torchtitan_config(_evaluate("fsdp2", attention="sdpa"))
    with pytest.raises(PlanError, match="torchtitan's attention is PyTorch's scaled_dot_product_attention"):
        torchtitan_config(_evaluate("fsdp2", attention="te"))
    megatron_args(_evaluate("megatron", attention="te"))


def test_parameters_kept_in_bf16_halve_the_state_not_the_reduction():
    """NeMo AutoModel's MoE models train in bf16 under FSDP2 (no fp32 master copy; bf16 gradients and Adam moments:
    2 + 2 + 4 bytes per parameter against torchtitan's 4 + 4 + 8), the reduce-scatter still in FSDP2's fp32
    reduce_dtype. Stating fp32 is the engine's own; the engines with an fp32 master copy and torchtitan's export
    refuse bf16 in one line."""
    fp32, bf16 = _evaluate("fsdp2").report, _evaluate("fsdp2", param_dtype="bf16").report
    assert _evaluate("fsdp2", param_dtype="fp32").report.memory == fp32.memory
    for key in ("params", "grads", "optimizer"):
        assert bf16.memory[key] == pytest.approx(fp32.memory[key] / 2)
    assert bf16.comm_bytes["reduce_scatter"] == fp32.comm_bytes["reduce_scatter"]
    assert bf16.memory_reserved < fp32.memory_reserved
    for framework in ("megatron", "deepspeed"):
        with pytest.raises(PlanError, match=f"{framework} keeps fp32 main weights"):
            _evaluate(framework, param_dtype="bf16")
    with pytest.raises(PlanError, match="torchtitan keeps fp32 parameters"):
        torchtitan_config(_evaluate("fsdp2", param_dtype="bf16"))
    with pytest.raises(PlanError, match="param_dtype='fp16'; use fp32 or bf16"):
        Stack(param_dtype="fp16")


def test_a_plan_of_another_engines_stack_keeps_its_megatron_baselines():
    """D-Rec's layouts are costed under Megatron: beside an FSDP2 plan stating kernels Megatron does not run, they
    run with Megatron's own (``stack_kernels.runnable``) instead of refusing the plan."""
    stated = Stack(loss="fp32", attention="sdpa", param_dtype="bf16", moe_routing="aux_loss")
    assert runnable(stated, "fsdp2") is stated
    assert runnable(stated, "megatron") == Stack(moe_routing="aux_loss")


def test_megatron_lm_overlap_flags_off_expose_the_communication_and_leave_the_export():
    """Megatron-LM leaves --tp-comm-overlap, --overlap-grad-reduce and --overlap-param-gather off by default: a stack
    stating them off (``Stack.tp_comm_overlap``, ``Stack.dp_comm_overlap``) is costed with the tensor-parallel and
    data-parallel communication exposed, and its export leaves the flags out; stating them on is the engine's own.
    Other engines have no such switches: refused in one line."""
    run = dict(devices=64, tp=4, pp=2, zero=1, micro_batch=1, global_batch=64, seq=4096)
    own = api.evaluate("llama3-70b", "dgx-h100", **run)
    on = api.evaluate("llama3-70b", "dgx-h100", stack=Stack(tp_comm_overlap=True, dp_comm_overlap=True), **run)
    assert (on.report.step_time_s, on.report.breakdown) == (own.report.step_time_s, own.report.breakdown)
    no_tp = api.evaluate("llama3-70b", "dgx-h100", stack=Stack(tp_comm_overlap=False), **run)
    no_dp = api.evaluate("llama3-70b", "dgx-h100", stack=Stack(dp_comm_overlap=False), **run)
    assert no_tp.report.breakdown["tp_comm"] > own.report.breakdown["tp_comm"]
    assert no_dp.report.breakdown["dp_comm"] > own.report.breakdown["dp_comm"]
    flags = megatron_args(own)
    assert {"--tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather"} <= set(flags)
    assert "--tp-comm-overlap" not in megatron_args(no_tp) and "--overlap-grad-reduce" in megatron_args(no_tp)
    assert not {"--overlap-grad-reduce", "--overlap-param-gather"} & set(megatron_args(no_dp))
    with pytest.raises(PlanError, match="state Megatron-LM's overlap flags; fsdp2 runs its own"):
        _evaluate("fsdp2", dp_comm_overlap=False)
    with pytest.raises(PlanError, match="tp_comm_overlap='no'; use True, False or None"):
        Stack(tp_comm_overlap="no")
