"""Plan -> Megatron-LM (megatron-core) command-line arguments.

The plan's configuration (``Plan.parallelism``) lowered to Megatron-LM's arguments: its
parallelism (the expert layers' own grid folded over the stage's ranks), the pipeline split,
recomputation and the distributed optimizer (ZeRO 1) or Megatron-FSDP (ZeRO 3), then the model.
``CAPABILITIES`` is what Megatron-LM runs beyond the configuration rule; ``refusal`` the rules it adds.
"""

from __future__ import annotations

from symtensor.cost.pipeline import ends_split, layout_string, parse_layout
from symtensor.cost.precision import AMAX_HISTORY, QUANTIZED, RECIPES, is_mxfp8, shape_refusal
from symtensor.cost.recompute import modules_of
from symtensor.cost.stack_kernels import engine_refusal
from symtensor.errors import PlanError
from symtensor.export.common import MEGATRON_LM, family_args, lowered, query_group_args, size_args
from symtensor.plan.parallelism import Capabilities, Parallelism, pipeline_split

# Megatron-LM's distributed optimizer is ZeRO-1 (megatron/core/optimizer/distrib_optimizer.py), Megatron-FSDP's
# optim_grads_params ZeRO-3 (megatron/core/distributed/fsdp, as cost.engine's megatron engine charges it); it runs
# context parallelism and any expert grid the configuration rule accepts, in BF16, FP8 or NVFP4 (--fp4-format)
CAPABILITIES = Capabilities(name="Megatron-LM", engine="megatron", zero=(0, 1, 2, 3), precision=("bf16", "fp8", "fp4"),
                            a2a=True)

# The Megatron-LM whose Megatron-FSDP arguments ``fsdp_args`` writes and ``fsdp_problems`` checks
# (megatron/training/arguments.py ``validate_args``): NVIDIA/Megatron-LM d98e8a64ddf3 (2026-08-22). The flag is
# --use-megatron-fsdp since af28b5a (2025-08-21); before it --use-custom-fsdp (e.g. 1e05700, 2025-05-24, which
# also asserted --no-gradient-accumulation-fusion for optim_grads(_params) and had no hybrid FSDP).
FSDP_SOURCE = "NVIDIA/Megatron-LM@d98e8a6 megatron/training/arguments.py"


def refusal(p: Parallelism) -> str | None:
    """The first rule of ``CAPABILITIES`` that configuration ``p`` breaks, or None. Hybrid
    sharding is ``--num-distributed-optimizer-instances`` (dp x cp / dp_shard) beside
    ``--use-distributed-optimizer``: Megatron-LM asserts that the instances divide dp x cp and
    the expert data-parallel size (megatron/core/parallel_state.py), which the configuration rule
    already holds (``plan.parallelism._hybrid_refusal``); without the distributed optimizer
    (ZeRO 0) the instances have nothing to shard."""
    if p.zero not in CAPABILITIES.zero:
        return f"Megatron-LM has no ZeRO-{p.zero}: plan with --zero 0 to 3, or export to torchtitan"
    if p.hsdp and p.zero == 0:
        return "--num-distributed-optimizer-instances needs --use-distributed-optimizer (ZeRO-1)"
    if p.recompute not in CAPABILITIES.recompute and not modules_of(p.recompute):
        return (f"Megatron-LM has no {p.recompute} recomputation (torchtitan's selective checkpointing): use "
                "--recompute selective or full, or export to torchtitan")
    return engine_refusal(p.stack, "megatron")


