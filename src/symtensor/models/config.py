"""Model descriptions: the zoo of real models, Hugging Face config.json loading, overrides.

Dimensions come from ../shared/data/model_configs.csv (which cites NVIDIA NeMo's configs, the
Hugging Face config.json files and the model papers); each preset repeats its source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from symtensor.errors import PlanError, did_you_mean, read_json
from symtensor.validate import hf_config, model_config


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """A transformer, dense or mixture-of-experts, in the terms every builder needs.

    Fields:
        name: display name.
        family: ``gpt`` (LayerNorm, GeLU MLP, learned positions, biases) or ``llama``
            (RMSNorm, SwiGLU, RoPE, no biases).
        layers, hidden, heads: depth, model width, attention heads.
        kv_heads: key/value heads (GQA/MQA when fewer than ``heads``); default ``heads``.
        head_dim: per-head width; default ``hidden // heads``.
        ffn: MLP width of dense layers (per expert for MoE unless ``moe_ffn`` is set).
        vocab: vocabulary size.
        max_context: longest sequence the model was trained for (a hint, not a limit).
        experts, top_k: mixture of experts (``experts == 1`` means dense).
        moe_ffn: per-expert MLP width, default ``ffn``.
        dense_layers: the first ``dense_layers`` layers of an MoE model are dense.
        capacity_factor: expert capacity = capacity_factor * top_k * tokens / experts.
        mlp: ``swiglu`` (3 matrices), ``gelu`` or ``relu2`` (2 matrices).
        norm: ``rmsnorm`` or ``layernorm``.
        tied: input embedding and LM head share one table.
        learned_pos: learned position embeddings (GPT) instead of RoPE.
        bias: biases on every linear (GPT); ``qkv_bias`` only on Q/K/V (Qwen2).
        attention: ``flash`` (fused, O(s) memory) or ``unfused`` (scores materialised, 2022 Megatron).
        dropout: dropout after attention probabilities, attention output and MLP output.
        lora_rank: LoRA rank (0 = full training); base weights are then frozen.
        lora_targets: projections that get LoRA adapters (q, k, v, o, gate, up, down).
        source: where the numbers come from.
    """

    name: str
    family: str = "llama"
    layers: int
    hidden: int
    heads: int
    kv_heads: int = 0
    head_dim: int = 0
    ffn: int
    vocab: int
    max_context: int = 4096
    experts: int = 1
    top_k: int = 1
    moe_ffn: int = 0
    dense_layers: int = 0
    capacity_factor: float = 1.0
    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    tied: bool = False
    learned_pos: bool = False
    bias: bool = False
    qkv_bias: bool = False
    attention: str = "flash"
    dropout: bool = False
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o")
    source: str = field(default="", compare=False)

    def __post_init__(self):
        for key in ("layers", "hidden", "heads", "ffn", "vocab"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise PlanError(f"model {self.name}: {key} must be a positive integer, got {value!r}")
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)
        if not self.head_dim:
            if self.hidden % self.heads:
                raise PlanError(f"model {self.name}: heads={self.heads} must divide hidden={self.hidden}; "
                                "change heads, or set head_dim for models whose heads*head_dim differs from hidden")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if not self.moe_ffn:
            object.__setattr__(self, "moe_ffn", self.ffn)
        self.validate()

    def validate(self) -> None:
        model_config(self)  # every field's type and bounds
        for key in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "experts", "top_k",
                    "max_context", "moe_ffn"):
            value = getattr(self, key)
            if not isinstance(value, int) or value <= 0:
                raise PlanError(f"model {self.name}: {key} must be a positive integer, got {value!r}")
        if self.lora_rank < 0:
            raise PlanError(f"model {self.name}: lora_rank must be >= 0, got {self.lora_rank}")
        if self.heads % self.kv_heads:
            raise PlanError(f"model {self.name}: kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.top_k > self.experts:
            raise PlanError(f"model {self.name}: top_k={self.top_k} exceeds experts={self.experts}")
        if not 0 <= self.dense_layers <= self.layers:
            raise PlanError(f"model {self.name}: dense_layers={self.dense_layers} must be in [0, layers]")
        if self.capacity_factor <= 0:
            raise PlanError(f"model {self.name}: capacity_factor must be positive, got {self.capacity_factor}")
        choices = {"family": ("gpt", "llama"), "mlp": ("swiglu", "gelu", "relu2"), "norm": ("rmsnorm", "layernorm"),
                   "attention": ("flash", "unfused")}
        for key, valid in choices.items():
            if getattr(self, key) not in valid:
                raise PlanError(f"model {self.name}: {key}={getattr(self, key)!r}; use one of {', '.join(valid)}")
        bad = set(self.lora_targets) - {"q", "k", "v", "o", "gate", "up", "down"}
        if bad:
            raise PlanError(f"model {self.name}: unknown lora target(s) {sorted(bad)}; use q, k, v, o, gate, up, down")

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


_NEMO = "NVIDIA NeMo llama.py configs mirroring HF config.json (shared/data/model_configs.csv)"
_GPT3 = "GPT-3 paper (Brown et al. 2020) Table 2.1 (shared/data/model_configs.csv)"
_KORTH = "Korthikanti et al. 2022 (arXiv:2205.05198) Table 3 (shared/data/calibration.csv)"
_GPT = dict(family="gpt", mlp="gelu", norm="layernorm", tied=True, learned_pos=True, bias=True, max_context=2048,
            vocab=50257)


def _gpt(name, layers, hidden, heads, source=_GPT3, **kw):
    args = dict(_GPT, **kw)
    return ModelConfig(name=name, layers=layers, hidden=hidden, heads=heads, ffn=args.pop("ffn", 4 * hidden),
                       source=source, **args)


PRESETS: dict[str, ModelConfig] = {c.name: c for c in [
    _gpt("gpt3-125m", 12, 768, 12),
    _gpt("gpt3-350m", 24, 1024, 16),
    _gpt("gpt3-760m", 24, 1536, 16),
    # the GPT-3 paper's table lists 24 heads of 128 on a 2048 model, which does not add up;
    # implementations (Megatron-LM, GPT-Neo) use 16 heads of 128, which gives the 1.3B parameters
    _gpt("gpt3-1.3b", 24, 2048, 16, ffn=8192),
    _gpt("gpt3-2.7b", 32, 2560, 32),
    _gpt("gpt3-6.7b", 32, 4096, 32),
    _gpt("gpt3-13b", 40, 5140, 40, head_dim=128, ffn=20560),
    _gpt("gpt3-175b", 96, 12288, 96),
    _gpt("gpt-22b", 48, 6144, 64, source=_KORTH, vocab=51200),
    _gpt("gpt-530b", 105, 20480, 128, source=_KORTH, vocab=51200),
    _gpt("gpt-1t", 128, 25600, 160, source=_KORTH, vocab=51200),
    ModelConfig(name="llama2-7b", layers=32, hidden=4096, heads=32, ffn=11008, vocab=32000, source=_NEMO),
    ModelConfig(name="llama2-13b", layers=40, hidden=5120, heads=40, ffn=13824, vocab=32000, source=_NEMO),
    ModelConfig(name="llama2-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000,
                source=_NEMO),
    ModelConfig(name="llama3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                max_context=8192, source=_NEMO),
    ModelConfig(name="llama3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256,
                max_context=8192, source=_NEMO),
    ModelConfig(name="llama3-405b", layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256,
                max_context=131072, source=_NEMO + "; LLaMA-3.1 405B"),
    ModelConfig(name="qwen2-7b", layers=28, hidden=3584, heads=28, kv_heads=4, ffn=18944, vocab=152064,
                qkv_bias=True, max_context=32768, source="Qwen2 HF config.json (shared/data/model_configs.csv)"),
    ModelConfig(name="qwen2-72b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=29568, vocab=152064,
                qkv_bias=True, max_context=32768, source="Qwen2 HF config.json (shared/data/model_configs.csv)"),
    ModelConfig(name="mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000,
                experts=8, top_k=2, max_context=32768, source="Mixtral HF config.json (shared/data/model_configs.csv)"),
    ModelConfig(name="mixtral-8x22b", layers=56, hidden=6144, heads=48, kv_heads=8, ffn=16384, vocab=32768,
                experts=8, top_k=2, max_context=65536, source="Mixtral HF config.json (shared/data/model_configs.csv)"),
    ModelConfig(name="tiny-llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, max_context=128,
                source="debug model for end-to-end runs on CPU"),
    ModelConfig(name="tiny-mixtral", layers=2, hidden=64, heads=4, kv_heads=2, ffn=96, vocab=256, experts=4, top_k=2,
                max_context=128, source="debug model for end-to-end runs on CPU"),
]}

ALIASES = {"llama3.1-405b": "llama3-405b", "gpt3-175b-megatron": "gpt3-175b"}


def _coerce(cfg: ModelConfig, key: str, raw: str):
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    if key not in fields:
        raise PlanError(f"--set {key}={raw}: unknown model field {key!r}." + did_you_mean(key, fields))
    current = getattr(cfg, key)
    try:
        if isinstance(current, bool):
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return raw.lower() in ("true", "1", "yes")
        if isinstance(current, int):
            return int(raw)
        if isinstance(current, float):
            return float(raw)
        if isinstance(current, tuple):
            return tuple(x for x in raw.split(",") if x)
    except ValueError:
        raise PlanError(f"--set {key}={raw}: expected a {type(current).__name__} value") from None
    return raw


def apply_overrides(cfg: ModelConfig, overrides: dict[str, str] | list[str] | None) -> ModelConfig:
    """Apply ``key=value`` overrides (strings, as from ``--set``) with the field's own type."""
    if not overrides:
        return cfg
    if isinstance(overrides, list):
        pairs = {}
        for item in overrides:
            if "=" not in item:
                raise PlanError(f"--set {item!r}: expected key=value, e.g. --set layers=4")
            k, v = item.split("=", 1)
            pairs[k.strip()] = v.strip()
        overrides = pairs
    changes = {k: _coerce(cfg, k, str(v)) for k, v in overrides.items()}
    # fields derived from others follow them unless they were set apart from their default
    derived = {"kv_heads": cfg.kv_heads == cfg.heads, "head_dim": cfg.head_dim * cfg.heads == cfg.hidden,
               "moe_ffn": cfg.moe_ffn == cfg.ffn}
    for key, follows in derived.items():
        if follows and key not in changes:
            changes[key] = 0  # recomputed in __post_init__
    return cfg.replace(**changes)


