"""Export a plan to the engines people run: Megatron-LM arguments, a torchtitan config, a DTensor
``parallelize_module`` plan (plus the runtime's RunSpec).

A SymTensor plan is per-op; an engine takes one configuration for the whole model. A plan exports
when its ops agree on a Megatron-style configuration on every device (``plan.summary.config_summary``:
not heterogeneous) and that configuration passes the checks the engine makes at launch
(``launch_refusal``); otherwise the export refuses in one line, naming what differs or the rule,
and the nearest exportable plan (``nearest``): it never writes a configuration that would fail at
launch. No torch import here: the DTensor plan is data (module name -> parallel style), which
``symtensor.runtime.apply`` applies.
"""

from __future__ import annotations

from symtensor.cost.engine import reshards_after_forward, sharded_parameters
from symtensor.errors import PlanError
from symtensor.plan.summary import MEGATRON_KEYS, repeated_work
from symtensor.search.megatron import check_config, configuration, grid_points, pipeline_args

FORMATS = ("megatron", "torchtitan", "dtensor")


def _check_expressible(plan, engine: str) -> dict:
    """The plan's Megatron-style summary when ``engine`` can run it as one configuration; otherwise
    a one-line PlanError naming the reason and the nearest exportable plan."""
    c = plan.config
    if c["heterogeneous"]:
        differs = c["differs"]
        more = f" (and {len(differs) - 1} more)" if len(differs) > 1 else ""
        raise PlanError(f"{engine} takes one configuration for every layer, but this plan is heterogeneous: "
                        f"{differs[0]}{more}; {nearest(plan)}")
    why = launch_refusal(plan, c)
    if why is not None:
        raise PlanError(f"{engine} would refuse this plan at launch: {why}; {nearest(plan)}")
    if engine == "torchtitan" and c["cp"] > 1 and c["zero"] == 0:
        raise PlanError(f"torchtitan would not run this plan as it is costed: {_torchtitan_cp_fsdp(c)}; the nearest "
                        f"exportable configuration: {_evaluate_command(plan, c, zero=1)} (FSDP2 over dp x cp, which "
                        "torchtitan runs; or export this one to megatron)")
    if engine == "torchtitan" and plan.model.is_moe and c["ep"] > 1:
        why = _torchtitan_ep(c)
        if why is not None:
            raise PlanError(f"torchtitan would refuse this plan at launch: {why}; the nearest exportable "
                            f"configuration: {_evaluate_command(plan, c, zero=3)} (or export this one to megatron)")
    return c


def launch_refusal(plan, c: dict) -> str | None:
    """The first rule that the engines assert at launch and the configuration ``c`` (the plan's
    summary) breaks, or None: Megatron-LM's rules as ``megatron.check_config`` states them
    (the world size, dp x micro batch dividing the global batch, tp dividing the heads and the
    MLP widths, the sequence cut, the expert grid, the pipeline split), and context parallelism's
    load balancing (the sequence in 2cp chunks, as Megatron-LM and torchtitan cut it); torchtitan's
    expert grid is ``_torchtitan_ep``."""
    try:
        check_config(plan.model, plan.cluster.n_devices, {k: c[k] for k in MEGATRON_KEYS})
    except PlanError as exc:
        return str(exc)
    if c["cp"] > 1 and c["seq"] % (2 * c["cp"]):
        return f"seq={c['seq']} does not split into 2cp = {2 * c['cp']} load-balanced chunks"
    return None


def _torchtitan_dp(c: dict) -> tuple[int, int, str]:
    """torchtitan's data parallelism for the plan's ZeRO stage: ``data_parallel_replicate_degree``,
    ``data_parallel_shard_degree`` and ``fsdp_reshard_after_forward`` (torchtitan/config/job_config.py
    ``Parallelism``; torchtitan/distributed/fsdp.py ``get_fsdp_reshard_after_forward_policy``).
    ZeRO 0 is DDP. Above it FSDP2 (``fully_shard``) shards parameters, gradients and optimizer
    state over dp and, as the fsdp2 engine costs it (``cost.engine``), reshards after forward at
    ZeRO 3 only: "always" there (torchtitan's "default" does not reshard under pipeline
    parallelism), "never" at ZeRO 1/2 (each block gathered once per micro-batch, kept to its
    backward). torchtitan has no ZeRO 1 (sharded optimizer state beside replicated gradients):
    ZeRO 1 runs as ZeRO 2, which the fsdp2 engine costs with the same collectives and no more memory
    (the gradients sharded too); the export says so (``_zero_note``)."""
    if not sharded_parameters(c["zero"], "fsdp2"):
        return c["dp"], 1, "default"
    return 1, c["dp"], "always" if reshards_after_forward(c["zero"]) else "never"


