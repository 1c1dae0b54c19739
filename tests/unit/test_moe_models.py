"""Mixture-of-experts models as they are trained today (issue #13, model reading and graphs).

Judged three ways: against ``data/model_configs.csv`` (published dimensions and parameter counts),
against the parameter count of Hugging Face's own model built from the same config on the meta
device (exact), and against closed forms of the new graph content: MLA's projections, shared
experts, sliding-window attention, the router / top-k / permutation ops and the permuted buffers.
"""

import dataclasses
import json
import math
import re

import pytest
import sympy as sp
from test_models import MOE_PRESET_OF_ROW, ROWS, _count

from symtensor.cli import main
from symtensor.errors import PlanError
from symtensor.graph import kind_of, model_flops, op_fwd_flops, op_saves
from symtensor.models import PRESETS, apply_overrides, build_graph, from_hf_dict, load_model_config, params_active
from symtensor.models.builder import layer_runs

from fixtures.hub_configs import PRESET_OF as HUB_CONFIGS

NEW = ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b")


def _graph(cfg, seq=128, **kw):
    return build_graph(cfg, micro_batch=1, seq=seq, **kw)


def _op(g, name):
    return next(op for op in g.ops if op.name == name)


def _write(tmp_path, data, folder="model"):
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


# -- published dimensions and counts -------------------------------------------------------------

def _numbers(cell: str, label: str) -> list[int]:
    """'18432 dense (first 3 layers); 2048 per expert' -> [2048] for 'per expert'."""
    return [int(n) for n in re.findall(rf"(\d+) {label}", cell)]


@pytest.mark.parametrize("row", sorted(MOE_PRESET_OF_ROW), ids=lambda r: MOE_PRESET_OF_ROW[r])
def test_preset_matches_csv_dimensions(row):
    r, cfg = ROWS[row], PRESETS[MOE_PRESET_OF_ROW[row]]
    for key in ("layers", "hidden", "heads", "vocab", "experts", "top_k"):
        assert getattr(cfg, key) == int(r[key]), key
    if r["kv_heads"] == "MLA":
        assert cfg.kv_latent and cfg.kv_heads == cfg.heads
    else:
        assert cfg.kv_heads == int(r["kv_heads"])
    rope = [int(n) for n in re.findall(r"\+(\d+) rope", r["head_dim"])]
    assert cfg.head_dim == int(r["head_dim"].split()[0]) + sum(rope) and cfg.rope_dim == sum(rope)
    assert [cfg.moe_ffn] == _numbers(r["ffn"], "per expert")
    assert _numbers(r["ffn"], "dense") in ([], [cfg.ffn])
    assert [cfg.dense_layers] == (_numbers(r["ffn"], "layers") or [0])  # "first 3 layers"
    assert cfg.shared_ffn == int(r["shared_experts"]) * cfg.moe_ffn


# Exact counts (each equals Hugging Face's, test_hf_models_count_the_same). Two published active
# counts are rounded more coarsely than 1%: Qwen writes 3.353B as "3.3B" (1.6% below), and
# DeepSeek's "37B" is 36.63B without the input embedding (1.0% above; 37.55B, 1.5% below, with
# it: the convention DeepSeek's rounding fits). They are held to one unit of the last digit.
EXACT = {"qwen3-30b-a3b": (30_532_122_624, 3_353_032_704), "qwen3-235b-a22b": (235_093_634_560, 22_190_763_520),
         "deepseek-v3": (671_026_404_352, 36_625_603_584), "gpt-oss-120b": (116_829_156_672, 5_132_849_472)}
ACTIVE_ROUNDED = {"qwen3-30b-a3b": 0.1e9, "deepseek-v3": 1e9}


