"""Capture Hugging Face causal LMs built from a config on the meta device, offline.

Accepted model descriptions (``capture_hf``'s first argument):

* a ``transformers`` config object (``LlamaConfig(...)``, ``Qwen2Config``, ``MixtralConfig``,
  ``GPT2Config``);
* a config.json dict, a path to a config.json, or a directory holding one;
* a preset name or :class:`~symtensor.models.ModelConfig` (``"tiny-llama"``, ``"llama2-7b"``),
  translated to the matching Hugging Face config;
* ``"package.module:factory"``: any PyTorch model; ``factory()`` returns ``(module, example_inputs)``.

No weights or configs are downloaded: the model is constructed from the config on the meta
device, and ``torch.export`` traces it on fake tensors (a 7B forward takes seconds, no memory).
"""

from __future__ import annotations

import copy
import importlib
import json
import re
from pathlib import Path

from symtensor.errors import PlanError, did_you_mean
from symtensor.models.config import ALIASES, PRESETS, ModelConfig
from symtensor.models.hf_config import from_hf_dict

_ARCHS = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mixtral": "MixtralForCausalLM",
          "gpt2": "GPT2LMHeadModel"}
_CONFIGS = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mixtral": "MixtralConfig", "gpt2": "GPT2Config"}
_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def capture_hf(config_or_path, micro_batch: int = 1, seq: int | None = None, *, dtype: str = "bf16",
               attention: str | None = None, name: str | None = None):
    """Build a Hugging Face causal LM from a config on the meta device and capture one training forward.

    Args:
        config_or_path: see the module docstring.
        micro_batch: sequences per micro-batch.
        seq: tokens per sequence (default: the context length capped at 4096).
        dtype: ``bf16``, ``fp16`` or ``fp32`` parameters and activations.
        attention: ``sdpa`` (fused attention) or ``eager`` (scores materialised); default
            ``sdpa``, or ``eager`` for a ModelConfig with ``attention="unfused"``.
        name: the graph's name.

    Returns:
        A validated Graph of ``model(input_ids, labels=labels)`` (logits and loss); ``meta["config"]``
        is the :class:`ModelConfig` when one is known.

    Example:
        >>> g = capture_hf("tiny-llama", micro_batch=2, seq=16)
        >>> sum(op.kind == "attention" for op in g.ops)
        2
    """
    from symtensor.frontends.capture import capture_module, import_torch

    if isinstance(config_or_path, str) and _is_factory(config_or_path):
        module, inputs = call_factory(config_or_path)
        return capture_module(module, inputs, name=name or config_or_path)
    for key, value in (("micro_batch", micro_batch), ("seq", seq if seq is not None else 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise PlanError(f"{key} must be a positive integer, got {value!r}")
    if dtype not in _DTYPES:
        raise PlanError(f"dtype={dtype!r}; use one of {', '.join(_DTYPES)}")
    torch = import_torch()
    hf_config, model_config, label = hf_config_of(config_or_path)
    if attention is None:
        attention = "eager" if model_config is not None and model_config.attention == "unfused" else "sdpa"
    seq = seq or min(_context(hf_config), 4096)
    model = build_meta_model(hf_config, getattr(torch, _DTYPES[dtype]), attention)
    ids = torch.zeros(micro_batch, seq, dtype=torch.long, device="meta")
    graph = capture_module(model, {"input_ids": ids, "labels": torch.zeros_like(ids)}, name=name or label)
    graph.meta["config"] = model_config
    return graph


def build_meta_model(hf_config, torch_dtype, attention: str = "sdpa"):
    """The ``*ForCausalLM`` of a Hugging Face config, on the meta device, in training mode."""
    import torch
    import transformers

    model_type = getattr(hf_config, "model_type", "")
    if model_type not in _ARCHS:
        raise PlanError(f"model_type {model_type!r} is not supported by capture_hf; use one of "
                        f"{', '.join(_ARCHS)}, or capture_module on your own module")
    if attention not in ("sdpa", "eager"):
        raise PlanError(f"attention={attention!r}; use sdpa or eager")
    hf_config = copy.deepcopy(hf_config)  # the caller's config is left as it was
    hf_config.use_cache = False  # a KV cache is an inference feature and not a tensor export can return
    hf_config._attn_implementation = attention
    with torch.device("meta"):
        model = getattr(transformers, _ARCHS[model_type])(hf_config)
    return model.to(torch_dtype).train()


def hf_config_of(spec):
    """``(Hugging Face config, ModelConfig or None, display name)`` for any accepted description."""
    import transformers

    if isinstance(spec, transformers.PretrainedConfig):
        return spec, _model_config_of(spec.to_dict()), getattr(spec, "model_type", "hf-model")
    if isinstance(spec, ModelConfig):
        return to_hf_config(spec), spec, spec.name
    if isinstance(spec, dict):
        return _from_dict(spec), _model_config_of(spec), spec.get("model_type", "hf-model")
    if isinstance(spec, (str, Path)):
        key = ALIASES.get(str(spec), str(spec))
        if key in PRESETS:
            return to_hf_config(PRESETS[key]), PRESETS[key], key
        data, label = _read_json(Path(spec))
        return _from_dict(data), _model_config_of(data), label
    raise PlanError(f"capture_hf cannot read a {type(spec).__name__}; give a transformers config, a config.json "
                    "dict or path, a preset name, a ModelConfig, or 'package.module:factory'")


def _read_json(path: Path):
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        raise PlanError(f"unknown model {str(path)!r}: not a preset, a config.json, or a 'module:factory'."
                        + did_you_mean(str(path), PRESETS))
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise PlanError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise PlanError(f"{path}: expected a JSON object")
    return data, path.parent.name if path.stem == "config" else path.stem


def _from_dict(data: dict):
    import transformers

    model_type = data.get("model_type") or ("gpt2" if "n_embd" in data else
                                            "mixtral" if (data.get("num_local_experts") or 1) > 1 else "llama")
    if model_type not in _CONFIGS:
        raise PlanError(f"config.json model_type {model_type!r} is not supported by capture_hf; use one of "
                        f"{', '.join(_CONFIGS)}")
    return getattr(transformers, _CONFIGS[model_type]).from_dict(data)


def _model_config_of(data: dict) -> ModelConfig | None:
    try:
        return from_hf_dict(data, name=data.get("model_type", "hf-model"))
    except PlanError:
        return None


def _context(hf_config) -> int:
    return getattr(hf_config, "max_position_embeddings", None) or getattr(hf_config, "n_positions", 4096)


def to_hf_config(cfg: ModelConfig):
    """The Hugging Face config of a zoo model: GPT2Config, LlamaConfig, Qwen2Config (qkv_bias) or
    MixtralConfig (experts > 1). Features Hugging Face's classes lack raise a PlanError."""
    import transformers

    if cfg.lora_rank:
        raise PlanError(f"model {cfg.name}: capture_hf builds plain Hugging Face models and has no LoRA; "
                        "capture your PEFT-wrapped module with capture_module (frozen weights are kept frozen)")
    if cfg.family == "gpt":
        return _gpt2_config(cfg, transformers)
    lacking = [k for k in ("kv_latent", "qk_norm", "shared_ffn", "moe_layers", "window", "sinks", "doc_tokens")
               if getattr(cfg, k)]
    if lacking or (cfg.bias and cfg.is_moe):
        raise PlanError(f"model {cfg.name}: capture_hf translates zoo models to LLaMA, Qwen2, Mixtral or GPT-2 "
                        f"configs, which lack {', '.join(lacking or ['expert biases'])}; plan the builder's graph "
                        "instead (symtensor plan MODEL)")
    if cfg.mlp != "swiglu" or cfg.norm != "rmsnorm" or cfg.learned_pos:
        raise PlanError(f"model {cfg.name}: the LLaMA family in Hugging Face has SwiGLU, RMSNorm and RoPE; "
                        f"got mlp={cfg.mlp}, norm={cfg.norm}, learned_pos={cfg.learned_pos}")
    common = {"vocab_size": cfg.vocab, "hidden_size": cfg.hidden, "num_hidden_layers": cfg.layers,
                  "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads,
                  "max_position_embeddings": cfg.max_context, "tie_word_embeddings": cfg.tied, "attention_dropout": 0.0}
    if cfg.is_moe:
        if cfg.dense_layers:
            raise PlanError(f"model {cfg.name}: Mixtral has no dense layers; set dense_layers=0")
        return transformers.MixtralConfig(intermediate_size=cfg.moe_ffn, num_local_experts=cfg.experts,
                                          num_experts_per_tok=cfg.top_k, head_dim=cfg.head_dim, **common)
    if cfg.qkv_bias:
        hf = transformers.Qwen2Config(intermediate_size=cfg.ffn, **common)
        hf.head_dim = cfg.head_dim
        return hf
    return transformers.LlamaConfig(intermediate_size=cfg.ffn, head_dim=cfg.head_dim, attention_bias=cfg.bias,
                                    mlp_bias=cfg.bias, **common)


def _gpt2_config(cfg: ModelConfig, transformers):
    if cfg.mlp != "gelu" or cfg.norm != "layernorm" or not cfg.learned_pos or cfg.kv_heads != cfg.heads \
            or cfg.head_dim * cfg.heads != cfg.hidden:
        raise PlanError(f"model {cfg.name}: GPT-2 has GeLU, LayerNorm, learned positions and heads*head_dim == "
                        "hidden; change the model or capture your own module with capture_module")
    p = 0.1 if cfg.dropout else 0.0
    return transformers.GPT2Config(n_layer=cfg.layers, n_embd=cfg.hidden, n_head=cfg.heads, n_inner=cfg.ffn,
                                   vocab_size=cfg.vocab, n_positions=cfg.max_context, resid_pdrop=p, embd_pdrop=p,
                                   attn_pdrop=p, tie_word_embeddings=cfg.tied)


# -- plain PyTorch models -------------------------------------------------------------------------
def _is_factory(spec: str) -> bool:
    return bool(_FACTORY.fullmatch(spec)) and not Path(spec).exists()


def call_factory(spec: str):
    """Import ``package.module``, call ``factory()``: it must return ``(module, example_inputs)``."""
    module_name, attr = spec.split(":", 1)
    try:
        factory = importlib.import_module(module_name)
        for part in attr.split("."):
            factory = getattr(factory, part)
    except (ImportError, AttributeError) as exc:
        raise PlanError(f"{spec}: cannot import the factory ({exc}); give 'package.module:function' "
                        "importable from the current environment") from None
    result = factory()
    if not (isinstance(result, tuple) and len(result) == 2):
        raise PlanError(f"{spec}: the factory must return (module, example_inputs), got {type(result).__name__}")
    return result
