"""Build the training graph of a transformer (GPT, LLaMA/Qwen2, Mixtral MoE, LoRA) for one micro-batch.

Every layer's operators are in the graph (126 layers for LLaMA-3.1-405B), so per-layer plans stay
possible; identical layers share op signatures, which the cost model and search exploit.

Shapes (dim legend in ``symtensor.graph.ir``): activations are ``[b, s, h]``; Q is ``[b, s, n, d]``,
K/V ``[b, s, g, d]``; expert slots ``[e, b, c, h]`` with capacity ``c`` per sequence.
"""

from __future__ import annotations

import math

from symtensor.errors import PlanError
from symtensor.graph import Graph, Op, Tensor
from symtensor.models.config import ModelConfig, load_model_config


# Megatron-LM pads the vocabulary to a multiple of 128 (--make-vocab-size-divisible-by) so that
# vocab-parallel cuts divide it; GPT-2's 50257 becomes 50304. Every other zoo vocabulary already is.
VOCAB_PAD = 128


def padded_vocab(vocab: int) -> int:
    return -(-vocab // VOCAB_PAD) * VOCAB_PAD


class _Builder:
    def __init__(self, cfg: ModelConfig, micro_batch: int, seq: int, dtype: str):
        if cfg.vocab >= VOCAB_PAD:
            cfg = cfg.replace(vocab=padded_vocab(cfg.vocab))
        self.cfg, self.b, self.s, self.dtype = cfg, micro_batch, seq, dtype
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
        """Y = X . W; LoRA adds (X . A) . B when ``target`` is a LoRA target (W is then frozen)."""
        cfg = self.cfg
        sizes = {d: sizes[d] for d in dict.fromkeys(x_dims + w_dims + out_dims)}
        lora = cfg.lora_rank > 0 and target in cfg.lora_targets
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
        a_w = self.param(f"{name}.lora_a.weight", tuple(sizes[d] for d in red) + (r,), red + ("r",), adapter=True)
        xa = self.act(f"{name}.lora_a", tuple(a_sizes[d] for d in xa_dims), xa_dims)
        self.op(f"{name}.lora_a", "linear", a_sizes, [x, a_w], [x_dims, red + ("r",)], [xa], [xa_dims])
        b_wdims = ("r",) + tuple(d for d in w_dims if d not in red)
        b_sizes = {d: sizes[d] for d in out_dims} | {"r": r}
        b_w = self.param(f"{name}.lora_b.weight", tuple(b_sizes[d] for d in b_wdims), b_wdims, adapter=True)
        xb = self.act(f"{name}.lora_b", shape, out_dims)
        self.op(f"{name}.lora_b", "linear", b_sizes, [xa, b_w], [xa_dims, b_wdims], [xb], [out_dims])
        return self.elementwise(f"{name}.lora_add", "add", [y, xb], out_dims, sizes, out_name=name)

    def elementwise(self, name, fn, inputs, dims, sizes, out_name=None, saves=(), in_dims=None, flops=1, **attrs):
        out = self.act(out_name or name, tuple(sizes[d] for d in dims), dims)
        self.op(name, "elementwise", {d: sizes[d] for d in dict.fromkeys(sum(in_dims or [dims] * len(inputs), ()))},
                inputs, in_dims or [dims] * len(inputs), [out], [dims], fn=fn, saves=saves,
                flops_per_element=flops, **attrs)
        return out

    def dropout(self, name, x, dims, sizes):
        if not self.cfg.dropout:
            return x
        return self.elementwise(name, "dropout", [x], dims, sizes)

    def norm(self, name, x, sizes):
        cfg = self.cfg
        bsh = ("b", "s", "h")
        inputs, in_dims = [x, self.param(f"{name}.weight", (cfg.hidden,), ("h",))], [bsh, ("h",)]
        if cfg.norm == "layernorm":
            inputs.append(self.param(f"{name}.bias", (cfg.hidden,), ("h",)))
            in_dims.append(("h",))
        y = self.act(name, (self.b, self.s, cfg.hidden), bsh)
        return self.op(name, "norm", {d: sizes[d] for d in bsh}, inputs, in_dims, [y], [bsh], axis="h", fn=cfg.norm)

    # -- blocks --------------------------------------------------------------------------------
    def embedding(self):
        cfg, b, s = self.cfg, self.b, self.s
        self.g.add_tensor(Tensor(name="ids", shape=(b, s), labels=("batch", "seq"), dtype="int64"))
        self.g.add_tensor(Tensor(name="labels", shape=(b, s), labels=("batch", "seq"), dtype="int64"))
        sizes = {"b": b, "s": s, "h": cfg.hidden, "v": cfg.vocab}
        table = self.param("word.weight", (cfg.vocab, cfg.hidden), ("v", "h"), tie="word_embeddings" if cfg.tied else None)
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
        bsh = ("b", "s", "h")
        xn = self.norm("attn_norm", x, sizes)
        qkv_bias = cfg.bias or cfg.qkv_bias
        q = self.linear("q_proj", xn, bsh, ("b", "s", "n", "d"), sizes, ("h", "n", "d"), "q", bias=qkv_bias)
        k = self.linear("k_proj", xn, bsh, ("b", "s", "g", "d"), sizes, ("h", "g", "d"), "k", bias=qkv_bias)
        v = self.linear("v_proj", xn, bsh, ("b", "s", "g", "d"), sizes, ("h", "g", "d"), "v", bias=qkv_bias)
        bsnd = ("b", "s", "n", "d")
        if not cfg.learned_pos:
            # rotary position embedding on Q and K (memory-bound elementwise; backward needs no input)
            q = self.elementwise("q_rope", "rope", [q], bsnd, sizes, flops=6)
            k = self.elementwise("k_rope", "rope", [k], ("b", "s", "g", "d"), sizes, flops=6)
        if cfg.attention == "flash":
            o = self.act("core", (self.b, self.s, cfg.heads, cfg.head_dim), bsnd)
            self.op("core", "attention", {k_: sizes[k_] for k_ in ("b", "s", "t", "n", "g", "d")}, [q, k, v],
                    [bsnd, ("b", "t", "g", "d"), ("b", "t", "g", "d")], [o], [bsnd], causal=True,
                    linked=(("n", "g"),))
        else:
            if cfg.kv_heads != cfg.heads:
                raise PlanError(f"model {cfg.name}: attention=unfused needs kv_heads == heads; use attention=flash")
            bnst = ("b", "n", "s", "t")
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
        y = self.linear("o_proj", o, bsnd, bsh, sizes, ("n", "d", "h"), "o", bias=cfg.bias)
        y = self.dropout("attn_out_dropout", y, bsh, sizes)
        return self.elementwise("attn_residual", "add", [x, y], bsh, sizes)

    def dense_mlp(self, x, sizes):
        cfg = self.cfg
        bsh, bsf = ("b", "s", "h"), ("b", "s", "f")
        if cfg.mlp == "swiglu":
            gt = self.linear("gate_proj", x, bsh, bsf, sizes, ("h", "f"), "gate")
            up = self.linear("up_proj", x, bsh, bsf, sizes, ("h", "f"), "up")
            a = self.elementwise("act", "swiglu", [gt, up], bsf, sizes, saves=("in0", "in1"), flops=4)
        else:
            a1 = self.linear("up_proj", x, bsh, bsf, sizes, ("h", "f"), "up", bias=cfg.bias)
            a = self.elementwise("act", cfg.mlp, [a1], bsf, sizes, saves=("in0",), flops=8)
        return self.linear("down_proj", a, bsf, bsh, sizes, ("f", "h"), "down", bias=cfg.bias)

    def moe_mlp(self, x, sizes):
        cfg = self.cfg
        bsh, bse, ebch, ebcf = ("b", "s", "h"), ("b", "s", "e"), ("e", "b", "c", "h"), ("e", "b", "c", "f")
        logits = self.linear("router", x, bsh, bse, sizes, ("h", "e"))
        gates = self.act("gates", (self.b, self.s, cfg.experts), bse, dtype="fp32")
        self.op("topk", "softmax", {k_: sizes[k_] for k_ in bse}, [logits], [bse], [gates], [bse], axis="e")
        xe = self.act("dispatch", (cfg.experts, self.b, sizes["c"], cfg.hidden), ebch)
        # a cut of the token sequence s carries over to the capacity slots c (no pending sum)
        self.op("dispatch", "moe_dispatch", {k_: sizes[k_] for k_ in ("b", "s", "e", "c", "h")}, [x, gates],
                [bsh, bse], [xe], [ebch], carry=(("s", "c"),))
        esz = {k_: sizes[k_] for k_ in ("e", "b", "c", "h")} | {"f": cfg.moe_ffn}
        gt = self.linear("experts.gate_proj", xe, ebch, ebcf, esz, ("e", "h", "f"), "gate")
        up = self.linear("experts.up_proj", xe, ebch, ebcf, esz, ("e", "h", "f"), "up")
        a = self.elementwise("experts.act", "swiglu", [gt, up], ebcf, esz, saves=("in0", "in1"), flops=4)
        ye = self.linear("experts.down_proj", a, ebcf, ebch, esz, ("e", "f", "h"), "down")
        y = self.act("combine", (self.b, self.s, cfg.hidden), bsh)
        return self.op("combine", "moe_combine", {k_: sizes[k_] for k_ in ("e", "b", "c", "s", "h")}, [ye, gates],
                       [ebch, bse], [y], [bsh], carry=(("c", "s"),))

    def layer_block(self, i, x):
        cfg = self.cfg
        self.layer, self.prefix = i, f"layers.{i}"
        sizes = {"b": self.b, "s": self.s, "t": self.s, "h": cfg.hidden, "n": cfg.heads, "g": cfg.kv_heads,
                 "d": cfg.head_dim, "f": cfg.ffn, "e": cfg.experts,
                 "c": max(1, math.ceil(cfg.capacity_factor * cfg.top_k * self.s / cfg.experts))}
        x = self.attention(x, sizes)
        xn = self.norm("mlp_norm", x, sizes)
        moe = cfg.is_moe and i >= cfg.dense_layers
        y = self.moe_mlp(xn, sizes) if moe else self.dense_mlp(xn, sizes)
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
        self.op("lm_head", "linear", sizes, [xf, w], [("b", "s", "h"), ("h", "v")], [logits], [("b", "s", "v")])
        loss = self.act("loss", (b, s), ("b", "s"), dtype="fp32")
        self.op("loss", "cross_entropy", {"b": b, "s": s, "v": cfg.vocab}, [logits, "labels"],
                [("b", "s", "v"), ("b", "s")], [loss], [("b", "s")])


def layer_runs(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(first layer, run length) of each run of identical layers; the first and the last layer are
    runs of their own (they meet the embedding and the LM head), dense and MoE layers differ."""
    def kind(i):
        return (i == 0, i == cfg.layers - 1, cfg.is_moe and i >= cfg.dense_layers)

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
    """Parameters a token passes through: for MoE, top_k of the experts of each MoE layer."""
    total = graph.params_total()
    if not cfg.is_moe:
        return total
    expert = sum(t.numel for t in graph.params() if ".experts." in t.name)
    return total - expert + expert * cfg.top_k // cfg.experts
