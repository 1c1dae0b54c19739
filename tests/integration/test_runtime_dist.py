"""End-to-end runs under torchrun (gloo, CPU): each parallel layout must reproduce one process.

Each test declares a run of 2 or 4 processes for 2 steps of a tiny model (``launch`` marker: the
runs share their launches, ``conftest.Launches``), then checks
  * losses and final parameters against the single-process reference (1e-5 with SGD, 1e-4 AdamW);
  * the bytes every rank's collectives moved in each step, per kind and mesh axis, against a
    formula derived by hand from the shapes. These formulas are what the planner's cost model
    must predict (byte definitions: ``symtensor.runtime.commcount``).

Notation (fp32, so 4 bytes per element): L layers, h hidden, s seq, v vocab, b sequences per
data-parallel rank, P_x parameter counts. Per step = forward + backward + optimizer.
"""

import pytest

pytest.importorskip("torch")

from symtensor.models import load_model_config
from symtensor.runtime import ATTN_TP, MLP_TP, VOCAB_TP, RunSpec

pytestmark = [pytest.mark.dist, pytest.mark.torch]

LLAMA = load_model_config("tiny-llama")
MIXTRAL = load_model_config("tiny-mixtral")
F32 = 4
TOL = {"sgd": 1e-5, "adamw": 1e-4}


def attn_params(cfg) -> int:
    return cfg.hidden * cfg.head_dim * (2 * cfg.heads + 2 * cfg.kv_heads)  # q, o: h*n*d; k, v: h*g*d


def mlp_params(cfg) -> int:
    return 3 * cfg.hidden * cfg.ffn  # gate, up, down


def router_params(cfg) -> int:
    return cfg.hidden * cfg.experts


def norm_params(cfg) -> int:
    return (2 * cfg.layers + 1) * cfg.hidden  # two per layer and the final one


def vocab_params(cfg) -> int:
    return 2 * cfg.vocab * cfg.hidden  # embedding and untied LM head


def dense_params(cfg) -> int:
    return cfg.layers * (attn_params(cfg) + mlp_params(cfg)) + norm_params(cfg) + vocab_params(cfg)


def checked(launched):
    """The test's run, its numerics checked against one process."""
    result, optimizer = launched.result, launched.optimizer
    assert result["loss_max_abs_diff"] < TOL[optimizer], result
    assert result["param_max_abs_diff"] < TOL[optimizer], result
    losses = result["reference_losses"]
    assert losses[1] < losses[0] - 0.5  # the steps really trained (so parameters really moved)
    return result


def assert_bytes(result, per_rank, first_step_extra=None):
    """Every step of every rank moved exactly ``per_rank[rank]`` bytes per ``kind@axis``.

    Args:
        per_rank: one {kind@axis: bytes} for all ranks, or a list with one per rank.
        first_step_extra: one-time bytes added to the first step only.
    """
    for step, ranks in enumerate(result["comm"]):
        for rank, record in enumerate(ranks):
            expected = dict(per_rank[rank] if isinstance(per_rank, list) else per_rank)
            for key, extra in (first_step_extra or {}).items() if step == 0 else ():
                expected[key] += extra
            assert record["bytes_by_axis"] == expected, f"step {step} rank {rank}"


@pytest.mark.launch("tiny-llama", RunSpec(mesh={"dp": 2}, dp_axes=("dp",)))
def test_data_parallel(launched):
    """dp=2: one all-reduce of every gradient: all_reduce = P * 4."""
    result = checked(launched)
    assert_bytes(result, {"all_reduce@dp": dense_params(LLAMA) * F32})


@pytest.mark.launch("tiny-llama", RunSpec(mesh={"dp": 2}, fsdp_axes=("dp",)), optimizer="adamw")
def test_fsdp_zero3(launched):
    """fsdp=2 (one group per layer plus the root, all resharded after forward): every parameter is
    all-gathered in forward and again in backward, every gradient reduce-scattered once:
    all_gather = 2 * P * 4 (gathered size), reduce_scatter = P * 4 (unsharded input)."""
    result = checked(launched)
    p = dense_params(LLAMA) * F32
    assert_bytes(result, {"all_gather@dp": 2 * p, "reduce_scatter@dp": p})


@pytest.mark.launch("tiny-llama", RunSpec(mesh={"rep": 2, "shard": 2}, dp_axes=("rep",), fsdp_axes=("shard",)),
                    optimizer="adamw")
