"""Plan -> a Megatron-DeepSpeed launch: pretrain_gpt.py's arguments and the DeepSpeed config JSON it reads.

The plan's configuration (``Plan.parallelism``) as microsoft/Megatron-DeepSpeed takes it (its
megatron/arguments.py at f4157bea69f3df8c6cb66f2ebcda66ba03d1288e) and the ds_config of its bf16 examples
(examples_deepspeed/universal_checkpointing/megatron_gpt/run_bf16.sh: ``"bf16": {"enabled": true}``,
``"data_types": {"grad_accum_dtype": "fp32"}``, which selects DeepSpeed's BF16_Optimizer), or under ``--precision
fp16`` ``--fp16`` and ``"fp16": {"enabled": true, "loss_scale": 0}`` (dynamic loss scaling: FP16_Optimizer at
ZeRO 0, DeepSpeedZeroOptimizer at ZeRO 1; ``cost.engine``'s megatron-deepspeed FP16 path). It runs the
``megatron-deepspeed`` engine (``cost.engine``): what that engine refuses (ZeRO 2/3 under the pipeline engine,
interleaving, stated splits, context and expert parallelism, FP8, hybrid sharding, torchtitan's checkpointing)
is refused here in one line. Recomputation: full is DeepSpeed's per-layer checkpointing of the pipeline module
(``--checkpoint-activations --checkpoint-num-layers 1``: GPTModelPipe's activation_checkpoint_interval),
selective Megatron's core-attention recomputation (``--recompute-granularity selective``).

    deepspeed pretrain_gpt.py <pretrain_gpt_args> --deepspeed --deepspeed_config ds_config.json
"""

from __future__ import annotations

from symtensor.errors import PlanError
from symtensor.export.common import MEGATRON_DEEPSPEED, family_args, lowered, query_group_args, size_args
from symtensor.plan.parallelism import Capabilities, engine_refusal

# its ZeRO stages and its context parallelism are the megatron-deepspeed engine's refusals (``refusal``); it runs
# bf16 and fp16 (``cost.engine``: the engine's FP16 path)
CAPABILITIES = Capabilities(name="Megatron-DeepSpeed", engine="megatron-deepspeed", precision=("bf16", "fp16"))


def refusal(p) -> str | None:
    """What the DeepSpeed pipeline engine does not run of ``p`` (``cost.engine.Engine.refuses``), or None."""
    return engine_refusal(p.replace(framework=CAPABILITIES.engine))


def megatron_deepspeed_config(plan) -> dict:
    """``pretrain_gpt_args`` (argument lines) and ``ds_config`` (the JSON of --deepspeed_config) for the plan."""
    p = lowered(plan, CAPABILITIES)
    why = refusal(p)
    if why is not None:
        raise PlanError(f"Megatron-DeepSpeed would refuse this plan at launch: {why}")
    cfg = plan.model
    if cfg.qkv_bias and not cfg.bias and not MEGATRON_DEEPSPEED.qkv_bias:
        # Megatron-DeepSpeed biases every linear layer or none (--disable-bias-linear): it would train the model
        # without its QKV bias (microsoft/Megatron-DeepSpeed@f4157be megatron/arguments.py, model/transformer.py)
        raise PlanError(f"Megatron-DeepSpeed cannot build {cfg.name}'s QKV-only bias (it biases all linear layers or "
                        "none): export it with --to megatron or --to torchtitan")
    args = [f"--tensor-model-parallel-size {p.tp}", f"--pipeline-model-parallel-size {p.pp}",
            f"--micro-batch-size {p.micro_batch}", f"--global-batch-size {p.global_batch}",
            f"--seq-length {p.seq}", f"--max-position-embeddings {max(p.seq, cfg.max_context)}",
            *size_args(cfg), *query_group_args(cfg, MEGATRON_DEEPSPEED)]
    if p.sp:
        args.append("--sequence-parallel")
    args += family_args(cfg, MEGATRON_DEEPSPEED, "Megatron-DeepSpeed")
    if p.recompute == "full":
        args += ["--checkpoint-activations", "--checkpoint-num-layers 1"]
    elif p.recompute == "selective":
        args.append("--recompute-granularity selective")
    fp16 = p.precision == "fp16"
    args += ["--use-flash-attn-v2", "--fp16" if fp16 else "--bf16", f"--zero-stage {p.zero}", "--deepspeed",
             "--deepspeed_config ds_config.json"]
    ds = {"train_batch_size": p.global_batch, "train_micro_batch_size_per_gpu": p.micro_batch,
          "zero_optimization": {"stage": p.zero}}
    # fp16: dynamic loss scaling (loss_scale 0) at DeepSpeed's defaults (initial_scale_power 16, window 1000,
    # hysteresis 2, min_loss_scale 1: deepspeed/runtime/constants.py FP16_*_DEFAULT); the gradients accumulate in fp16
    ds.update({"fp16": {"enabled": True, "loss_scale": 0}} if fp16 else
              {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}})
    return {"pretrain_gpt_args": args, "ds_config": ds, "_devices": plan.cluster.n_devices}
