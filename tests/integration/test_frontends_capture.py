"""Frontends: torch.export capture of PyTorch / Hugging Face models into the IR (moved from the unit tests:
importing torch and transformers and exporting models takes seconds per module).

The captured tiny LLaMA must match the hand-built graph of ``symtensor.models`` (parameters,
main operators with their dims, model FLOPs); a 7B LLaMA captures on fake tensors in seconds.
The dim-table tests are tests/unit/test_frontends.py.
"""

import warnings

import pytest

from symtensor.errors import PlanError

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from symtensor.frontends import CaptureWarning, capture_hf, capture_module  # noqa: E402
from symtensor.graph import grad_operands, model_flops, op_model_flops  # noqa: E402
from symtensor.models import PRESETS, build_graph, build_model  # noqa: E402

MAIN = ("linear", "attention", "norm", "embedding", "cross_entropy", "moe_dispatch", "moe_combine")


def kinds(g, kind):
    return [op for op in g.ops if op.kind == kind]


def flops_by_hand(g):
    """Model FLOPs, grad operands counted as the brief says: 2 for a linear with a trainable weight,
    1 for a frozen one, 2 for a bmm."""
    total = 0.0
    for op in g.ops:
        grads = 0
        if op.kind == "linear":
            grads = 2 if g.tensors[op.inputs[1]].trainable else 1
        elif op.kind == "bmm":
            grads = 2
        total += op_model_flops(op, grads)
    return total


@pytest.fixture(scope="module")
def tiny_llama():
    return capture_hf("tiny-llama", micro_batch=2, seq=16), build_model("tiny-llama", micro_batch=2, seq=16)


def test_tiny_llama_matches_the_builder(tiny_llama):
    g, ref = tiny_llama
    assert g.params_total() == ref.params_total()
    for kind in ("linear", "attention", "norm", "embedding", "cross_entropy"):
        assert len(kinds(g, kind)) == len(kinds(ref, kind)), kind
    assert model_flops(g) == pytest.approx(model_flops(ref), rel=0.01)
    assert flops_by_hand(g) == pytest.approx(flops_by_hand(ref), rel=0.01)
    g.validate()


def test_tiny_llama_main_ops_have_the_builders_dims(tiny_llama):
    """Views are folded: q_proj is [b,s,h] x [h,n,d] -> [b,s,n,d], attention reads K/V as [b,t,g,d]."""
    g, ref = tiny_llama
    ours = [op for op in g.ops if op.kind in MAIN]
    theirs = [op for op in ref.ops if op.kind in MAIN]
    assert [op.kind for op in ours] == [op.kind for op in theirs]
    for a, b in zip(ours, theirs):
        assert dict(a.dims) == dict(b.dims), (a.name, b.name)
        assert a.in_dims == b.in_dims, (a.name, b.name)
        if a.kind != "cross_entropy":  # ours is reduced to a scalar, as torch computes it
            assert a.out_dims == b.out_dims, (a.name, b.name)
    attn = kinds(g, "attention")[0]
    assert attn.attr("causal") is True and attn.attr("linked") == (("n", "g"),)
    assert g.meta["micro_batch"] == 2 and g.meta["seq"] == 16 and g.meta["layers"] == 2
    assert [op.layer for op in g.ops if op.kind == "embedding"] == [-1]
    assert kinds(g, "linear")[-1].layer == 2  # the LM head comes after the last layer


def test_tiny_mixtral_experts_and_routing():
    g = capture_hf("tiny-mixtral", micro_batch=2, seq=16)
    ref = build_model("tiny-mixtral", micro_batch=2, seq=16)
    assert g.params_total() == ref.params_total()
    assert model_flops(g) == pytest.approx(model_flops(ref), rel=0.01)
    for kind in ("moe_dispatch", "moe_combine", "attention"):
        assert len(kinds(g, kind)) == len(kinds(ref, kind)), kind
    experts = [op for op in kinds(g, "linear") if "e" in op.dim_sizes and op.in_dims[0][0] == "e"]
    assert experts and all(op.in_dims[0][:3] == ("e", "b", "c") for op in experts)
    assert not g.meta["generic_ops"]  # routing ops are mapped: no warning


def test_gpt2_with_tied_embeddings_and_fused_qkv():
    cfg = PRESETS["tiny-llama"].replace(name="tiny-gpt", family="gpt", mlp="gelu", norm="layernorm", tied=True,
                                        learned_pos=True, bias=True, kv_heads=4, ffn=256)
    g = capture_hf(cfg, micro_batch=2, seq=16)
    ref = build_graph(cfg, micro_batch=2, seq=16)
    assert g.params_total() == ref.params_total()
    assert model_flops(g) == pytest.approx(model_flops(ref), rel=0.01)
    assert len(kinds(g, "attention")) == 2
    qkv = next(op for op in g.ops if op.name.endswith("c_attn"))
    assert qkv.in_dims[1] == ("h", "x0", "n", "d")  # one fused [h, 3, n, d] weight, split into q, k, v
    assert sum(op.attr("fn") == "gelu" for op in g.ops) == 2  # the tanh GeLU written out, fused


