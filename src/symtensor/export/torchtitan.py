"""Plan -> a torchtitan job config (its [parallelism], [training] and [activation_checkpoint]
sections).

The plan's configuration (``Plan.parallelism``) lowered to torchtitan's ``Parallelism`` degrees
(torchtitan/config/job_config.py). torchtitan runs the fsdp2 engine's semantics (``CAPABILITIES``);
the rules it adds to the configuration rule are ``_cp_fsdp``, ``_hybrid``, ``_expert_grid`` and
``_attention_core``, which ``torchtitan_config`` applies in that order; a model torchtitan has no native
architecture for (``native_model``) gets a note.
"""

from __future__ import annotations

from symtensor.cost.recompute import modules_of
from symtensor.cost.train import SAC_OP, layer_every
from symtensor.errors import PlanError
from symtensor.export.common import evaluate_command, lowered, zero1_note
from symtensor.plan.parallelism import Capabilities, Parallelism

# torchtitan applies FSDP2 whenever cp > 1 (cp_needs_fsdp, ``_cp_fsdp``); its expert grid takes
# expert TP 1 or tp and borrows ranks (``_expert_grid``); ZeRO 1 runs as ZeRO 2 (a note)
CAPABILITIES = Capabilities(name="torchtitan", engine="fsdp2", cp_needs_fsdp=True)


def native_model(cfg) -> str | None:
    """The torchtitan model that builds ``cfg``'s architecture, or None (pytorch/torchtitan@b5bcd76c66d0
    torchtitan/models/: llama3, a dense decoder with RMSNorm, SwiGLU, RoPE and no biases; qwen3, the same with
    QK-norm, dense or MoE; deepseek_v3, multi-head latent attention and MoE (Kimi K2's architecture too); gpt_oss,
    attention sinks and sliding windows). Mixtral, GPT-3, Qwen2 (QKV biases) and Nemotron-4 have none there."""
    if cfg.kv_latent:
        return "deepseek_v3"
    if cfg.sinks:
        return "gpt_oss"
    llama = (cfg.family == "llama" and cfg.mlp == "swiglu" and cfg.norm == "rmsnorm" and cfg.rotary_percent == 1
             and not (cfg.bias or cfg.qkv_bias or cfg.learned_pos))
    if llama and cfg.qk_norm:
        return "qwen3"
    return "llama3" if llama and not cfg.is_moe else None


def _hybrid(p: Parallelism) -> str | None:
    """Hybrid sharding as torchtitan takes it: its FSDP mesh dim ``dp_shard_cp`` is
    data_parallel_shard_degree x cp, inside ``dp_replicate`` (ParallelDims.build_mesh), so the
    plan's shard group (dp_shard ranks of dp x cp, cp innermost) must hold all of cp."""
    if p.hsdp and p.dp_shard % p.cp:
        return (f"its FSDP shards over data_parallel_shard_degree x cp (the dp_shard_cp mesh), so dp_shard="
                f"{p.dp_shard} must be a multiple of cp={p.cp}")
    return None


