"""The loss, elementwise and attention kernels a stack runs (``Stack.loss``, ``Stack.elementwise``,
``Stack.attention``), and the dtype it keeps the parameters in (``Stack.param_dtype``).

Elementwise kernels (``ELEMENTWISE``): ``eager``, the PyTorch composites of RMSNorm, RoPE and SwiGLU kernel by kernel
(``opcost.EAGER_BYTES``; eager SwiGLU keeps the silu's output too, ``Engine.unfused_swiglu``), what torchtitan's
FSDP2 runs without torch.compile; ``fused``, one kernel each way (Transformer Engine's modules, NeMo AutoModel's
``TE`` backends, torch.compile's fusions), what Megatron runs. Unstated, the engine's own.

The loss kernel: how a stack computes the cross-entropy over the vocabulary.

Each engine costs its own by default (``None``: the megatron engine one fused kernel each way over the bf16 logits,
the fsdp2 and deepspeed engines PyTorch's cross-entropy on an fp32 copy, ``opcost.EAGER_BYTES``, with the loss
backward's transient of ``Engine.loss_grad_bytes``). A stack that runs another states it; what each moves, keeps and
allocates, per local logit element (bytes, bf16 logits in), counted kernel by kernel:

    fused           one kernel each way over the bf16 logits (Transformer Engine's parallel cross-entropy): reads
                    them forward (2), writes their gradient backward (2 + 2); keeps the fp32 softmax (4, as the
                    graph's cross_entropy op keeps it); its backward allocates the bf16 gradient (2).
    vocab-parallel  Megatron-core's ``vocab_parallel_cross_entropy``, what Megatron-LM runs without
                    --cross-entropy-loss-fusion (NVIDIA/Megatron-LM@d98e8a64dd megatron/core/tensor_parallel/
                    cross_entropy.py, each step an eager kernel on fp32): forward cast up 6, max 4, subtract 8, exp 8,
                    sum 4, divide 8 = 38; backward the in-place gradient multiply 8 and the cast of the gradient
                    down for the output layer 6 = 14; keeps the fp32 softmax (4); allocates the bf16 gradient (2).
    fp32            PyTorch's ``cross_entropy`` on an fp32 copy of the logits (torchtitan's ``cross_entropy(pred.
                    float())``, Hugging Face's loss): forward cast up 6, log_softmax 8 = 14; backward nll-loss
                    gradient fill 4, log_softmax backward 12, cast down 6 = 22 (``opcost.EAGER_BYTES``); keeps the fp32
                    log-probabilities (4); allocates 8 (``cost.engine``'s fsdp2 note).
    bf16            PyTorch's ``cross_entropy`` on the bf16 logits (NVIDIA-NeMo/Automodel's MaskedCrossEntropy with
                    ``fp32_upcast: false``, nemo_automodel/components/loss/masked_ce.py): forward log_softmax 4;
                    backward nll-loss gradient fill 2, log_softmax backward 6 = 8; keeps the bf16 log-probabilities
                    (2); allocates the two bf16 gradients (4).
"""

from __future__ import annotations

from dataclasses import dataclass

from symtensor.cost import kernels
from symtensor.cost.engine import FA2_ATTENTION, SDPA_ATTENTION, TE_ATTENTION, table_kernel


@dataclass(frozen=True, slots=True)
class Loss:
    """Bytes per local logit element: moved forward and backward, kept for backward, allocated by the backward."""

    fwd: float
    bwd: float
    saved: float
    grad: float


LOSSES = {"fused": Loss(2, 4, 4, 2), "vocab-parallel": Loss(38, 14, 4, 2), "fp32": Loss(14, 22, 4, 8),
          "bf16": Loss(4, 8, 2, 4)}
FUSED_BYTES = 2  # what a fused kernel reads per logit forward: the multiples ``opcost`` charges are of it


ELEMENTWISE = ("eager", "fused")