@pytest.mark.parametrize("row", sorted(MOE_PRESET_OF_ROW), ids=lambda r: MOE_PRESET_OF_ROW[r])
def test_params_match_published(row):
    name = MOE_PRESET_OF_ROW[row]
    g = _graph(PRESETS[name])
    total, active = g.params_total(), params_active(PRESETS[name], g)
    assert (total, active) == EXACT[name]
    assert total == pytest.approx(_count(ROWS[row]["params_total"]), rel=0.01)
    published = _count(ROWS[row]["params_active"])
    assert active == pytest.approx(published, rel=0.01, abs=ACTIVE_ROUNDED.get(name, 0))


@pytest.mark.parametrize("name", NEW)
def test_symtensor_graph_prints_the_counts(capsys, name):
    assert main(["graph", name, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["params_total"], out["params_active"]) == EXACT[name]


# -- config.json, as transformers writes it and as the Hub publishes it -----------------------------

PUBLISHED_DIMS = {
    "qwen3-30b-a3b": ("qwen3_moe", dict(num_hidden_layers=48, hidden_size=2048, num_attention_heads=32,
                                        num_key_value_heads=4, head_dim=128, intermediate_size=6144,
                                        moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                                        vocab_size=151936, max_position_embeddings=40960)),
    "qwen3-235b-a22b": ("qwen3_moe", dict(num_hidden_layers=94, hidden_size=4096, num_attention_heads=64,
                                          num_key_value_heads=4, head_dim=128, intermediate_size=12288,
                                          moe_intermediate_size=1536, num_experts=128, num_experts_per_tok=8,
                                          vocab_size=151936, max_position_embeddings=40960)),
    "deepseek-v3": ("deepseek_v3", dict(num_hidden_layers=61, hidden_size=7168, num_attention_heads=128,
                                        num_key_value_heads=128, intermediate_size=18432, moe_intermediate_size=2048,
                                        n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
                                        first_k_dense_replace=3, q_lora_rank=1536, kv_lora_rank=512,
                                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                        vocab_size=129280, max_position_embeddings=163840)),
    "gpt-oss-120b": ("gpt_oss", dict(num_hidden_layers=36, hidden_size=2880, num_attention_heads=64,
                                     num_key_value_heads=8, head_dim=64, intermediate_size=2880, num_local_experts=128,
                                     num_experts_per_tok=4, vocab_size=201088, sliding_window=128,
                                     max_position_embeddings=131072)),
    "mixtral-8x7b": ("mixtral", dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                                     num_key_value_heads=8, intermediate_size=14336, num_local_experts=8,
                                     num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=32768)),
}


def _same_model(cfg, preset):
    """The config read equals the preset (the preset's ffn is per expert where no layer is dense)."""
    assert dataclasses.replace(cfg, name=preset.name, ffn=preset.ffn) == preset


@pytest.mark.parametrize("name", sorted(PUBLISHED_DIMS))
def test_config_json_written_by_transformers(tmp_path, name):
    """AutoConfig.for_model(model_type, **published dims) -> config.json -> the preset's model."""
    transformers = pytest.importorskip("transformers")
    model_type, dims = PUBLISHED_DIMS[name]
    path = tmp_path / name / "config.json"
    path.parent.mkdir()
    transformers.AutoConfig.for_model(model_type, **dims).to_json_file(path, use_diff=False)
    _same_model(load_model_config(path), PRESETS[name])


@pytest.mark.parametrize("name", sorted(HUB_CONFIGS))
def test_config_json_as_published(tmp_path, name):
    _same_model(load_model_config(_write(tmp_path, HUB_CONFIGS[name])), PRESETS[name])


@pytest.mark.parametrize("model_type, dims", [*PUBLISHED_DIMS.values(), ("qwen2_moe", {}), ("deepseek_v2", dict(
    num_experts_per_tok=6, num_hidden_layers=4, first_k_dense_replace=1))],
    ids=[*PUBLISHED_DIMS, "qwen2-moe-a2.7b", "deepseek-v2-4-layers"])