def test_hybrid_sharding_2x2(launched):
    """HSDP on the 2-D mesh rep=2 x shard=2 (fully_shard shards over the last dim, replicates over
    the first): per step every parameter all-gathered twice inside its shard group and every
    gradient reduce-scattered there once, then the reduced half all-reduced across the replicas:
    all_gather@shard = 2 * P * 4, reduce_scatter@shard = P * 4, all_reduce@rep = P * 4 / 2."""
    result = checked(launched)
    p = dense_params(LLAMA) * F32
    assert_bytes(result, {"all_gather@shard": 2 * p, "reduce_scatter@shard": p, "all_reduce@rep": p // 2})


@pytest.mark.launch("tiny-llama", RunSpec(mesh={"tp": 2}, tp_axis="tp", styles=ATTN_TP | MLP_TP | VOCAB_TP,
                                          sequence_parallel=True))
def test_tensor_and_sequence_parallel(launched):
    """tp=2 with sequence parallel and vocab-parallel embedding and LM head; b = 4, x = b*s*h*4.

    Per layer and block (attention, MLP): forward all-gather x before, reduce-scatter x after;
    backward the mirror (reduce-scatter, all-gather): 4L all_gather + 4L reduce_scatter of x.
    Embedding (rows = vocab cut): forward reduce-scatter of its partial sums, backward all-gather.
    LM head (columns = vocab cut): forward all-gather of its input x and of the logits b*s*v*4,
    backward reduce-scatter of the input gradient x. Norm weights (replicated, fed a sequence
    shard): one all-reduce of their gradient each, (2L + 1) * h * 4.
    """
    spec, result = launched.spec, checked(launched)
    cfg, b, s = LLAMA, spec.global_batch, spec.seq
    x, logits = b * s * cfg.hidden * F32, b * s * cfg.vocab * F32
    assert_bytes(result, {"all_gather@tp": (4 * cfg.layers + 2) * x + logits,
                          "reduce_scatter@tp": (4 * cfg.layers + 2) * x,
                          "all_reduce@tp": norm_params(cfg) * F32})


@pytest.mark.launch("tiny-llama", RunSpec(mesh={"dp": 2, "tp": 2}, fsdp_axes=("dp",), tp_axis="tp",
                                          styles=ATTN_TP | MLP_TP, sequence_parallel=True), optimizer="adamw")
def test_fsdp_x_tensor_parallel_2d(launched):
    """2-D mesh dp=2 x tp=2: fully_shard over dp composed with TP+SP over tp (attention and MLP;
    embedding and LM head replicated over tp); b = 2 per dp rank, x = b*s*h*4.

    tp axis: per layer 4 all-gathers and 4 reduce-scatters of x (as above); the replicated
    embedding's output is cut on the sequence for free, its gradient all-gathered (x); the
    replicated LM head all-gathers its input (x), and its input gradient is just sliced;
    norm gradients all-reduced, (2L + 1) * h * 4.
    dp axis: FSDP over this tp rank's local parameters P_loc = L*(attn + mlp)/tp + norms + vocab:
    all_gather = 2 * P_loc * 4, reduce_scatter = P_loc * 4.
    """
    spec, result = launched.spec, checked(launched)
    cfg, b, s = LLAMA, spec.global_batch // 2, spec.seq
    x = b * s * cfg.hidden * F32
    local = cfg.layers * (attn_params(cfg) + mlp_params(cfg)) // 2 + norm_params(cfg) + vocab_params(cfg)
    assert_bytes(result, {"all_gather@tp": (4 * cfg.layers + 2) * x, "reduce_scatter@tp": 4 * cfg.layers * x,
                          "all_reduce@tp": norm_params(cfg) * F32,
                          "all_gather@dp": 2 * local * F32, "reduce_scatter@dp": local * F32})


@pytest.mark.launch("tiny-mixtral", RunSpec(mesh={"dp": 2}, dp_axes=("dp",), ep_axes="dp"))
def test_expert_parallel(launched):
    """tiny-mixtral, dp=2 with experts cut over dp (ep=2): T = b*s = 32 tokens per rank, E = 4.

    Each MoE layer exchanges a slot buffer of E * C * h elements, capacity C = T (no dropping):
    all-to-all to the experts and back in forward, and both again in backward:
    all_to_all = 4L * E*T*h*4. Non-expert gradients are all-reduced over dp; expert gradients
    are not (the all-to-all's backward already summed them on their owner):
    all_reduce = (L*(attn + router) + norms + vocab) * 4.
    """
    spec, result = launched.spec, checked(launched)
    cfg, tokens = MIXTRAL, spec.global_batch // 2 * spec.seq
    slots = cfg.experts * tokens * cfg.hidden * F32
    replicated = cfg.layers * (attn_params(cfg) + router_params(cfg)) + norm_params(cfg) + vocab_params(cfg)
    assert_bytes(result, {"all_to_all@dp": 4 * cfg.layers * slots, "all_reduce@dp": replicated * F32})


@pytest.mark.launch("tiny-llama", RunSpec(mesh={"pp": 2}, pp_axis="pp", microbatches=2, pp_schedule="1f1b"))
def test_pipeline_1f1b(launched):
    """pp=2, 1F1B, M = 2 micro-batches of mb = 2 sequences: per micro-batch stage 0 sends its
    activation mb*s*h*4 forward and receives its gradient back: send = recv = M * mb*s*h*4 on
    each rank. Step 1 also carries pipelining's one-time warm-up vote, one int32 each way."""
    spec, result = launched.spec, checked(launched)
    message = spec.global_batch // spec.microbatches * spec.seq * LLAMA.hidden * F32
    p2p = spec.microbatches * message
    assert_bytes(result, {"send@pp": p2p, "recv@pp": p2p}, first_step_extra={"send@pp": 4, "recv@pp": 4})


@pytest.mark.launch("tiny-llama", RunSpec(mesh={"dp": 2, "pp": 2}, dp_axes=("dp",), pp_axis="pp", microbatches=2,
                                          pp_schedule="gpipe"))
def test_pipeline_gpipe_x_data_parallel(launched):
    """dp=2 x pp=2, GPipe, M = 2 micro-batches of 1 sequence per dp rank. Stage 0 (embedding and
    layer 0) and stage 1 (layer 1, final norm, LM head) all-reduce their own gradients over dp;
    p2p as for 1F1B with mb = 1. Ranks are row-major: rank = dp * 2 + pp."""
    spec, result = launched.spec, checked(launched)
    cfg = LLAMA
    layer = attn_params(cfg) + mlp_params(cfg) + 2 * cfg.hidden
    stage_params = [cfg.vocab * cfg.hidden + layer, layer + cfg.hidden + cfg.vocab * cfg.hidden]
    mb = spec.global_batch // 2 // spec.microbatches  # sequences per micro-batch on a dp rank
    p2p = spec.microbatches * mb * spec.seq * cfg.hidden * F32
    per_rank = [{"all_reduce@dp": stage_params[rank % 2] * F32, "send@pp": p2p, "recv@pp": p2p} for rank in range(4)]
    assert_bytes(result, per_rank, first_step_extra={"send@pp": 4, "recv@pp": 4})


@pytest.mark.launch("tiny-llama", RunSpec(mesh={"dp": 2, "tp": 2}, dp_axes=("dp",), tp_axis="tp", styles=ATTN_TP,
                                          layer_styles={1: MLP_TP}))
def test_heterogeneous_attention_tp_mlp_replicated(launched):
    """dp=2 x tp=2; attention tensor parallel (no SP) in every layer; the MLP replicated over tp
    (only data parallel) except in layer 1, whose override makes it tensor parallel too.
    b = 2 per dp rank, x = b*s*h*4.

    tp axis: a tensor-parallel block all-reduces x once in forward (after its row-parallel
    projection) and once in backward (its input gradient): (2L + 2*1) * x.
    dp axis: all gradients of this tp rank, the TP-cut ones at half size:
    (L*attn/2 + mlp + mlp/2 + norms + vocab) * 4.
    """
    spec, result = launched.spec, checked(launched)
    cfg, b = LLAMA, spec.global_batch // 2
    x = b * spec.seq * cfg.hidden * F32
    local = (cfg.layers * attn_params(cfg) // 2 + mlp_params(cfg) + mlp_params(cfg) // 2 + norm_params(cfg)
             + vocab_params(cfg))
    assert_bytes(result, {"all_reduce@tp": (2 * cfg.layers + 2) * x, "all_reduce@dp": local * F32})
