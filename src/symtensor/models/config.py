"""Model descriptions: the zoo of real models and overrides (config.json loading: ``hf_config``).

Dimensions come from ../shared/data/model_configs.csv (which cites NVIDIA NeMo's configs, the
Hugging Face config.json files and the model papers); each preset repeats its source.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from symtensor.errors import PlanError, did_you_mean
from symtensor.validate import MAX_SEQ, MAX_WIDTH, integer, model_config

# The attention kernels a run may name (``ModelConfig.attention``, ``--set attention=...``). Every
# fused one is one ``attention`` op with O(s) memory; ``cost.efficiency.ATTENTION_KERNELS`` prices
# the named ones against FlashAttention-2.
ATTENTION = {
    "flash": "the engine's fused kernel: Transformer Engine's (megatron), PyTorch SDPA's FlashAttention-2 "
             "(fsdp2, deepspeed)",
    "flash2": "FlashAttention-2 (flash-attn >= 2.0, PyTorch SDPA's flash backend), whatever the engine",
    "flash1": "FlashAttention v1 or its Triton port (llm-foundry's attn_impl: triton)",
    "unfused": "scores and probabilities materialised: bmm, softmax, bmm (2022 Megatron)",
}
FUSED_ATTENTION = tuple(k for k in ATTENTION if k != "unfused")


# LoRA targets that fuse projections as Megatron's modules do (one adapter on linear_qkv, one on linear_fc1:
# NVIDIA-NeMo/Megatron-Bridge@067f987df src/megatron/bridge/peft/lora.py target_modules, default linear_qkv,
# linear_proj, linear_fc1, linear_fc2 = qkv, o, fc1, down here): one A over the shared input, B the fused width
FUSED_LORA = {"qkv": ("q", "k", "v"), "fc1": ("gate", "up")}
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # each its own adapter, as Hugging Face PEFT adds them


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
        moe_layers: the MoE layers when not every layer from ``dense_layers`` on is one (Qwen's
            ``decoder_sparse_step`` and ``mlp_only_layers``); empty: all of them.
        shared_ffn: MLP width of the shared expert every token passes through in an MoE layer
            (DeepSeek: n_shared_experts * moe_ffn; Qwen2-MoE); 0: none.
        shared_gate: the shared expert's output is scaled by a learned sigmoid gate (Qwen2-MoE).
        mlp: ``swiglu`` (3 matrices), ``gelu`` or ``relu2`` (2 matrices).
        norm: ``rmsnorm``, ``layernorm`` or ``layernorm1p`` (LayerNorm with a zero-centred gamma, weight + 1:
            Megatron's --apply-layernorm-1p, Nemotron; the same bytes and FLOPs as ``layernorm``).
        tied: input embedding and LM head share one table.
        learned_pos: learned position embeddings (GPT) instead of RoPE.
        rotary_percent: the fraction of each head RoPE rotates (Megatron's --rotary-percent; Nemotron-4: 0.5).
            Costed over the whole head: Megatron and Transformer Engine's fused RoPE read and write the whole
            head and copy the unrotated part (Megatron-LM@d98e8a64dd rope_utils.py, TransformerEngine@d0067d0da
            fused_rope.cu), so only the rotation's few FLOPs on that part are overcounted.
        bias: biases on every attention and MLP linear (GPT; GPT-OSS's attention, router and
            experts); ``qkv_bias`` only on Q/K/V (Qwen2).
        qk_norm: RMSNorm over the head dim of Q and K (Qwen3).
        kv_latent: multi-head latent attention (MLA, DeepSeek-V2/V3): K and V are projected up from
            a ``kv_latent``-wide compression of the hidden state; 0: plain attention.
        q_latent: MLA only: Q too is projected up from a ``q_latent``-wide compression; 0: from hidden.
        rope_dim: MLA only: the rotary part of each query/key head (``head_dim`` counts it), whose
            key part is one ``rope_dim``-wide projection shared by every head.
        v_head_dim: MLA only: per-head width of V and of the attention output; 0: ``head_dim``
            (``value_dim`` reads it).
        window: sliding-window attention: each query attends to at most ``window`` keys; 0: none.
        window_layers: the layers with the window (GPT-OSS: every other); empty: all of them.
        sinks: attention sinks, a learned logit per head added to each softmax (GPT-OSS).
        attention: the attention kernel of the run's software stack, one of ``ATTENTION``: a fused
            kernel (``flash``, ``flash2``, ``flash1``: O(s) memory, one ``attention`` op whose
            ``kernel`` attr the cost model prices) or ``unfused`` (scores materialised, 2022 Megatron).
        dropout: dropout after attention probabilities, attention output and MLP output.
        lora_rank: LoRA rank (0 = full training); base weights are then frozen.
        doc_tokens: packed sequences (SFT and LoRA datasets packed to the sequence length): each query attends
            only within its document, as the engines' variable-length fused kernels run it (Transformer
            Engine's THD format with cu_seqlens in Megatron-Bridge and NeMo's packed_sequence_specs,
            FlashAttention's varlen, torchtitan's block-causal FlexAttention), so the fused attention costs
            documents of ``doc_tokens``, not the whole sequence. Documents of equal length; for lengths that
            vary give the length-weighted mean sum(d^2) / sum(d), which the attention's work follows. 0: one
            document per sequence (pre-training). Not with unfused attention (its score matrices are the
            whole sequence's, masked).
        lora_targets: projections that get LoRA adapters (q, k, v, o, gate, up, down), each its own as Hugging Face
            PEFT adds them; ``qkv`` and ``fc1``: one adapter on the fused Q/K/V and gate/up projections, as Megatron
            adds them to linear_qkv and linear_fc1 (Megatron-Bridge's default targets are qkv, o, fc1, down; NeMo
            1.x's attention_qkv is qkv).
        active_with_embedding: the input embedding table counts among the active parameters, as
            Mistral and Qwen count them; DeepSeek and OpenAI leave it out (a lookup, no matmul).
            Changes no graph, only ``params_active``.
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
    moe_layers: tuple[int, ...] = ()
    shared_ffn: int = 0
    shared_gate: bool = False
    capacity_factor: float = 1.0
    mlp: str = "swiglu"
    norm: str = "rmsnorm"
    tied: bool = False
    learned_pos: bool = False
    rotary_percent: float = 1.0
    bias: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    kv_latent: int = 0
    q_latent: int = 0
    rope_dim: int = 0
    v_head_dim: int = 0
    window: int = 0
    window_layers: tuple[int, ...] = ()
    sinks: bool = False
    attention: str = "flash"
    dropout: bool = False
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("q", "k", "v", "o")
    doc_tokens: int = 0
    active_with_embedding: bool = field(default=True, compare=False)
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
        if not (isinstance(self.rotary_percent, (int, float)) and 0 < self.rotary_percent <= 1):
            raise PlanError(f"model {self.name}: rotary_percent must be in (0, 1], got {self.rotary_percent!r}")
        if self.learned_pos and self.rotary_percent != 1:
            raise PlanError(f"model {self.name}: rotary_percent applies to RoPE; a model with learned_pos has none")
        choices = {"family": ("gpt", "llama"), "mlp": ("swiglu", "gelu", "relu2"),
                   "norm": ("rmsnorm", "layernorm", "layernorm1p"), "attention": tuple(ATTENTION)}
        for key, valid in choices.items():
            if getattr(self, key) not in valid:
                raise PlanError(f"model {self.name}: {key}={getattr(self, key)!r}; use one of {', '.join(valid)}")
        bad = set(self.lora_targets) - set(LORA_TARGETS) - set(FUSED_LORA)
        if bad:
            raise PlanError(f"model {self.name}: unknown lora target(s) {sorted(bad)}; use {', '.join(LORA_TARGETS)} "
                            f"(or {', '.join(FUSED_LORA)}: one adapter on the fused projections)")
        for fused, parts in FUSED_LORA.items():
            both = [t for t in parts if t in self.lora_targets]
            if fused in self.lora_targets and both:
                raise PlanError(f"model {self.name}: lora target {fused} is one adapter on {', '.join(parts)} "
                                f"together; list it or {', '.join(both)}, not both")
        if "qkv" in self.lora_targets and self.kv_latent:
            raise PlanError(f"model {self.name}: lora target qkv is one adapter on Q, K and V projected from one "
                            "input; multi-head latent attention projects them from different ones: list q, k, v")
        self._validate_moe()
        self._validate_attention()

    def _validate_moe(self) -> None:
        where = f"model {self.name}"
        integer(self.shared_ffn, f"{where}: shared_ffn", lo=0, hi=MAX_WIDTH)
        _layer_list(self.moe_layers, f"{where}: moe_layers", self.dense_layers, self.layers)
        if not self.is_moe and (self.moe_layers or self.shared_ffn):
            raise PlanError(f"{where}: moe_layers and shared_ffn need experts > 1, got experts={self.experts}")
        if self.shared_gate and not self.shared_ffn:
            raise PlanError(f"{where}: shared_gate gates the shared expert; set shared_ffn too")

    def _validate_attention(self) -> None:
        where = f"model {self.name}"
        for key, hi in (("kv_latent", MAX_WIDTH), ("q_latent", MAX_WIDTH), ("rope_dim", MAX_WIDTH),
                        ("v_head_dim", MAX_WIDTH), ("window", MAX_SEQ), ("doc_tokens", MAX_SEQ)):
            integer(getattr(self, key), f"{where}: {key}", lo=0, hi=hi)
        _layer_list(self.window_layers, f"{where}: window_layers", 0, self.layers)
        if self.window_layers and not self.window:
            raise PlanError(f"{where}: window_layers needs window > 0 (the keys each query attends to)")
        if self.kv_latent:
            if self.kv_heads != self.heads:
                raise PlanError(f"{where}: MLA (kv_latent > 0) projects K and V per head: kv_heads must equal heads "
                                f"({self.heads}), got {self.kv_heads}")
            if not 0 < self.rope_dim < self.head_dim:
                raise PlanError(f"{where}: MLA needs 0 < rope_dim < head_dim (head_dim = the non-rotary part + "
                                f"rope_dim), got rope_dim={self.rope_dim}, head_dim={self.head_dim}")
        elif self.q_latent or self.rope_dim or self.value_dim != self.head_dim:
            raise PlanError(f"{where}: q_latent, rope_dim and v_head_dim != head_dim describe MLA; set kv_latent too")
        fused = ("kv_latent", "window", "sinks", "doc_tokens")
        if self.attention == "unfused" and any(getattr(self, k) for k in fused):
            raise PlanError(f"{where}: attention=unfused is the 2022 Megatron graph of plain attention; "
                            f"{', '.join(k for k in fused if getattr(self, k))} need attention=flash "
                            f"(or another fused kernel: {', '.join(FUSED_ATTENTION[1:])})")

    @property
    def value_dim(self) -> int:
        """Per-head width of V and of the attention output."""
        return self.v_head_dim or self.head_dim

    def is_moe_layer(self, i: int) -> bool:
        """Layer ``i`` has routed experts (otherwise a dense MLP)."""
        return self.is_moe and i >= self.dense_layers and (not self.moe_layers or i in self.moe_layers)

    def is_window_layer(self, i: int) -> bool:
        """Layer ``i`` attends through the sliding window."""
        return bool(self.window) and (not self.window_layers or i in self.window_layers)

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)


def _layer_list(layers, what: str, lo: int, hi: int) -> None:
    """A tuple of distinct layer indices in [lo, hi)."""
    if not isinstance(layers, tuple):
        raise PlanError(f"{what} must be a tuple of layer indices, got {type(layers).__name__}")
    for i in layers:
        integer(i, what, lo=lo, hi=hi - 1, fix=f"; list layers in [{lo}, {hi - 1}]")
    if len(set(layers)) != len(layers):
        raise PlanError(f"{what} lists a layer twice: {layers}")


_NEMO = "NVIDIA NeMo llama.py configs mirroring HF config.json (shared/data/model_configs.csv)"
_GPT3 = "GPT-3 paper (Brown et al. 2020) Table 2.1 (shared/data/model_configs.csv)"
_KORTH = "Korthikanti et al. 2022 (arXiv:2205.05198) Table 3 (shared/data/calibration.csv)"
_QWEN3 = "Qwen3-MoE HF config.json (shared/data/model_configs.csv)"
_NEMO2 = "NVIDIA/NeMo@8cfedd720346"


def _nemotron4(size: str, cls: str, **dims) -> ModelConfig:
    """Nemotron-4 as NeMo 2 states it (the comment above its presets says what is costed how)."""
    source = (f"{_NEMO2}:nemo/collections/llm/gpt/model/nemotron.py {cls} (NemotronConfig: LayerNorm, squared_relu, "
              "add_bias_linear False, untied, rotary_percent 0.5, zero-centred gamma); vocabulary 256000 as "
              f"{_NEMO2}:scripts/performance/llm/pretrain_nemotron4_{size}.py states (NullTokenizer vocab_size); "
              f"the same dimensions in NVIDIA/dgxc-benchmarking@35a9aec:nemotron/nemotron4-{size}-synth.yaml")
    return ModelConfig(name=f"nemotron4-{size}", vocab=256000, mlp="relu2", norm="layernorm1p", rotary_percent=0.5,
                       max_context=4096, source=source, **dims)


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
    # every layer MoE; Q/K norms; head_dim 128 != hidden / heads; ffn is per expert
    ModelConfig(name="qwen3-30b-a3b", layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, ffn=768,
                vocab=151936, experts=128, top_k=8, qk_norm=True, max_context=40960, source=_QWEN3),
    ModelConfig(name="qwen3-235b-a22b", layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128, ffn=1536,
                vocab=151936, experts=128, top_k=8, qk_norm=True, max_context=40960, source=_QWEN3),
    # MLA (head_dim 192 = 128 + 64 rotary, V 128); 3 dense layers, then 256 routed experts + 1 shared.
    # The main model: the multi-token-prediction module (num_nextn_predict_layers=1) is left out,
    # as in the published 671B; "37B activated" leaves the input embedding out
    ModelConfig(name="deepseek-v3", layers=61, hidden=7168, heads=128, head_dim=192, v_head_dim=128, rope_dim=64,
                q_latent=1536, kv_latent=512, ffn=18432, moe_ffn=2048, shared_ffn=2048, dense_layers=3,
                experts=256, top_k=8, vocab=129280, max_context=163840, active_with_embedding=False,
                source="DeepSeek-V3 HF config.json; DeepSeek-V3 report arXiv:2412.19437 "
                       "(shared/data/model_configs.csv)"),
    # DeepSeek-V3's architecture (model_type kimi_k2) with 384 routed experts, 64 heads and 1 dense layer, no
    # multi-token-prediction module; the model card's "1T total, 32B activated" (1,026.4B and 31.7B here, the
    # input embedding left out of the active count as for DeepSeek-V3)
    ModelConfig(name="kimi-k2", layers=61, hidden=7168, heads=64, head_dim=192, v_head_dim=128, rope_dim=64,
                q_latent=1536, kv_latent=512, ffn=18432, moe_ffn=2048, shared_ffn=2048, dense_layers=1,
                experts=384, top_k=8, vocab=163840, max_context=131072, active_with_embedding=False,
                source="moonshotai/Kimi-K2-Instruct config.json (hidden 7168, 61 layers, 64 heads, q/kv LoRA ranks "
                       "1536/512, qk 128+64, v 128, 384 experts top-8 + 1 shared of 2048, first_k_dense_replace 1, "
                       "vocab 163840); Kimi K2 model card"),
    # a 128-token window on every other layer (from layer 0), attention sinks, biases on attention,
    # router and experts; OpenAI's "5.1B active" leaves the input embedding out
    ModelConfig(name="gpt-oss-120b", layers=36, hidden=2880, heads=64, kv_heads=8, head_dim=64, ffn=2880,
                vocab=201088, experts=128, top_k=4, bias=True, sinks=True, window=128,
                window_layers=tuple(range(0, 36, 2)), max_context=131072, active_with_embedding=False,
                source="gpt-oss HF config.json; OpenAI gpt-oss model card (shared/data/model_configs.csv)"),
    # the same architecture at 24 layers and 32 experts (OpenAI's "21B total, 3.6B active")
    ModelConfig(name="gpt-oss-20b", layers=24, hidden=2880, heads=64, kv_heads=8, head_dim=64, ffn=2880,
                vocab=201088, experts=32, top_k=4, bias=True, sinks=True, window=128,
                window_layers=tuple(range(0, 24, 2)), max_context=131072, active_with_embedding=False,
                source="NVIDIA/NeMo nemo/collections/llm/gpt/model/gpt_oss.py GPTOSSConfig20B (GPTOSSConfig with "
                       "num_layers 24, num_moe_experts 32)"),
    # Nemotron-4: squared-ReLU MLP (2 matrices), LayerNorm with weight and bias and a zero-centred gamma
    # (layernorm1p, the same cost), no linear biases, untied embeddings, 8 query groups, vocabulary 256,000, sequence
    # 4096; 340B's head_dim 18432 / 96 = 192, as the Nemotron-4 340B row of shared/data/model_configs.csv states.
    # RoPE turns half of each head (rotary_percent 0.5), costed over the whole head (q_rope/k_rope, memory-bound
    # elementwise ops): Megatron rotates the first half and concatenates the rest back (NVIDIA/Megatron-LM@d98e8a64dd
    # megatron/core/models/common/embeddings/rope_utils.py), the fused kernel NeMo runs (apply_rope_fusion) copies it
    # ("copy the rest": NVIDIA/TransformerEngine@d0067d0da transformer_engine/common/fused_rope/fused_rope.cu): the
    # whole head is read and written either way, only the elementwise FLOPs on the unrotated half are counted in
    # excess
    _nemotron4("15b", "Nemotron4Config15B", layers=32, hidden=6144, heads=48, kv_heads=8, ffn=24576),
    _nemotron4("340b", "Nemotron4Config340B", layers=96, hidden=18432, heads=96, kv_heads=8, ffn=73728),
    ModelConfig(name="tiny-llama", layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, max_context=128,
                source="debug model for end-to-end runs on CPU"),
    ModelConfig(name="tiny-mixtral", layers=2, hidden=64, heads=4, kv_heads=2, ffn=96, vocab=256, experts=4, top_k=2,
                max_context=128, source="debug model for end-to-end runs on CPU"),
    # Qwen3-MoE's shape in small: every layer MoE, Q/K norms, head_dim != hidden / heads
    ModelConfig(name="tiny-qwen3-moe", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=32, ffn=32, vocab=256,
                experts=8, top_k=2, qk_norm=True, max_context=128, source="debug model for end-to-end runs on CPU"),
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
            items = tuple(x.strip() for x in raw.split(",") if x.strip())
            return tuple(int(x) for x in items) if fields[key].type == "tuple[int, ...]" else items
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
    if isinstance(changes.get("layers"), int):
        changes.update(_cut_layer_lists(cfg, changes))
    return cfg.replace(**changes)


def _cut_layer_lists(cfg: ModelConfig, changes: dict) -> dict:
    """``--set layers=N``: a model cut to its first N layers keeps their MoE and window pattern."""
    depth, kept = changes["layers"], {}
    for key in ("moe_layers", "window_layers"):
        listed = getattr(cfg, key)
        cut = tuple(i for i in listed if i < depth)
        if key in changes or cut == listed:
            continue
        if not cut:  # an empty list means every layer
            raise PlanError(f"--set layers={depth}: none of {key} {listed} is below {depth}; set {key} too")
        kept[key] = cut
    return kept