def _torchtitan_cp_fsdp(c: dict) -> str:
    """Why torchtitan cannot run a ZeRO-0 plan with context parallelism as DDP: it applies FSDP2
    whenever cp > 1 (``ParallelDims.fsdp_enabled`` is ``dp_shard_enabled or cp_enabled``;
    torchtitan/models/llama3/infra/parallelize.py shards over its ``dp_shard_cp`` mesh, dp_shard x
    cp, before it considers DDP), even at data_parallel_shard_degree 1, and it has no setting that
    keeps the parameters replicated there. Above ZeRO 0 it is what the plan costs: the cost model
    shards ZeRO's state over the data-parallel axes dp x cp (``cost.params.data_axes``)."""
    return (f"with context parallelism (cp={c['cp']}) it shards the parameters with FSDP over dp x cp = "
            f"{c['dp'] * c['cp']} ranks (ParallelDims.fsdp_enabled, its dp_shard_cp mesh) even at "
            "data_parallel_shard_degree 1, so a ZeRO-0 plan would not run as the DDP it is costed as")


def _zero1_note(engine: str, setting: str) -> str:
    """The note of a ZeRO-1 plan run as FSDP2 without resharding after forward (ZeRO-2)."""
    return (f"{engine} has no ZeRO-1: this plan runs as FSDP2 with {setting}, which shards the gradients too "
            "(ZeRO-2); under the fsdp2 engine that is the same collectives and no more memory than the plan "
            "predicts (--zero 2 costs it)")


def _torchtitan_ep(c: dict) -> str | None:
    """torchtitan's expert grid (``ParallelDims``): expert TP is 1 or tp, and EP borrows all of
    cp (and tp when expert TP is 1) and part of the FSDP degree ``data_parallel_shard_degree``,
    which a plan without sharded state (ZeRO 0: DDP) leaves at 1."""
    tp, cp, ep, etp = c["tp"], c["cp"], c["ep"], c["etp"]
    shard = _torchtitan_dp(c)[1]
    if etp not in (1, tp):
        return f"torchtitan takes expert TP 1 or tp={tp}, not etp={etp}"
    borrowed = cp * (tp if etp == 1 else 1)
    if ep % borrowed or (shard * borrowed) % ep:
        return (f"its expert parallelism borrows cp{' x tp' if etp == 1 else ''} = {borrowed} and FSDP ranks "
                f"(data_parallel_shard_degree {shard} at ZeRO-{c['zero']}), so ep={ep} must be a multiple of "
                f"{borrowed} dividing {shard * borrowed}")
    return None


def _evaluate_command(plan, c: dict, **changed) -> str:
    """The ``symtensor evaluate`` command of the plan's configuration ``c`` with ``changed``."""
    c = {**c, **changed}
    cl = plan.cluster
    flags = " ".join(f"--{k} {c[k]}" for k in ("tp", "pp", "dp", "cp", "ep", "etp", "zero", "micro_batch",
                                                "global_batch", "seq", "vpp"))
    flags = flags.replace("_", "-") + (" --sp" if c["sp"] else "") + f" --recompute {c['recompute']}"
    flags += f" --framework {c['framework']}" if c["framework"] != "megatron" else ""
    return f"symtensor evaluate {_model_arg(plan.model)} --cluster {cl.name} --devices {cl.n_devices} {flags}"


def nearest(plan) -> str:
    """The nearest exportable plan, as the command that finds it: the Megatron space at the plan's
    global batch, or else at the least larger one that has a Megatron configuration (first the
    batch that lets data parallelism use every device, when devices repeat work)."""
    c, cl = plan.config, plan.cluster
    gb, repeat = c["global_batch"], repeated_work(plan)
    framework = f" --framework {c['framework']}" if c["framework"] != "megatron" else ""
    command = (f"symtensor plan {_model_arg(plan.model)} --cluster {cl.name} --devices {cl.n_devices} "
               f"--seq {c['seq']}{framework}")
    tail = f" (--global-batch {repeat[2]} lets every device take its own share)" if repeat else ""
    batches = [gb] + ([repeat[2]] if repeat else []) + [gb * k for k in (2, 3, 4, 6, 8, 12, 16)]
    for batch in dict.fromkeys(batches):
        if _megatron_runs(plan, batch):
            return (f"the nearest exportable plan: {command} --global-batch {batch} --space megatron"
                    + (tail if batch == gb else ""))
    return (f"no Megatron configuration runs {plan.model.name} on {cl.n_devices} devices at a global batch of "
            f"{gb} to {16 * gb}; change the device count or the global batch{tail}")


