"""Plan -> the runtime's RunSpec: the plan's configuration (``Plan.parallelism``) lowered to what
``symtensor run`` executes under torchrun, or refused with the reason before any process starts.

The runtime runs Megatron-style tensor parallelism (column then row per block, vocabulary-parallel
embedding, sequence parallelism), data parallelism by gradient all-reduce, FSDP2 (ZeRO-3, and the
fsdp2 engine's ZeRO-1/2 without resharding after forward), hybrid sharding (HSDP: the data-parallel
role split into a replicate axis, its outer axes, and a shard axis, its innermost ``dp_shard``
ranks, as ``cost.params.shard_axes`` takes them), expert parallelism over whole axes and
pipelines of data-parallel stages: ``CAPABILITIES``, whose rules ``refusal`` applies after the
one configuration rule (``plan.parallelism.refusal``).

One mesh vocabulary: the RunSpec's mesh axes are the plan's own (``nvlink0``, ``ib1``, or
``loopback0`` on this machine's processes), those of one role joined by ``+`` as the runtime
flattens them (``runtime.apply.submesh``): tp = 4 on the two inner axes of 8 processes is the
axis ``loopback1+loopback2`` of size 4, named in ``tp_axis``. The plan file, the RunSpec and the
run's per-axis byte counts name the same axes. The runtime lays the roles out in Megatron's rank
order (pp, dp, tp: tp fastest), as a Megatron-style plan's axes are.
"""

from __future__ import annotations

from symtensor.errors import PlanError
from symtensor.plan.parallelism import Capabilities, Parallelism
from symtensor.plan.summary import role_axes
from symtensor.runtime.spec import ATTN_TP, MLP_TP, RunSpec, tp_styles

# the runtime's worker: no context parallelism or recomputation; ZeRO above 0 only as FSDP2 (the
# plan's engine shards the parameters: fsdp2's ZeRO 1/2, every engine's ZeRO 3); experts cut over
# whole mesh axes with expert TP 1. Its predictions follow the fsdp2 engine (runtime.verify).
CAPABILITIES = Capabilities(name="the runtime", engine="fsdp2", zero_as_costed=True, context_parallel=False,
                            recompute=("none",))


def refusal(p: Parallelism, model, attention_only: bool = False) -> str | None:
    """The first rule of ``CAPABILITIES`` that configuration ``p`` breaks on ``model`` (with
    ``attention_only``: tensor parallelism in attention only), or None."""
    caps = CAPABILITIES
    if p.cp > 1 and not caps.context_parallel:
        return "the runtime has no context parallelism yet; plan with cp=1"
    if p.stack.offloads:
        return ("the runtime does not offload activations to host memory; plan without --cpu-offload-layers and "
                "--offload-modules")
    if p.recompute not in caps.recompute:
        return "the runtime does not recompute activations; plan with recompute=none"
    if p.stack.low_precision:
        return ("the runtime has no quantized parameters or BF16-kept layers (Megatron-LM's); plan without "
                "--fp8-param-gather and --first-last-layers-bf16")
    if p.precision not in caps.precision:
        return f"the runtime does not run {p.precision} (no loss scaling); plan with --precision bf16"
    if p.zero > 0 and caps.zero_as_costed and not p.sharded_parameters:
        return (f"the runtime runs ZeRO-0 (all-reduce), ZeRO-3 (FSDP) and the fsdp2 engine's ZeRO-1/2 (FSDP2 without "
                f"resharding after forward), not {p.framework}'s ZeRO-{p.zero}; plan with --framework fsdp2 or "
                "--zero 3")
    if model.is_moe and p.tp > 1 and not (p.sp or attention_only):
        return ("the runtime runs MoE layers with tensor parallelism under sequence parallelism only (each rank routes "
                "its sequence shard, as Megatron requires); plan with sp")
    if p.hsdp and p.ep > 1:
        return "the runtime runs hybrid sharding (HSDP) without expert parallelism; plan with ep=1 or without dp_shard"
    if p.ep == 1:
        return None
    if p.etp != 1:
        return f"the runtime has no expert tensor parallelism; plan with etp=1, got etp={p.etp}"
    if attention_only:
        return "--attention-only-tp replicates the MoE layers over tp; run it without expert parallelism"
    if p.ep not in _folds(p):
        return (f"the runtime cuts experts over whole mesh axes: ep must be one of {sorted(_folds(p))} (tp={p.tp}, "
                f"dp={p.dp}), got ep={p.ep}")
    return None


