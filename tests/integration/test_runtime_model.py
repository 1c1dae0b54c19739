"""The runtime's torch model, its TP plan and the collective counter, in this one process."""

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from symtensor.errors import PlanError  # noqa: E402
from symtensor.models import load_model_config  # noqa: E402
from symtensor.runtime.spec import ATTN_TP, MLP_TP, VOCAB_TP, RunSpec  # noqa: E402
from symtensor.runtime.torch_models import build_torch_model, loss_fn  # noqa: E402

pytestmark = pytest.mark.torch

LLAMA = load_model_config("tiny-llama")
MIXTRAL = load_model_config("tiny-mixtral")


def test_deterministic_and_shapes():
    a, b = build_torch_model(LLAMA, seed=3), build_torch_model(LLAMA, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    ids = torch.randint(0, LLAMA.vocab, (2, 8))
    logits = a(ids)
    assert logits.shape == (2, 8, LLAMA.vocab)
    assert torch.isfinite(loss_fn(logits, ids))
    names = dict(a.named_parameters())
    assert names["layers.0.attn.k_proj.weight"].shape == (LLAMA.kv_heads * LLAMA.head_dim, LLAMA.hidden)
    assert names["layers.1.mlp.down_proj.weight"].shape == (LLAMA.hidden, LLAMA.ffn)


def test_causal():
    """Changing a later token leaves the logits of earlier positions alone."""
    model = build_torch_model(LLAMA)
    ids = torch.randint(0, LLAMA.vocab, (1, 8))
    changed = ids.clone()
    changed[0, 5] = (ids[0, 5] + 1) % LLAMA.vocab
    assert torch.allclose(model(ids)[:, :5], model(changed)[:, :5])


def test_moe_slots_match_a_token_loop():
    """The slot buffer (capacity = tokens) computes exactly the Mixtral top-k mixture."""
    moe = build_torch_model(MIXTRAL).layers["0"].mlp
    x = torch.randn(2, 5, MIXTRAL.hidden)
    x_TH = x.reshape(-1, MIXTRAL.hidden)
    top, idx = moe.router(x_TH).topk(MIXTRAL.top_k, dim=-1)
    gates = F.softmax(top, dim=-1)
    w = moe.experts
    expected = torch.zeros_like(x_TH)
    for t in range(x_TH.shape[0]):
        for k in range(MIXTRAL.top_k):
            e = idx[t, k]
            h = F.silu(x_TH[t] @ w.w_gate[e]) * (x_TH[t] @ w.w_up[e])
            expected[t] += gates[t, k] * (h @ w.w_down[e])
    assert torch.allclose(moe(x).reshape(-1, MIXTRAL.hidden), expected, atol=1e-5)


def test_unsupported_model_is_refused():
    with pytest.raises(PlanError, match=r"LLaMA-style models only and needs family='llama'"):
        build_torch_model(load_model_config("gpt3-125m").replace(layers=1, hidden=64, heads=4, kv_heads=4,
                                                                         head_dim=16, ffn=128, vocab=256))


@pytest.mark.parametrize("changes, message", [
    (dict(kv_latent=16, rope_dim=4, kv_heads=4), r"does not build multi-head latent attention \(MLA\)"),
    (dict(shared_ffn=32), r"does not build shared experts \(shared_ffn=32\)"),
    (dict(window=8), r"does not build sliding-window attention \(window=8\)"),
    (dict(sinks=True), r"does not build attention sinks"),
])
def test_moe_features_the_runtime_does_not_build_are_refused(changes, message):
    """One line per feature instead of a model that silently leaves it out (issue 13)."""
    with pytest.raises(PlanError, match=message):
        build_torch_model(MIXTRAL.replace(**changes))


def test_qwen3_moe_layers_and_qk_norms():
    """tiny-qwen3-moe: Q/K norms over a head width of its own (32, not hidden / heads = 16), and
    MoE layers where the config puts them (moe_layers), dense MLPs elsewhere."""
    cfg = load_model_config("tiny-qwen3-moe")
    model = build_torch_model(cfg)
    names = dict(model.named_parameters())
    assert names["layers.0.attn.q_norm.weight"].shape == (cfg.head_dim,)
    assert names["layers.0.attn.q_proj.weight"].shape == (cfg.heads * 32, cfg.hidden)
    ids = torch.randint(0, cfg.vocab, (2, 8))
    assert model(ids).shape == (2, 8, cfg.vocab)
    mixed = build_torch_model(cfg.replace(layers=3, moe_layers=(1,)))
    assert [type(block.mlp).__name__ for block in mixed.layers.values()] == ["MLP", "MoE", "MLP"]


def test_tp_plan_moe_sequence_parallel():
    """An MoE layer under sequence parallelism takes its sequence shard as a local tensor."""
    from torch.distributed.tensor.parallel import PrepareModuleInput, SequenceParallel

    from symtensor.runtime.apply import tp_plan

    spec = RunSpec(mesh={"tp": 2}, tp_axis="tp", styles=ATTN_TP | VOCAB_TP, sequence_parallel=True, ep_axes="tp")
    plan = tp_plan(build_torch_model(MIXTRAL), spec)
    assert type(plan["layers.0.mlp_norm"]) is SequenceParallel and type(plan["layers.0.mlp"]) is PrepareModuleInput
    assert not any(name.startswith("layers.0.mlp.") for name in plan)


def test_tp_plan_sequence_parallel():
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    from symtensor.runtime.apply import tp_plan

    spec = RunSpec(mesh={"tp": 2}, tp_axis="tp", styles=ATTN_TP | MLP_TP | {"lm_head": "colwise"},
                   sequence_parallel=True)
    plan = tp_plan(build_torch_model(LLAMA), spec)
    kinds = {name: type(style) for name, style in plan.items()}
    assert kinds["layers.0.attn_norm"] is SequenceParallel and kinds["norm"] is SequenceParallel
    assert kinds["layers.1.attn"] is PrepareModuleInput and kinds["layers.1.mlp"] is PrepareModuleInput
    assert kinds["layers.1.mlp.up_proj"] is ColwiseParallel and kinds["layers.1.mlp.down_proj"] is RowwiseParallel
    assert kinds["embed"] is PrepareModuleOutput  # replicated table, output cut on the sequence
    assert kinds["lm_head"] is ColwiseParallel
    assert len(plan) == 2 * (2 + 2 + 4 + 3) + 3
    assert tp_plan(build_torch_model(LLAMA), RunSpec(mesh={"tp": 2}, tp_axis="tp", styles=VOCAB_TP)).keys() == {
        "embed", "lm_head"}


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_comm_counter_bytes(one_rank_group):
    """Bytes per kind follow the commcount definitions, for c10d and functional collectives."""
    import torch.distributed._functional_collectives as funcol

    from symtensor.runtime.commcount import CommCounter

    x = torch.ones(10)  # 40 bytes
    with CommCounter({one_rank_group.group_name: "world"}) as counter:
        dist.all_reduce(x)                                        # all_reduce: 40
        dist.all_gather_single(torch.empty(10), x)                # all_gather: output, 40
        dist.reduce_scatter_single(torch.empty(10), x)            # reduce_scatter: input, 40
        dist.all_to_all_single(torch.empty(10), x)                # all_to_all: input, 40
        funcol.wait_tensor(funcol.all_reduce(x.double(), "sum", one_rank_group))       # 80
        funcol.wait_tensor(funcol.all_gather_single(x[:4], 0, one_rank_group))         # 16
        y = torch.ones(6, requires_grad=True)
        funcol.wait_tensor(funcol.all_to_all_single_autograd(y * 1, None, None, one_rank_group)).sum().backward()
    assert counter.bytes == {"all_reduce": 120, "all_gather": 56, "reduce_scatter": 40, "all_to_all": 88}
    assert counter.calls == {"all_reduce": 2, "all_gather": 2, "reduce_scatter": 1, "all_to_all": 3}
    assert counter.summary()["bytes_by_axis"]["all_to_all@world"] == 88


@pytest.mark.parametrize("reshard", [True, False])
def test_fully_shard_keeps_or_reshards_every_group_as_the_spec_says(one_rank_group, reshard):
    """apply_fsdp passed reshard_after_forward=True to every group whatever the plan: after forward
    the registered parameters are the sharded DTensors when fully_shard reshards (ZeRO-3) and the
    unsharded tensors when it does not (ZeRO-2; torch.distributed.fsdp.fully_shard), the root's
    (embedding, final norm, LM head) included."""
    from torch.distributed.tensor import DTensor

    from symtensor.runtime.apply import apply_fsdp, build_mesh

    spec = RunSpec(mesh={"dp": 1}, fsdp_axes=("dp",), reshard_after_forward=reshard)
    model = build_torch_model(LLAMA)
    apply_fsdp(model, spec, build_mesh(spec))
    ids = torch.randint(0, LLAMA.vocab, (2, 16))
    loss = loss_fn(model(ids), ids)
    sharded = {name: isinstance(p, DTensor) for name, p in model.named_parameters()}
    loss.backward()
    assert set(sharded.values()) == {reshard} and "embed.weight" in sharded and "lm_head.weight" in sharded
