"""``symtensor run``: plan (or load a plan), execute it under torchrun, check numerics and bytes.

The runtime executes the plans its RunSpec can express (``runtime.lower``: Megatron-style tensor
parallelism, data parallelism, FSDP2, expert parallelism over whole axes, pipelines of
data-parallel stages). A plan is lowered to a RunSpec on the plan's own mesh axes
(``runtime.lower.plan_to_spec``); a plan that needs anything else is refused with the reason
before any process starts. The same configuration is costed by the model with the
runtime's precision (fp32 weights, activations and gradients) and its per-kind bytes per device
and step are compared with what the run issued.

No torch import at module level: ``symtensor.runtime.launch`` imports it when a run starts.
"""

from __future__ import annotations

from symtensor.cost import Evaluator
from symtensor.errors import PlanError
from symtensor.hardware import GIB
from symtensor.models import build_graph, load_model_config
from symtensor.plan.parallelism import DEFAULT_FRAMEWORK, Heterogeneous
from symtensor.runtime.lower import CAPABILITIES, plan_to_spec
from symtensor.search.megatron import assign_axes, megatron_layouts, megatron_plan

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def local_cluster(devices: int):
    """The processes of one machine as a one-level cluster; its speeds only rank configurations
    (bytes do not depend on them). CPU-class numbers, not a measured machine."""
    from symtensor.hardware import cluster_from_dict

    return cluster_from_dict({"name": "local-gloo", "device": {"name": "cpu-process", "peak_tflops": {"bf16": 1,
                              "fp32": 1}, "hbm_gbps": 50, "memory_gib": 64},
                              "levels": [{"name": "loopback", "bandwidth_gbps": 5, "latency_us": 20}]}, devices)
TOLERANCE = 0.01


ATTENTION_BLOCKS = ("q_proj", "k_proj", "v_proj", "q_rope", "k_rope", "core", "scores", "softmax", "context",
                    "o_proj")


def predicted_bytes(plan, attention_only: bool = False) -> dict:
    """Bytes per collective kind per device per step the model predicts for the runtime's
    execution of ``plan`` on its devices' processes, at fp32."""
    rep = prediction(plan, local_cluster(plan.cluster.n_devices), attention_only)
    return {k: rep.comm_bytes.get(k, 0.0) for k in KINDS}


def prediction(plan, cluster, attention_only: bool = False, dtype: str = "fp32"):
    """The cost report of the runtime's execution of the Megatron-style ``plan`` on ``cluster``:
    fp32 weights and gradients, activations in ``dtype`` (fp32 on CPU, bf16 under the GPU run's
    autocast)."""
    p, cfg = plan.parallelism, plan.model
    if cfg.is_moe:
        # the runtime gives every expert room for all tokens (no dropping): capacity c = s
        cfg = cfg.replace(capacity_factor=cfg.experts / cfg.top_k)
    graph = build_graph(cfg, micro_batch=p.micro_batch * p.dp, seq=p.seq, dtype=dtype, skeleton=True)
    train = p.train.replace(param_bytes=4, grad_bytes=4, framework=CAPABILITIES.engine)
    ev = Evaluator(graph, cluster, pp=p.pp, framework=train.framework)
    c = p.as_dict()  # the Megatron layouts' working record
    layouts = megatron_layouts(graph, ev.mesh, c)
    # the runtime gathers the logits for the loss instead of a vocabulary-parallel cross-entropy
    for op in graph.ops:
        if op.kind == "cross_entropy":
            layouts[op.name] = layouts[op.name].without_axes(set(layouts[op.name].axes_of("v")))
    if attention_only:  # every op outside attention repeats over the tensor-parallel axes
        tp_axes = set(assign_axes(ev.mesh, c)["tp"])
        for op in graph.ops:
            if op.block.split(".")[0] not in ATTENTION_BLOCKS:
                layouts[op.name] = layouts[op.name].without_axes(tp_axes)
    return ev.evaluate(layouts, train)


def measured_bytes(result: dict) -> dict:
    """The last step's bytes per kind on the busiest rank (send and receive counted as send_recv)."""
    last = result["comm_bytes"][-1]
    per_rank = []
    for rank in last:
        kinds = {k: 0.0 for k in KINDS}
        for kind, nbytes in rank.items():
            key = "send_recv" if kind in ("send", "recv") else kind
            if key in kinds:
                kinds[key] += nbytes
        per_rank.append(kinds)
    return max(per_rank, key=lambda k: sum(k.values()))