def data_parallel(p: Parallelism) -> tuple[int, int, str]:
    """torchtitan's data parallelism for the plan's ZeRO stage: ``data_parallel_replicate_degree``,
    ``data_parallel_shard_degree`` and ``fsdp_reshard_after_forward`` (torchtitan/config/job_config.py
    ``Parallelism``; torchtitan/distributed/fsdp.py ``get_fsdp_reshard_after_forward_policy``).
    ZeRO 0 is DDP. Above it FSDP2 (``fully_shard``) shards parameters, gradients and optimizer
    state over dp and, as the fsdp2 engine costs it (``cost.engine``), reshards after forward at
    ZeRO 3 only: "always" there (torchtitan's "default" does not reshard under pipeline
    parallelism), "never" at ZeRO 1/2 (each block gathered once per micro-batch, kept to its
    backward). torchtitan has no ZeRO 1 (sharded optimizer state beside replicated gradients):
    ZeRO 1 runs as ZeRO 2, which the fsdp2 engine costs with the same collectives and no more memory
    (the gradients sharded too); the export says so (``_zero_note``). Hybrid sharding (``p.hsdp``)
    is HSDP: ``data_parallel_replicate_degree`` the replicas, ``data_parallel_shard_degree`` the
    shard group over cp (torchtitan's FSDP mesh is dp_shard x cp; ParallelDims requires
    replicate x shard x cp x tp x pp = world size)."""
    runs = p.replace(framework=CAPABILITIES.engine)  # as the fsdp2 engine runs it: sharding and resharding
    reshard = "always" if runs.reshards_after_forward else "never"
    if p.hsdp:
        return p.dp_replicate, p.dp_shard // p.cp, reshard
    if not runs.sharded_parameters:
        return p.dp, 1, "default"
    return 1, p.dp, reshard


def _cp_fsdp(p: Parallelism) -> str | None:
    """With context parallelism (``cp_needs_fsdp``), why torchtitan cannot run a ZeRO-0 plan as
    DDP: it applies FSDP2 whenever cp > 1 (``ParallelDims.fsdp_enabled`` is ``dp_shard_enabled or
    cp_enabled``; torchtitan/models/llama3/infra/parallelize.py shards over its ``dp_shard_cp``
    mesh, dp_shard x cp, before it considers DDP), even at data_parallel_shard_degree 1, and it
    has no setting that keeps the parameters replicated there. Above ZeRO 0 it is what the plan
    costs: the cost model shards ZeRO's state over the data-parallel axes dp x cp
    (``cost.params.data_axes``)."""
    if not (CAPABILITIES.cp_needs_fsdp and p.cp > 1 and p.zero == 0):
        return None
    return (f"with context parallelism (cp={p.cp}) it shards the parameters with FSDP over dp x cp = "
            f"{p.dp * p.cp} ranks (ParallelDims.fsdp_enabled, its dp_shard_cp mesh) even at "
            "data_parallel_shard_degree 1, so a ZeRO-0 plan would not run as the DDP it is costed as")


def _expert_grid(p: Parallelism, model) -> str | None:
    """An MoE model's expert grid as torchtitan takes it (``ParallelDims``): expert TP is 1 or tp,
    and EP borrows all of cp (and tp when expert TP is 1) and part of the FSDP degree
    ``data_parallel_shard_degree``, which a plan without sharded state (ZeRO 0: DDP) leaves at 1."""
    if not model.is_moe or p.ep == 1:
        return None
    tp, cp, ep, etp = p.tp, p.cp, p.ep, p.etp
    shard = data_parallel(p)[1]
    if etp not in (1, tp):
        return f"torchtitan takes expert TP 1 or tp={tp}, not etp={etp}"
    borrowed = cp * (tp if etp == 1 else 1)
    if ep % borrowed or (shard * borrowed) % ep:
        return (f"its expert parallelism borrows cp{' x tp' if etp == 1 else ''} = {borrowed} and FSDP ranks "
                f"(data_parallel_shard_degree {shard} at ZeRO-{p.zero}), so ep={ep} must be a multiple of "
                f"{borrowed} dividing {shard * borrowed}")
    return None


