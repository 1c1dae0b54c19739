"""Hugging Face config.json -> ModelConfig, one reader per ``model_type``; ``load_model_config``:
a preset, an alias or a config.json.

The keys each family's reader reads ([optional]):

    gpt2                        n_layer n_embd n_head vocab_size [n_positions n_inner]
    llama mistral qwen2 qwen3   num_hidden_layers hidden_size num_attention_heads intermediate_size
                                vocab_size [num_key_value_heads head_dim max_position_embeddings
                                hidden_act tie_word_embeddings attention_bias]; qwen2: Q/K/V biases;
                                qwen3: Q/K norms; mistral: sliding_window on every layer
    mixtral                     + num_local_experts num_experts_per_tok [sliding_window]
    qwen2_moe qwen3_moe         + num_experts (or num_local_experts) num_experts_per_tok
                                moe_intermediate_size [decoder_sparse_step mlp_only_layers];
                                qwen2_moe: shared_expert_intermediate_size (a gated shared expert)
    deepseek_v2 deepseek_v3     + n_routed_experts num_experts_per_tok moe_intermediate_size
                                [n_shared_experts first_k_dense_replace moe_layer_freq]; MLA:
                                kv_lora_rank qk_nope_head_dim qk_rope_head_dim v_head_dim [q_lora_rank];
                                kimi_k2 (Kimi K2: DeepSeek-V3's architecture and keys)
    gpt_oss                     + num_local_experts num_experts_per_tok (or experts_per_token),
                                [layer_types sliding_window]; attention sinks; biases

A config without ``model_type`` is read by its keys: GPT-2's, or LLaMA's (with Mixtral's experts).
Sliding windows: ``layer_types`` (``full_attention`` / ``sliding_attention`` per layer) when given,
else the family's rule (mistral and mixtral: every layer; gpt_oss: every other, from layer 0).

Refused, each with one PlanError line that names the keys: a ``model_type`` not listed above; a
key that looks like mixture-of-experts (experts, routers, shared or dense layers, latent ranks)
which the family's reader neither reads nor knows to leave the graph as it is (router loss
weights, routing groups and scaling); a layer type other than full or sliding attention.

Left out on purpose: DeepSeek's ``num_nextn_predict_layers`` (the multi-token-prediction module;
Hugging Face's model does not build it either, and the published 671B excludes it), the routing
algorithm (grouped top-k, score function, bias correction: the same shapes), quantization (plans
are for bf16 training), RoPE scaling, norm epsilons and dropout rates.

    >>> cfg = read_hf_config({"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
    ...     "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
    ...     "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936})
    >>> cfg.experts, cfg.top_k, cfg.moe_ffn, cfg.qk_norm
    (128, 8, 768, True)
"""

from __future__ import annotations

import re
from pathlib import Path

from symtensor.errors import PlanError, did_you_mean
from symtensor.models.config import ALIASES, PRESETS, ModelConfig, apply_overrides
from symtensor.validate import MAX_EXPERTS, MAX_LAYERS, MAX_SEQ, MAX_WIDTH, boolean, hf_config, integer, name, read_json

_DENSE = ("llama", "mistral", "qwen2", "qwen3")
_MOE = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "kimi_k2", "gpt_oss")
FAMILIES = ("gpt2",) + _DENSE + _MOE

# what a key looks like when it describes experts, routing or layers that differ
_MOE_LOOKING = re.compile(r"expert|moe|router|routed|topk|top_k|sparse|dense_replace|mlp_only|lora_rank|n_group")
# MoE-looking keys that leave the graph as it is: loss weights, logging, routing algorithm
_NEUTRAL = frozenset({"router_aux_loss_coef", "output_router_logits", "router_jitter_noise", "norm_topk_prob",
                      "routed_scaling_factor", "n_group", "topk_group", "topk_method"})
_LAYER_TYPES = ("full_attention", "sliding_attention")


