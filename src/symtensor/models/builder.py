"""Build the training graph of a transformer for one micro-batch: GPT, LLaMA/Qwen2/Qwen3, MoE
(Mixtral, Qwen-MoE, DeepSeek-V3, GPT-OSS), LoRA.

Every layer's operators are in the graph (126 layers for LLaMA-3.1-405B), so per-layer plans stay
possible; identical layers share op signatures, which the cost model and search exploit.

Shapes (dim legend in ``symtensor.graph.ir``): activations are ``[b, s, h]``; Q is ``[b, s, n, d]``,
K/V ``[b, s, g, d]``; expert slots ``[e, b, c, h]`` with capacity ``c`` per sequence. MLA
(multi-head latent attention) adds ``l`` (a compressed width: ``q_latent`` or ``kv_latent``),
``k`` and ``j`` (the non-rotary and rotary parts of a query/key head, ``d = k + j``) and ``w`` (the
value head dim): K is ``[b, s, g, d]`` = ``[b, s, g, k]`` projected up per head from ``[b, s, l]``,
beside one ``[b, s, j]`` rotary key shared by every head; V and the output run over ``w``.

The MoE layer, as Megatron-LM's alltoall token dispatcher runs it: the router (a linear), top-k
with the score function (``softmax``, memory-bound), the permutation of the tokens into expert
slots (``moe_dispatch``, memory-bound), the experts' batched GEMMs, the weighted unpermutation
(``moe_combine``, memory-bound); the permuted buffers ``[e, b, c, h]`` / ``[e, b, c, f]`` are saved
for backward by the GEMMs and the activation that read them. A shared expert is a dense MLP beside.
"""

from __future__ import annotations

import math

from symtensor.errors import PlanError
from symtensor.graph import Graph, Op, Tensor
from symtensor.models.config import FUSED_LORA, ModelConfig
from symtensor.models.hf_config import load_model_config

# Megatron-LM pads the vocabulary to a multiple of 128 (--make-vocab-size-divisible-by) so that
# vocab-parallel cuts divide it; GPT-2's 50257 becomes 50304. Every other zoo vocabulary already is.
VOCAB_PAD = 128