def activation_checkpoint(recompute: str) -> dict:
    """torchtitan's [activation_checkpoint] for the plan's recomputation (torchtitan/config/job_config.py
    ``ActivationCheckpoint``: mode "none", "full" or "selective"; under "selective", selective_ac_option "op"
    or an integer N, every N-th block, defaulting to "2"; pytorch/torchtitan@238fa9953e4aec2a62582121564273d7cbb1e9f1):
    torchtitan's own checkpointing as stated (``selective-op``, ``layer:N``), none and full by mode.

    The planner's ``selective`` is Megatron's: the unfused attention core (scores, softmax, dropout, context:
    ops marked ``core``) re-run in backward and nothing else (``cost.segment.recompute_share``). torchtitan has
    no such policy, and needs none: it runs fused attention (SDPA, flex), which keeps no S x S core, so such a
    plan is costed as one without recomputation and runs as costed with mode "none". Mode "selective" would
    run either of torchtitan's policies instead, both recomputing more than costed (alone, its default "2":
    every other block whole; "op": every op but the SDPA outputs and every other matmul). A graph with an
    unfused core is refused before (``_attention_core``)."""
    if modules_of(recompute):  # no torchtitan option re-runs named modules: its SAC is per op or per block
        raise PlanError(f"torchtitan has no per-module recomputation (recompute={recompute!r}, Megatron's "
                        "--recompute-modules); export to Megatron, or plan with selective-op, layer:N or full")
    every = layer_every(recompute)
    if recompute == SAC_OP or every:
        return {"mode": "selective", "selective_ac_option": "op" if recompute == SAC_OP else str(every)}
    return {"mode": {"none": "none", "selective": "none", "full": "full"}[recompute]}


def _attention_core(plan, p: Parallelism) -> str | None:
    """Why torchtitan cannot run the planner's ``selective`` recomputation of ``plan``: its graph has an
    unfused attention core (``attention=unfused``, ops marked ``core``) to recompute, and torchtitan neither
    runs unfused attention nor has a policy that recomputes the core alone (``activation_checkpoint``)."""
    if p.recompute != "selective" or not any(op.attr("core") for op in plan.graph.ops):
        return None
    return ("it has no recomputation of the unfused attention core alone (its selective modes are per op and every "
            "N-th block) and runs fused attention")