class _Keys:
    """The keys of one config.json, each read through a typed, bounded getter that records it."""

    def __init__(self, data: dict, path: str):
        self.data, self.path, self.read = data, path, set()

    def where(self, key: str) -> str:
        return f"{self.path}: key {key}"

    def need(self, *keys: str) -> None:
        missing = [k for k in keys if self.data.get(k) is None]
        if missing:
            family = self.data.get("model_type") or "a LLaMA-style model"
            raise PlanError(f"{self.path}: missing key(s) {', '.join(missing)} in config.json; {family} needs "
                            f"{' '.join(keys)}")

    def int(self, key: str, default: int = 0, lo: int = 1, hi: int = MAX_WIDTH) -> int:
        """An integer key; absent or null: ``default``."""
        self.read.add(key)
        value = self.data.get(key)
        return default if value is None else integer(value, self.where(key), lo=lo, hi=hi)

    def flag(self, key: str, default: bool) -> bool:
        self.read.add(key)
        value = self.data.get(key)
        return default if value is None else boolean(value, self.where(key))

    def text(self, key: str, default: str) -> str:
        self.read.add(key)
        value = self.data.get(key)
        return default if value is None else name(value, self.where(key))

    def items(self, key: str, kind: str) -> list | None:
        """A list of layer indices (``kind="layer"``) or of names (``"name"``); absent or null: None."""
        self.read.add(key)
        value = self.data.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) > MAX_LAYERS:
            raise PlanError(f"{self.where(key)} must be a list of at most {MAX_LAYERS} {kind}s, got "
                            f"{type(value).__name__}")
        if kind == "layer":
            return [integer(v, self.where(key), lo=0, hi=MAX_LAYERS) for v in value]
        return [name(v, self.where(key)) for v in value]

    def one_of(self, keys: tuple[str, ...], default: int = 0, lo: int = 1, hi: int = MAX_EXPERTS) -> int:
        """The value of whichever of ``keys`` is given (synonyms); two that disagree are an error."""
        values = {k: self.int(k, 0, lo, hi) for k in keys if self.data.get(k) is not None}
        if len(set(values.values())) > 1:
            raise PlanError(f"{self.path}: keys {' and '.join(f'{k}={v}' for k, v in values.items())} disagree; "
                            "keep one of them")
        return next(iter(values.values()), default)

    def not_understood(self, model_type: str) -> None:
        """Refuse MoE-looking keys this family's reader did not read (null, 0 and [] change nothing)."""
        bad = sorted(k for k, v in self.data.items() if _MOE_LOOKING.search(k) and k not in self.read
                     and k not in _NEUTRAL and v not in (None, 0, False, [], {}))
        if bad:
            family = f"model_type {model_type}" if model_type else "no model_type"
            raise PlanError(f"{self.path}: {family}: key(s) {', '.join(bad)} not understood (they would change the "
                            f"experts); give the model_type whose reader knows them ({', '.join(_MOE)})")


def read_hf_config(data: dict, name: str = "hf-model", path: str = "config.json") -> ModelConfig:
    """A ModelConfig from a Hugging Face config.json's keys (see the module docstring).

    Args:
        data: the parsed config.json.
        name: the model's display name.
        path: where ``data`` comes from, for messages.
    """
    hf_config(data, path)  # types and ranges of the keys every family reads
    model_type = data.get("model_type") or ""
    keys = _Keys(data, path)
    if model_type and model_type not in FAMILIES:
        raise PlanError(f"{path}: model_type {model_type!r} is not a family SymTensor reads ({', '.join(FAMILIES)}); "
                        "use a preset, or remove model_type to read the LLaMA keys alone"
                        + did_you_mean(model_type, FAMILIES))
    if model_type == "gpt2" or (not model_type and ("n_layer" in data or "n_embd" in data)):
        fields = _gpt2(keys)
    else:
        fields = _llama(keys, model_type) | _READERS.get(model_type, _no_type)(keys, model_type)
    keys.not_understood(model_type)
    return ModelConfig(name=name, source=path, **fields)


def _gpt2(k: _Keys) -> dict:
    k.need("n_layer", "n_embd", "n_head", "vocab_size")
    hidden = k.data["n_embd"]
    # GPT-2 ties its LM head to the token embedding unless the file says otherwise
    tied = k.data.get("tie_word_embeddings", True)
    return dict(family="gpt", mlp="gelu", norm="layernorm", tied=tied, learned_pos=True, bias=True,
                layers=k.data["n_layer"], hidden=hidden, heads=k.data["n_head"],
                ffn=k.data.get("n_inner") or 4 * hidden, vocab=k.data["vocab_size"],
                max_context=k.data.get("n_positions", 1024))


