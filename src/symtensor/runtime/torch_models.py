"""A small LLaMA-style transformer and its Mixtral- and Qwen3-style MoE variants, in plain PyTorch.

Module names follow the planner's op names, so a RunSpec key maps to a module path:
``layers.{i}.attn.q_proj`` ... ``layers.{i}.mlp.down_proj``, ``layers.{i}.mlp.experts``, ``embed``,
``lm_head``. ``layers`` is a ModuleDict keyed by the layer index, so a pipeline stage that drops
layers keeps the others' names.

Shape suffixes: B batch, S sequence, H hidden, N heads, G kv heads, D head dim, F ffn, V vocab,
T tokens (B*S), E experts, C expert capacity (slots per expert), K top-k.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from symtensor.errors import PlanError

# what the runtime does not build, and the field that asks for it (0 / False / empty: absent)
UNSUPPORTED = {"kv_latent": "multi-head latent attention (MLA)", "shared_ffn": "shared experts",
               "window": "sliding-window attention", "sinks": "attention sinks",
               "doc_tokens": "packed documents (per-document attention)"}


def check_supported(cfg) -> None:
    """Refuse configs this model does not build: it is LLaMA-style (with Q/K norms, a head width
    of its own, and mixture-of-experts layers where the config puts them), without MLA, shared
    experts, sliding windows, sinks or packed documents.

    Args:
        cfg: a ``symtensor.models.ModelConfig``.
    """
    rules = {"family": "llama", "mlp": "swiglu", "norm": "rmsnorm", "tied": False, "bias": False,
             "qkv_bias": False, "learned_pos": False, "lora_rank": 0, "dropout": False}
    for key, want in rules.items():
        if getattr(cfg, key) != want:
            raise PlanError(f"model {cfg.name}: the runtime builds LLaMA-style models only and needs "
                            f"{key}={want!r}, got {getattr(cfg, key)!r}")
    for key, what in UNSUPPORTED.items():
        if getattr(cfg, key):
            raise PlanError(f"model {cfg.name}: the runtime does not build {what} ({key}={getattr(cfg, key)!r}); "
                            "run a model without it (tiny-llama, tiny-mixtral, tiny-qwen3-moe)")


class RMSNorm(nn.Module):
    """Root-mean-square norm, written out so that DTensor can shard it on the sequence."""

    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        return x_BSH * torch.rsqrt(x_BSH.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x_BSND: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (rotate-half form) over the sequence positions 0..S-1."""
    seq, dim = x_BSND.shape[1], x_BSND.shape[-1]
    device = x_BSND.device
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim)
    angles_SD = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv_freq).repeat(1, 2)
    cos, sin = angles_SD.cos()[:, None, :], angles_SD.sin()[:, None, :]
    x1, x2 = x_BSND.chunk(2, dim=-1)
    return x_BSND * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    """Causal grouped-query attention, with Qwen3's RMSNorm over each head of Q and K when the
    config has ``qk_norm``. Under tensor parallelism each rank sees only its heads: the head
    counts are read from the projections' local output width."""

    def __init__(self, cfg, use_rope: bool = True):
        super().__init__()
        self.head_dim, self.use_rope = cfg.head_dim, use_rope
        self.q_proj = nn.Linear(cfg.hidden, cfg.heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim) if cfg.qk_norm else None

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        b, s, _ = x_BSH.shape
        q_BSND = self.q_proj(x_BSH).view(b, s, -1, self.head_dim)
        k_BSGD = self.k_proj(x_BSH).view(b, s, -1, self.head_dim)
        v_BSGD = self.v_proj(x_BSH).view(b, s, -1, self.head_dim)
        if self.q_norm is not None:  # before the rotation, as Qwen3 does
            q_BSND, k_BSGD = self.q_norm(q_BSND), self.k_norm(k_BSGD)
        if self.use_rope:
            q_BSND, k_BSGD = rope(q_BSND), rope(k_BSGD)
        group = q_BSND.shape[2] // k_BSGD.shape[2]  # query heads per kv head
        k_BSND = k_BSGD.repeat_interleave(group, dim=2)
        v_BSND = v_BSGD.repeat_interleave(group, dim=2)
        o_BNSD = F.scaled_dot_product_attention(q_BSND.transpose(1, 2), k_BSND.transpose(1, 2),
                                                v_BSND.transpose(1, 2), is_causal=True)
        return self.o_proj(o_BNSD.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x_BSH)) * self.up_proj(x_BSH))


class LocalDispatch:
    """Expert dispatch when every expert lives on this rank: the identity."""

    def dispatch(self, x_ECH: torch.Tensor) -> torch.Tensor:
        return x_ECH

    def combine(self, y_ECH: torch.Tensor) -> torch.Tensor:
        return y_ECH