def fsdp_args(p: Parallelism) -> list[str]:
    """Megatron-FSDP (ZeRO 2 and 3) as cost.engine's megatron engine charges it (``FSDP_SOURCE``): gradients and
    optimizer states sharded over dp x cp at ZeRO 2 (``optim_grads``: a reduce-scatter per micro-batch, the
    replicated weights gathered once per step), parameters too at ZeRO 3 (``optim_grads_params``), in the
    ``fsdp_dtensor`` checkpoint format
    arguments.py asserts with it; ``--use-distributed-optimizer`` stays (Megatron-FSDP v1, the default
    ``--megatron-fsdp-version``, runs Megatron-core's DistributedOptimizer and sets it when absent). Hybrid
    sharding is ``--num-distributed-optimizer-instances`` with the outer replicas unsharded (the default
    ``--outer-dp-sharding-strategy no_shard``: HSDP). The gradient dtype is stated: since b969f76 (2026-03-02)
    Megatron-FSDP keeps and reduces gradients in ``--megatron-fsdp-main-grads-dtype`` (default ``auto``, the
    parameters' bf16) and no longer reads ``--grad-reduce-in-bf16`` alone, so fp32 unless the plan states bf16.
    Launch: CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (arguments.py asserts it is not 1)."""
    dtype = "bf16" if p.stack.grad_reduce_bf16 else "fp32"
    strategy = "optim_grads_params" if p.zero == 3 else "optim_grads"
    return ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {strategy}",
            "--ckpt-format fsdp_dtensor", f"--megatron-fsdp-main-grads-dtype {dtype}"]


def overlap_args(p: Parallelism) -> list[str]:
    """What the megatron engine costs and Megatron-LM leaves off by default (megatron/training/arguments.py,
    megatron/core/model_parallel_config.py at ``FSDP_SOURCE``'s commit: each flag default False): the gradient
    reduction overlapped with backward (``--overlap-grad-reduce``, ``cost.engine``'s ``overlap_grad_reduce``) and the
    parameter all-gather with the next forward (``--overlap-param-gather``: the distributed optimizer's or
    Megatron-FSDP's; arguments.py asserts it beside --overlap-grad-reduce) wherever there is data parallelism;
    Transformer Engine's tensor-parallel communication overlap (``--tp-comm-overlap``, ``engine.tp_overlapped``;
    arguments.py asserts sequence parallelism with it); the fused cross-entropy (``--cross-entropy-loss-fusion``)
    unless the plan states the vocab-parallel loss (``cost.stack_kernels``: what Megatron-core runs without it). A plan
    whose stack states an overlap off (``Stack.tp_comm_overlap``, ``Stack.dp_comm_overlap``) leaves its flags out."""
    args = []
    if p.dp * p.cp > 1 and p.stack.dp_comm_overlap is not False:
        args.append("--overlap-grad-reduce")
        args += ["--overlap-param-gather"] if p.zero >= 1 else []
    if p.tp > 1 and p.sp and p.stack.tp_comm_overlap is not False:
        args.append("--tp-comm-overlap")
    return args + ([] if p.stack.loss == "vocab-parallel" else ["--cross-entropy-loss-fusion"])


def fp8_refusal(p: Parallelism, model) -> str | None:
    """Why Transformer Engine would refuse an FP8 (or NVFP4: the same ``assert_dim_for_fp8_exec``) plan's GEMM
    shapes at launch (``precision.shape_refusal``)."""
    if p.precision not in QUANTIZED:
        return None
    why = shape_refusal(model, p.tp, p.cp, p.micro_batch * p.seq)
    what = "FP8" if p.precision == "fp8" else "NVFP4"
    return None if why is None else f"Transformer Engine would refuse this {what} plan at launch: {why}; plan it in " \
        "BF16"


def precision_args(p: Parallelism) -> list[str]:
    """BF16, and under FP8 Transformer Engine's recipe (megatron/training/arguments.py ``--fp8-format``,
    ``--fp8-recipe``): the hybrid format (E4M3 forward, E5M2 gradients) except MXFP8, which runs E4M3
    throughout (Transformer Engine's ``MXFP8BlockScaling`` default); delayed scaling with the amax history
    the cost model charges (``precision.AMAX_HISTORY``, NeMo's). Under FP4 Transformer Engine's NVFP4 recipe
    (megatron/core/transformer/transformer_config.py ``fp4``: ``--fp4-format e2m1``, ``fp4_recipe``: ``--fp4-recipe
    nvfp4``; NVIDIA/Megatron-LM@d98e8a64). Then the low-precision stack facts (``lowp_args``)."""
    if p.precision == "fp4":
        return ["--bf16", "--fp4-format e2m1", f"--fp4-recipe {p.fp8_recipe}", *lowp_args(p)]
    if p.precision != "fp8":
        return ["--bf16"]
    recipe = RECIPES[p.fp8_recipe]
    args = ["--bf16", f"--fp8-format {'e4m3' if recipe.needs_mx else 'hybrid'}", f"--fp8-recipe {recipe.name}"]
    if recipe.history:
        args += [f"--fp8-amax-history-len {AMAX_HISTORY}", "--fp8-amax-compute-algo max"]
    return args + lowp_args(p)