def _llama(k: _Keys, model_type: str) -> dict:
    """The keys of every LLaMA-style family (validate.hf_config has checked their types)."""
    k.need("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    d = k.data
    heads = d["num_attention_heads"]
    act = d.get("hidden_act") or "silu"
    return dict(family="llama", layers=d["num_hidden_layers"], hidden=d["hidden_size"], heads=heads,
                kv_heads=d.get("num_key_value_heads") or heads, head_dim=d.get("head_dim") or 0,
                ffn=d["intermediate_size"], vocab=d["vocab_size"], max_context=d.get("max_position_embeddings", 4096),
                mlp="swiglu" if act in ("silu", "swish") else "gelu", tied=bool(d.get("tie_word_embeddings", False)),
                qkv_bias=bool(d.get("attention_bias", False)) or model_type == "qwen2")


def _no_type(k: _Keys, model_type: str) -> dict:
    """No model_type: dense, or Mixtral's experts (the keys the reader has always known)."""
    return _mixtral(k, model_type) if (k.data.get("num_local_experts") or 1) > 1 else {}


def _dense(k: _Keys, model_type: str) -> dict:
    return _windows(k, model_type) | ({"qk_norm": True} if model_type == "qwen3" else {})


def _experts(k: _Keys, experts: int, top_keys=("num_experts_per_tok",)) -> dict:
    if experts <= 1:
        return {}
    top_k = k.one_of(top_keys)
    if not top_k:
        raise PlanError(f"{k.path}: missing key {' or '.join(top_keys)} (experts per token) for {experts} experts")
    return dict(experts=experts, top_k=top_k)


def _mixtral(k: _Keys, model_type: str) -> dict:
    return _experts(k, k.int("num_local_experts", 1, lo=0, hi=MAX_EXPERTS)) | _windows(k, "mixtral")


def _qwen_moe(k: _Keys, model_type: str) -> dict:
    """Qwen2-MoE / Qwen3-MoE: layer i has experts when (i + 1) % decoder_sparse_step == 0 and i is
    not in mlp_only_layers (Hugging Face's rule); Qwen2-MoE adds a sigmoid-gated shared expert."""
    experts = k.one_of(("num_experts", "num_local_experts"), default=1, lo=0)
    layers = k.data["num_hidden_layers"]
    step = k.int("decoder_sparse_step", 1, hi=MAX_LAYERS)
    dense = set(k.items("mlp_only_layers", "layer") or ())
    moe = tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)
    fields = _windows(k, model_type)
    if model_type == "qwen3_moe":
        fields["qk_norm"] = True
    else:  # Qwen2-MoE's Q/K/V projections have biases (a key only in newer files)
        fields["qkv_bias"] = k.flag("qkv_bias", True)
        shared = k.int("shared_expert_intermediate_size", 0, lo=0)
        if shared and experts > 1 and moe:
            fields.update(shared_ffn=shared, shared_gate=True)
    if experts <= 1 or not moe:
        return fields
    k.need("moe_intermediate_size")
    return fields | _experts(k, experts) | dict(moe_ffn=k.int("moe_intermediate_size"),
                                               moe_layers=() if len(moe) == layers else moe)