_HF_LLAMA_KEYS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
_HF_GPT2_KEYS = ("n_layer", "n_embd", "n_head", "vocab_size")


def _need(data: dict, keys, path) -> None:
    missing = [k for k in keys if k not in data]
    if missing:
        raise PlanError(f"{path}: missing key(s) {', '.join(missing)} in config.json; add them "
                        "(GPT-2 needs n_layer n_embd n_head vocab_size; LLaMA/Qwen2/Mixtral need "
                        "num_hidden_layers hidden_size num_attention_heads intermediate_size vocab_size)")


def from_hf_dict(data: dict, name: str = "hf-model", path: str = "config.json") -> ModelConfig:
    """Read a Hugging Face style config (GPT-2 keys or LLaMA/Qwen2/Mixtral keys)."""
    hf_config(data, path)  # types and ranges of every key read below
    if "n_layer" in data or "n_embd" in data:
        _need(data, _HF_GPT2_KEYS, path)
        hidden = data["n_embd"]
        return ModelConfig(name=name, family="gpt", mlp="gelu", norm="layernorm", tied=True, learned_pos=True,
                           bias=True, layers=data["n_layer"], hidden=hidden, heads=data["n_head"],
                           ffn=data.get("n_inner") or 4 * hidden, vocab=data["vocab_size"],
                           max_context=data.get("n_positions", 1024), source=path)
    _need(data, _HF_LLAMA_KEYS, path)
    experts = data.get("num_local_experts", 1) or 1
    act = data.get("hidden_act", "silu")
    heads = data["num_attention_heads"]
    return ModelConfig(
        name=name, family="llama", layers=data["num_hidden_layers"], hidden=data["hidden_size"], heads=heads,
        kv_heads=data.get("num_key_value_heads") or heads, head_dim=data.get("head_dim") or 0,
        ffn=data["intermediate_size"], vocab=data["vocab_size"],
        max_context=data.get("max_position_embeddings", 4096), experts=experts,
        top_k=data.get("num_experts_per_tok", 1) if experts > 1 else 1,
        mlp="swiglu" if act in ("silu", "swish") else "gelu", tied=bool(data.get("tie_word_embeddings", False)),
        qkv_bias=bool(data.get("attention_bias", False)) or data.get("model_type") == "qwen2", source=path)


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