def test_hf_models_count_the_same(model_type, dims):
    """Hugging Face's own model of the config, built on the meta device, has exactly the
    parameters of SymTensor's graph (shared experts, MLA, sinks and biases included)."""
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    hf = transformers.AutoConfig.for_model(model_type, **dims)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    cfg = from_hf_dict(hf.to_dict(), name=model_type)
    assert _graph(cfg).params_total() == sum(p.numel() for p in model.parameters())


def test_qwen2_moe_shared_expert_is_gated_and_active():
    """Qwen1.5-MoE-A2.7B (the Qwen2MoeConfig defaults): 60 experts, top 4, a shared expert of
    5632 behind a sigmoid gate; 14.3B parameters, 2.7B active."""
    transformers = pytest.importorskip("transformers")
    cfg = from_hf_dict(transformers.AutoConfig.for_model("qwen2_moe").to_dict())
    assert (cfg.experts, cfg.top_k, cfg.moe_ffn, cfg.shared_ffn, cfg.shared_gate, cfg.qkv_bias) == (
        60, 4, 1408, 5632, True, True)
    g = _graph(cfg)
    assert g.params_total() == pytest.approx(14.3e9, rel=0.01)
    assert params_active(cfg, g) == pytest.approx(2.7e9, rel=0.01)
    assert _op(g, "layers.0.shared_expert_gate").kind == "linear"
    assert _op(g, "layers.0.shared_expert_scale").inputs[1] == "layers.0.shared_expert_gate"