def run(model: str, devices: int, steps: int = 2, optimizer: str = "sgd", global_batch: int = 8, seq: int = 16,
        tp: int | None = None, zero: int = 0, ep: int | None = None, pp: int = 1, plan_file: str | None = None,
        dp_shard: int | None = None, attention_only: bool = False, timeout_s: float = 300,
        master_port: int | None = None, device: str = "cpu", cluster: str | None = None) -> dict:
    """Run a plan file's configuration, or the fastest runnable one (or the given tp); compare.

    ``timeout_s`` and ``master_port``: see ``symtensor.runtime.launch.run_spec``. ``device="cuda"``
    runs on this machine's GPUs (NCCL, bf16 autocast) and reports the measured step time and peak
    memory beside the prediction on ``cluster`` (a preset or cluster file; default: the preset of
    this GPU); bytes are reported there, numerics are checked on CPU only. ``dp_shard``: hybrid
    sharding (HSDP: ``fully_shard`` on a 2-D mesh, replicas x shards), with ``zero`` 1, 2 or 3."""
    from symtensor.runtime.launch import run_spec

    cfg = load_model_config(model)
    if device not in ("cpu", "cuda"):
        raise PlanError(f"--device {device!r}: use cpu (gloo processes) or cuda (this machine's GPUs, NCCL)")
    gpu_cluster = _gpu_cluster(cluster, devices) if device == "cuda" else None
    if device == "cpu":
        _small_enough(cfg)
    plan = (runnable_plan(plan_file, cfg, devices) if plan_file
            else choose_plan(cfg, devices, global_batch, seq, tp, zero, ep, pp, dp_shard))
    config = plan.parallelism
    if attention_only:
        if config.tp == 1:
            raise PlanError("--attention-only-tp needs --tp > 1")
        config = config.replace(sp=False)
        plan = megatron_plan(cfg, plan.cluster, **config.as_dict())
    spec = plan_to_spec(plan, attention_only)
    if device == "cpu":
        _few_enough_tokens(config)
    predicted = predicted_bytes(plan, attention_only)  # its errors come before any process starts
    result = run_spec(model, spec, steps=steps, optimizer=optimizer, nproc=devices, timeout_s=timeout_s,
                      master_port=master_port, device=device)
    measured = measured_bytes(result)
    rows = []
    for kind in KINDS:
        p, m = predicted[kind], measured[kind]
        ok = abs(p - m) <= TOLERANCE * max(p, m) + 1e-9
        rows.append({"kind": kind, "predicted_bytes": p, "measured_bytes": m, "ok": ok})
    numerics_ok = None if device == "cuda" else result["loss_max_abs_diff"] <= (1e-5 if optimizer == "sgd" else 1e-4)
    out = {"model": cfg.name, "devices": devices, "device": device, "config": config.as_dict(), "spec": spec.to_dict(),
           "losses": result["losses"], "reference_losses": result["reference_losses"],
           "loss_max_abs_diff": result["loss_max_abs_diff"], "param_max_abs_diff": result["param_max_abs_diff"],
           "numerics_ok": numerics_ok, "bytes": rows, "bytes_ok": all(r["ok"] for r in rows),
           "step_times_s": result["step_times_s"], "wall_s": result["wall_s"]}
    if gpu_cluster is not None:
        rep = prediction(plan, gpu_cluster, attention_only, dtype="bf16")
        timed = result["step_times_s"][1:] or result["step_times_s"]  # the first step warms up NCCL and the allocator
        out |= {"cluster": gpu_cluster.name, "predicted_step_s": rep.step_time_s,
                "measured_step_s": sorted(timed)[len(timed) // 2], "predicted_memory_gib": rep.memory_peak / GIB,
                "measured_memory_gib": max(result["peak_memory_bytes"]) / GIB}
    return out


def _gpu_cluster(spec: str | None, devices: int):
    """The cluster a GPU run is predicted on, checked before any process starts."""
    import torch

    from symtensor.hardware.cluster import load_cluster, preset_for

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if devices > gpus:
        raise PlanError(f"--device cuda --devices {devices}: torch sees {gpus} GPU(s) on this machine")
    spec = spec or preset_for(torch.cuda.get_device_name(0), None)
    if spec is None:
        raise PlanError(f"no cluster preset is a {torch.cuda.get_device_name(0)}: give --cluster FILE for the "
                        "prediction (symtensor profile --out FILE measures one)")
    return load_cluster(spec, devices=devices)


def runnable_plan(path: str, cfg, devices: int):
    """The Megatron-style plan of a plan file, for model ``cfg`` on ``devices`` processes; refused
    when the runtime cannot run it."""
    from symtensor.plan import load_plan
    from symtensor.validate import same_model

    plan = load_plan(path)
    if plan.model.name != cfg.name:
        raise PlanError(f"plan {path} is for model {plan.model.name}, not {cfg.name}")
    same_model(plan.model, cfg, f"plan {path}")
    if plan.cluster.n_devices != devices:
        raise PlanError(f"plan {path} is for {plan.cluster.n_devices} devices, not --devices {devices}")
    try:
        plan.parallelism  # noqa: B018 (read for its refusal)
    except Heterogeneous:
        raise PlanError(f"plan {path} gives different ops different cuts; the runtime runs Megatron-style plans "
                        "(plan with --space megatron)") from None
    return plan


def choose_plan(cfg, devices: int, global_batch: int, seq: int, tp: int | None = None, zero: int = 0,
                ep: int | None = None, pp: int = 1, dp_shard: int | None = None):
    """The plan of the runnable configuration the model predicts fastest (or the one asked for)
    on the ``devices`` processes of this machine; ``dp_shard``: hybrid sharding over that many
    of the data-parallel processes (the innermost)."""
    cluster = local_cluster(devices)
    best = None
    if devices % pp:
        raise PlanError(f"--pp {pp} does not divide the {devices} processes; use a divisor of {devices}")
    if tp and (devices // pp) % tp:
        raise PlanError(f"--tp {tp} does not divide the {devices // pp} processes of a pipeline stage; use a divisor "
                        f"of {devices // pp}")
    tps = [tp] if tp else [t for t in (1, 2, 4, 8) if (devices // pp) % t == 0 and cfg.heads % t == 0
                          and cfg.kv_heads % t == 0]
    refused = None  # why the runtime refused a configuration the model could cost
    for t in tps:
        dp = devices // (t * pp)
        # experts fold over whole axes of the runtime's mesh: all of a stage's ranks, the tp axis, none
        eps = [ep] if ep else (list(dict.fromkeys([t * dp, t, 1])) if cfg.is_moe else [1])
        for e in eps:
            try:
                # a pipeline needs micro-batches: one sequence each; otherwise one micro-batch per step
                mb = 1 if pp > 1 else global_batch // dp
                z = zero if dp > 1 else 0  # ZeRO 1/2 runs as the fsdp2 engine costs it (plan_to_spec)
                plan = megatron_plan(cfg, cluster, tp=t, pp=pp, dp=dp, ep=e, sp=t > 1, zero=z, micro_batch=mb,
                                     global_batch=global_batch, seq=seq, dp_shard=dp_shard,
                                     framework=CAPABILITIES.engine if z in (1, 2) else DEFAULT_FRAMEWORK)
            except PlanError as exc:
                refused = refused or (exc if dp_shard else None)  # (a hybrid sharding the processes cannot take)
                continue
            try:
                plan_to_spec(plan)  # only what the runtime runs (experts over whole mesh axes)
            except PlanError as exc:
                refused = exc
                continue
            if best is None or plan.report.step_time_s < best[0]:
                best = (plan.report.step_time_s, plan)
    if best is None and refused is not None:
        raise refused
    if best is None:
        raise PlanError(f"no runnable configuration of {cfg.name} on {devices} processes with global batch "
                        f"{global_batch}: {_why_none(cfg, devices, global_batch, tps, pp)}")
    return best[1]


def _why_none(cfg, devices: int, global_batch: int, tps: list[int], pp: int) -> str:
    """Why no configuration ran, and a change that differs from what was given."""
    dp = devices // (max(tps) * pp)
    if global_batch % dp:
        fix = dp * max(1, -(-global_batch // dp))
        return f"the batch must split over the {dp} data-parallel ranks; try --global-batch {fix}"
    return (f"tp={', '.join(map(str, tps))} must divide the heads ({cfg.heads}, {cfg.kv_heads} kv) and the memory "
            "must fit; try fewer --devices or another --tp")


# symtensor run trains on CPU: fp32 weights, gradients and AdamW state on every process and the reference
RUN_MAX_PARAMS = 200_000_000
RUN_MAX_TOKENS, RUN_MAX_SEQ = 65_536, 8192  # per step; attention's work grows with seq^2


def _few_enough_tokens(p) -> None:
    tokens = p.global_batch * p.seq
    if p.seq > RUN_MAX_SEQ or tokens > RUN_MAX_TOKENS:
        raise PlanError(f"run trains on CPU processes: --global-batch {p.global_batch} x --seq {p.seq} = "
                        f"{tokens:,} tokens per step; the limits are {RUN_MAX_TOKENS:,} tokens and sequences of "
                        f"{RUN_MAX_SEQ:,}; give a smaller batch or sequence")


def _small_enough(cfg) -> None:
    params = build_graph(cfg, micro_batch=1, seq=1).params_total()
    if params > RUN_MAX_PARAMS:
        raise PlanError(f"run trains {cfg.name} on CPU processes: {params / 1e6:,.0f}M parameters is above the "
                        f"limit of {RUN_MAX_PARAMS / 1e6:,.0f}M; run a small model (tiny-llama, tiny-mixtral) or a "
                        "config.json with fewer layers and a smaller width")
