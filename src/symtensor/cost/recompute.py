"""Megatron-core's module-level selective recomputation, ``--recompute-granularity selective --recompute-modules
M ...``, stated as ``modules:M,M`` (e.g. ``modules:layernorm,moe_act``): which ops of the graph each module
checkpoints, and the one rule that refuses a module list.

Source: NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/core/transformer/transformer_config.py
(``recompute_modules``: "moe_act", "layernorm", "mla_up_proj" ... use output-discarding checkpointing, "core_attn",
"mlp", "moe" and "shared_experts" use normal checkpointing; default ["core_attn"]) and where each is run:

    core_attn       attention.py: the attention core under tensor_parallel.checkpoint; the graph's ops marked
                    ``core`` (the unfused scores, softmax, dropout and context; a fused kernel has none, so with
                    flash attention it frees nothing, as Megatron's own warning says): today's ``selective``
    layernorm       transformer_layer.py: input_layernorm and pre_mlp_layernorm under CheckpointWithoutOutput,
                    each output discarded once the attention / MLP forward has run and recomputed by a hook on
                    that module's output gradient; only where the norm is a module of its own: Transformer
                    Engine's layer spec (models/gpt/gpt_layer_specs.py) fuses the input norm into linear_qkv
                    (IdentityOp) except under MLA, and the pre-MLP norm into a dense MLP's linear_fc1 (IdentityOp),
                    so it is the MoE layers' pre-MLP norm and, under MLA, every layer's input norm
    moe_act         moe/experts.py: the grouped experts' activation under CheckpointWithoutOutput, its output
                    (linear_fc2's input) discarded after linear_fc2's forward
    mla_up_proj     multi_latent_attention.py: from the compressed Q and KV (and the rotary key) to Q, K and V:
                    the up projections with their fused latent norms, the rotary embedding and the concatenation,
                    under CheckpointWithoutOutput; Q, K and V discarded after the attention core's forward
    mlp             transformer_layer.py: a dense layer's MLP (with linear_fc1's fused pre-MLP norm) under
                    tensor_parallel.checkpoint; nothing on MoE layers
    moe             moe/moe_layer.py: the whole MoE layer (router, dispatch, experts, combine, shared expert)
                    under tensor_parallel.checkpoint; its input is the pre-MLP norm's output
    shared_experts  moe/moe_layer.py: the shared expert (and its gate) under tensor_parallel.checkpoint

A checkpointed region keeps its inputs from outside and frees what its ops save; backward re-runs its forward
(with its collectives: ``cost.segment``). An output-discarding region also frees its outputs, whoever saves them.
"""

from __future__ import annotations

from symtensor.cost.engine import ALIASES, ENGINES

MODULES_PREFIX = "modules:"
# Megatron's names, in its documented order (the canonical order of a stated list)
MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts")
DISCARDS = frozenset({"moe_act", "layernorm", "mla_up_proj"})  # CheckpointWithoutOutput: outputs freed too
_MLA_UP = ("q_norm", "q_proj", "q_rope", "kv_norm", "k_proj", "v_proj", "k_rope", "k_concat")
_DENSE_MLP = ("mlp_norm", "gate_proj", "up_proj", "act", "down_proj")
_MOE = ("router", "topk", "dispatch", "combine", "shared_expert_gate", "shared_expert_scale", "shared_expert_add")
_SHARED = ("shared_expert_gate", "shared_expert_scale")
# a module nested in another runs as part of the outer one's region (moe holds moe_act and shared_experts)
_OUTER = ("moe", "mlp", "shared_experts", "mla_up_proj", "moe_act", "layernorm", "core_attn")


def modules_of(recompute) -> tuple[str, ...]:
    """The modules a ``modules:`` recomputation names, in Megatron's order (``MODULES``); () for any other mode."""
    text = str(recompute)
    if not text.startswith(MODULES_PREFIX):
        return ()
    named = {m.strip() for m in text[len(MODULES_PREFIX):].split(",")}
    return tuple(m for m in MODULES if m in named)


