"""The per-GPU memory peak of a torchtitan run (``--framework fsdp2 --zero 3``), term by term, against a hand count
from torchtitan's and PyTorch's source: Llama 3 8B on 8 H100, local batch 1, seq 8192, BF16, under no activation
checkpointing, torchtitan's per-op SAC (selective-op), every second block (layer:2) and full.

Sources: pytorch/torchtitan@238fa9953e4aec2a62582121564273d7cbb1e9f1 (torchtitan/models/llama3/model/model.py: the
eager block and the SwiGLU ``w2(F.silu(w1(x)) * w3(x))``; torchtitan/components/loss.py: cross entropy on
``pred.float()``; torchtitan/train.py: ``zero_grad`` opens the step, ``del pred`` before backward;
torchtitan/models/llama3/infra/parallelize.py apply_fsdp: a unit per block, [norm, output] not resharded after
forward; torchtitan/distributed/activation_checkpoint.py: the op policy; torchtitan/components/metrics.py: the log's
"memory" is ``reserved_bytes.all.peak`` in GiB) and PyTorch 2.13 (torchgen/packaged/autograd/derivatives.yaml,
native_functions.yaml: CUDA's fused RMSNorm saves its input and rstd; torch/distributed/fsdp/_fully_shard:
the all-gather buffers on the copy-in stream, the sharded gradients on the reduce-scatter stream).
"""

import pytest

from symtensor import api
from symtensor.cost.memory import peak_terms

S, D, KV, F, V, HEADS, L, DP = 8192, 4096, 1024, 14336, 128256, 32, 32, 8
LAYER_PARAMS = 2 * D * D + 2 * D * KV + 3 * D * F + 2 * D
N = L * LAYER_PARAMS + 2 * V * D + D
P, G, ADAM = 4 * N / DP, 4 * N / DP, 8 * N / DP  # fp32 sharded parameters, gradients, Adam m and v
LSE = 4 * S * HEADS  # the fused attention's fp32 log-sum-exp
# no checkpointing, per block: the input (saved by the fused RMSNorm), its output (by wq, wk, wv), RoPE'd q and k
# and v (by SDPA), the attention output (by SDPA and wo), h (by the second norm), its output (by w1, w3), w1's
# output (by silu), silu's and w3's outputs (by the product) and the product (by w2)
SAVED = 2 * S * (6 * D + 2 * KV + 4 * F) + LSE
# the op policy keeps the input and the outputs of wq, wv (1st, 3rd mm), SDPA, w1 (5th) and w2 (7th)
SAC_KEPT = 2 * S * (4 * D + KV + F) + LSE
KEPT = {"none": SAVED, "selective-op": SAC_KEPT, "layer:2": (2 * S * D + SAVED) / 2, "full": 2 * S * D}
# after the blocks: the embedding's int64 ids, the final norm's input and output, the fp32 log-probabilities
OTHER = 8 * S + 2 * 2 * S * D + 4 * S * V
LOSS = 8 * S * V  # nll_loss's fp32 gradient and log_softmax's, beside the saved log-probabilities
HEAD_UNIT = 2 * (V * D + D)  # [norm, output] gathered in bf16, kept from forward
BLOCK_UNIT = 2 * LAYER_PARAMS
WORKSPACE = 8 * 4096 * 1024  # cuBLAS on Hopper


def hand_allocated(mode: str) -> float:
    """At the loss's backward: no gradient yet (one micro-batch), the head's unit gathered, every block's kept
    activations and the head's, and the loss's two fp32 gradients."""
    return P + ADAM + HEAD_UNIT + L * KEPT[mode] + OTHER + LOSS + WORKSPACE


@pytest.fixture(scope="module")
def runs():
    return {mode: api.evaluate("llama3-8b", "dgx-h100", 8, tp=1, zero=3, framework="fsdp2", micro_batch=1,
                               global_batch=8, seq=S, recompute=mode).report
            for mode in ("none", "selective-op", "layer:2", "full")}


@pytest.mark.parametrize("mode", ["none", "selective-op", "layer:2", "full"])
def test_the_peak_is_the_loss_backward_term_by_term(runs, mode):
    mem = runs[mode].memory
    terms = peak_terms(mem)
    assert terms["state"] == pytest.approx(P + ADAM, rel=1e-4)  # the gradients were set to None by zero_grad
    assert terms["gathered_params"] == pytest.approx(HEAD_UNIT, rel=1e-4)
    assert terms["activations"] == pytest.approx(L * KEPT[mode] + OTHER, rel=1e-6)
    assert terms["engine_buffers"] == 0.0  # no reduce-scatter has started
    assert terms["transient"] == pytest.approx(LOSS, rel=1e-9)
    assert mem["allocated"] == pytest.approx(hand_allocated(mode), rel=1e-4)


@pytest.mark.parametrize("mode", ["none", "selective-op", "layer:2", "full"])
def test_reserved_adds_the_side_streams(runs, mode):
    """What torchtitan logs (the allocator's reserved peak): the compute stream's peak, the reduce-scatter stream's
    blocks that held the gradients and the copy-in stream's two all-gather buffers (the head's unit and a block's).
    The device adds the CUDA context and NCCL's buffers for the group of 8."""
    mem = runs[mode].memory
    assert mem["allocator_reserved"] == pytest.approx(hand_allocated(mode) + G + HEAD_UNIT + BLOCK_UNIT, rel=1e-4)
    assert runs[mode].memory_reserved == pytest.approx(mem["allocator_reserved"] + 400e6 + 688e6, rel=1e-9)


def test_recomputed_block(runs):
    """What one block's re-run brings back beside the kept: under the op policy what no checkpointing saves but
    the input and the kept outputs it saves (v, the attention output and its log-sum-exp, w1's output); a block
    checkpointed whole (full, layer:2) all it saves but its input."""
    assert runs["selective-op"].memory["recompute_transient"] == pytest.approx(
        SAVED - 2 * S * D - (2 * S * (KV + D + F) + LSE), rel=1e-9)
    for mode in ("full", "layer:2"):
        assert runs[mode].memory["recompute_transient"] == pytest.approx(SAVED - 2 * S * D, rel=1e-9)


def test_two_micro_batches_hold_the_gradients_at_the_loss():
    """With gradient accumulation the second micro-batch's loss backward finds the first's gradients (FSDP2
    accumulates into the sharded gradients): the whole state is live, and only the copy-in stream's buffers stay
    reserved beyond the peak."""
    mem = api.evaluate("llama3-8b", "dgx-h100", 8, tp=1, zero=3, framework="fsdp2", micro_batch=1, global_batch=16,
                       seq=S, recompute="full").report.memory
    assert peak_terms(mem)["state"] == pytest.approx(P + G + ADAM, rel=1e-4)
    assert mem["allocated"] == pytest.approx(hand_allocated("full") + G, rel=1e-4)
    assert mem["fragmentation"] == pytest.approx(HEAD_UNIT + BLOCK_UNIT, rel=1e-4)


def test_fixed_and_scaled_bound_the_peak_from_below(runs):
    """What does not grow with the batch plus what does, where the peak is, is at most the device's peak (the
    search extrapolates it to other batches: ``search.outer``)."""
    for rep in runs.values():
        mem = rep.memory
        assert mem["fixed"] + mem["scaled"] <= rep.memory_reserved
        assert mem["scaled"] == pytest.approx(peak_terms(mem)["activations"] + peak_terms(mem)["transient"])