def _folds(p: Parallelism) -> dict[int, tuple[str, ...]]:
    """The expert-parallel degrees the runtime runs, and the roles whose axes they cut, in mesh
    order. Megatron's rank order (``megatron.assign_axes``) folds EP over the tensor-parallel
    ranks first, then the data-parallel ones; the runtime cuts whole axes, so ep is tp, tp x dp,
    or (tp 1) dp."""
    return {p.tp: ("tp",), p.tp * p.dp: ("dp", "tp")} if p.tp > 1 else {p.dp: ("dp",)}


def hybrid_axes(names: tuple[str, ...], mesh, dp_shard: int) -> tuple[str, str]:
    """The replicate and the shard axis of hybrid sharding over the data-parallel axes ``names``
    (mesh order): the innermost axes whose sizes multiply to ``dp_shard`` shard (the cost model's
    ``cost.params.shard_axes``), the others replicate; each role's axes joined by ``+``."""
    sizes = {a.name: a.size for a in mesh}
    shard, size = [], 1
    for name in reversed(names):
        if dp_shard % (size * sizes[name]):
            break
        shard.insert(0, name)
        size *= sizes[name]
    if size != dp_shard:
        raise PlanError(f"dp_shard={dp_shard} is not the size of the innermost data-parallel axes "
                        f"{[sizes[n] for n in names]}; choose a product of the innermost ones")
    return "+".join(n for n in names if n not in shard), "+".join(shard)


def plan_to_spec(plan, attention_only: bool = False) -> RunSpec:
    """The RunSpec of a plan whose ops agree on one configuration (``Plan.parallelism``), on the
    plan's mesh axes (the module docstring); refuses what the runtime cannot run."""
    p, cfg = plan.parallelism, plan.model
    why = p.refusal(cfg, plan.cluster.n_devices) or refusal(p, cfg, attention_only)
    if why is not None:
        raise PlanError(why)
    tp, pp, dp = p.tp, p.pp, p.dp
    roles = role_axes(plan)
    axis = {role: "+".join(names) for role, names in roles.items()}  # one axis per role
    mesh, dp_axes, fsdp_axes = {}, (), ()
    if pp > 1:
        mesh[axis["pp"]] = pp
    if dp > 1 and p.hsdp:  # replicas outside, shards inside: fully_shard on the 2-D mesh
        replicate, shard = hybrid_axes(roles["dp"], plan.mesh, p.dp_shard)
        mesh |= {replicate: p.dp_replicate, shard: p.dp_shard}
        dp_axes, fsdp_axes = (replicate,), (shard,)
    elif dp > 1:
        mesh[axis["dp"]] = dp
        # the fsdp2 engine's ZeRO 1/2 is FSDP2 without resharding after forward (cost.engine); FSDP2
        # has no ZeRO 1 (replicated gradients), so ZeRO 1 runs as ZeRO 2: the same collectives
        dp_axes, fsdp_axes = ((), (axis["dp"],)) if p.sharded_parameters else ((axis["dp"],), ())
    if tp > 1:
        mesh[axis["tp"]] = tp
    if not mesh:  # one process: the plan has no mesh axis; the runtime's mesh needs one
        mesh["dp"] = 1
        dp_axes = ("dp",)
    styles, layer_styles = {}, {}
    if tp > 1 and attention_only:  # a heterogeneous plan: attention TP, the rest data parallel
        styles = dict(ATTN_TP)
    elif tp > 1:
        styles = tp_styles(cfg.is_moe)
        if cfg.is_moe:  # the dense layers among the MoE ones keep a tensor-parallel MLP
            layer_styles = {i: dict(MLP_TP) for i in range(cfg.layers) if not cfg.is_moe_layer(i)}
    ep_axes = () if p.ep == 1 else tuple(axis[role] for role in _folds(p)[p.ep] if role == "tp" or dp > 1)
    return RunSpec(mesh=mesh, tp_axis=axis["tp"] if tp > 1 else None, styles=styles, layer_styles=layer_styles,
                   sequence_parallel=p.sp, dp_axes=dp_axes, fsdp_axes=fsdp_axes,
                   reshard_after_forward=p.reshards_after_forward or not fsdp_axes, ep_axes=ep_axes,
                   pp_axis=axis["pp"] if pp > 1 else None, microbatches=p.micro_steps if pp > 1 else 1,
                   global_batch=p.global_batch, seq=p.seq)