def _megatron_runs(plan, global_batch: int) -> bool:
    """Whether some Megatron configuration (``search.megatron.grid_points``, validated) runs the
    plan's model on its cluster at ``global_batch``."""
    cfg, cl = plan.model, plan.cluster
    node = cl.levels[0].fanout or cl.n_devices
    for point in grid_points(cfg, cl.n_devices, node, global_batch, plan.seq):
        try:
            check_config(cfg, cl.n_devices, configuration(point))
        except PlanError:
            continue
        return True
    return False


def _model_arg(cfg) -> str:
    """The model as ``symtensor plan`` takes it: its preset (with the ``--set`` overrides that
    make it this model), or the config file it came from."""
    from dataclasses import fields

    from symtensor.models import PRESETS

    preset = PRESETS.get(cfg.name)
    if preset is None:
        return cfg.source if cfg.source.endswith(".json") else cfg.name
    changed = []
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if f.compare and value != getattr(preset, f.name):
            shown = ",".join(map(str, value)) if isinstance(value, tuple) else value  # as --set parses it
            changed.append(f"--set {f.name}={shown}")
    return " ".join([cfg.name] + changed)


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
    pipeline = pipeline_args(cfg.layers, c["pp"], c["vpp"], plan.train.stage_layers(cfg.layers))
    if pipeline is None:
        raise PlanError(f"Megatron-LM would refuse this plan at launch: its split of {cfg.layers} layers over pp="
                        f"{c['pp']} stages, {list(plan.train.stage_layers(cfg.layers))}, is neither even nor the "
                        f"first and last stages apart; {nearest(plan)}")
    args += pipeline + _attention_args(cfg)
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
    replicate, shard, reshard = _torchtitan_dp(c)
    out = {
        "parallelism": {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
                        "fsdp_reshard_after_forward": reshard,
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
    if c["zero"] == 1:
        out["_zero_note"] = _zero1_note("torchtitan", "fsdp_reshard_after_forward 'never'")
    if replicate > 1 and shard == 1 and (c["tp"] > 1 or c["pp"] > 1 or c["ep"] > 1):
        out["_ddp_note"] = _ddp_note(plan, c)
    return out


def _ddp_note(plan, c: dict) -> str:
    """Why a ZeRO-0 plan with other parallelisms depends on the torchtitan version: it runs as DDP
    over data_parallel_replicate_degree beside them. torchtitan's parallelize functions refused
    that once (``if world_mesh.ndim > 1: raise RuntimeError("DDP has not supported > 1D
    parallelism")``); later ones check the dp_replicate mesh only (``parallel_dims.get_mesh(
    "dp_replicate")``), so it launches there."""
    return ("this plan runs as DDP (data_parallel_replicate_degree) beside tensor, pipeline or expert parallelism: "
            "torchtitan versions whose parallelize checks world_mesh.ndim > 1 raise 'DDP has not supported > 1D "
            "parallelism' at launch (newer ones check the dp_replicate mesh only); with such a version, export "
            f"the FSDP2 plan instead: {_evaluate_command(plan, c, zero=1)}")


def dtensor_plan(plan) -> dict:
    """Per module, the DTensor parallel style (``parallelize_module`` plan) and the mesh axes, and
    the data parallelism over ``data_parallel_axes`` (dp and cp: the axes the cost model reduces
    gradients and shards ZeRO's state over, ``cost.params.data_axes``), as the fsdp2 engine costs
    each ZeRO stage (``cost.engine``): ZeRO 0 replicates (DDP, PyTorch's ``replicate``); above it
    ``fully_shard`` (FSDP2) shards parameters, gradients and optimizer state, with
    ``reshard_after_forward`` True at ZeRO 3 (gathered again in backward) and False at ZeRO 1/2
    (gathered once per micro-batch, kept to backward; torch.distributed.fsdp.fully_shard). FSDP2
    has no ZeRO 1: it runs as ZeRO 2, which the fsdp2 engine costs with the same collectives and
    no more memory; the export says so (``_zero_note``). The same rule as ``_torchtitan_dp``."""
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
    data_axes = [name for name in ("dp", "cp") if c[name] > 1]
    shard = bool(data_axes) and sharded_parameters(c["zero"], "fsdp2")
    out = {"mesh": mesh, "tp_plan": styles,
           "data_parallel": ("fully_shard" if shard else "replicate") if data_axes else None,
           "data_parallel_axes": data_axes, "fully_shard": shard,
           "reshard_after_forward": reshards_after_forward(c["zero"]) if shard else None,
           "expert_parallel_degree": c["ep"], "expert_tensor_parallel_degree": c["etp"],
           "context_parallel": c["cp"] > 1}
    if shard and c["zero"] == 1:
        out["_zero_note"] = _zero1_note("FSDP2 (fully_shard)", "reshard_after_forward=False")
    return out


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