class Experts(nn.Module):
    """E SwiGLU experts as stacked weights, so expert parallelism is a cut of dim 0.

    The input is a slot buffer [E, C, H]: row c of expert e is the c-th token routed to e (zeros
    after the last one). A dispatcher may move slots to the rank owning the expert and back
    (``symtensor.runtime.apply.AllToAllDispatch``); the weights then hold that rank's experts only.
    """

    def __init__(self, experts: int, hidden: int, ffn: int):
        super().__init__()
        self.w_gate = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.w_up = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.w_down = nn.Parameter(torch.empty(experts, ffn, hidden))
        self.dispatcher = LocalDispatch()

    def set_dispatcher(self, dispatcher, first: int, count: int) -> None:
        """Keep experts [first, first + count) and route slots through ``dispatcher``.

        Args:
            dispatcher: an object with ``dispatch`` and ``combine`` (see LocalDispatch).
            first: index of this rank's first expert.
            count: experts on this rank.
        """
        for name in ("w_gate", "w_up", "w_down"):
            full = getattr(self, name)
            setattr(self, name, nn.Parameter(full.detach()[first:first + count].clone()))
        self.dispatcher = dispatcher

    def forward(self, x_ECH: torch.Tensor) -> torch.Tensor:
        x_eCH = self.dispatcher.dispatch(x_ECH)  # e: experts on this rank, C: slots from all ranks
        h_eCF = F.silu(torch.bmm(x_eCH, self.w_gate)) * torch.bmm(x_eCH, self.w_up)
        return self.dispatcher.combine(torch.bmm(h_eCF, self.w_down))


class MoE(nn.Module):
    """Mixtral-style mixture of experts: top-k routing, softmax over the k chosen logits.

    Capacity is the number of tokens on this rank (C = T), so no token is ever dropped and the
    slot buffer, and hence every all-to-all, has a static size E * T * H.
    """

    def __init__(self, cfg):
        super().__init__()
        self.top_k = cfg.top_k
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.experts = Experts(cfg.experts, cfg.hidden, cfg.moe_ffn)

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        b, s, h = x_BSH.shape
        x_TH = x_BSH.reshape(-1, h)
        tokens, experts = x_TH.shape[0], self.router.out_features
        top_TK, expert_TK = self.router(x_TH).topk(self.top_k, dim=-1)
        gate_TK = F.softmax(top_TK, dim=-1)
        # slot of each (token, choice): experts fill their slots in token order
        onehot_TKE = F.one_hot(expert_TK, experts)
        rank_in_expert = (onehot_TKE.flatten(0, 1).cumsum(0).view_as(onehot_TKE) - 1) * onehot_TKE
        slot_TK = expert_TK * tokens + rank_in_expert.sum(-1)
        token_TK = torch.arange(tokens, device=x_TH.device).unsqueeze(1).expand_as(slot_TK)
        x_slots = x_TH.new_zeros(experts * tokens, h).index_copy(0, slot_TK.flatten(), x_TH[token_TK.flatten()])
        y_slots = self.experts(x_slots.view(experts, tokens, h)).reshape(-1, h)
        y_TKH = y_slots[slot_TK.flatten()].view(tokens, self.top_k, h)
        return (y_TKH * gate_TK.unsqueeze(-1)).sum(1).view(b, s, h)


class Block(nn.Module):
    """Pre-norm transformer layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg, layer: int, use_rope: bool = True):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden)
        self.attn = Attention(cfg, use_rope)
        self.mlp_norm = RMSNorm(cfg.hidden)
        self.mlp = MoE(cfg) if cfg.is_moe_layer(layer) else MLP(cfg.hidden, cfg.ffn)

    def forward(self, x_BSH: torch.Tensor) -> torch.Tensor:
        x_BSH = x_BSH + self.attn(self.attn_norm(x_BSH))
        return x_BSH + self.mlp(self.mlp_norm(x_BSH))


class Transformer(nn.Module):
    """Embedding, layers, final norm, untied LM head. A pipeline stage sets the parts it does not
    own to None (``embed`` on later stages, ``norm`` and ``lm_head`` on earlier ones)."""

    def __init__(self, cfg, use_rope: bool = True):
        super().__init__()
        check_supported(cfg)
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleDict({str(i): Block(cfg, i, use_rope) for i in range(cfg.layers)})
        self.norm = RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids [B, S] (or hidden states [B, S, H] without ``embed``) -> logits [B, S, V]
        (or hidden states without ``lm_head``)."""
        x_BSH = self.embed(x) if self.embed is not None else x
        for layer in self.layers.values():
            x_BSH = layer(x_BSH)
        if self.norm is not None:
            x_BSH = self.norm(x_BSH)
        return self.lm_head(x_BSH) if self.lm_head is not None else x_BSH


def loss_fn(logits_BSV: torch.Tensor, labels_BS: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over all tokens."""
    return F.cross_entropy(logits_BSV.flatten(0, 1).float(), labels_BS.flatten())


def init_weights(model: nn.Module, seed: int) -> None:
    """Deterministic init: N(0, 1/fan_in) for linears and experts, N(0, 1) for the embedding,
    ones for norms, drawn in parameter-name order from a generator seeded with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):  # (the Q/K norms too)
                p.fill_(1.0)
            elif name == "embed.weight":
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-2] if p.dim() == 3 else p.shape[-1]  # experts [E, in, out], linear [out, in]
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)


def build_torch_model(cfg, seed: int = 0, use_rope: bool = True) -> Transformer:
    """The fp32 CPU model of ``cfg`` with deterministic weights.

    Args:
        cfg: a ``symtensor.models.ModelConfig`` (LLaMA-style or Mixtral-style).
        seed: weight seed; every rank builds the same weights from it.
        use_rope: rotary position embedding in attention.

    Example:
        >>> from symtensor.models import load_model_config
        >>> m = build_torch_model(load_model_config("tiny-llama"))
        >>> m(torch.zeros(2, 8, dtype=torch.long)).shape
        torch.Size([2, 8, 256])
    """
    model = Transformer(cfg, use_rope)
    init_weights(model, seed)
    return model
