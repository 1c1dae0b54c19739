"""Export a plan to the engines people run: Megatron-LM arguments, a torchtitan config, a DTensor
``parallelize_module`` plan (plus the runtime's RunSpec).

A SymTensor plan is per-op; an engine takes one configuration for the whole model. A plan exports
when its ops agree on a Megatron-style configuration (``plan.summary.config_summary``); otherwise
the export names the ops that differ and what the engine cannot express. No torch import here: the
DTensor plan is data (module name -> parallel style), which ``symtensor.runtime.apply`` applies.
"""

from __future__ import annotations

from symtensor.errors import PlanError
from symtensor.plan.summary import layer_types

FORMATS = ("megatron", "torchtitan", "dtensor")


def _check_expressible(plan, engine: str) -> dict:
    c = plan.config
    if c["heterogeneous"]:
        rows = layer_types(plan)
        ref = next(r for r in rows if r["kind"] == "attention" or r["kind"] == "bmm")
        odd = sorted({r["op"] for r in rows if r["kind"] in ("linear", "attention")
                      and (r["dp"], r["cp"]) != (ref["dp"], ref["cp"])})
        raise PlanError(f"{engine} takes one configuration for every layer, but this plan cuts ops differently "
                        f"({', '.join(odd[:6])}{' ...' if len(odd) > 6 else ''}); plan with --space megatron to "
                        "export, or run it with symtensor run")
    return c


def megatron_args(plan) -> list[str]:
    """Megatron-LM (megatron-core) command-line arguments for the plan."""
    c = _check_expressible(plan, "Megatron-LM")
    cfg = plan.model
    args = [f"--tensor-model-parallel-size {c['tp']}", f"--pipeline-model-parallel-size {c['pp']}",
            f"--context-parallel-size {c['cp']}", f"--micro-batch-size {c['micro_batch']}",
            f"--global-batch-size {c['global_batch']}", f"--seq-length {c['seq']}",
            f"--num-layers {cfg.layers}", f"--hidden-size {cfg.hidden}", f"--num-attention-heads {cfg.heads}",
            f"--ffn-hidden-size {cfg.ffn}"]
    if cfg.kv_heads != cfg.heads:
        args += ["--group-query-attention", f"--num-query-groups {cfg.kv_heads}"]
    if cfg.is_moe:
        args += [f"--num-experts {cfg.experts}", f"--moe-router-topk {cfg.top_k}",
                 f"--expert-model-parallel-size {c['ep']}"]
    if c["sp"]:
        args.append("--sequence-parallel")
    if c["vpp"] > 1:
        args.append(f"--num-layers-per-virtual-pipeline-stage {cfg.layers // (c['pp'] * c['vpp'])}")
    if c["recompute"] == "selective":
        args.append("--recompute-activations")
    elif c["recompute"] == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    if c["zero"] >= 1:
        args.append("--use-distributed-optimizer")
    if c["zero"] >= 2:
        raise PlanError(f"Megatron-LM has no ZeRO-{c['zero']}; its distributed optimizer is ZeRO-1 "
                        "(plan with --space megatron, or export to torchtitan for FSDP)")
    if cfg.family == "llama":
        args += ["--normalization RMSNorm", "--swiglu", "--position-embedding-type rope",
                 "--untie-embeddings-and-output-weights", "--disable-bias-linear"]
    args += ["--use-flash-attn", "--bf16"]
    return args


def torchtitan_config(plan) -> dict:
    """A torchtitan job config (the [parallelism] and [training] sections) for the plan."""
    c = _check_expressible(plan, "torchtitan")
    n = plan.cluster.n_devices
    shard = c["dp"] if c["zero"] >= 2 else 1
    return {
        "parallelism": {"data_parallel_replicate_degree": c["dp"] // shard, "data_parallel_shard_degree": shard,
                        "tensor_parallel_degree": c["tp"], "context_parallel_degree": c["cp"],
                        "pipeline_parallel_degree": c["pp"], "expert_parallel_degree": c["ep"],
                        "enable_async_tensor_parallel": False,
                        "pipeline_parallel_schedule": "Interleaved1F1B" if c["vpp"] > 1 else "1F1B"},
        "training": {"local_batch_size": c["micro_batch"], "global_batch_size": c["global_batch"],
                     "seq_len": c["seq"]},
        "activation_checkpoint": {"mode": {"none": "none", "selective": "selective", "full": "full"}[c["recompute"]]},
        "_devices": n,
    }


def dtensor_plan(plan) -> dict:
    """Per module, the DTensor parallel style (``parallelize_module`` plan) and the mesh axes."""
    c = _check_expressible(plan, "the DTensor plan")
    from symtensor.runtime.spec import ATTN_TP, MLP_TP

    styles = {}
    if c["tp"] > 1:
        styles.update({k: "ColwiseParallel" if v == "colwise" else "RowwiseParallel" for k, v in ATTN_TP.items()})
        if not plan.model.is_moe:
            styles.update({k: "ColwiseParallel" if v == "colwise" else "RowwiseParallel" for k, v in MLP_TP.items()})
        styles.update({"embed": "RowwiseParallel", "lm_head": "ColwiseParallel"})
        if c["sp"]:
            styles.update({"attention_norm": "SequenceParallel", "ffn_norm": "SequenceParallel",
                           "norm": "SequenceParallel"})
    mesh = {name: size for name, size in (("pp", c["pp"]), ("dp", c["dp"]), ("cp", c["cp"]), ("tp", c["tp"]))
            if size > 1} or {"dp": 1}
    return {"mesh": mesh, "tp_plan": styles, "fully_shard": c["zero"] == 3,
            "expert_parallel_degree": c["ep"], "context_parallel": c["cp"] > 1}


# the engine whose semantics (cost.engine) each export format runs under
ENGINE_OF = {"megatron": "megatron", "torchtitan": "fsdp2", "dtensor": "fsdp2"}


def engine_note(plan, to: str) -> str | None:
    """A note when the plan was costed under another engine than the one the format runs."""
    want, got = ENGINE_OF[to], plan.train.framework
    if want == got:
        return None
    return (f"this plan was costed with {got} semantics; {to} runs {want}: its step time may differ, re-plan "
            f"with --framework {want} for a prediction of that run")


def export(plan, to: str):
    if to not in FORMATS:
        raise PlanError(f"unknown export format {to!r}; use one of {', '.join(FORMATS)}")
    out = {"megatron": megatron_args, "torchtitan": torchtitan_config, "dtensor": dtensor_plan}[to](plan)
    note = engine_note(plan, to)
    if note and isinstance(out, dict):
        out["_engine_note"] = note
    return out