# The attention kernels a stack may state (``Stack.attention``), under the names the stacks give them, and the
# kernel of the measured tables (``cost.kernels``) each runs per device, the first device-name part found winning:
# ``te``, Transformer Engine's DotProductAttention (cuDNN's fused attention on Hopper, the megatron engine's
# ``TE_ATTENTION``: NeMo AutoModel's ``attn: te`` backend too); ``sdpa``, PyTorch's scaled_dot_product_attention as
# torch 2.11 and later and torchtitan run it (cuDNN's fused attention on Hopper and Blackwell, FlashAttention-2
# elsewhere: the fsdp2 and deepspeed engines' ``SDPA_ATTENTION``); ``fa2``, FlashAttention-2 on every device (the
# flash-attn library, or SDPA's flash backend on torch 2.10 and older, torchtitan's on Hopper before October 2025:
# ``FA2_ATTENTION``); ``fa3``, FlashAttention-3 (Hopper only: Shah et al. 2024). Unstated, the engine's own.
ATTENTION = {"te": TE_ATTENTION, "sdpa": SDPA_ATTENTION, "fa2": FA2_ATTENTION, "fa3": (("", "fa3"),)}

# The dtype the model's parameters are kept in, which is what the optimizer updates (``Stack.param_dtype``): ``fp32``,
# the engines' own (Megatron's fp32 main parameters, torchtitan's fp32 model under FSDP2's bf16 mixed precision);
# ``bf16``, a model built in bf16 and trained without an fp32 copy: NeMo AutoModel's own MoE models
# (NVIDIA-NeMo/Automodel@89e3a9fdd nemo_automodel/components/models/deepseek_v3/model.py ``initialize_weights``:
# ``self.to(dtype)``, dtype bfloat16, for DeepSeek-V3, Kimi-K2, Qwen3-MoE and GPT-OSS alike) under FSDP2's
# MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) (nemo_automodel/components/moe/parallelizer.py): the
# sharded parameters and their gradients in bf16 (FSDP2 casts the fp32-reduced shard to the parameter's dtype),
# torch.optim.Adam's exp_avg and exp_avg_sq in the parameters' dtype: 2 + 2 + 4 bytes per parameter, the
# reduce-scatter still in fp32. FSDP2 only: Megatron's distributed optimizer and DeepSpeed keep fp32 main weights.
PARAM_DTYPES = ("fp32", "bf16")
BF16_PARAM_STATE = (2, 2, 4)  # bytes per parameter: weights, gradients, Adam m + v (``Engine.state_bytes``' order)


def refusal(loss, elementwise=None, attention=None, param_dtype=None) -> str | None:
    """One line naming a loss, elementwise or attention kernel or parameter dtype no stack runs here, or None."""
    if loss is not None and loss not in LOSSES:
        return f"loss={loss!r}; use one of {', '.join(LOSSES)} (or leave it out: the engine's own)"
    if elementwise is not None and elementwise not in ELEMENTWISE:
        return f"elementwise={elementwise!r}; use eager or fused (or leave it out: the engine's own)"
    if attention is not None and attention not in ATTENTION:
        return f"attention={attention!r}; use one of {', '.join(ATTENTION)} (or leave it out: the engine's own)"
    if param_dtype is not None and param_dtype not in PARAM_DTYPES:
        return f"param_dtype={param_dtype!r}; use fp32 or bf16 (or leave it out: the engine's own)"
    return None


# the loss kernels each engine's stack runs, where it does not run them all: Megatron-core's loss is its fused
# kernel or its vocab-parallel one (megatron/core/models/common/language_module/language_module.py
# ``compute_language_model_loss``), never PyTorch's own cross-entropy
ENGINE_LOSSES = {"megatron": (None, "fused", "vocab-parallel")}
# the attention kernels each engine's stack runs, where it does not run them all, and what it runs: Megatron-core's
# Transformer Engine DotProductAttention; Megatron-DeepSpeed's flash-attn FlashAttention-2 (--use-flash-attn-v2,
# ``cost.engine``'s megatron-deepspeed), neither PyTorch's SDPA
ENGINE_ATTENTION = {"megatron": ("te", "Transformer Engine's attention"),
                    "megatron-deepspeed": ("fa2", "flash-attn's FlashAttention-2 (--use-flash-attn-v2)")}


def engine_refusal(stack, framework: str) -> str | None:
    """One line where engine ``framework``'s stack does not run the kernels or parameter dtype ``stack`` states, or
    None: Megatron's are Transformer Engine's fused ones; only FSDP2 trains parameters kept in bf16."""
    allowed = ENGINE_LOSSES.get(framework)
    if allowed is not None and stack.loss not in allowed:
        return (f"{framework}'s loss is fused (--cross-entropy-loss-fusion) or vocab-parallel, not {stack.loss}: use "
                "--loss fused or vocab-parallel (or leave it out), or another --framework")
    if framework == "megatron" and stack.elementwise == "eager":
        return ("megatron runs Transformer Engine's fused norms, RoPE and SwiGLU, not eager PyTorch composites: leave "
                "--elementwise out, or use --framework fsdp2")
    own = ENGINE_ATTENTION.get(framework)
    if own is not None and stack.attention not in (None, own[0]):
        return (f"{framework} runs {own[1]}, not {stack.attention}: leave --attention out (or state {own[0]}), or "
                "use --framework fsdp2")
    return param_dtype_refusal(stack.param_dtype, framework)