def _deepseek(k: _Keys, model_type: str) -> dict:
    """DeepSeek-V2/V3: MLA attention; the first first_k_dense_replace layers dense, then layer i
    has experts when i % moe_layer_freq == 0; n_shared_experts shared experts of moe_ffn each."""
    k.need("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    k.read.add("head_dim")  # Hugging Face's head_dim is the rotary part here; qk_*_head_dim say it all
    rope = k.int("qk_rope_head_dim")
    fields = dict(kv_heads=k.data["num_attention_heads"], kv_latent=k.int("kv_lora_rank"),
                  q_latent=k.int("q_lora_rank", 0, lo=0), rope_dim=rope,
                  head_dim=k.int("qk_nope_head_dim") + rope, v_head_dim=k.int("v_head_dim"),
                  active_with_embedding=False)  # DeepSeek's "37B activated" leaves the embedding out
    experts = k.int("n_routed_experts", 1, lo=0, hi=MAX_EXPERTS)
    if experts <= 1:
        return fields
    k.need("moe_intermediate_size")
    layers, first = k.data["num_hidden_layers"], k.int("first_k_dense_replace", 0, lo=0, hi=MAX_LAYERS)
    freq = k.int("moe_layer_freq", 1, hi=MAX_LAYERS)
    moe_ffn = k.int("moe_intermediate_size")
    moe = tuple(i for i in range(first, layers) if i % freq == 0)
    return fields | _experts(k, experts) | dict(
        moe_ffn=moe_ffn, dense_layers=min(first, layers), shared_ffn=k.int("n_shared_experts", 0, lo=0) * moe_ffn,
        moe_layers=() if len(moe) == layers - first else moe)


def _gpt_oss(k: _Keys, model_type: str) -> dict:
    """GPT-OSS: biases on Q/K/V/O, the router and the experts; a learned sink logit per head."""
    if not k.flag("attention_bias", True):
        raise PlanError(f"{k.path}: gpt_oss with attention_bias=false is not read (its router and experts keep "
                        "their biases); remove the key")
    experts = k.int("num_local_experts", 1, lo=0, hi=MAX_EXPERTS)
    return (_experts(k, experts, ("num_experts_per_tok", "experts_per_token")) | _windows(k, model_type)
            | dict(bias=True, qkv_bias=False, sinks=True, active_with_embedding=False))


def _windows(k: _Keys, model_type: str) -> dict:
    """window / window_layers from layer_types and sliding_window, or the family's rule."""
    layers = k.data["num_hidden_layers"]
    window = k.int("sliding_window", 0, lo=0, hi=MAX_SEQ)
    types = k.items("layer_types", "name")
    if types is None:
        if model_type.startswith("qwen") and k.flag("use_sliding_window", False):
            raise PlanError(f"{k.path}: use_sliding_window=true: Qwen's layer rule differs between versions; "
                            "write layer_types (full_attention / sliding_attention per layer)")
        rule = {"mistral": range(layers), "mixtral": range(layers), "gpt_oss": range(0, layers, 2)}
        types = ["sliding_attention" if i in rule.get(model_type, ()) else "full_attention" for i in range(layers)]
        if not window:
            return {}
    bad = sorted(set(types) - set(_LAYER_TYPES))
    if bad or len(types) != layers:
        raise PlanError(f"{k.where('layer_types')}: expected {layers} entries of {' or '.join(_LAYER_TYPES)}, got "
                        f"{len(types)}" + (f" with {', '.join(bad)}" if bad else ""))
    sliding = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    if sliding and not window:
        raise PlanError(f"{k.path}: layer_types has sliding_attention layers but sliding_window is "
                        f"{k.data.get('sliding_window')!r}; give the window in tokens")
    if not sliding:
        return {}
    return dict(window=window, window_layers=() if len(sliding) == layers else sliding)


_READERS = {**{t: _dense for t in _DENSE}, "mixtral": _mixtral, "qwen2_moe": _qwen_moe, "qwen3_moe": _qwen_moe,
            "deepseek_v2": _deepseek, "deepseek_v3": _deepseek, "kimi_k2": _deepseek,
            "gpt_oss": _gpt_oss}


def from_hf_dict(data: dict, name: str = "hf-model", path: str = "config.json") -> ModelConfig:
    """Read a Hugging Face config.json (``read_hf_config``)."""
    return read_hf_config(data, name, path)


def load_model_config(spec: str | Path, overrides=None) -> ModelConfig:
    """A preset name, an alias, or a path to a Hugging Face style config.json; then ``--set`` overrides."""
    key = str(spec)
    key = ALIASES.get(key, key)
    if key in PRESETS:
        return apply_overrides(PRESETS[key], overrides)
    path = Path(key)
    if path.suffix == ".json" or path.exists():
        data = read_json(path, "model config file")
        return apply_overrides(from_hf_dict(data, name=path.stem if path.stem != "config" else path.parent.name,
                                            path=str(path)), overrides)
    raise PlanError(f"unknown model {key!r}: give a preset name or a config.json path." + did_you_mean(key, PRESETS))
