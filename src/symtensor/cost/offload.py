"""Megatron-core's fine-grained activation offloading, ``--fine-grained-activation-offloading --offload-modules M
...`` (``Stack.offload_modules``): which graph ops' inputs each module sends to host memory, and the one rule that
refuses a module list. The copies' cost and the memory they free are the layer-level offloading's
(``cost.engine.CPU_OFFLOAD``: ``cost.memory.offloaded``, ``cost.model.offload_seconds``).

Source: NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553
docs/user-guide/features/fine_grained_activation_offloading.md ("Each module offloads its **input** activation to
CPU during forward and reloads it before backward", on a side stream; the norms are "Skipped if using IdentityOp")
and megatron/core/transformer/transformer_config.py (``offload_modules``, ``min_offloaded_tensor_size`` = 1024 *
1024 elements, and the refusals: not with ``cpu_offloading``, ``attn_proj`` only with ``core_attn``,
``fused_group_mlp`` needs ``use_transformer_engine_op_fuser`` and excludes ``expert_fc1`` and ``moe_act``, none
inside the MoE layer when ``moe`` is recomputed). Every layer of every stage offloads (``activation_offload_fraction``
1.0, the default; ``delta_offload_bytes_across_pp_ranks`` 0). Each module, as the graph holds it:

    attn_norm   the input norm's input, where the norm is a module of its own (``cost.recompute``: under MLA;
                Transformer Engine fuses it into linear_qkv otherwise, an IdentityOp: nothing)
    qkv_linear  the query/key/value projections' input (under MLA the down projections' and the rotary key's)
    core_attn   the attention core's inputs from outside it (Q, K, V)
    attn_proj   the output projection's input (the core's output)
    mlp_norm    the pre-MLP norm's input, where it is a module of its own (MoE layers; fused into a dense MLP's fc1)
    expert_fc1  the routed experts' gate/up projections' input (the dispatched tokens)
    moe_act     the routed experts' activation's input

A tensor backward does not keep (a recomputed region's, ``cost.recompute``; every one under full recomputation,
whose forward saves nothing but the layer's input) is not offloaded; one smaller than ``MIN_OFFLOADED_ELEMENTS`` on
the device stays.
"""

from __future__ import annotations

from symtensor.cost.engine import offload_engine_refusal
from symtensor.cost.recompute import modules_of, norm_is_module

# Megatron's names that the graph can run, in its documented order (the canonical order of a stated list)
MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
# Megatron's names this model does not run: each with why
UNMODELLED = {"fused_group_mlp": "needs Transformer Engine's op fuser (--use-transformer-engine-op-fuser), "
                                 "which is not modelled",
              "gdp_qkv": "offloads the GatedDeltaProduct mixer's input, which no model here has"}
# transformer_config.py min_offloaded_tensor_size: 1024 * 1024 elements (smaller tensors stay on the device)
MIN_OFFLOADED_ELEMENTS = 1024 * 1024
_QKV = ("q_proj", "k_proj", "v_proj")
_MLA_QKV = ("q_down", "kv_down", "k_rope_proj")
_EXPERT_FC1 = ("experts.gate_proj", "experts.up_proj", "experts.fc1")


def refusal(modules) -> str | None:
    """Why a list of offloaded modules is refused, in one line naming the fix, or None: not a tuple of names, an
    unknown or unmodelled name, a name twice, and Megatron's own rule (attn_proj without core_attn)."""
    if not isinstance(modules, (tuple, list)) or not all(isinstance(m, str) for m in modules):
        return f"offload_modules={modules!r}; use a tuple of module names of {', '.join(MODULES)}"
    for m in modules:
        if m in UNMODELLED:
            return f"offload module {m} {UNMODELLED[m]}; use modules of {', '.join(MODULES)}"
        if m not in MODULES:
            return f"offload module {m!r} is unknown; use modules of {', '.join(MODULES)} (Megatron's names)"
    if len(set(modules)) != len(modules):
        return f"offload_modules={','.join(modules)} names a module twice; name each once"
    if "attn_proj" in modules and "core_attn" not in modules:
        return ("offload module attn_proj needs core_attn (Megatron refuses it alone: its input is the core's output, "
                "which core_attn's backward needs); add core_attn")
    return None


def engine_refusal(framework: str) -> str | None:
    """Why ``framework``'s engine has no fine-grained offloading (Megatron-core's, ``Engine.cpu_offload``), in one
    line naming the fix, or None."""
    return offload_engine_refusal(framework, "--offload-modules", "fine-grained activation offloading is "
                                  "Megatron-core's (--fine-grained-activation-offloading)")


def combination_refusal(modules, recompute: str) -> str | None:
    """Megatron's refusal of offloading inside the MoE layer while ``moe`` is recomputed, in one line, or None."""
    inside = [m for m in modules if m in ("expert_fc1", "moe_act")]
    if inside and "moe" in modules_of(recompute):
        return (f"offload modules {','.join(inside)} run inside the MoE layer that recompute module moe checkpoints "
                "(Megatron refuses both); drop moe from --recompute or those from --offload-modules")
    return None


def module_of(short: str, op, moe_layer: bool, mla: bool) -> str | None:
    """The offload module whose input is ``op``'s (short name ``short``, in a MoE layer or not, of an MLA model or
    not), or None."""
    if short in ("attn_norm", "mlp_norm"):
        return short if norm_is_module(short, moe_layer, mla) else None
    if short in (_MLA_QKV if mla else _QKV):
        return "qkv_linear"
    if op.kind == "attention" or op.attr("core"):
        return "core_attn"
    if short == "o_proj":
        return "attn_proj"
    if moe_layer and short in _EXPERT_FC1:
        return "expert_fc1"
    if moe_layer and short == "experts.act":
        return "moe_act"
    return None
