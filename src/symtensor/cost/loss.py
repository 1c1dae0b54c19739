"""The loss kernel: how a stack computes the cross-entropy over the vocabulary (``Stack.loss``).

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


def refusal(loss) -> str | None:
    """One line naming a loss no stack runs here, or None."""
    if loss is None or loss in LOSSES:
        return None
    return f"loss={loss!r}; use one of {', '.join(LOSSES)} (or leave it out: the engine's own)"


# the loss kernels each engine's stack runs, where it does not run them all: Megatron-core's loss is its fused
# kernel or its vocab-parallel one (megatron/core/models/common/language_module/language_module.py
# ``compute_language_model_loss``), never PyTorch's own cross-entropy
ENGINE_LOSSES = {"megatron": (None, "fused", "vocab-parallel")}


def engine_refusal(loss, framework: str) -> str | None:
    """One line where engine ``framework``'s stack does not run loss kernel ``loss``, or None."""
    allowed = ENGINE_LOSSES.get(framework)
    if allowed is None or loss in allowed:
        return None
    return (f"{framework}'s loss is fused (--cross-entropy-loss-fusion) or vocab-parallel, not {loss}: use --loss "
            "fused or vocab-parallel (or leave it out), or another --framework")


def multiples(name: str) -> tuple[float, float]:
    """Forward and backward bytes of loss ``name`` as multiples of a fused kernel's forward reads."""
    loss = LOSSES[name]
    return loss.fwd / FUSED_BYTES, loss.bwd / FUSED_BYTES
