"""The loss and elementwise kernels a stack runs (``Stack.loss``, ``Stack.elementwise``).

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


def refusal(loss, elementwise=None) -> str | None:
    """One line naming a loss or elementwise kernel no stack runs here, or None."""
    if loss is not None and loss not in LOSSES:
        return f"loss={loss!r}; use one of {', '.join(LOSSES)} (or leave it out: the engine's own)"
    if elementwise is not None and elementwise not in ELEMENTWISE:
        return f"elementwise={elementwise!r}; use eager or fused (or leave it out: the engine's own)"
    return None


# the loss kernels each engine's stack runs, where it does not run them all: Megatron-core's loss is its fused
# kernel or its vocab-parallel one (megatron/core/models/common/language_module/language_module.py
# ``compute_language_model_loss``), never PyTorch's own cross-entropy
ENGINE_LOSSES = {"megatron": (None, "fused", "vocab-parallel")}


def engine_refusal(loss, framework: str, elementwise=None) -> str | None:
    """One line where engine ``framework``'s stack does not run loss kernel ``loss`` or the ``elementwise``
    kernels, or None: Megatron's are Transformer Engine's fused ones."""
    allowed = ENGINE_LOSSES.get(framework)
    if allowed is not None and loss not in allowed:
        return (f"{framework}'s loss is fused (--cross-entropy-loss-fusion) or vocab-parallel, not {loss}: use --loss "
                "fused or vocab-parallel (or leave it out), or another --framework")
    if framework == "megatron" and elementwise == "eager":
        return ("megatron runs Transformer Engine's fused norms, RoPE and SwiGLU, not eager PyTorch composites: leave "
                "--elementwise out, or use --framework fsdp2")
    return None


def op_facts(kind: str, memory_bound: bool, stack) -> tuple[str | None, str | None]:
    """The stated facts of ``stack`` that price an op of ``kind`` (its loss kernel, its elementwise kernels): the
    loss kernel for the loss, the elementwise kernels for the other memory-bound ops; None where unstated."""
    if stack is None or not memory_bound:
        return None, None
    return (stack.loss, None) if kind == "cross_entropy" else (None, stack.elementwise)


def runs_eager(elementwise: str | None, engine_eager: bool) -> bool:
    """Whether the norms, RoPE and SwiGLU run as eager PyTorch composites: as stated (``elementwise``), else as the
    engine runs them (``engine_eager``: its efficiency's ``eager_elementwise``, its ``unfused_swiglu``)."""
    return engine_eager if elementwise is None else elementwise == "eager"


def multiples(name: str) -> tuple[float, float]:
    """Forward and backward bytes of loss ``name`` as multiples of a fused kernel's forward reads."""
    loss = LOSSES[name]
    return loss.fwd / FUSED_BYTES, loss.bwd / FUSED_BYTES