def test_eager_attention_is_bmm_softmax_bmm():
    g = capture_hf("tiny-llama", micro_batch=2, seq=16, attention="eager")
    assert len(kinds(g, "bmm")) == 4 and len(kinds(g, "softmax")) == 2
    scores = kinds(g, "bmm")[0]
    assert {"b", "s", "t", "d"} <= set(scores.dim_sizes) and scores.out_dims[0][-2:] == ("s", "t")
    assert model_flops(g) == pytest.approx(model_flops(build_model("tiny-llama", micro_batch=2, seq=16)), rel=0.01)


class _LoRALinear(torch.nn.Module):
    """A frozen base weight with a trainable low-rank adapter."""

    def __init__(self, n_in, n_out, rank=2):
        super().__init__()
        self.base = torch.nn.Linear(n_in, n_out, bias=False)
        self.base.weight.requires_grad_(False)
        self.a = torch.nn.Linear(n_in, rank, bias=False)
        self.b = torch.nn.Linear(rank, n_out, bias=False)

    def forward(self, x):
        return self.base(x) + self.b(self.a(x))


def test_frozen_weights_stay_frozen():
    g = capture_module(_LoRALinear(16, 32), (torch.randn(2, 5, 16),))
    base = next(op for op in g.ops if op.name == "base")
    assert not g.tensors[base.inputs[1]].trainable and base.attr("saves") == ()
    grads = grad_operands(g)
    assert grads["base"] == 0 and grads["b"] == 2  # the input of the frozen base needs no gradient
    assert flops_by_hand(g) == pytest.approx(2 * 2 * 5 * (16 * 32 * 2 + 16 * 2 * 3 + 2 * 32 * 3))


class _Odd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.special.erfinv(torch.tanh(self.proj(x))).sum()


def test_unmapped_op_becomes_generic_with_one_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        g = capture_module(_Odd(), (torch.randn(4, 8),), fake=False)
    ours = [w for w in caught if issubclass(w.category, CaptureWarning)]
    assert len(ours) == 1 and "aten::special_erfinv" in str(ours[0].message)
    odd = [op for op in g.ops if op.kind == "generic"]
    assert [op.attr("fn") for op in odd] == ["special_erfinv"]
    assert g.meta["generic_ops"] == {"aten::special_erfinv": 1}


def test_factory_string_and_config_json(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(
        "import torch\n"
        "def make():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)), "
        "(torch.randn(3, 8),)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    g = capture_hf("my_models:make")
    assert [op.kind for op in g.ops] == ["linear", "elementwise", "linear"]
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "qwen2", "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4,'
                      ' "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256}')
    q = capture_hf(str(config), micro_batch=1, seq=8)
    q_proj = next(op for op in q.ops if op.name.endswith("q_proj"))
    assert q_proj.in_dims == (("b", "s", "h"), ("h", "n", "d"), ("n", "d"))  # Qwen2's q/k/v bias
    assert q.meta["config"].qkv_bias and q.meta["micro_batch"] == 1


class _DataDependent(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x


@pytest.mark.parametrize("call, message", [
    (lambda: capture_module("not a module", ()), "needs a torch.nn.Module"),
    (lambda: capture_module(_DataDependent(), (torch.randn(3),)), "torch.export could not capture"),
    (lambda: capture_module(torch.nn.Linear(2, 2), 3), "example_inputs must be"),
    (lambda: capture_hf("tiny-lama"), "unknown model 'tiny-lama'.*Did you mean tiny-llama"),
    (lambda: capture_hf("tiny-llama", micro_batch=0), "micro_batch must be a positive integer"),
    (lambda: capture_hf({"model_type": "bert", "hidden_size": 8}), "model_type 'bert' is not supported"),
    (lambda: capture_hf("no_such_module:make"), "cannot import the factory"),
    (lambda: capture_hf(PRESETS["tiny-llama"].replace(lora_rank=4)), "has no LoRA"),
], ids=["not-module", "data-dependent", "bad-inputs", "unknown-model", "micro-batch", "model-type", "factory",
        "lora"])
def test_errors_name_the_problem(call, message):
    with pytest.raises(PlanError, match=message):
        call()


class _Contractions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(8, 6))
        self.e = torch.nn.Parameter(torch.randn(6, 5))

    def forward(self, x):
        a = x @ self.w
        b = torch.einsum("bsk,kn->bsn", a, self.e)
        scores = torch.bmm(b, b.transpose(1, 2))  # [b, s, s]: the second s is a new dim
        return torch.log_softmax(scores, -1) @ torch.ones(3)


def test_contractions_of_a_plain_module():
    g = capture_module(_Contractions(), (torch.randn(2, 3, 8),))
    assert [op.kind for op in g.ops] == ["linear", "linear", "bmm", "softmax", "bmm"]
    scores = g.ops[2]
    assert scores.out_dims == (("b", "s", "t"),) and g.ops[3].attr("axis") == "t"
    assert g.tensors[g.ops[0].inputs[1]].labels == ("h", "x0")  # x @ w: w is [in, out]
    assert g.ops[-1].out_dims == (("b", "s"),)
