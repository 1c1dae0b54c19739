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
        odd = sorted({r["op"] for r in rows if r["kind"] in ("linear", "attention") and ".experts." not in r["op"]
                      and (r["dp"], r["cp"]) != (ref["dp"], ref["cp"])})
        raise PlanError(f"{engine} takes one configuration for every layer, but this plan cuts ops differently "
                        f"({', '.join(odd[:6])}{' ...' if len(odd) > 6 else ''}); plan with --space megatron to "
                        "export, or run it with symtensor run")
    return c


def megatron_args(plan) -> list[str]:
    """Megatron-LM (megatron-core) command-line arguments for the plan: its parallelism (the
    expert layers' own grid folded over the stage's ranks), then the model."""
    c = _check_expressible(plan, "Megatron-LM")
    cfg = plan.model
    args = [f"--tensor-model-parallel-size {c['tp']}", f"--pipeline-model-parallel-size {c['pp']}",
            f"--context-parallel-size {c['cp']}", f"--micro-batch-size {c['micro_batch']}",
            f"--global-batch-size {c['global_batch']}", f"--seq-length {c['seq']}",
            f"--num-layers {cfg.layers}", f"--hidden-size {cfg.hidden}", f"--num-attention-heads {cfg.heads}",
            f"--ffn-hidden-size {cfg.ffn}"]
    if c["sp"]:
        args.append("--sequence-parallel")
    args += _pipeline_args(cfg.layers, c["pp"], c["vpp"]) + _attention_args(cfg)
    if cfg.is_moe:
        args += _moe_args(cfg, c)
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
                 "--untie-embeddings-and-output-weights"]
        args += ["--add-qkv-bias"] if cfg.qkv_bias and not cfg.bias else []
        args += [] if cfg.bias else ["--disable-bias-linear"]
    args += ["--use-flash-attn", "--bf16"]
    return args


def _pipeline_args(layers: int, pp: int, vpp: int) -> list[str]:
    """Virtual stages, and the uneven split (``cost.train.chunks_fit``): the embedding and the
    loss count as a layer slot each (126 layers in 64 chunks, 94 in 32)."""
    chunks = pp * vpp
    if layers % chunks == 0:
        return [f"--num-layers-per-virtual-pipeline-stage {layers // chunks}"] if vpp > 1 else []
    if (layers + 2) % chunks:
        return []
    out = ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    return out + ([f"--num-virtual-stages-per-pipeline-rank {vpp}"] if vpp > 1 else [])


def _attention_args(cfg) -> list[str]:
    """GQA, head width, Q/K norms, multi-head latent attention, sliding windows and sinks."""
    args = []
    if cfg.kv_heads != cfg.heads:
        args += ["--group-query-attention", f"--num-query-groups {cfg.kv_heads}"]
    if cfg.kv_latent:  # Megatron's qk-head-dim is the non-rotary part of a head
        args += ["--multi-latent-attention", f"--kv-lora-rank {cfg.kv_latent}",
                 f"--qk-head-dim {cfg.head_dim - cfg.rope_dim}", f"--qk-pos-emb-head-dim {cfg.rope_dim}",
                 f"--v-head-dim {cfg.value_dim}"]
        args += [f"--q-lora-rank {cfg.q_latent}"] if cfg.q_latent else []
    elif cfg.head_dim * cfg.heads != cfg.hidden:
        args.append(f"--kv-channels {cfg.head_dim}")
    if cfg.qk_norm:
        args.append("--qk-layernorm")
    if cfg.window:  # (left, right) keys; 1 marks a sliding-window layer, 0 a full one
        args.append(f"--window-size {cfg.window},0")
        if cfg.window_layers:
            windowed = [int(cfg.is_window_layer(i)) for i in range(cfg.layers)]
            args.append(f"--window-attn-skip-freq '{layer_pattern(windowed)}'")
    if cfg.sinks:
        args.append("--softmax-type learnable")
    return args


def _moe_args(cfg, c: dict) -> list[str]:
    """The experts and their grid: EP and expert TP folded over the tp x cp x dp ranks of a
    stage (Megatron's MoE parallel folding), the alltoall dispatcher the cost model follows,
    shared experts and the dense layers among the MoE ones."""
    args = [f"--num-experts {cfg.experts}", f"--moe-router-topk {cfg.top_k}", f"--moe-ffn-hidden-size {cfg.moe_ffn}",
            f"--expert-model-parallel-size {c['ep']}", f"--expert-tensor-parallel-size {c['etp']}",
            "--moe-token-dispatcher-type alltoall", "--moe-grouped-gemm"]
    if cfg.shared_ffn:
        args.append(f"--moe-shared-expert-intermediate-size {cfg.shared_ffn}")
        args += ["--moe-shared-expert-gate"] if cfg.shared_gate else []
    moe = [int(cfg.is_moe_layer(i)) for i in range(cfg.layers)]
    if not all(moe):
        args.append(f"--moe-layer-freq '{layer_pattern(moe)}'")
    return args


def layer_pattern(bits: list[int]) -> str:
    """A per-layer 0/1 list as the Python list expression Megatron's ``--moe-layer-freq`` and
    ``--window-attn-skip-freq`` evaluate: a repeated period, or runs (quoted where it is printed
    as a shell line).

    >>> layer_pattern([0, 0, 0, 1, 1]), layer_pattern([1, 0, 1, 0])
    ('([0]*3+[1]*2)', '([1,0])*2')
    """
    n = len(bits)
    period = next(p for p in range(1, n + 1) if n % p == 0 and bits == bits[:p] * (n // p))
    if 1 < period <= 4 and period < n:
        return f"([{','.join(map(str, bits[:period]))}])*{n // period}"
    runs: list[list[int]] = []
    for b in bits:
        if runs and runs[-1][0] == b:
            runs[-1][1] += 1
        else:
            runs.append([b, 1])
    return "(" + "+".join(f"[{b}]*{k}" for b, k in runs) + ")"


def torchtitan_config(plan) -> dict:
    """A torchtitan job config (the [parallelism] and [training] sections) for the plan."""
    c = _check_expressible(plan, "torchtitan")
    n = plan.cluster.n_devices
    shard = c["dp"] if c["zero"] >= 2 else 1
    return {
        "parallelism": {"data_parallel_replicate_degree": c["dp"] // shard, "data_parallel_shard_degree": shard,
                        "tensor_parallel_degree": c["tp"], "context_parallel_degree": c["cp"],
                        "pipeline_parallel_degree": c["pp"], "expert_parallel_degree": c["ep"],
                        "expert_tensor_parallel_degree": c["etp"],
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
            "expert_parallel_degree": c["ep"], "expert_tensor_parallel_degree": c["etp"],
            "context_parallel": c["cp"] > 1}


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