def refusal(recompute, *, framework: str | None = None, model=None, fp8_recipe: str | None = None,
            shared_overlap: bool = False, ep_overlap: bool = False) -> str | None:
    """Why a ``modules:`` recomputation is refused, in one line naming the fix, or None (also for any other mode).
    The syntax always; with ``framework`` the engine (only Megatron-core has the option, ``Engine.recompute_modules``);
    with ``model`` the modules it lacks (Megatron refuses mla_up_proj without MLA; a module that would checkpoint
    nothing in this model, e.g. layernorm in a dense non-MLA model whose norms Transformer Engine fuses, is refused
    too); Megatron's own checks: moe_act and layernorm with FP8 delayed scaling, shared_experts with
    --moe-shared-expert-overlap, moe with --overlap-moe-expert-parallel-comm."""
    text = str(recompute)
    if not text.startswith(MODULES_PREFIX):
        return None
    named = [m.strip() for m in text[len(MODULES_PREFIX):].split(",")]
    unknown = [m for m in named if m not in MODULES]
    if unknown or not named:
        return (f"recompute={text!r}: unknown module {unknown[0] if unknown else ''!r}; use modules:M,M with M of "
                f"{', '.join(MODULES)} (Megatron's --recompute-modules)")
    if len(set(named)) != len(named):
        return f"recompute={text!r} names a module twice; name each once"
    if framework is not None:
        eng = ENGINES.get(ALIASES.get(framework, framework))
        if eng is not None and not eng.recompute_modules:
            return (f"recompute={text!r} is Megatron-core's --recompute-modules, which the {eng.name} engine has not; "
                    "use --framework megatron, or --recompute selective or full")
    if fp8_recipe == "delayed" and {"moe_act", "layernorm"} & set(named):
        return ("recompute modules moe_act and layernorm do not run under FP8 delayed scaling (Megatron refuses them); "
                "use --fp8-recipe tensorwise or blockwise, or drop them")
    if shared_overlap and "shared_experts" in named:
        return ("recompute module shared_experts does not run with --moe-shared-overlap (Megatron refuses it); drop "
                "one of them")
    if ep_overlap and "moe" in named:
        return "recompute module moe does not run with --moe-ep-overlap (Megatron refuses it); drop one of them"
    if model is not None:
        for m in named:
            why = _lacks(m, model)
            if why is not None:
                return f"recompute module {m}: model {model.name} {why}; drop it from the list"
    return None


def _lacks(module: str, model) -> str | None:
    """What ``model`` lacks for ``module`` to checkpoint anything (``regions``), or None."""
    moe = any(model.is_moe_layer(i) for i in range(model.layers))
    dense = not all(model.is_moe_layer(i) for i in range(model.layers))
    if module == "core_attn":
        return None  # (Megatron's default; a fused kernel's core frees nothing, as today's selective)
    if module == "mla_up_proj" and not model.kv_latent:
        return "has no multi-head latent attention (Megatron: mla_up_proj needs multi_latent_attention)"
    if module in ("moe_act", "moe") and not moe:
        return "has no MoE layer"
    if module == "shared_experts" and not (moe and model.shared_ffn):
        return "has no shared expert"
    if module == "mlp" and not dense:
        return "has no dense MLP (every layer is MoE)"
    if module == "layernorm" and not (moe or model.kv_latent):
        return ("has no separate norm module: Transformer Engine fuses its norms into the next linear (IdentityOp "
                "under Megatron's layer spec)")
    return None


def position(op) -> str:
    """``op``'s name within its transformer layer (``layers.3.experts.act`` -> ``experts.act``), the names the
    module rules read (here and ``cost.offload``); an op outside the layers keeps its name."""
    return op.name.split(".", 2)[2] if op.name.startswith("layers.") else op.name


def norm_is_module(short: str, moe_layer: bool, mla: bool) -> bool:
    """Whether norm ``short`` (``attn_norm`` or ``mlp_norm``) is a module of its own under Megatron's Transformer
    Engine layer spec (``layernorm`` above): the input norm under MLA, the pre-MLP norm in a MoE layer; otherwise
    fused into the next linear (an IdentityOp). Read by the recomputation and the offloading (``cost.offload``)."""
    return mla if short == "attn_norm" else moe_layer


def _module(short: str, op, moe_layer: bool, mla: bool) -> list[tuple[str, str]]:
    """Every (module, region within the layer) that would checkpoint ``op`` (short name ``short``, in a MoE layer
    or not, of an MLA model or not); the caller keeps those named and the outermost of them."""
    hits = []
    if op.attr("core"):
        hits.append(("core_attn", "core"))
    if short in ("attn_norm", "mlp_norm") and norm_is_module(short, moe_layer, mla):
        hits.append(("layernorm", short))
    if mla and short in _MLA_UP:
        hits.append(("mla_up_proj", "up"))
    if moe_layer:
        if short == "experts.act":
            hits.append(("moe_act", "act"))
        if short.startswith(("experts.", "shared_expert.")) or short in _MOE:
            hits.append(("moe", "moe"))
        if short.startswith("shared_expert.") or short in _SHARED:
            hits.append(("shared_experts", "shared"))
    elif short in _DENSE_MLP:
        hits.append(("mlp", "mlp"))
    return hits


def regions(graph, recompute) -> dict:
    """Op name -> (region key, module, discards output) of every op a ``modules:`` recomputation checkpoints (the
    outermost of the named modules it belongs to; a region is one module's ops in one layer); {} for other modes."""
    named = set(modules_of(recompute))
    if not named:
        return {}
    cfg, layers = graph.meta["config"], graph.meta["layers"]
    mla = bool(cfg.kv_latent)
    out = {}
    for op in graph.ops:
        if not 0 <= op.layer < layers:
            continue
        hits = [h for h in _module(position(op), op, cfg.is_moe_layer(op.layer), mla) if h[0] in named]
        if hits:
            module, part = min(hits, key=lambda h: _OUTER.index(h[0]))
            out[op.name] = ((op.layer, module, part), module, module in DISCARDS)
    return out