def torchtitan_config(plan) -> dict:
    """A torchtitan job config (the [parallelism] and [training] sections) for the plan."""
    p = lowered(plan, CAPABILITIES)
    why = _cp_fsdp(p)
    if why is not None:
        raise PlanError(f"torchtitan would not run this plan as it is costed: {why}; the nearest exportable "
                        f"configuration: {evaluate_command(plan, p.replace(zero=1))} (FSDP2 over dp x cp, which "
                        "torchtitan runs; or export this one to megatron)")
    why = _hybrid(p)
    if why is not None:
        raise PlanError(f"torchtitan would refuse this plan at launch: {why}; the nearest exportable configuration: "
                        f"{evaluate_command(plan, p.replace(dp_shard=None))} (FSDP over all of dp x cp)")
    why = _expert_grid(p, plan.model)
    if why is not None:
        raise PlanError(f"torchtitan would refuse this plan at launch: {why}; the nearest exportable "
                        f"configuration: {evaluate_command(plan, p.replace(zero=3))} (or export this one to megatron)")
    if p.stack.loss not in (None, "fp32"):  # torchtitan/components/loss.py: cross_entropy(pred.float(), ...)
        raise PlanError(f"torchtitan's loss is PyTorch's cross-entropy on an fp32 copy of the logits, not "
                        f"{p.stack.loss}: plan with --loss fp32 (or leave it out), or export this one to megatron")
    if p.stack.attention not in (None, "sdpa"):  # torchtitan/models/attention.py: scaled_dot_product_attention
        raise PlanError(f"torchtitan's attention is PyTorch's scaled_dot_product_attention (cuDNN's first on Hopper "
                        f"and Blackwell, FlashAttention-2 elsewhere), not "
                        f"{p.stack.attention}: plan with --attention sdpa (or leave it out), or export this one to "
                        "megatron")
    if p.stack.param_dtype == "bf16":  # its model in fp32, FSDP2 MixedPrecisionPolicy(param_dtype=bf16) gathers bf16
        raise PlanError("torchtitan keeps fp32 parameters (FSDP2 gathers bf16 copies for compute), not bf16 ones: "
                        "plan without --param-dtype bf16 to export to torchtitan")
    why = _attention_core(plan, p)
    if why is not None:
        raise PlanError(f"torchtitan would not run this plan as it is costed: {why}; plan with --set attention=flash "
                        "(the fused kernel it runs: selective then recomputes nothing) or export this one to megatron")
    replicate, shard, reshard = data_parallel(p)
    out = {
        "parallelism": {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
                        "fsdp_reshard_after_forward": reshard,
                        "tensor_parallel_degree": p.tp, "context_parallel_degree": p.cp,
                        "pipeline_parallel_degree": p.pp, "expert_parallel_degree": p.ep,
                        "expert_tensor_parallel_degree": p.etp,
                        "enable_async_tensor_parallel": False,
                        "pipeline_parallel_schedule": "Interleaved1F1B" if p.vpp > 1 else "1F1B"},
        "training": {"local_batch_size": p.micro_batch, "global_batch_size": p.global_batch, "seq_len": p.seq},
        "activation_checkpoint": activation_checkpoint(p.recompute),
        "_devices": plan.cluster.n_devices,
    }
    # torchtitan runs global / (local_batch_size x dp) accumulation steps, each one forward-backward or, under
    # pipeline parallelism, one whole schedule of local_batch_size / pipeline_parallel_microbatch_size (default 1)
    # micro-batches (pytorch/torchtitan@238fa99 torchtitan/train.py, distributed/pipeline_parallel.py). The plan
    # costs its global / (dp x micro_batch) micro-batches as Stack.pp_schedules schedules (default one: the rank's
    # whole batch in it).
    if p.pp > 1:
        out["training"]["local_batch_size"] = p.global_batch // (p.dp * p.stack.pp_schedules)
        out["parallelism"]["pipeline_parallel_microbatch_size"] = p.micro_batch
    if p.stack.elementwise == "fused":  # torch.compile fuses the blocks' norms, RoPE and SwiGLU (Stack.elementwise);
        # the loss stays eager, as costed (torchtitan@238fa99 job_config.py Compile: components default model, loss)
        out["compile"] = {"enable": True, "components": ["model"]}
    if p.stack.grad_reduce_bf16:  # FSDP2's reduce_dtype (cost.engine.Engine.grad_reduce_bf16; default float32)
        out["training"]["mixed_precision_reduce"] = "bfloat16"
    if p.precision == "fp8":
        out.update(float8_config(p, shard))
    if p.hsdp:
        out["_hsdp_note"] = (f"hybrid sharding: FSDP2 over {p.dp_shard} ranks (data_parallel_shard_degree {shard} x "
                             f"cp {p.cp}), replicated {replicate} times; the launch checks replicate x shard x cp x tp "
                             f"x pp = {replicate * shard * p.cp * p.tp * p.pp} devices")
    if p.layer_split is not None:  # a stated split (the search's balanced one, evaluate --pp-layout)
        out["parallelism"]["module_fqns_per_model_part"] = module_fqns(p.layer_split)
    if p.zero == 1:
        out["_zero_note"] = zero1_note("torchtitan", "fsdp_reshard_after_forward 'never'")
    if replicate > 1 and shard == 1 and (p.tp > 1 or p.pp > 1 or p.ep > 1):
        out["_ddp_note"] = _ddp_note(plan, p)
    if native_model(plan.model) is None:
        out["_model_note"] = (f"torchtitan has no model of {plan.model.name}'s architecture (torchtitan/models/: "
                              "llama3, qwen3, deepseek_v3, gpt_oss); its experiments/transformers_modeling_backend "
                              "trains the Hugging Face model, whose attention and elementwise kernels may differ from "
                              "what the fsdp2 engine costs")
    if plan.model.doc_tokens:  # (ModelConfig.doc_tokens)
        out["_packing_note"] = (
            f"costed with attention per packed document of {plan.model.doc_tokens} tokens: torchtitan's language "
            "models mask block-causally whatever the job config says (their data loaders emit per-document "
            "positions; pytorch/torchtitan@b5bcd76 torchtitan/models/common/config_utils.py get_attention_config: "
            "flex, flex_flash or varlen), so the documents your data loader packs run as costed, at the engine's "
            "attention kernel")
    dispatcher = p.stack.moe_dispatcher
    if dispatcher != "alltoall":  # (cost.moe; torchtitan's "standard" backend is the all-to-all)
        out["_dispatcher_note"] = (f"this plan is costed with the {dispatcher} token dispatcher: torchtitan "
                                   f"takes it in the model's config (comm_backend=\"{dispatcher}\", "
                                   "torchtitan/models/common/config_utils.py), not in this job config")
    return out