def padded_vocab(vocab: int) -> int:
    return -(-vocab // VOCAB_PAD) * VOCAB_PAD


class _Builder:
    def __init__(self, cfg: ModelConfig, micro_batch: int, seq: int, dtype: str):
        self.stated_vocab = cfg.vocab
        if cfg.vocab >= VOCAB_PAD:
            cfg = cfg.replace(vocab=padded_vocab(cfg.vocab))
        self.cfg, self.b, self.s, self.dtype = cfg, micro_batch, seq, dtype
        self.shared_a: dict = {}  # (fused LoRA target, input tensor) -> the adapter's A output (linear)
        self.g = Graph(name=cfg.name, meta={"config": cfg, "micro_batch": micro_batch, "seq": seq,
                                            "layers": cfg.layers, "dtype": dtype, "inputs": ("ids", "labels")})
        self.layer, self.prefix = -1, "embed"

    # -- small constructors -----------------------------------------------------------------
    def act(self, name, shape, labels, dtype=None):
        return self.g.add_tensor(Tensor(name=f"{self.prefix}.{name}", shape=shape, labels=labels,
                                        dtype=dtype or self.dtype)).name

    def param(self, name, shape, labels, tie=None, adapter=False):
        """A weight; under LoRA only the adapters train, every base weight is frozen."""
        trainable = adapter or self.cfg.lora_rank == 0
        return self.g.add_tensor(Tensor(name=f"{self.prefix}.{name}", shape=shape, labels=labels, dtype=self.dtype,
                                        param=True, trainable=trainable, tie=tie)).name

    def op(self, name, kind, dims, inputs, in_dims, outputs, out_dims, **attrs):
        self.g.add_op(Op(name=f"{self.prefix}.{name}", kind=kind, dims=tuple(dims.items()), inputs=tuple(inputs),
                         outputs=tuple(outputs), in_dims=tuple(in_dims), out_dims=tuple(out_dims), layer=self.layer,
                         block=name if self.layer >= 0 else f"{self.prefix}.{name}",
                         attrs=tuple(sorted(attrs.items()))))
        return outputs[0]

    def linear(self, name, x, x_dims, out_dims, sizes, w_dims, target=None, bias=False):
        """Y = X . W; LoRA adds (X . A) . B when ``target`` is a LoRA target (W is then frozen). Under a fused
        target (``FUSED_LORA``: Megatron's linear_qkv and linear_fc1 adapters) the projections it fuses that read
        the same input share one A, each with its part of the one B."""
        cfg = self.cfg
        sizes = {d: sizes[d] for d in dict.fromkeys(x_dims + w_dims + out_dims)}
        fused = next((f for f, parts in FUSED_LORA.items() if target in parts and f in cfg.lora_targets), None)
        lora = cfg.lora_rank > 0 and (target in cfg.lora_targets or fused is not None)
        w = self.param(f"{name}.weight", tuple(sizes[d] for d in w_dims), w_dims)
        inputs, in_dims = [x, w], [x_dims, w_dims]
        if bias:
            bdims = tuple(d for d in out_dims if d in w_dims)
            inputs.append(self.param(f"{name}.bias", tuple(sizes[d] for d in bdims), bdims))
            in_dims.append(bdims)
        shape = tuple(sizes[d] for d in out_dims)
        y = self.act(f"{name}.base" if lora else name, shape, out_dims)
        # a frozen weight's backward needs no saved input (no dW), only dX
        frozen = cfg.lora_rank > 0
        self.op(name, "linear", sizes, inputs, in_dims, [y], [out_dims], **({"saves": ()} if frozen else {}))
        if not lora:
            return y
        r = cfg.lora_rank
        red = tuple(d for d in w_dims if d in x_dims)  # contracted dims (two for o_proj: n, d)
        keep = tuple(d for d in x_dims if d not in red)
        xa_dims = keep + ("r",)
        a_sizes = {d: sizes[d] for d in x_dims} | {"r": r}
        xa = self.shared_a.get((fused, x)) if fused else None
        if xa is None:
            a_name = f"{name.rpartition('.')[0]}.{fused}".lstrip(".") if fused else name  # (experts.fc1, qkv)
            a_w = self.param(f"{a_name}.lora_a.weight", tuple(sizes[d] for d in red) + (r,), red + ("r",),
                             adapter=True)
            xa = self.act(f"{a_name}.lora_a", tuple(a_sizes[d] for d in xa_dims), xa_dims)
            self.op(f"{a_name}.lora_a", "linear", a_sizes, [x, a_w], [x_dims, red + ("r",)], [xa], [xa_dims])
            if fused:
                self.shared_a[(fused, x)] = xa
        b_wdims = ("r",) + tuple(d for d in w_dims if d not in red)
        b_sizes = {d: sizes[d] for d in out_dims} | {"r": r}
        b_w = self.param(f"{name}.lora_b.weight", tuple(b_sizes[d] for d in b_wdims), b_wdims, adapter=True)
        xb = self.act(f"{name}.lora_b", shape, out_dims)
        self.op(f"{name}.lora_b", "linear", b_sizes, [xa, b_w], [xa_dims, b_wdims], [xb], [out_dims])
        return self.elementwise(f"{name}.lora_add", "add", [y, xb], out_dims, sizes, out_name=name)

    def elementwise(self, name, fn, inputs, dims, sizes, out_name=None, saves=(), in_dims=None, flops=1, **attrs):
        out = self.act(out_name or name, tuple(sizes[d] for d in dims), dims)
        in_dims = in_dims or [dims] * len(inputs)
        self.op(name, "elementwise", {d: sizes[d] for d in dict.fromkeys(sum(in_dims, ()) + dims)},
                inputs, in_dims, [out], [dims], fn=fn, saves=saves, flops_per_element=flops, **attrs)
        return out

    def dropout(self, name, x, dims, sizes):
        if not self.cfg.dropout:
            return x
        return self.elementwise(name, "dropout", [x], dims, sizes)

    def norm(self, name, x, sizes, dims=("b", "s", "h"), axis="h"):
        """The model's norm over ``axis`` of ``x`` (``dims``), with a weight (and a bias for LayerNorm)."""
        cfg = self.cfg
        inputs, in_dims = [x, self.param(f"{name}.weight", (sizes[axis],), (axis,))], [dims, (axis,)]
        if cfg.norm in ("layernorm", "layernorm1p"):
            inputs.append(self.param(f"{name}.bias", (sizes[axis],), (axis,)))
            in_dims.append((axis,))
        y = self.act(name, tuple(sizes[d] for d in dims), dims)
        return self.op(name, "norm", {d: sizes[d] for d in dims}, inputs, in_dims, [y], [dims], axis=axis, fn=cfg.norm)

    # -- blocks --------------------------------------------------------------------------------
    def embedding(self):
        cfg, b, s = self.cfg, self.b, self.s
        self.g.add_tensor(Tensor(name="ids", shape=(b, s), labels=("batch", "seq"), dtype="int64"))
        self.g.add_tensor(Tensor(name="labels", shape=(b, s), labels=("batch", "seq"), dtype="int64"))
        sizes = {"b": b, "s": s, "h": cfg.hidden, "v": cfg.vocab}
        table = self.param("word.weight", (cfg.vocab, cfg.hidden), ("v", "h"),
                           tie="word_embeddings" if cfg.tied else None)
        x = self.act("word", (b, s, cfg.hidden), ("b", "s", "h"))
        self.op("word", "embedding", sizes, ["ids", table], [("b", "s"), ("v", "h")], [x], [("b", "s", "h")])
        if cfg.learned_pos:
            if s > cfg.max_context:
                raise PlanError(f"model {cfg.name}: seq={s} exceeds its {cfg.max_context} learned positions; "
                                f"use --seq <= {cfg.max_context} or --set max_context={s}")
            # positions are looked up per sequence (b, s): the table's gradient then sums over the
            # batch like any weight's, synchronised once per step
            pos = self.param("pos.weight", (cfg.max_context, cfg.hidden), ("p", "h"))
            pe = self.act("pos", (b, s, cfg.hidden), ("b", "s", "h"))
            self.op("pos", "embedding", {"b": b, "s": s, "p": cfg.max_context, "h": cfg.hidden}, [pos],
                    [("p", "h")], [pe], [("b", "s", "h")], saves=())
            x = self.elementwise("add_pos", "add", [x, pe], ("b", "s", "h"), sizes)
        return self.dropout("dropout", x, ("b", "s", "h"), sizes)

    def attention(self, x, sizes):
        cfg = self.cfg
        bsh, bsnd = ("b", "s", "h"), ("b", "s", "n", "d")
        xn = self.norm("attn_norm", x, sizes)
        q, k, v = self.mla_qkv(xn, sizes) if cfg.kv_latent else self.qkv(xn, sizes)
        vd = "w" if cfg.kv_latent else "d"  # the value head dim
        o_dims = ("b", "s", "n", vd)
        if cfg.attention != "unfused":  # a fused kernel: one op, O(s) memory
            o = self.act("core", tuple(sizes[d] for d in o_dims), o_dims)
            inputs, in_dims = [q, k, v], [bsnd, ("b", "t", "g", "d"), ("b", "t", "g", vd)]
            if cfg.sinks:  # one learned logit per head joins each softmax row
                inputs.append(self.param("sinks", (cfg.heads,), ("n",)))
                in_dims.append(("n",))
            # the keys a query reaches: a sliding window, packed documents shorter than the sequence (doc_tokens)
            reach = {"window": cfg.window} if cfg.is_window_layer(self.layer) else {}
            if cfg.doc_tokens and cfg.doc_tokens < self.s:
                reach["document"] = cfg.doc_tokens
            # the engine's own kernel (flash) carries no attr: default graphs are unchanged
            kernel = {"kernel": cfg.attention} if cfg.attention != "flash" else {}
            core_dims = ("b", "s", "t", "n", "g", "d") + (("w",) if cfg.kv_latent else ())
            self.op("core", "attention", {k_: sizes[k_] for k_ in core_dims}, inputs, in_dims, [o], [o_dims],
                    causal=True, linked=(("n", "g"),), **reach, **kernel)
        else:
            o = self.unfused_core(q, k, v, sizes)
        y = self.linear("o_proj", o, o_dims, bsh, sizes, ("n", vd, "h"), "o", bias=cfg.bias)
        y = self.dropout("attn_out_dropout", y, bsh, sizes)
        return self.elementwise("attn_residual", "add", [x, y], bsh, sizes)

    def qkv(self, xn, sizes):
        """Q [b, s, n, d] and K, V [b, s, g, d] projected from the normed hidden state."""
        cfg = self.cfg
        bsh, bsnd, bsgd = ("b", "s", "h"), ("b", "s", "n", "d"), ("b", "s", "g", "d")
        qkv_bias = cfg.bias or cfg.qkv_bias
        q = self.linear("q_proj", xn, bsh, bsnd, sizes, ("h", "n", "d"), "q", bias=qkv_bias)
        k = self.linear("k_proj", xn, bsh, bsgd, sizes, ("h", "g", "d"), "k", bias=qkv_bias)
        v = self.linear("v_proj", xn, bsh, bsgd, sizes, ("h", "g", "d"), "v", bias=qkv_bias)
        if cfg.qk_norm:  # Qwen3: RMSNorm over each head of Q and K, before the rotation
            q = self.norm("q_norm", q, sizes, bsnd, "d")
            k = self.norm("k_norm", k, sizes, bsgd, "d")
        if not cfg.learned_pos:
            # rotary position embedding on Q and K (memory-bound elementwise; backward needs no input)
            q = self.elementwise("q_rope", "rope", [q], bsnd, sizes, flops=6)
            k = self.elementwise("k_rope", "rope", [k], bsgd, sizes, flops=6)
        return q, k, v

    def mla_qkv(self, xn, sizes):
        """Multi-head latent attention (DeepSeek-V2/V3): Q projected up from a q_latent-wide
        compression (or from hidden); K's non-rotary part and V projected up per head from one
        kv_latent-wide compression; K's rotary part one rope_dim-wide projection that every head
        shares, joined to each head's. The projections are plain linears: they cost as such."""
        cfg = self.cfg
        bsh, bsl, bsnd = ("b", "s", "h"), ("b", "s", "l"), ("b", "s", "n", "d")
        if cfg.q_latent:
            qsz = sizes | {"l": cfg.q_latent}
            cq = self.linear("q_down", xn, bsh, bsl, qsz, ("h", "l"))
            cq = self.norm("q_norm", cq, qsz, bsl, "l")
            q = self.linear("q_proj", cq, bsl, bsnd, qsz, ("l", "n", "d"), "q")
        else:
            q = self.linear("q_proj", xn, bsh, bsnd, sizes, ("h", "n", "d"), "q")
        q = self.elementwise("q_rope", "rope", [q], bsnd, sizes, flops=6)
        ksz = sizes | {"l": cfg.kv_latent, "k": cfg.head_dim - cfg.rope_dim, "j": cfg.rope_dim}
        ckv = self.linear("kv_down", xn, bsh, bsl, ksz, ("h", "l"))
        ckv = self.norm("kv_norm", ckv, ksz, bsl, "l")
        k_nope = self.linear("k_proj", ckv, bsl, ("b", "s", "g", "k"), ksz, ("l", "g", "k"), "k")
        v = self.linear("v_proj", ckv, bsl, ("b", "s", "g", "w"), ksz, ("l", "g", "w"), "v")
        k_pe = self.linear("k_rope_proj", xn, bsh, ("b", "s", "j"), ksz, ("h", "j"))
        k_pe = self.elementwise("k_rope", "rope", [k_pe], ("b", "s", "j"), ksz, flops=6)
        # a copy: no FLOPs, the bytes of its operands (memory-bound)
        k = self.elementwise("k_concat", "concat", [k_nope, k_pe], ("b", "s", "g", "d"), ksz,
                             in_dims=[("b", "s", "g", "k"), ("b", "s", "j")], flops=0)
        return q, k, v

    def unfused_core(self, q, k, v, sizes):
        """Scores, softmax (dropout) and context as separate ops: the 2022 Megatron graph."""
        cfg = self.cfg
        bsnd, bnst = ("b", "s", "n", "d"), ("b", "n", "s", "t")
        if cfg.kv_heads != cfg.heads:
            raise PlanError(f"model {cfg.name}: attention=unfused needs kv_heads == heads; use attention=flash")
        sc_sizes = {k_: sizes[k_] for k_ in ("b", "n", "s", "t", "d")}
        scores = self.act("scores", (self.b, cfg.heads, self.s, self.s), bnst)
        self.op("scores", "bmm", sc_sizes, [q, k], [bsnd, ("b", "t", "n", "d")], [scores], [bnst], core=True)
        probs = self.act("probs", (self.b, cfg.heads, self.s, self.s), bnst)
        self.op("softmax", "softmax", {k_: sizes[k_] for k_ in bnst}, [scores], [bnst], [probs], [bnst], axis="t",
                core=True)
        if cfg.dropout:
            probs = self.elementwise("attn_dropout", "dropout", [probs], bnst, sizes, core=True)
        o = self.act("core", (self.b, self.s, cfg.heads, cfg.head_dim), bsnd)
        self.op("context", "bmm", sc_sizes, [probs, v], [bnst, ("b", "t", "n", "d")], [o], [bsnd], core=True)
        return o

    def dense_mlp(self, x, sizes, prefix=""):
        """The MLP of a dense layer, or (``prefix`` ``shared_expert.``) an MoE layer's shared expert."""
        cfg = self.cfg
        bsh, bsf = ("b", "s", "h"), ("b", "s", "f")
        if cfg.mlp == "swiglu":
            gt = self.linear(f"{prefix}gate_proj", x, bsh, bsf, sizes, ("h", "f"), "gate", bias=cfg.bias)
            up = self.linear(f"{prefix}up_proj", x, bsh, bsf, sizes, ("h", "f"), "up", bias=cfg.bias)
            a = self.elementwise(f"{prefix}act", "swiglu", [gt, up], bsf, sizes, saves=("in0", "in1"), flops=4)
        else:
            a1 = self.linear(f"{prefix}up_proj", x, bsh, bsf, sizes, ("h", "f"), "up", bias=cfg.bias)
            a = self.elementwise(f"{prefix}act", cfg.mlp, [a1], bsf, sizes, saves=("in0",), flops=8)
        return self.linear(f"{prefix}down_proj", a, bsf, bsh, sizes, ("f", "h"), "down", bias=cfg.bias)

    def moe_mlp(self, x, sizes):
        cfg = self.cfg
        bsh, bse, ebch, ebcf = ("b", "s", "h"), ("b", "s", "e"), ("e", "b", "c", "h"), ("e", "b", "c", "f")
        logits = self.linear("router", x, bsh, bse, sizes, ("h", "e"), bias=cfg.bias)
        gates = self.act("gates", (self.b, self.s, cfg.experts), bse, dtype="fp32")
        self.op("topk", "softmax", {k_: sizes[k_] for k_ in bse}, [logits], [bse], [gates], [bse], axis="e")
        xe = self.act("dispatch", (cfg.experts, self.b, sizes["c"], cfg.hidden), ebch)
        # a cut of the token sequence s carries over to the capacity slots c (no pending sum)
        self.op("dispatch", "moe_dispatch", {k_: sizes[k_] for k_ in ("b", "s", "e", "c", "h")}, [x, gates],
                [bsh, bse], [xe], [ebch], carry=(("s", "c"),))
        esz = {k_: sizes[k_] for k_ in ("e", "b", "c", "h")} | {"f": cfg.moe_ffn}
        gt = self.linear("experts.gate_proj", xe, ebch, ebcf, esz, ("e", "h", "f"), "gate", bias=cfg.bias)
        up = self.linear("experts.up_proj", xe, ebch, ebcf, esz, ("e", "h", "f"), "up", bias=cfg.bias)
        a = self.elementwise("experts.act", "swiglu", [gt, up], ebcf, esz, saves=("in0", "in1"), flops=4)
        ye = self.linear("experts.down_proj", a, ebcf, ebch, esz, ("e", "f", "h"), "down", bias=cfg.bias)
        y = self.act("combine", (self.b, self.s, cfg.hidden), bsh)
        y = self.op("combine", "moe_combine", {k_: sizes[k_] for k_ in ("e", "b", "c", "s", "h")}, [ye, gates],
                    [ebch, bse], [y], [bsh], carry=(("c", "s"),))
        if not cfg.shared_ffn:
            return y
        ys = self.dense_mlp(x, sizes | {"f": cfg.shared_ffn}, prefix="shared_expert.")
        if cfg.shared_gate:  # Qwen2-MoE: sigmoid(x . w) scales the shared expert, per token
            g = self.linear("shared_expert_gate", x, bsh, ("b", "s"), sizes, ("h",))
            ys = self.elementwise("shared_expert_scale", "sigmoid_mul", [ys, g], bsh, sizes,
                                  in_dims=[bsh, ("b", "s")], saves=("in0", "in1"), flops=5)
        return self.elementwise("shared_expert_add", "add", [y, ys], bsh, sizes)

    def layer_block(self, i, x):
        cfg = self.cfg
        self.layer, self.prefix = i, f"layers.{i}"
        sizes = {"b": self.b, "s": self.s, "t": self.s, "h": cfg.hidden, "n": cfg.heads, "g": cfg.kv_heads,
                 "d": cfg.head_dim, "w": cfg.value_dim, "f": cfg.ffn, "e": cfg.experts,
                 "c": max(1, math.ceil(cfg.capacity_factor * cfg.top_k * self.s / cfg.experts))}
        x = self.attention(x, sizes)
        xn = self.norm("mlp_norm", x, sizes)
        y = self.moe_mlp(xn, sizes) if cfg.is_moe_layer(i) else self.dense_mlp(xn, sizes)
        y = self.dropout("mlp_dropout", y, ("b", "s", "h"), sizes)
        return self.elementwise("mlp_residual", "add", [x, y], ("b", "s", "h"), sizes)

    def head(self, x):
        cfg, b, s = self.cfg, self.b, self.s
        self.layer, self.prefix = cfg.layers, "head"
        sizes = {"b": b, "s": s, "h": cfg.hidden, "v": cfg.vocab}
        xf = self.norm("final_norm", x, sizes)
        w = self.param("lm_head.weight", (cfg.hidden, cfg.vocab), ("h", "v"),
                       tie="word_embeddings" if cfg.tied else None)
        logits = self.act("logits", (b, s, cfg.vocab), ("b", "s", "v"))
        # (the vocabulary the model states, where padding changed it: what an engine that does not pad runs)
        stated = {"stated_vocab": self.stated_vocab} if self.stated_vocab != cfg.vocab else {}
        self.op("lm_head", "linear", sizes, [xf, w], [("b", "s", "h"), ("h", "v")], [logits], [("b", "s", "v")],
                **stated)
        loss = self.act("loss", (b, s), ("b", "s"), dtype="fp32")
        self.op("loss", "cross_entropy", {"b": b, "s": s, "v": cfg.vocab}, [logits, "labels"],
                [("b", "s", "v"), ("b", "s")], [loss], [("b", "s")])


def layer_runs(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(first layer, run length) of each run of identical layers; the first and the last layer are
    runs of their own (they meet the embedding and the LM head), dense and MoE layers differ, and
    so do windowed and full attention."""
    def kind(i):
        return (i == 0, i == cfg.layers - 1, cfg.is_moe_layer(i), cfg.is_window_layer(i))

    runs: list[tuple[int, int]] = []
    for i in range(cfg.layers):
        if runs and kind(i) == kind(runs[-1][0]):
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def build_graph(cfg: ModelConfig, micro_batch: int = 1, seq: int | None = None, dtype: str = "bf16",
                validate: bool = True, skeleton: bool = False) -> Graph:
    """The forward graph of one micro-batch; backward and optimizer are implied.

    Args:
        cfg: the model.
        micro_batch: sequences per micro-batch.
        seq: tokens per sequence (default: the model's ``max_context`` capped at 4096).
        dtype: activation and parameter dtype.
        skeleton: build one layer per run of identical layers (``layer_runs``) and record the run
            lengths in ``meta["repeat"]``; the cost model expands them, so a 126-layer model costs
            like 3 layers. The full graph (the default) has every layer's operators.

    Example:
        >>> from symtensor.models import PRESETS
        >>> g = build_graph(PRESETS["tiny-llama"], micro_batch=2, seq=16)
        >>> len([op for op in g.ops if op.kind == "attention"])
        2
    """
    seq = seq or min(cfg.max_context, 4096)
    for key, value in (("micro_batch", micro_batch), ("seq", seq)):
        if not isinstance(value, int) or value <= 0:
            raise PlanError(f"{key} must be a positive integer, got {value!r}")
    builder = _Builder(cfg, micro_batch, seq, dtype)
    x = builder.embedding()
    runs = layer_runs(cfg) if skeleton else [(i, 1) for i in range(cfg.layers)]
    for first, _ in runs:
        x = builder.layer_block(first, x)
    builder.head(x)
    builder.g.meta["repeat"] = {first: n for first, n in runs}
    return builder.g.validate() if validate else builder.g


def build_model(spec, micro_batch: int = 1, seq: int | None = None, overrides=None, **kw) -> Graph:
    """Build a graph from a preset name or config.json path (see ``load_model_config``)."""
    return build_graph(load_model_config(spec, overrides), micro_batch=micro_batch, seq=seq, **kw)


def params_active(cfg: ModelConfig, graph: Graph) -> int:
    """Parameters a token passes through: for MoE, top_k of the routed experts of each MoE layer
    (shared experts and routers count whole), and the input embedding table unless the model's
    publisher leaves it out (``cfg.active_with_embedding``; a tied table stays: it is the LM head)."""
    total = graph.params_total()
    if not cfg.is_moe:
        return total
    expert = sum(t.numel for t in graph.params() if ".experts." in t.name)
    active = total - expert + expert * cfg.top_k // cfg.experts
    table = graph.tensors["embed.word.weight"]
    return active if cfg.active_with_embedding or table.tie else active - table.numel