def test_qwen_sparse_step_and_mlp_only_layers(tmp_path):
    """Layer i has experts when (i + 1) % decoder_sparse_step == 0 and i is not in mlp_only_layers."""
    data = {**HUB_CONFIGS["qwen3-30b-a3b"], "num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    cfg = load_model_config(_write(tmp_path, data))
    assert cfg.moe_layers == (1, 5)
    g = _graph(cfg)
    moe = [i for i in range(6) if any(op.name == f"layers.{i}.experts.gate_proj" for op in g.ops)]
    assert moe == [1, 5]
    assert _op(g, "layers.0.gate_proj").dim_sizes["f"] == 6144  # a dense layer: intermediate_size


# -- refusals -------------------------------------------------------------------------------------

QWEN3 = HUB_CONFIGS["qwen3-30b-a3b"]
LLAMA = {k: v for k, v in HUB_CONFIGS["mixtral-8x7b"].items() if k not in ("num_local_experts", "num_experts_per_tok")}


@pytest.mark.parametrize("data, match", [
    ({**QWEN3, "model_type": "qwen9_moe"}, r"model_type 'qwen9_moe' is not a family SymTensor reads .*Did you mean"),
    ({**LLAMA, "model_type": "llama", "num_local_experts": 8},
     r"model_type llama: key\(s\) num_local_experts not understood \(they would change the experts\)"),
    ({**{k: v for k, v in QWEN3.items() if k != "model_type"}},
     r"no model_type: key\(s\) decoder_sparse_step, moe_intermediate_size, num_experts, num_experts_per_tok not"),
    ({**QWEN3, "n_shared_experts": 2}, r"model_type qwen3_moe: key\(s\) n_shared_experts not understood"),
    ({**QWEN3, "num_local_experts": 64}, r"keys num_experts=128 and num_local_experts=64 disagree"),
    ({**HUB_CONFIGS["gpt-oss-120b"], "layer_types": ["chunked_attention"] * 36},
     r"layer_types: expected 36 entries of full_attention or sliding_attention, got 36 with chunked_attention"),
    ({**QWEN3, "use_sliding_window": True}, r"use_sliding_window=true: .*write layer_types"),
    ({**HUB_CONFIGS["gpt-oss-120b"], "sliding_window": None}, r"sliding_attention layers but sliding_window is None"),
    ({k: v for k, v in HUB_CONFIGS["deepseek-v3"].items() if k != "kv_lora_rank"},
     r"missing key\(s\) kv_lora_rank in config.json; deepseek_v3 needs"),
    ({**HUB_CONFIGS["deepseek-v3"], "q_lora_rank": "1536"}, r"key q_lora_rank must be an integer, got '1536'"),
], ids=["unknown-model-type", "experts-on-llama", "moe-keys-without-model-type", "unknown-moe-key",
        "synonyms-disagree", "unknown-layer-type", "qwen-window-rule", "window-missing", "mla-key-missing",
        "bad-type"])
def test_refused_with_the_keys_named(tmp_path, data, match):
    with pytest.raises(PlanError, match=match):
        load_model_config(_write(tmp_path, data))


def test_unknown_moe_config_is_one_line_on_the_command_line(capsys, tmp_path):
    path = _write(tmp_path, {**QWEN3, "model_type": "llama"})
    assert main(["graph", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert re.search(r"key\(s\) .*num_experts.* not understood", err)


@pytest.mark.parametrize("base, changes, match", [
    ("deepseek-v3", {"kv_heads": 8}, r"kv_heads must equal heads \(128\), got 8"),
    ("deepseek-v3", {"rope_dim": 192}, r"MLA needs 0 < rope_dim < head_dim"),
    ("tiny-llama", {"q_latent": 8}, r"describe MLA; set kv_latent too"),
    ("tiny-llama", {"window_layers": (0,)}, r"window_layers needs window > 0"),
    ("tiny-mixtral", {"moe_layers": (5,)}, r"moe_layers is 5, above the limit of 1; list layers in \[0, 1\]"),
    ("tiny-mixtral", {"moe_layers": [1]}, r"moe_layers must be a tuple of layer indices, got list"),
    ("tiny-llama", {"shared_ffn": 64}, r"moe_layers and shared_ffn need experts > 1"),
    ("gpt-oss-120b", {"attention": "unfused"}, r"window, sinks need attention=flash"),
], ids=["mla-kv-heads", "mla-rope", "q-latent-alone", "window-layers-alone", "moe-layer-range", "moe-layers-list",
        "shared-on-dense", "unfused-window"])
def test_model_config_checks(base, changes, match):
    with pytest.raises(PlanError, match=match):
        PRESETS[base].replace(**changes)


def test_set_reads_layer_lists():
    cfg = apply_overrides(PRESETS["gpt-oss-120b"], ["window=256", "window_layers=1,3"])
    assert (cfg.window, cfg.window_layers) == (256, (1, 3))
    # fewer layers keep the pattern of the first ones
    assert apply_overrides(PRESETS["gpt-oss-120b"], ["layers=5"]).window_layers == (0, 2, 4)
    sparse = PRESETS["qwen3-30b-a3b"].replace(moe_layers=(3, 5))
    assert apply_overrides(sparse, ["layers=5"]).moe_layers == (3,)
    with pytest.raises(PlanError, match=r"--set layers=3: none of moe_layers \(3, 5\) is below 3; set moe_layers"):
        apply_overrides(sparse, ["layers=3"])


# -- graph content --------------------------------------------------------------------------------

def test_mla_projections_are_linears_with_their_flops():
    """DeepSeek-V3's attention: Q 7168 -> 1536 -> 128 x 192, KV 7168 -> 512 -> 128 x (128 + 128) plus
    one shared 64-wide rotary key; 187,107,328 parameters per layer, as Hugging Face counts them."""
    cfg = PRESETS["deepseek-v3"]
    g = _graph(cfg, seq=256)
    tokens = 256
    params = {t.name: t.numel for t in g.params()}
    shapes = {"q_down": (7168, 1536), "q_proj": (1536, 128, 192), "kv_down": (7168, 512),
              "k_proj": (512, 128, 128), "v_proj": (512, 128, 128), "k_rope_proj": (7168, 64),
              "o_proj": (128, 128, 7168)}
    for block, shape in shapes.items():
        op = _op(g, f"layers.0.{block}")
        assert op.kind == "linear" and g.tensors[op.inputs[1]].shape == shape, block
        assert op_fwd_flops(op) == 2 * tokens * math.prod(shape), block
    attn = sum(n for k, n in params.items() if k.startswith("layers.0.") and "mlp_norm" not in k
               and any(f".{b}." in k for b in ("attn_norm", "q_norm", "kv_norm", *shapes)))
    assert attn - 7168 == 187_107_328  # without the attention's input norm, as HF's attention module
    core = _op(g, "layers.0.core")
    assert (core.dim_sizes["d"], core.dim_sizes["w"], core.dim_sizes["g"]) == (192, 128, 128)
    # QK^T over 192 and PV over 128 per (query, key) pair, causal: half the pairs
    assert op_fwd_flops(core) == 2 * 128 * 256 * (256 / 2) * (192 + 128)
    assert _op(g, "layers.0.k_concat").attr("flops_per_element") == 0  # a copy, memory-bound


def test_shared_expert_is_a_dense_mlp_counted_whole():
    cfg = PRESETS["deepseek-v3"].replace(layers=5)
    g = _graph(cfg)
    assert [i for i in range(5) if cfg.is_moe_layer(i)] == [3, 4]
    gate = _op(g, "layers.3.shared_expert.gate_proj")
    assert gate.dim_sizes["f"] == 2048 and "e" not in gate.dim_sizes
    experts = sum(t.numel for t in g.params() if ".experts." in t.name)
    table = g.tensors["embed.word.weight"].numel
    assert params_active(cfg, g) == g.params_total() - experts * (256 - 8) // 256 - table


def test_sliding_window_attention_flops():
    """GPT-OSS: layer 0 attends through a 128-token window, layer 1 to every earlier token. With k
    keys per query out of t, a causal kernel computes k (1 - k / 2t) per query."""
    cfg = PRESETS["gpt-oss-120b"]
    seq, w, n, d = 4096, 128, 64, 64
    g = _graph(cfg.replace(layers=2, window_layers=(0,)), seq=seq)
    windowed, full = _op(g, "layers.0.core"), _op(g, "layers.1.core")
    assert windowed.attr("window") == w and full.attr("window") is None
    assert op_fwd_flops(windowed) == pytest.approx(4 * n * seq * w * d * (1 - w / (2 * seq)))
    assert op_fwd_flops(full) == 4 * n * seq * seq * d / 2
    short = _graph(cfg.replace(layers=2, window_layers=(0,)), seq=w)  # no longer than the window
    assert op_fwd_flops(_op(short, "layers.0.core")) == op_fwd_flops(_op(short, "layers.1.core"))
    sinks = windowed.inputs[3]
    assert g.tensors[sinks].param and g.tensors[sinks].shape == (n,)


def test_sliding_window_flops_are_symbolic_too():
    """The formula of analysis.formula: a sympy Min, equal to the number once substituted."""
    sizes = {k: sp.Symbol(k, positive=True) for k in "bnstd"}
    attrs = {"window": 128, "causal": True}
    expr = kind_of("attention").fwd_flops(sizes, attrs)
    assert "Min(128, t)" in str(expr)
    values = {"b": 2, "n": 8, "s": 1024, "t": 1024, "d": 64}
    assert float(expr.subs({sizes[k]: v for k, v in values.items()})) == pytest.approx(
        kind_of("attention").fwd_flops(values, attrs))


def test_router_topk_and_permutations_are_memory_bound_and_their_buffers_saved():
    """The MoE layer as the alltoall dispatcher runs it: the router is a GEMM; top-k, permutation
    and unpermutation move bytes; the permuted buffers (top_k copies of every token, [e, b, c, h]
    and [e, b, c, f]) are saved for backward by the ops that read them."""
    cfg = PRESETS["qwen3-30b-a3b"]
    seq = 1024
    g = _graph(cfg, seq=seq)
    kinds = {b: _op(g, f"layers.0.{b}").kind for b in ("router", "topk", "dispatch", "combine")}
    assert kinds == {"router": "linear", "topk": "softmax", "dispatch": "moe_dispatch", "combine": "moe_combine"}
    assert all(kind_of(kinds[b]).memory_bound for b in ("topk", "dispatch", "combine"))
    assert op_fwd_flops(_op(g, "layers.0.router")) == 2 * seq * cfg.hidden * cfg.experts
    saved = set()
    for op in g.layer_ops(0):
        for slot in op_saves(op):
            tensors = op.inputs if slot.startswith("in") else op.outputs
            saved.add(tensors[int(slot[-1])])
    slots = cfg.top_k * seq  # capacity factor 1: c * e = top_k * s
    for name, width in (("dispatch", cfg.hidden), ("experts.gate_proj", cfg.moe_ffn), ("experts.up_proj", cfg.moe_ffn),
                        ("experts.act", cfg.moe_ffn), ("experts.down_proj", cfg.hidden)):
        assert f"layers.0.{name}" in saved, name
        assert g.tensors[f"layers.0.{name}"].nbytes == 2 * slots * width, name


@pytest.mark.parametrize("name, changes, runs", [
    ("gpt-oss-120b", {"layers": 6, "window_layers": (0, 2, 4)}, 6),
    ("deepseek-v3", {"layers": 7, "dense_layers": 2}, 4),
    ("qwen3-235b-a22b", {"layers": 5}, 3),
], ids=["alternating-window", "dense-first", "all-moe"])
def test_skeleton_flops_equal_full(name, changes, runs):
    cfg = PRESETS[name].replace(**changes)
    assert len(layer_runs(cfg)) == runs
    full, skel = _graph(cfg, seq=512), _graph(cfg, seq=512, skeleton=True)
    assert model_flops(skel) == pytest.approx(model_flops(full), rel=1e-12)


def test_qk_norm_normalises_each_head():
    g = _graph(PRESETS["qwen3-30b-a3b"])
    q_norm, k_norm = _op(g, "layers.0.q_norm"), _op(g, "layers.0.k_norm")
    assert (q_norm.kind, q_norm.attr("axis"), q_norm.dim_sizes["n"], k_norm.dim_sizes["g"]) == ("norm", "d", 32, 4)
    assert g.tensors[q_norm.inputs[1]].shape == (128,)


def test_deepseek_v3_is_costed_with_expert_parallelism(capsys):
    """Megatron's DeepSeek-V3 layout under today's rule (ep divides dp): 16 stages, 64-way EP."""
    argv = ["evaluate", "deepseek-v3", "--cluster", "dgx-h100", "--devices", "1024", "--tp", "1", "--pp", "16",
            "--dp", "64", "--ep", "64", "--zero", "1", "--global-batch", "4096", "--seq", "4096", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step_time_s"] > 0 and out["breakdown"]["ep_comm"] > 0
    assert (out["config"]["ep"], out["config"]["pp"]) == (64, 16)


@pytest.mark.parametrize("name, lacking", [("deepseek-v3", "kv_latent, shared_ffn"), ("gpt-oss-120b", "window, sinks"),
                                           ("qwen3-30b-a3b", "qk_norm")])
def test_capture_hf_refuses_what_its_configs_lack(name, lacking):
    """capture_hf translates presets to LLaMA/Qwen2/Mixtral/GPT-2 configs: the new presets would
    silently become Mixtral models without MLA, shared experts, windows, sinks or Q/K norms."""
    pytest.importorskip("transformers")
    from symtensor.frontends.hf import to_hf_config

    with pytest.raises(PlanError, match=rf"configs, which lack {lacking}; plan the builder's graph"):
        to_hf_config(PRESETS[name])


def test_value_head_dim_follows_head_dim():
    """Regression: replace(head_dim=16) on a plain model kept a filled-in v_head_dim of 64 and was
    refused as a half-described MLA."""
    cfg = PRESETS["gpt3-125m"].replace(head_dim=16)
    assert cfg.value_dim == 16 and PRESETS["deepseek-v3"].value_dim == 128