KERNEL_FACTS = ("loss", "elementwise", "attention", "param_dtype")  # the ``Stack`` facts this module prices


def runnable(stack, framework: str):
    """``stack``, or where engine ``framework`` does not run its kernel facts (``engine_refusal``) the stack with
    them unstated (``KERNEL_FACTS``: the engine's own): how a baseline tied to one engine (D-Rec's layouts, costed
    under Megatron's) stands beside a plan of another engine's stack."""
    if stack is None or engine_refusal(stack, framework) is None:
        return stack
    return stack.replace(**dict.fromkeys(KERNEL_FACTS))


def param_dtype_refusal(param_dtype: str | None, framework: str) -> str | None:
    """One line where engine ``framework`` does not keep its parameters in ``param_dtype`` alone, or None."""
    if framework != "fsdp2" and param_dtype == "bf16":
        return (f"{framework} keeps fp32 main weights beside bf16 ones (its optimizer's master copy): parameters kept "
                "in bf16 alone are FSDP2's (NeMo AutoModel); leave --param-dtype out, or use --framework fsdp2")
    return None


def state_bytes(param_dtype: str | None, engine_bytes: tuple) -> tuple:
    """Bytes per parameter of the weights, gradients and optimizer state kept: the engine's (``engine_bytes``,
    ``Engine.state_bytes``) unless the parameters are stated kept in bf16 (``BF16_PARAM_STATE``)."""
    return BF16_PARAM_STATE if param_dtype == "bf16" else engine_bytes


def attention_table(attention: str, device) -> str:
    """The table kernel (``cost.kernels``) the stated attention kernel ``attention`` (``ATTENTION``) runs on
    ``device`` (a device or its name)."""
    return table_kernel(ATTENTION[attention], str(getattr(device, "name", device)))


def device_refusal(attention: str | None, device) -> str | None:
    """One line where ``device`` has no measured table of the stated attention kernel, or None."""
    if attention is None or device is None or kernels.has_attention(device, attention_table(attention, device)):
        return None
    return (f"attention {attention} has no measured kernel table on {getattr(device, 'name', device)}: state another "
            "--attention (or leave it out: the engine's own)")


def stack_refusal(stack, framework: str, device) -> str | None:
    """One line where engine ``framework`` on ``device`` does not run the kernels or parameter dtype ``stack``
    states (``engine_refusal``, ``device_refusal``), or None."""
    return engine_refusal(stack, framework) or device_refusal(stack.attention, device)


UNSTATED = (None, None, None)  # ``op_facts`` of an op no stated fact prices


def op_facts(kind: str, memory_bound: bool, stack) -> tuple[str | None, str | None, str | None]:
    """The stated facts of ``stack`` that price an op of ``kind`` (its loss kernel, its elementwise kernels, its
    attention kernel): the loss kernel for the loss, the elementwise kernels for the other memory-bound ops, the
    attention kernel for attention; None where unstated."""
    if stack is None:
        return UNSTATED
    if kind == "attention":
        return None, None, stack.attention
    if not memory_bound:
        return UNSTATED
    return (stack.loss, None, None) if kind == "cross_entropy" else (None, stack.elementwise, None)


def runs_eager(elementwise: str | None, engine_eager: bool) -> bool:
    """Whether the norms, RoPE and SwiGLU run as eager PyTorch composites: as stated (``elementwise``), else as the
    engine runs them (``engine_eager``: its efficiency's ``eager_elementwise``, its ``unfused_swiglu``)."""
    return engine_eager if elementwise is None else elementwise == "eager"


def multiples(name: str) -> tuple[float, float]:
    """Forward and backward bytes of loss ``name`` as multiples of a fused kernel's forward reads."""
    loss = LOSSES[name]
    return loss.fwd / FUSED_BYTES, loss.bwd / FUSED_BYTES
