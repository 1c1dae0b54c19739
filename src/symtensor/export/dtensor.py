"""Plan -> a DTensor plan: per module the parallel style (``parallelize_module``), the mesh, and
the data parallelism (``replicate`` or ``fully_shard``).

No torch import: the plan is data (module name -> parallel style), which
``symtensor.runtime.apply`` applies. It runs the fsdp2 engine's semantics (``CAPABILITIES``);
every configuration the configuration rule accepts lowers.
"""

from __future__ import annotations

from symtensor.export.common import lowered, zero1_note
from symtensor.plan.parallelism import Capabilities

# FSDP2 runs every ZeRO stage (ZeRO 1 as ZeRO 2: a note), context parallelism without FSDP, and
# records the expert grid as degrees
CAPABILITIES = Capabilities(name="the DTensor plan", engine="fsdp2")


def dtensor_plan(plan) -> dict:
    """Per module, the DTensor parallel style (``parallelize_module`` plan) and the mesh axes, and
    the data parallelism over ``data_parallel_axes`` (dp and cp: the axes the cost model reduces
    gradients and shards ZeRO's state over, ``cost.params.data_axes``), as the fsdp2 engine costs
    each ZeRO stage (``cost.engine``): ZeRO 0 replicates (DDP, PyTorch's ``replicate``); above it
    ``fully_shard`` (FSDP2) shards parameters, gradients and optimizer state, with
    ``reshard_after_forward`` True at ZeRO 3 (gathered again in backward) and False at ZeRO 1/2
    (gathered once per micro-batch, kept to backward; torch.distributed.fsdp.fully_shard). FSDP2
    has no ZeRO 1: it runs as ZeRO 2, which the fsdp2 engine costs with the same collectives and
    no more memory; the export says so (``_zero_note``). The same rule as
    ``export.torchtitan.data_parallel``."""
    p = lowered(plan, CAPABILITIES)
    from symtensor.runtime.spec import tp_styles

    styles = {}
    if p.tp > 1:
        styles = {k: "ColwiseParallel" if v == "colwise" else "RowwiseParallel"
                  for k, v in tp_styles(plan.model.is_moe).items()}
        if p.sp:
            styles.update({"attention_norm": "SequenceParallel", "ffn_norm": "SequenceParallel",
                           "norm": "SequenceParallel"})
    degrees = {"pp": p.pp, "dp": p.dp, "cp": p.cp, "tp": p.tp}
    mesh = {name: size for name, size in degrees.items() if size > 1} or {"dp": 1}
    data_axes = [name for name in ("dp", "cp") if degrees[name] > 1]
    runs = p.replace(framework=CAPABILITIES.engine)  # as the fsdp2 engine runs it: sharding and resharding
    shard = bool(data_axes) and runs.sharded_parameters
    out = {"mesh": mesh, "tp_plan": styles,
           "data_parallel": ("fully_shard" if shard else "replicate") if data_axes else None,
           "data_parallel_axes": data_axes, "fully_shard": shard,
           "reshard_after_forward": runs.reshards_after_forward if shard else None,
           "expert_parallel_degree": p.ep, "expert_tensor_parallel_degree": p.etp,
           "context_parallel": p.cp > 1}
    if shard and p.hsdp:  # hybrid sharding: fully_shard on the 2-D mesh (replicate, shard) of dp x cp
        out["hybrid_shard"] = {"replicate_degree": p.dp_replicate, "shard_degree": p.dp_shard}
    if shard and p.zero == 1:
        out["_zero_note"] = zero1_note("FSDP2 (fully_shard)", "reshard_after_forward=False")
    return out