def lowp_args(p: Parallelism) -> list[str]:
    """The low-precision stack facts (``cost.precision``) as Megatron-LM spells them (megatron/training/
    arguments.py, transformer_config.py @d98e8a64): the quantized parameters, ``--fp8-param-gather`` or, under FP4,
    ``--fp4-param-gather``, with MXFP8 under the distributed optimizer ``--reuse-grad-buf-for-mxfp8-param-ag`` (its
    parameters cannot map into the uint8 parameter buffer: TE's ``replace_raw_data`` refuses MXFP8, so the gather
    runs through the gradient buffer, as the cost model charges it; Megatron-FSDP turns the flag off itself); the
    BF16 layers, ``--first-last-layers-bf16`` with both counts stated (Megatron's defaults are 1 each)."""
    args = []
    if p.stack.fp8_param_gather:
        args.append("--fp4-param-gather" if p.precision == "fp4" else "--fp8-param-gather")
        if p.precision == "fp8" and is_mxfp8(RECIPES[p.fp8_recipe]) and p.zero == 1:
            args.append("--reuse-grad-buf-for-mxfp8-param-ag")
    first, last = p.stack.bf16_layers
    if (first, last) != (0, 0):
        args += ["--first-last-layers-bf16", f"--num-layers-at-start-in-bf16 {first}",
                 f"--num-layers-at-end-in-bf16 {last}"]
    return args


def pipeline_args(layers: int, pp: int, vpp: int, split: tuple[int, ...], stated: bool = False) -> list[str]:
    """Megatron-LM's arguments for ``layers`` over pp stages of vpp virtual stages each, split as
    ``split`` (layers per virtual stage; ``stated``: the configuration's own split, exported
    exactly; ``plan.parallelism.pipeline_split``)."""
    how = pipeline_split(layers, pp, vpp, split, stated)
    if how[0] == "even":
        return [f"--num-layers-per-virtual-pipeline-stage {how[1]}"] if vpp > 1 else []
    if how[0] == "slots":
        out = ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
        return out + ([f"--num-virtual-stages-per-pipeline-rank {vpp}"] if vpp > 1 else [])
    if how[0] == "ends":
        return [f"--decoder-first-pipeline-num-layers {how[1]}", f"--decoder-last-pipeline-num-layers {how[2]}"]
    return [f"--pipeline-model-parallel-layout '{layout_string(how[1])}'"]