def float8_config(p: Parallelism, shard: int) -> dict:
    """torchtitan's float8 converter for an FP8 plan (torchtitan/config/job_config.py ``Float8``;
    docs/float8.md): ``[model] converters = ["float8"]``, ``[float8] recipe_name = "tensorwise"``,
    FP8 all-gather of the FSDP-sharded weights and their scales precomputed in one all-reduce where
    FSDP shards them, and the LM head (``output``) left in BF16 as the cost model leaves it. The
    converter (torchao ``Float8Linear``) runs dynamic tensorwise scaling only: a plan costed under
    another recipe runs tensorwise, and the note says so."""
    fsdp = shard > 1
    note = "the cost model gathers FSDP's weights in BF16; float8 all-gather sends them in 8 bits"
    if p.fp8_recipe != "tensorwise":
        note += (f"; this plan was costed with the {p.fp8_recipe} recipe, which torchtitan's float8 converter does "
                 "not run: it runs tensorwise scaling (an amax pass per cast more; plan with --fp8-recipe tensorwise "
                 "for its cost)")
    return {"model": {"converters": ["float8"]},
            "float8": {"recipe_name": "tensorwise", "enable_fsdp_float8_all_gather": fsdp,
                       "precompute_float8_dynamic_scale_for_fsdp": fsdp, "filter_fqns": ["output"]},
            "_fp8_note": note}


def module_fqns(split: tuple[int, ...]) -> list[list[str]]:
    """A split (layers per virtual stage, ``cost.train.TrainConfig.layer_split``) as torchtitan's
    ``module_fqns_per_model_part`` (torchtitan/config/job_config.py ``Parallelism``): its models'
    modules ``tok_embeddings``, ``layers.<i>``, ``norm``, ``output`` per stage, stage k on pipeline
    rank k % pp as its looped schedules (Interleaved1F1B) place them, Megatron's layout order.

    >>> module_fqns((1, 2, 0))
    [['tok_embeddings', 'layers.0'], ['layers.1', 'layers.2'], ['norm', 'output']]
    """
    out, start = [], 0
    for c in split:
        out.append([f"layers.{i}" for i in range(start, start + c)])
        start += c
    out[0].insert(0, "tok_embeddings")
    out[-1] += ["norm", "output"]
    return out


def _ddp_note(plan, p: Parallelism) -> str:
    """Why a ZeRO-0 plan with other parallelisms depends on the torchtitan version: it runs as DDP
    over data_parallel_replicate_degree beside them. torchtitan's parallelize functions refused
    that once (``if world_mesh.ndim > 1: raise RuntimeError("DDP has not supported > 1D
    parallelism")``); later ones check the dp_replicate mesh only (``parallel_dims.get_mesh(
    "dp_replicate")``), so it launches there."""
    return ("this plan runs as DDP (data_parallel_replicate_degree) beside tensor, pipeline or expert parallelism: "
            "torchtitan versions whose parallelize checks world_mesh.ndim > 1 raise 'DDP has not supported > 1D "
            "parallelism' at launch (newer ones check the dp_replicate mesh only); with such a version, export "
            f"the FSDP2 plan instead: {evaluate_command(plan, p.replace(zero=1))}")