def launched_split(layers: int, pp: int, args: list[str]) -> tuple[int, ...]:
    """The split (layers per virtual stage) Megatron-LM builds from its pipeline arguments, with
    the checks it makes at launch (a PlanError quoting the one that fails): arguments.py
    ``validate_args`` (at most one of --num-layers-per-virtual-pipeline-stage,
    --num-virtual-stages-per-pipeline-rank and --pipeline-model-parallel-layout; the layout's
    stages divide by pp; the layers, with the embedding and loss slots, divide by pp and the
    layers per rank by the layers per virtual stage), Megatron-core's TransformerConfig (the
    layout apart from the first/last and account-for flags; first/last > 0 and divisible by
    vpp; the middle ranks' layers even and divisible by vpp) and
    ``PipelineParallelLayerLayout.validate_layer_layout`` (``cost.pipeline.parse_layout``)."""
    flags = dict((a.split(" ", 1) + [""])[:2] for a in args)
    per_stage = flags.get("--num-layers-per-virtual-pipeline-stage")
    stages = flags.get("--num-virtual-stages-per-pipeline-rank")
    layout = flags.get("--pipeline-model-parallel-layout")
    if sum(x is not None for x in (per_stage, stages, layout)) > 1:
        raise PlanError("Megatron-LM takes no more than one of --num-layers-per-virtual-pipeline-stage, "
                        "--num-virtual-stages-per-pipeline-rank and --pipeline-model-parallel-layout")
    first, last = (flags.get(f"--decoder-{k}-pipeline-num-layers") for k in ("first", "last"))
    slots = ("--account-for-embedding-in-pipeline-split" in flags) + ("--account-for-loss-in-pipeline-split" in flags)
    if layout is not None:
        if first is not None or last is not None or slots:
            raise PlanError("Megatron-LM takes --pipeline-model-parallel-layout without the first/last stage and "
                            "account-for-embedding/loss arguments")
        return parse_layout(layout.strip("'"), pp, layers)
    if first is not None or last is not None:
        vpp = int(stages or 1)
        if per_stage is not None or slots:
            raise PlanError("Megatron-LM takes uneven first/last stages with --num-virtual-stages-per-pipeline-rank "
                            "only, and without the account-for-embedding/loss arguments")
        return ends_split(None if first is None else int(first), None if last is None else int(last), layers, pp, vpp)
    total = layers + slots
    if total % pp:
        raise PlanError(f"Megatron-LM: number of layers {total} should be divisible by the pipeline-model-parallel "
                        f"size {pp}")
    per_rank = total // pp
    vpp = int(stages) if stages is not None else per_rank // int(per_stage) if per_stage is not None else 1
    if per_stage is not None and per_rank % int(per_stage):
        raise PlanError(f"Megatron-LM: layers per pipeline stage {per_rank} must divide by the layers per virtual "
                        f"stage {per_stage}")
    if per_rank % vpp:
        raise PlanError(f"Megatron-LM: layers per pipeline rank {per_rank} must divide by vpp={vpp}")
    counts = [per_rank // vpp] * (pp * vpp)
    if "--account-for-embedding-in-pipeline-split" in flags:
        counts[0] -= 1
    if "--account-for-loss-in-pipeline-split" in flags:
        counts[-1] -= 1
    return tuple(counts)


def megatron_args(plan) -> list[str]:
    """Megatron-LM (megatron-core) command-line arguments for the plan: its parallelism (the
    expert layers' own grid folded over the stage's ranks), then the model."""
    p = lowered(plan, CAPABILITIES)
    why = refusal(p) or fp8_refusal(p, plan.model)
    if why is not None:
        raise PlanError(why)
    cfg = plan.model
    args = [f"--tensor-model-parallel-size {p.tp}", f"--pipeline-model-parallel-size {p.pp}",
            f"--context-parallel-size {p.cp}", f"--micro-batch-size {p.micro_batch}",
            f"--global-batch-size {p.global_batch}", f"--seq-length {p.seq}", *size_args(cfg)]
    if p.sp:
        args.append("--sequence-parallel")
    if p.cp > 1 and p.train.context == "a2a":  # (Megatron's "a2a: like DeepSpeed Ulysses")
        args.append("--cp-comm-type a2a")
    split = p.train.chunk_layers(cfg.layers)  # (the configuration rule took it: plan.parallelism.refusal)
    piped = pipeline_args(cfg.layers, p.pp, p.vpp, split, stated=p.layer_split is not None)
    launched = launched_split(cfg.layers, p.pp, piped)
    # Megatron builds the stated split exactly, the rule's at the same pace (its fullest rank)
    assert launched == split if p.layer_split is not None else max(launched) == max(split), (launched, split)
    args += piped + _attention_args(cfg)
    if cfg.is_moe:
        args += _moe_args(cfg, p)
    if p.recompute == "selective":
        args.append("--recompute-activations")
    elif p.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    elif modules_of(p.recompute):  # Megatron-core's module list (transformer_config.py recompute_modules)
        args += ["--recompute-granularity selective", f"--recompute-modules {' '.join(modules_of(p.recompute))}"]
    if p.zero >= 1:
        args.append("--use-distributed-optimizer")
    if p.hsdp:  # hybrid sharding: optimizer instances (or FSDP's outer replicas) of dp_shard ranks each, replicated
        args.append(f"--num-distributed-optimizer-instances {p.dp_replicate}")
    if p.stack.grad_reduce_bf16:  # the gradient buffer and its reduction in bf16 (cost.engine.Engine.grad_reduce_bf16)
        args.append("--grad-reduce-in-bf16")
    if p.stack.cpu_offload_layers:  # (Megatron sets cpu_offloading itself when N > 0: no --cpu-offloading flag exists;
        # cost.engine.CPU_OFFLOAD)
        args.append(f"--cpu-offloading-num-layers {p.stack.cpu_offload_layers}")
    if p.stack.offload_modules:  # (transformer_config.py fine_grained_activation_offloading, offload_modules: a
        # list, nargs='+'; cost.offload)
        args += ["--fine-grained-activation-offloading", f"--offload-modules {' '.join(p.stack.offload_modules)}"]
    if p.zero >= 2:
        args += fsdp_args(p)
    args += overlap_args(p)
    args += family_args(cfg, MEGATRON_LM, "Megatron-LM")
    args += ["--use-flash-attn", *precision_args(p)]
    return args


def _attention_args(cfg) -> list[str]:
    """GQA, head width, Q/K norms, multi-head latent attention, sliding windows and sinks."""
    args = query_group_args(cfg, MEGATRON_LM)
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
    if cfg.doc_tokens:  # packed documents (ModelConfig.doc_tokens): the data loader returns each sample's document
        # boundaries as cu_seqlens and attention runs per document in the THD format (Megatron-LM@d98e8a64dd
        # arguments.py "--dataloader-inter-document-masking", pretrain_gpt.py PackedSeqParams(qkv_format="thd"))
        args.append("--dataloader-inter-document-masking")
    return args


def _moe_args(cfg, p: Parallelism) -> list[str]:
    """The experts and their grid: EP and expert TP folded over the tp x cp x dp ranks of a
    stage (Megatron's MoE parallel folding), the alltoall dispatcher the cost model follows,
    shared experts and the dense layers among the MoE ones."""
    args = [f"--num-experts {cfg.experts}", f"--moe-router-topk {cfg.top_k}", f"--moe-ffn-hidden-size {cfg.moe_ffn}",
            f"--expert-model-parallel-size {p.ep}", f"--expert-tensor-parallel-size {p.etp}",
            *dispatcher_args(p), "--moe-grouped-gemm"]
    if cfg.shared_ffn:
        args.append(f"--moe-shared-expert-intermediate-size {cfg.shared_ffn}")
        args += ["--moe-shared-expert-gate"] if cfg.shared_gate else []
        args += ["--moe-shared-expert-overlap"] if p.stack.moe_shared_overlap else []
    moe = [int(cfg.is_moe_layer(i)) for i in range(cfg.layers)]
    if not all(moe):
        args.append(f"--moe-layer-freq '{layer_pattern(moe)}'")
    return args


def dispatcher_args(p: Parallelism) -> list[str]:
    """The token dispatcher and routing the cost model followed (``cost.moe``; megatron/training/
    arguments.py): ``--moe-token-dispatcher-type alltoall``, or ``flex`` with ``--moe-flex-dispatcher-backend
    deepep`` (DeepEP's normal kernels; --moe-enable-deepep is deprecated: transformer_config.py "Please use
    --moe-flex-dispatcher-backend=deepep instead") or ``hybridep`` (HybridEP; megatron/core/
    transformer/moe/README.md's dispatcher table); under auxiliary-loss routing its load-balancing type, and a capacity
    factor with Megatron's default drop policy stated (``probs``: the lowest-probability tokens go); the
    expert all-to-alls overlapped across micro-batches (``moe_ep_overlap``). Balanced routing, the cost
    model's default, is left to the run (a benchmark adds
    ``--moe-router-force-load-balancing``)."""
    args = {"deepep": ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep"],
            "hybridep": ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend hybridep"]}.get(
        p.stack.moe_dispatcher, ["--moe-token-dispatcher-type alltoall"])
    if p.stack.moe_routing == "aux_loss":
        args.append("--moe-router-load-balancing-type aux_loss")
    if p.stack.moe_capacity_factor is not None:
        args += [f"--moe-expert-capacity-factor {p.stack.moe_capacity_factor:g}", "--moe-token-drop-policy probs"]
    if p.stack.moe_ep_overlap:  # the combined 1F1B schedule (cost.moe), as the MoE model zoo's A2A_OVERLAP=1 runs it
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
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
