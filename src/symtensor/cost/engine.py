"""Engine semantics: what overlaps with what, how often parameters are gathered, bucket sizes.

A step time belongs to an engine. The evaluator costs each *unit* (a transformer layer, or the
ops before and after the layers) of a pipeline stage: its forward and backward compute per
micro-batch and one all-gather / reduce-scatter / all-reduce of its parameters and gradients over
their data-parallel replicas. This module turns those into the exposed data-parallel time of a
step, never with a constant fraction: communication is hidden only behind compute that runs at
the same time, unit by unit, and what cannot overlap (the last gradient bucket, the first unit's
gather) stays exposed.

    megatron   Megatron-core with the distributed optimizer (ZeRO 1), --overlap-grad-reduce and
               --overlap-param-gather: gradients are reduced once per step in buckets during the
               last micro-batch's backward; the last bucket to fill is exposed. Updated
               parameters are all-gathered during the next step's first forward. ZeRO 2 and 3 are
               Megatron-FSDP (``--use-megatron-fsdp``, formerly ``--use-custom-fsdp``, with
               ``--data-parallel-sharding-strategy optim_grads`` / ``optim_grads_params``), below: at
               ZeRO 2 the gradients are reduce-scattered every micro-batch out of a per-unit bucket
               (param_and_grad_buffer.py, as at ZeRO 3) and the replicated weights gathered once per
               step after the optimizer, the ZeRO paper's stage 2. Transformer Engine
               overlaps tensor-parallel communication with the GEMMs (``tp_overlap``).
    fsdp2      PyTorch FSDP2 as torchtitan runs it: one unit per transformer block; the next
               unit's all-gather is prefetched behind this unit's compute, in forward and (with
               reshard_after_forward, ZeRO 3) again in backward, and each unit's gradients are
               reduce-scattered behind the next unit's backward, every micro-batch. Each gathered
               unit is copied out of the all-gather buffer into its parameters on the compute
               stream (``wait_for_unshard``: "overlap the current copy-out with the next
               all-gather", torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py): a read and
               a write of the unit's gathered bytes that no collective hides. ZeRO 1/2
               (reshard_after_forward=False) gathers once per micro-batch. ZeRO 0 is DDP:
               bucketed all-reduce behind backward.
    deepspeed  DeepSpeed ZeRO with overlap_comm: stages 1/2 reduce gradients in buckets behind
               backward (stage 2 every micro-batch) and all-gather the updated parameters after
               the optimizer step, exposed. Stage 3 gathers each parameter on its own (one
               collective per tensor: latency per tensor), prefetched like FSDP, and again for a
               recomputed forward under full recomputation. Context parallelism is DeepSpeed-Ulysses
               (``context``; deepspeed/sequence/layer.py ``DistributedAttention``: an all-to-all turns the
               sequence-cut query, key and value into head-cut ones before the local attention, and one
               more turns its output back): the projections cut by sequence and the attention core by
               heads on the cp devices (``search.megatron``), the all-to-alls costed as any redistribution
               (``cost.opcost.redistribute``); no ring attention (``cut_refusal``).
    megatron-deepspeed
               Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed, the BLOOM-176B stack) on DeepSpeed's pipeline
               engine: Megatron's fused kernels, tensor and sequence parallelism (its pre-Transformer-Engine
               layers: no TP overlap, FlashAttention-2 through --use-flash-attn-v2), every model a
               ``PipelineModule`` (GPTModelPipe unless --no-pipeline-parallel, which ZeRO 2/3 need) run by
               DeepSpeed's ``PipelineEngine`` with ZeRO 0/1 and bf16, as Megatron-DeepSpeed's examples
               configure it (``"bf16": {"enabled": true}``, ``"data_types": {"grad_accum_dtype": "fp32"}``),
               which selects DeepSpeed's ``BF16_Optimizer``. Its documented differences from megatron:
               - p2p: ``TrainSchedule`` exchanges a micro-batch's activation and gradient in four instructions
                 of their own (SendActivation, RecvActivation, SendGrad, RecvGrad), each a blocking
                 ``dist.send``/``dist.recv`` (p2p.py: "Doesn't support async_op true"), where Megatron batches a
                 send with the opposite receive (send_forward_recv_backward): four transfers on a stage's
                 critical path per micro-batch, not two (``p2p_transfers``), none overlapped with compute.
               - gradients: the pipeline engine turns DeepSpeed's backward all-reduce off ("We schedule the
                 all-reduces, so disable it in super().backward()") and reduces once, in the ReduceGrads
                 instruction after the last backward (``reduce_after_backward``): nothing hides it.
                 ``BF16_Optimizer`` accumulates the gradients in fp32 and all-reduces them
                 (``buffered_allreduce_fallback`` in buckets of MEMORY_OPT_ALLREDUCE_SIZE = 5e8 elements, one
                 flattened bucket at a time) even at ZeRO 1 (``zero_all_reduce``, ``reduce_bytes`` 4), steps
                 its fp32 partition and all-gathers the updated bf16 weights after the step
                 (``all_gather_dp_groups``, allgather_bucket_size), exposed.
               - state: bf16 weights and their bf16 gradients (zeroed, kept: ``clear_lp_grads``) + the fp32
                 accumulation buffer of every gradient (``fp32_groups_gradients``, not sharded at ZeRO 1),
                 fp32 master + Adam m, v sharded at ZeRO 1 (2 + 6 + 12 bytes per parameter); the loss runs on
                 an fp32 copy of the logits (``vocab_parallel_cross_entropy(output.float())``).
               - refusals (``refuses``): ZeRO 2/3 ("ZeRO-2 and ZeRO-3 are incompatible with pipeline
                 parallelism", PipelineEngine.__init__; Megatron-DeepSpeed then runs --no-pipeline-parallel,
                 the deepspeed engine); interleaving (TrainSchedule is the only training schedule); a stated
                 layer split (GPTModelPipe partitions with partition_method='type:transformer'); context
                 parallelism (its long-sequence path is DeepSpeed-Ulysses, not modelled), expert parallelism
                 (DeepSpeed-MoE, not modelled), FP8 and hybrid sharding.
               Sources: deepspeedai/DeepSpeed@edaa7221267243c7be7fb49c5d5f5c4fb97b4641:
               deepspeed/runtime/pipe/engine.py (PipelineEngine.__init__, _exec_reduce_grads,
               _bf16_reduce_grads, _exec_backward_pass), deepspeed/runtime/pipe/schedule.py (TrainSchedule),
               deepspeed/runtime/pipe/p2p.py (send, recv), deepspeed/runtime/engine.py
               (_do_optimizer_sanity_check, buffered_allreduce_fallback, MEMORY_OPT_ALLREDUCE_SIZE),
               deepspeed/runtime/bf16_optimizer.py; microsoft/Megatron-DeepSpeed@
               f4157bea69f3df8c6cb66f2ebcda66ba03d1288e: pretrain_gpt.py (model_provider), megatron/model/
               gpt_model.py (GPTModelPipe, CrossEntropy), examples_deepspeed/universal_checkpointing/
               megatron_gpt/run_bf16.sh (the ds_config).
               FP16 (``--precision fp16``: ``"fp16": {"enabled": true}``, dynamic loss scaling; ``Engine.fp16``):
               DeepSpeed's ``_do_optimizer_sanity_check`` wraps the optimizer in ``FP16_Optimizer``
               (fp16/fused_optimizer.py) at ZeRO 0 and in ``DeepSpeedZeroOptimizer`` (zero/stage_1_and_2.py) at
               ZeRO 1 (BF16_Optimizer is bf16's with fp32 accumulation only). What differs from bf16:
               - state: fp16 weights and fp16 gradients accumulated in place (grad_accum_dtype is the model's),
                 fp32 master + Adam m, v (2 + 2 + 12, the master sharded with m, v at ZeRO 1); the step
                 flattens the gradients it updates to fp32 (``fp32_groups_flat[i].grad``,
                 ``single_partition_of_fp32_groups``): 4 bytes per owned parameter, transient.
               - reduction: in fp16 (``communication_data_type`` is the fp16 model's dtype), an all-reduce
                 in 5e8-element buckets at ZeRO 0 (``buffered_allreduce_fallback``) and, at ZeRO 1, the
                 pipeline engine's ``reduce_gradients(pipeline_parallel=True)``: one ipg bucket of
                 reduce_bucket_size elements, reduced to each partition's owner (``average_tensor``, a
                 reduce-scatter's bytes), then the updated fp16 weights all-gathered.
               - the loss-scale check every step (``has_overflow``): a scan of the gradients for inf/nan
                 (``_has_inf_or_nan``: ``float(x.float().sum())`` per tensor at ZeRO 0, a cast, isnan, isinf,
                 or, cast and max over the owned partition at ZeRO 1: ``overflow_scan_bytes``), then a one-byte
                 MAX all-reduce of the flag over the model-parallel group (and the data-parallel group first at
                 ZeRO 1; ``overflow_flags``), read back by the host (``.item()``).
               Sources: the DeepSpeed commit above: deepspeed/runtime/engine.py (_do_optimizer_sanity_check,
               communication_data_type, allreduce_gradients), deepspeed/runtime/pipe/engine.py
               (_exec_reduce_grads), deepspeed/runtime/fp16/fused_optimizer.py (FP16_Optimizer.__init__, step),
               deepspeed/runtime/zero/stage_1_and_2.py (reduce_gradients, average_tensor, has_overflow,
               _has_inf_or_nan), deepspeed/runtime/utils.py (CheckOverflow.has_overflow).

Megatron-FSDP (megatron ZeRO 3), read at NVIDIA/Megatron-LM 1e05700 (May 2025, megatron/core/distributed/
custom_fsdp/, the commit the MoE model zoo's Qwen3-235B FSDP row ran) and d98e8a6 (2026, megatron/core/
distributed/fsdp/: mcore_fsdp_adapter.py, src/megatron_fsdp/megatron_fsdp.py, param_and_grad_buffer.py, docs/
user-guide/features/megatron_fsdp.md); both the same in what is costed here:
    - units: each TransformerLayer is an FSDP unit (``fsdp_unit_modules``); a unit's parameters form one
      parameter group per data-parallel group and dtype: the dense ones over dp x cp (``dp_cp_group``), the
      experts' over the expert data-parallel group (``expt_dp_group``), each gathered and reduced apart.
    - per micro-batch: the pre-forward hook all-gathers the unit (bf16 model weights; prefetching the next
      within ``suggested_communication_unit_size``, 2 x the mean unit), the post-forward hook frees it; the
      pre-backward hook gathers it again, and a fully recomputed forward finds it gathered (state
      PRE_BACKWARD: "we can just call unshard once"): 2 gathers. The post-backward hook reduce-scatters the
      unit's gradients on a side stream *every* micro-batch ("grad_reduce_every_bprop" for optim_grads and
      optim_grads_params; ``no_sync`` only clears is_last_microbatch: "For grads shard mode there will
      actually always be gradient sync happening") and adds the shard into the sharded main gradient
      (``local_buffer += grad_shard``): the fsdp2 rules, without a copy-out (parameters are views of the
      gather bucket: ``copy_out`` False).
    - dtype: the main gradient buffer is fp32 when ``grad_reduce_in_fp32`` (Megatron-LM sets it from
      accumulate_allreduce_grads_in_fp32, on under --bf16 unless --grad-reduce-in-bf16); the reduce-scatter
      runs in that dtype. (Since Megatron-LM adfe9e1, July 2026, Megatron-FSDP ignores it and reduces in
      ``--megatron-fsdp-main-grads-dtype``, default ``auto``: the parameters' bf16. The tool keeps the fp32
      default of the runs it is checked against; state --grad-reduce-in-bf16 for the newer default.)
    - each unit's gradients are reduce-scattered out of an unsharded bucket of their own (the gradient buffer
      is sharded, ``is_grad_buffer_distributed``; ``fetch_bucket`` / ``free_bucket_storage``):
      ``unit_reduce_buffer``.
    - hybrid sharding (--num-distributed-optimizer-instances, outer_dp_sharding_strategy no_shard, 2026): the
      reduce-scatter inside DP-shard every micro-batch, the all-reduce of the accumulated shard across DP-outer
      only on the last (``outer_fsdp_group_grad_reduce=use_hybrid_fsdp and (is_last_microbatch or
      model_auto_sync)``): ``replicate_once``.

What each keeps per parameter (``state_bytes``: weights, gradients, optimizer state): Megatron
bf16 weights, fp32 main gradients, fp32 master weights + Adam m, v (2 + 4 + 12; Korthikanti et
al. 2022); FSDP2 with torchtitan's mixed precision keeps the sharded fp32 parameters (the master
copy), fp32 gradients and Adam m, v (4 + 4 + 8) and gathers bf16 units; DeepSpeed ZeRO as the ZeRO
paper counts it, 16-bit weights and gradients, fp32 master + m, v (2 + 2 + 12).

Which state each shards, by ZeRO stage (``Engine.sharded_from``: the lowest stage that shards the
weights, gradients and optimizer state over the data-parallel replicas): the stages as the ZeRO paper
defines them (Rajbhandari et al. 2020: optimizer state at 1, + gradients at 2, + parameters at 3) under
Megatron and DeepSpeed. FSDP2 has no replicated-parameter mode: ``fully_shard`` turns every parameter
into a dim-0 sharded DTensor and only its ``reshard_after_forward`` varies (PyTorch docs,
torch.distributed.fsdp.fully_shard), and each backward reduce-scatters the gradients into shards of
the same placement. It shards parameters and gradients from stage 1 (it has no ZeRO 1: ZeRO 1 runs
as ZeRO 2); its ZeRO 1/2 are ``reshard_after_forward=False`` (as export/formats.py lowers them for
torchtitan), ZeRO 3 ``True``.

Bucket sizes are the engines' defaults: Megatron ``--ddp-bucket-size`` max(40M, 1M x dp)
parameters (megatron/core/distributed/distributed_data_parallel_config.py); PyTorch DDP
``bucket_cap_mb=25``; DeepSpeed ``reduce_bucket_size=5e8`` elements.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# indices of ``Engine.state_bytes`` and ``Engine.sharded_from``
WEIGHTS, GRADIENTS, OPTIMIZER = 0, 1, 2


@dataclass(frozen=True, slots=True)
class Engine:
    """What an engine does with one step's parameters, gradients and optimizer state and their
    communication; every rule that differs between engines is a field here (the module docstring
    gives each engine's source)."""

    name: str
    # gradient bucket in bytes of the reduced dtype, or None for "per engine rule" (see bucket_bytes)
    ddp_bucket_bytes: float
    per_tensor_gathers: bool  # ZeRO 3 gathers each parameter apart (DeepSpeed) or per unit
    regather_recompute: bool  # a recomputed forward gathers the parameters again (ZeRO 3)
    tp_overlap: bool  # default of TrainConfig.tp_overlap
    keeps_sp_shard: bool  # keeps the sequence-parallel shard of a gathered input for backward
    exposed_param_gather: bool  # ZeRO 1/2: the post-step parameter all-gather is not overlapped
    copy_out: bool  # each all-gathered unit is copied out of the gather buffer on the compute stream
    # bytes per parameter of the weights, gradients and optimizer state the engine keeps
    state_bytes: tuple[int, int, int]
    # the lowest ZeRO stage at which the weights, gradients and optimizer state are sharded over the
    # data-parallel replicas (the module docstring); sharded weights are gathered unit by unit for compute
    sharded_from: tuple[int, int, int]
    # the lowest ZeRO stage at which sharded weights are freed after forward and gathered again for
    # backward (FSDP2's ``reshard_after_forward``, DeepSpeed stage 3's release after use)
    reshards_from: int
    # its kernels are PyTorch's own (SDPA attention, eager elementwise composites), not Transformer
    # Engine's fused ones (``efficiency.efficiency_for``)
    pytorch_kernels: bool
    # memory the engine allocates besides the state (``cost.memory``; each with its source there):
    # staging buffers of ``ddp_bucket_bytes`` for the gradient reduction (DeepSpeed's double-buffered IPG
    # buckets); whether ZeRO 0's buckets copy every gradient (PyTorch DDP, gradient_as_bucket_view=False);
    # whether each unit of sharded weights has its gradients reduce-scattered out of a buffer of their own (FSDP2,
    # Megatron-FSDP);
    # bytes per local logit element the loss's backward allocates beyond what it saved; bytes per owned
    # parameter the optimizer step allocates; whether the caching allocator runs with expandable segments
    bucket_buffers: int = 0
    ddp_bucket_copy: bool = False
    unit_reduce_buffer: bool = False
    loss_grad_bytes: int = 2
    step_temp_bytes: int = 0
    expandable_segments: bool = False
    # the fused attention kernel the stack runs, per device: (device name part, kernel of the kernel tables,
    # ``cost.kernels``), the first part found in the device's name wins ("" matches every device); a device
    # without that kernel's tables runs the first of ``ATTENTION_FALLBACK`` it has (``attention_kernel``)
    attention_kernels: tuple[tuple[str, str], ...] = (("", "fa2"),)
    # the pipeline and the data-parallel reduction (the module docstring's megatron-deepspeed): stage-boundary
    # transfers on a stage's critical path per micro-batch (2: a send batched with the opposite receive, twice);
    # whether gradients are reduced only after the last backward (nothing hides them); whether ZeRO 1/2 reduce
    # the gradients with an all-reduce (each rank keeps its shard) instead of a reduce-scatter; bytes per element
    # of the reduced gradients (0: the gradients' own, ``TrainConfig.grad_bytes``)
    p2p_transfers: int = 2
    reduce_after_backward: bool = False
    zero_all_reduce: bool = False
    reduce_bytes: int = 0
    # how the engine reduces gradients in bf16 when the stack says so (``TrainConfig.stack.grad_reduce_bf16``, each
    # engine's source at ``GRAD_REDUCE_BF16``): ``buffer`` (the gradient buffer itself is bf16, so the reduction
    # and the kept gradients halve and the optimizer step copies its owned shard to fp32), ``comm`` (only the
    # reduction's dtype; the sharded gradients stay fp32), ``default`` (it already reduces in bf16: nothing
    # changes), "" (no such option: refused, ``grad_reduce_refusal``)
    grad_reduce_bf16: str = ""
    # FP16 with dynamic loss scaling (``TrainConfig.precision`` fp16; the module docstring's megatron-deepspeed):
    # the engine as it runs then, or None where its FP16 path is not modelled (``refusal``); the loss-scale check's
    # bytes read and written per gradient element it scans (the local gradients at ZeRO 0, the owned partition
    # above) and its one-byte flag all-reduces per step, at ZeRO 0 and above (0, 0: no loss scaling)
    fp16: Engine | None = None
    overflow_scan_bytes: tuple[int, int] = (0, 0)
    overflow_flags: tuple[int, int] = (0, 0)
    # whether the engine checkpoints by module (Megatron-core's --recompute-modules: ``cost.recompute``)
    recompute_modules: bool = False
    # hybrid sharding of sharded weights (ZeRO 3 with ``TrainConfig.dp_replicate``): whether the all-reduce of each
    # unit's reduced shard across the replicas runs once per step, in the last micro-batch's backward (the shard
    # accumulates over the micro-batches: Megatron-FSDP, the module docstring), instead of after every
    # reduce-scatter (FSDP2: ``foreach_reduce`` all-reduces over the replicate dim each backward unless
    # ``set_requires_all_reduce(False)``, which torchtitan does not call)
    replicate_once: bool = False
    # whether the engine offloads the first N layers' saved activations to host memory (``TrainConfig.
    # cpu_offload_layers``: Megatron-LM's --cpu-offloading-num-layers, ``CPU_OFFLOAD``); the others refuse it
    cpu_offload: bool = False
    # how many times the bytes of the experts' output the MoE combine keeps for backward (``cost.moe.saved_scale``):
    # 1 where it weights the expert output by the router probabilities and keeps it for their gradient (the graph's
    # ``moe_combine``), 0 where the probabilities are applied inside the experts' activation and the unpermutation
    # keeps only its indices (Megatron-core), 2 where the weighting runs on an fp32 copy (torchtitan)
    moe_combine_keeps: float = 1.0
    # the MoE token dispatchers the engine runs (``cost.moe.DISPATCHERS``, ``TrainConfig.stack.moe_dispatcher``):
    # Megatron-core's alltoall and flex dispatcher with its deepep and hybridep backends (NVIDIA/Megatron-LM@d98e8a64dd
    # moe/token_dispatcher.py ``MoEFlexTokenDispatcher``), torchtitan's comm_backend "standard", "deepep" and
    # "hybridep" (pytorch/torchtitan@b5bcd76c66d0 torchtitan/models/common/config_utils.py); DeepSpeed's MoE its own
    # all-to-all
    moe_dispatchers: tuple[str, ...] = ("alltoall",)
    # the eager SwiGLU of PyTorch model code, ``w2(F.silu(w1(x)) * w3(x))``: silu saves its input, the product
    # both of its operands and w2 the product, so a layer keeps the silu's output too (one gate-sized tensor
    # beyond the fused activation of the graph: ``cost.segment``). pytorch/torchtitan@238fa9953e4aec2a62582121564273d7
    # cbb1e9f1 torchtitan/models/llama3/model/model.py FeedForward.forward (and the MoE experts' grouped GEMMs);
    # torchgen/packaged/autograd/derivatives.yaml (torch 2.13): silu saves ``self``, mul.Tensor ``self`` and ``other``
    unfused_swiglu: bool = False
    # the forward-backward peak placed where it happens in torchtitan's FSDP2 step (``cost.memory.timed_positions``)
    # instead of all transients on top of all persistent terms: at the loss's backward (no gradient yet in a
    # one-micro-batch step, only the LM head's unit gathered, no reduction buffer) or in the layers' backward; and
    # the blocks FSDP2's side streams keep reserved (``cost.memory.side_streams``); where weights are sharded
    timed_peak: bool = False
    # under a pipeline, a stage's micro-batches run backward without gradient sync or resharding and each schedule
    # reduce-scatters the stage's units once, after its last backward: torch.distributed.pipelining (torch 2.13
    # distributed/pipelining/stage.py ``backward_maybe_with_nosync``: set_requires_gradient_sync(False),
    # set_reshard_after_backward(False); ``perform_reduce_grad``, "REDUCE_GRAD action is scheduled after all
    # microbatches W, B actions", runs FSDP's post_backward), which torchtitan and NeMo AutoModel run FSDP2's pipelines
    # with; the unsharded gradients accumulate until then (``cost.memory.engine_buffers``), and so do the unsharded
    # weights, resharded after forward or not (``schedule_gathers``). (``exposure``)
    pipeline_sync_once: bool = False
    # what the engine does not run, each with the reason its refusal states (``refusal``): ``pp`` (a pipeline),
    # ``vpp`` (interleaved virtual stages), ``zero2``, ``zero3``, ``cp``, ``ep``, ``fp8``, ``hsdp``, ``layout`` (a
    # stated layer split),
    # ``sac`` (torchtitan's selective checkpointing, ``selective-op`` and ``layer:N``), ``fp4`` (NVFP4, costed as
    # Transformer Engine's NVFP4BlockScaling: ``cost.precision``), ``lowp`` (Megatron-LM's quantized parameters
    # and BF16-kept layers, ``--fp8-param-gather`` and ``--first-last-layers-bf16``: ``cost.precision``)
    refuses: tuple[tuple[str, str], ...] = ()
    # how context parallelism runs the attention core, named as Megatron-LM's --cp-comm-type names it (``CP_COMMS``):
    # "p2p" (ring attention: its query sequence cut, the keys and values passed round the cp group; torchtitan's
    # only) or "a2a" (cut by heads behind all-to-alls: DeepSpeed-Ulysses', DeepSpeed's only). ``context``: the
    # engine's own, ``contexts``: those it runs (a stack states one: ``Stack.cp_comm``); an engine without rings
    # runs no attention with its query sequence cut (``cut_refusal``)
    context: str = "p2p"
    contexts: tuple[str, ...] = ("p2p",)
    # whether the engine pads the vocabulary to a multiple of 128 itself (Megatron-LM's --make-vocab-size-divisible-by,
    # default 128, megatron/training/arguments.py; Megatron-DeepSpeed keeps it), as the graph is always costed
    # (``models.builder.VOCAB_PAD``); an engine of PyTorch models (torchtitan, Hugging Face models under DeepSpeed)
    # runs the vocabulary the model states, and a plan says what a vocabulary that is no multiple of 8 costs there
    # (``plan.document.description_notes``)
    pads_vocab: bool = False

    @property
    def a2a_only(self) -> bool:
        """Whether its only context parallelism is all-to-all: DeepSpeed-Ulysses (DeepSpeed's, sequence parallel in
        its own words), which Megatron-DeepSpeed does not run beside Megatron's sequence parallelism."""
        return self.contexts == ("a2a",)

    def refuses_feature(self, feature: str) -> bool:
        """Whether the engine refuses ``feature`` (a key of ``refuses``)."""
        return any(name == feature for name, _ in self.refuses)

    def shards(self, state: int, zero: int) -> bool:
        """Whether ZeRO stage ``zero`` shards ``state`` (WEIGHTS, GRADIENTS or OPTIMIZER) over the replicas."""
        return zero >= self.sharded_from[state]

    def zero_sharded(self, zero: int) -> bool:
        """Whether ``zero`` shards any state: gradients are then reduce-scattered to their shard's
        owner and the updated (or sharded) weights all-gathered, instead of all-reduced."""
        return zero >= min(self.sharded_from)

    def reshards(self, zero: int) -> bool:
        """Whether sharded weights are freed after forward and gathered again for backward."""
        return self.shards(WEIGHTS, zero) and zero >= self.reshards_from


# torchtitan's selective activation checkpointing (``cost.segment.recompute_share``) is torchtitan's: Megatron-LM's
# selective recomputation is by module (--recompute-modules), DeepSpeed's by layer (Megatron's checkpointing)
_SAC = ("sac", "torchtitan's selective checkpointing (selective-op, layer:N) runs under --framework fsdp2 "
        "(torchtitan); use --recompute selective or full")

# Transformer Engine "prefers cuDNN flash attention on Hopper+ architectures, and Tri Dao flash attention on
# Ampere" (NeMo docs, memory_optimizations.rst, NVIDIA/NeMo#9188); Blackwell's only table is SimuMax's measured
# Transformer Engine attention (``te``), which Blackwell Ultra (B300, GB300) reads too (cost.kernels.B300).
# PyTorch's SDPA: ``SDPA_ATTENTION`` below (cuDNN on Hopper and Blackwell since torch 2.11, FlashAttention-2 elsewhere).
# NVFP4 (``cost.precision``) is costed as Transformer Engine's NVFP4BlockScaling, which Megatron-LM runs
# (--fp4-format e2m1 --fp4-recipe nvfp4); torchtitan's nvfp4 converter (pytorch/torchtitan@b5bcd76c
# torchtitan/components/quantization/nvfp4.py) runs torchao's prototype Triton NVFP4 kernels instead, for which
# no kernel rate is measured here; DeepSpeed and Megatron-DeepSpeed have no NVFP4 training path
_FP4 = ("fp4", "NVFP4 is costed as Transformer Engine's NVFP4BlockScaling, which Megatron-LM runs; use --framework "
               "megatron, or --precision fp8")
# Megatron-LM's quantized parameters (--fp8-param-gather) and BF16-kept layers (--first-last-layers-bf16) are
# Transformer Engine's fp8_model_init and per-layer autocast under Megatron-core (``cost.precision``); torchtitan's
# float8 converter has its own FSDP2 float8 all-gather (enable_fsdp_float8_all_gather, torchao's tensorwise weights
# cast per step) and module filter, neither modelled; DeepSpeed has neither
_LOWP = ("lowp", "--fp8-param-gather and --first-last-layers-bf16 are Megatron-LM's (Transformer Engine's quantized "
                 "parameters and per-layer precision); use --framework megatron, or leave them out")
# DeepSpeed's pipeline parallelism is its PipelineEngine (TrainSchedule only, no interleaving; ZeRO 0 or 1: "ZeRO-2
# and ZeRO-3 are incompatible with pipeline parallelism"; blocking p2p): the megatron-deepspeed engine models it
# (its refusals). The deepspeed engine is DeepSpeed ZeRO over data (and tensor) parallelism, so a pipeline under it
# would be costed with Megatron's schedule and p2p and could pair ZeRO 2/3 with stages, which DeepSpeed refuses.
_PIPE = ("pp", "DeepSpeed's pipeline parallelism is its pipeline engine (ZeRO 0 or 1, no interleaving, blocking p2p), "
               "costed as --framework megatron-deepspeed; use --pp 1 under --framework deepspeed, or that engine")
TE_ATTENTION = (("H100", "cudnn"), ("H200", "cudnn"), ("H800", "cudnn"), ("B200", "te"), ("B300", "te"),
                ("", "fa2"))
# PyTorch's scaled_dot_product_attention prefers cuDNN's fused attention on sm90 and sm100 since torch 2.11
# (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp ``check_prefer_cudnn_attention``: the backend order cuDNN,
# flash, efficient, math where the bundled cuDNN is above 9.15.0, which torch 2.11's CUDA wheels are the first to
# carry; the guard came in after the 2.5 bugs, pytorch/pytorch#138522, #162073; huggingface/transformers#48163
# "on recent torch the default is already cuDNN"), the kernels Transformer Engine's DotProductAttention runs there;
# elsewhere (A100) FlashAttention-2. torchtitan sets the order itself (``sdpa_kernel(backends, set_priority=True)``):
# cuDNN first on every device since 2025-10-09 (pytorch/torchtitan 6a3a9da95, #1776: torchtitan/models/attention.py
# ``ScaledDotProductAttentionWrapper.sdpa_backends`` CUDNN_ATTENTION, FLASH_ATTENTION, ...; at b5bcd76c6, 2026-08,
# torchtitan/models/common/attention.py the same), FlashAttention-2 first on Hopper and cuDNN on B200 from 2025-05-14
# (#1196) to then, torch's own order before. Measured: torch 2.11's SDPA ran cuDNN's kernels in this project's H200
# steps (benchmarks/results/hopper_runs.md). A stack on torch 2.10 or older, or torchtitan before October 2025, states
# ``--attention fa2``.
SDPA_ATTENTION = TE_ATTENTION
# the flash-attn library's FlashAttention-2 (Megatron-DeepSpeed's --use-flash-attn-v2), on every device
FA2_ATTENTION = (("", "fa2"),)
# a device without the engine's kernel's tables runs the first of these it has
ATTENTION_FALLBACK = ("fa2", "cudnn", "fa3", "te")

# fsdp2's reduce_bytes: FSDP2's MixedPrecisionPolicy reduce-scatters in its reduce_dtype, float32 under torchtitan
# (job_config mixed_precision_reduce, default "float32") and NeMo AutoModel (nemo_automodel/components/moe/
# parallelizer.py: reduce_dtype=torch.float32), whatever the parameters' dtype (``Stack.param_dtype``).
# fsdp2's loss_grad_bytes: torchtitan's loss is ``F.cross_entropy(pred.flatten(0, 1).float(), ...)``
# (pytorch/torchtitan@238fa9953e4aec2a62582121564273d7cbb1e9f1 torchtitan/components/loss.py), i.e. log_softmax of an
# fp32 copy of the logits, whose fp32 output is saved (the graph's loss extra), then nll_loss. Its backward:
# nll_loss_backward allocates a zeroed fp32 gradient of the log-probabilities (4 bytes per logit), then
# _log_softmax_backward_data allocates the fp32 gradient of its input (4 more) while that gradient and the saved
# output still live (derivatives.yaml: ``_log_softmax: self: _log_softmax_backward_data(grad, result, ...)``):
# 8 bytes per logit beyond the saved 4, the step's largest moment (3 fp32 copies of the logits at once).
_EP_DISPATCHERS = ("alltoall", "deepep", "hybridep")  # Megatron's and torchtitan's (``Engine.moe_dispatchers``)
# context parallelism's kinds (``Engine.context``), as Megatron-LM's --cp-comm-type names them (arguments.py: p2p,
# a2a, allgather, a2a+p2p; the last two are not modelled)
CP_COMMS = ("p2p", "a2a")
ENGINES = {
    "megatron": Engine("megatron", ddp_bucket_bytes=40e6 * 4, per_tensor_gathers=False, regather_recompute=False,
                       tp_overlap=True, keeps_sp_shard=True, exposed_param_gather=False, copy_out=False,
                       state_bytes=(2, 4, 12), sharded_from=(3, 2, 1), reshards_from=3, pytorch_kernels=False,
                       attention_kernels=TE_ATTENTION, grad_reduce_bf16="buffer", refuses=(_SAC,),
                       recompute_modules=True, unit_reduce_buffer=True, replicate_once=True,
                       moe_combine_keeps=0.0, cpu_offload=True, moe_dispatchers=_EP_DISPATCHERS,
                       contexts=("p2p", "a2a"), pads_vocab=True),
    "fsdp2": Engine("fsdp2", ddp_bucket_bytes=25 * 2**20, per_tensor_gathers=False, regather_recompute=False,
                    tp_overlap=False, keeps_sp_shard=False, exposed_param_gather=False, copy_out=True,
                    state_bytes=(4, 4, 8), sharded_from=(1, 1, 1), reshards_from=3, pytorch_kernels=True,
                    ddp_bucket_copy=True, unit_reduce_buffer=True, loss_grad_bytes=8, expandable_segments=True,
                    attention_kernels=SDPA_ATTENTION, grad_reduce_bf16="comm", moe_combine_keeps=2.0, reduce_bytes=4,
                    unfused_swiglu=True, timed_peak=True, moe_dispatchers=_EP_DISPATCHERS, refuses=(_FP4, _LOWP),
                    pipeline_sync_once=True),
    "deepspeed": Engine("deepspeed", ddp_bucket_bytes=5e8 * 2, per_tensor_gathers=True, regather_recompute=True,
                        tp_overlap=False, keeps_sp_shard=False, exposed_param_gather=True, copy_out=False,
                        state_bytes=(2, 2, 12), sharded_from=(3, 2, 1), reshards_from=3, pytorch_kernels=True,
                        bucket_buffers=2, loss_grad_bytes=4, step_temp_bytes=4, attention_kernels=SDPA_ATTENTION,
                        grad_reduce_bf16="default", refuses=(_PIPE, _SAC, _FP4, _LOWP), context="a2a",
                        contexts=("a2a",)),
}
# DeepSpeed's pipeline engine under Megatron-DeepSpeed (the module docstring); its refusals name the fix
_DS_PIPE = "DeepSpeed's pipeline engine (Megatron-DeepSpeed)"
ENGINES["megatron-deepspeed"] = Engine(
    "megatron-deepspeed", ddp_bucket_bytes=5e8 * 4, per_tensor_gathers=False, regather_recompute=False,
    tp_overlap=False, keeps_sp_shard=True, exposed_param_gather=True, copy_out=False, state_bytes=(2, 6, 12),
    sharded_from=(3, 2, 1), reshards_from=3, pytorch_kernels=False, bucket_buffers=1, loss_grad_bytes=4,
    attention_kernels=FA2_ATTENTION, p2p_transfers=4, reduce_after_backward=True, zero_all_reduce=True,
    reduce_bytes=4, pads_vocab=True, refuses=(
        ("zero2", f"{_DS_PIPE} runs ZeRO 0 or 1 (\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\"); "
                  "use --zero 1, or --framework deepspeed (Megatron-DeepSpeed's --no-pipeline-parallel, pp 1)"),
        ("zero3", f"{_DS_PIPE} runs ZeRO 0 or 1 (\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\"); "
                  "use --zero 1, or --framework deepspeed (Megatron-DeepSpeed's --no-pipeline-parallel, pp 1)"),
        ("vpp", f"{_DS_PIPE} has no interleaved schedule (TrainSchedule only); use --vpp 1"),
        ("layout", f"{_DS_PIPE} splits the layers by count (partition_method 'type:transformer'); leave "
                   "--pp-layout out or use 'even'"),
        ("cp", f"{_DS_PIPE}: context parallelism is not modelled (its long-sequence path is DeepSpeed-Ulysses); "
               "use --cp 1"),
        ("ep", f"{_DS_PIPE}: DeepSpeed-MoE expert parallelism is not modelled; use --ep 1 or --framework megatron"),
        ("fp8", f"{_DS_PIPE}: FP8 is not modelled; use --precision bf16"),
        ("hsdp", f"{_DS_PIPE} shards ZeRO 1 over the whole data-parallel group; leave --dp-shard out"), _SAC, _FP4,
        _LOWP,
    ))
# its FP16 path (the module docstring): the state of FP16_Optimizer / DeepSpeedZeroOptimizer (2 + 2 + 12), fp16
# reduction (reduce_bytes 0: the gradients' own 2 bytes; reduce_bucket_size 5e8 fp16 elements) to the owners at
# ZeRO 1, the fp32 gradients of the step (4 bytes per owned parameter) and the loss-scale check: at ZeRO 0
# ``float(x.float().sum())`` reads 2, writes 4 and reads 4 bytes per element; at ZeRO 1 ``_has_inf_or_nan`` casts
# (2 + 4), isnan and isinf (4 + 1 each), logical_or (1 + 1 + 1), casts (1 + 4) and takes the max (4): 28
ENGINES["megatron-deepspeed"] = replace(
    ENGINES["megatron-deepspeed"], fp16=replace(
        ENGINES["megatron-deepspeed"], state_bytes=(2, 2, 12), ddp_bucket_bytes=5e8 * 2, zero_all_reduce=False,
        reduce_bytes=0, step_temp_bytes=4, overflow_scan_bytes=(10, 28), overflow_flags=(1, 2)))
# other names of an engine a configuration may give: ``torch`` (PyTorch's own FSDP2)
ALIASES = {"torch": "fsdp2"}


def table_kernel(kernels: tuple[tuple[str, str], ...], device_name: str) -> str:
    """The table kernel of ``kernels`` ((device name part, kernel) pairs, as ``Engine.attention_kernels``) that
    ``device_name`` runs: the first part found in its name (FlashAttention-2 where none is)."""
    name = device_name.upper()
    return next((k for part, k in kernels if part in name), "fa2")


def attention_kernel(engine: Engine, device_name: str, has=lambda kernel: True) -> str:
    """The table kernel ``engine``'s fused attention runs on ``device_name`` (``Engine.attention_kernels``),
    or the first of ``ATTENTION_FALLBACK`` for which ``has(kernel)`` holds when the device lacks it."""
    kernel = table_kernel(engine.attention_kernels, device_name)
    return kernel if has(kernel) else next((k for k in ATTENTION_FALLBACK if has(k)), kernel)


def refusal(engine: Engine, *, pp: int = 1, zero: int = 0, vpp: int = 1, cp: int = 1, ep: int = 1, fp8: bool = False,
            hsdp: bool = False, layout: bool = False, sac: bool = False, fp16: bool = False, fp4: bool = False,
            lowp: bool = False) -> str | None:
    """Why ``engine`` does not run a configuration with these features (``Engine.refuses``; FP16 where its
    ``Engine.fp16`` is not modelled), or None."""
    if fp16 and engine.fp16 is None:
        return (f"FP16 with dynamic loss scaling is modelled for {', '.join(k for k, e in ENGINES.items() if e.fp16)} "
                f"only, not {engine.name}; use --precision bf16")
    used = {"pp": pp > 1, "zero2": zero == 2, "zero3": zero == 3, "vpp": vpp > 1, "cp": cp > 1, "ep": ep > 1,
            "fp8": fp8, "hsdp": hsdp, "layout": layout, "sac": sac, "fp4": fp4, "lowp": lowp}
    return next((why for feature, why in engine.refuses if used[feature]), None)


def ulysses_sp_refusal(engine: Engine, cp: int, sp: bool) -> str | None:
    """Why ``engine`` does not run Megatron's sequence parallelism ``sp`` beside context parallelism ``cp``, or None:
    an engine whose only context parallelism is DeepSpeed-Ulysses (``Engine.a2a_only``) does not, as Megatron-DeepSpeed
    says of its Ulysses switch (microsoft/Megatron-DeepSpeed megatron/arguments.py ``--ds-sequence-parallel-size``:
    "Cannot be combined with --sequence-parallel, which enables Megatron-LM's sequence parallel"). Megatron-LM's own
    a2a runs beside it (Transformer Engine's all-to-all attention takes the heads of a tensor-parallel rank)."""
    if engine.a2a_only and cp > 1 and sp:
        return (f"cp={cp} under the {engine.name} engine is DeepSpeed-Ulysses, which Megatron-DeepSpeed does not "
                "combine with Megatron's sequence parallelism (--ds-sequence-parallel-size: \"Cannot be combined "
                "with --sequence-parallel\"); use --no-sp, or --cp 1")
    return None


def context_of(framework: str, cp_comm: str | None = None) -> str:
    """How context parallelism runs under engine ``framework`` with the stack's ``cp_comm`` (``Stack.cp_comm``;
    None: the engine's own, ``Engine.context``): ``p2p`` (ring attention) or ``a2a`` (all-to-alls around an
    attention core cut by heads)."""
    return cp_comm or engine_named(framework).context


def context_refusal(framework: str, cp_comm: str | None) -> str | None:
    """One line where engine ``framework`` does not run the context parallelism ``cp_comm`` states (``Engine.contexts``:
    torchtitan's is ring attention only, DeepSpeed's Ulysses only), or None."""
    eng = ENGINES.get(ALIASES.get(framework, framework))
    if cp_comm is None or eng is None:
        return None
    if eng.refuses_feature("cp"):
        return f"--cp-comm-type {cp_comm}: the {eng.name} engine runs no context parallelism; leave --cp-comm-type out"
    if cp_comm in eng.contexts:
        return None
    runs = "DeepSpeed-Ulysses (a2a)" if eng.a2a_only else "ring attention (p2p)"
    return (f"--cp-comm-type {cp_comm}: the {eng.name} engine runs context parallelism as {runs} only; leave "
            "--cp-comm-type out" + (", or use --framework megatron" if eng.name != "megatron" else ""))


def cut_refusal(train, op, layout) -> str | None:
    """Why ``train``'s engine does not run ``op`` under ``layout`` (an ``OpLayout``), or None: where context
    parallelism runs as all-to-alls (``TrainConfig.context``: DeepSpeed's, or a stack that states Megatron's a2a)
    no attention core has its query sequence ``s`` cut (ring attention); the one rule the search's layouts and a
    stated plan's both meet (``search.partition.Problem.legal``, ``Evaluator.check``)."""
    if op.kind == "attention" and train.context == "a2a" and layout.axes_of("s"):
        return (f"the {train.framework} engine runs no ring attention here (its context parallelism is all-to-all, "
                "DeepSpeed-Ulysses' scheme: the attention core cut by heads, the projections by sequence); cut the "
                "attention core's heads, not its query sequence")
    return None


# Gradient reduction in bf16 (``Engine.grad_reduce_bf16``), as each engine states it:
# - megatron: ``--grad-reduce-in-bf16`` sets accumulate_allreduce_grads_in_fp32 False (megatron/training/
#   arguments.py), so DistributedDataParallelConfig.grad_reduce_in_fp32 is False and the contiguous gradient buffer
#   (main_grad, which the buckets reduce in place) takes the parameter's dtype: ``grad_dtype = torch.float if
#   grad_reduce_in_fp32 else param.dtype`` (megatron/core/distributed/distributed_data_parallel.py). The optimizer
#   step then copies each owned shard to fp32 (``shard_main_param.grad = shard_model_grad.float()``,
#   megatron/core/optimizer/distrib_optimizer.py ``_copy_model_grads_to_main_grads``; a view, no copy, when the
#   buffer is already fp32): 4 bytes per owned parameter for the step (``GRAD_REDUCE_STEP_BYTES``).
# - fsdp2 (torchtitan): ``training.mixed_precision_reduce = "bfloat16"`` is FSDP2's MixedPrecisionPolicy
#   reduce_dtype (torchtitan/config/training.py, Literal["bfloat16", "float32"], default float32; older
#   job_config.py allowed float32 only), which "only takes effect when data_parallel_shard_degree > 1": the
#   reduce-scatter runs in bf16 and its output is cast back to the fp32 sharded gradient.
# - deepspeed: ``communication_data_type`` defaults to bf16 when bf16 is enabled (deepspeed/runtime/engine.py,
#   the communication_data_type property): the engine's gradients are bf16 already (``state_bytes``).
# - megatron-deepspeed: DeepSpeed's bf16 optimizer accumulates and reduces fp32 gradients (``reduce_bytes``); a
#   bf16 reduction there is not modelled.
GRAD_REDUCE_STEP_BYTES = 4


def grad_reduce_refusal(framework: str, zero: int) -> str | None:
    """Why ``framework``'s engine does not reduce gradients in bf16 at ZeRO ``zero`` (``Engine.grad_reduce_bf16``),
    in one line naming the fix, or None."""
    eng = ENGINES.get(ALIASES.get(framework, framework))
    if eng is None:
        return None  # (TrainConfig names an unknown engine)
    if not eng.grad_reduce_bf16:
        return (f"--grad-reduce-in-bf16: {framework} has no bf16 gradient reduction modelled (it reduces fp32 "
                "gradients); leave it out or use --framework megatron")
    if eng.grad_reduce_bf16 == "comm" and zero == 0:
        return ("--grad-reduce-in-bf16 is torchtitan's mixed_precision_reduce, which takes effect only under FSDP "
                "(data_parallel_shard_degree > 1); use --zero 1, 2 or 3 or leave it out")
    return None


# CPU activation offloading (``Engine.cpu_offload``, ``TrainConfig.stack.cpu_offload_layers``), as Megatron-LM runs it
# (NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553): --cpu-offloading-num-layers N (a TransformerConfig
# field the CLI builds; ``--cpu-offloading`` has no flag of its own: megatron/training/arguments.py sets
# args.cpu_offloading = True when N > 0) hands Transformer Engine's get_cpu_offload_context(enabled, N, num_layers,
# activations=True, weights=False, ...) to the TransformerBlock (megatron/core/transformer/transformer_block.py).
# TransformerConfig refuses N < 0 or N >= num_layers, pipeline parallelism ("Currently there is no support for
# Pipeline parallelism with CPU offloading"), any activation recomputation ("CPU offloading does not work when
# activation recomputation is enabled") and per-layer CUDA graphs (megatron/core/transformer/transformer_config.py).
# Transformer Engine's default scheduling (NVIDIA/TransformerEngine@d0067d0da6cb01811b8072a7d304f0e00344ce2b
# docs/features/other_optimizations/cpu_offloading/cpu_offloading.rst): the first N layers are offloaded, each as
# soon as its tensors are saved for backward, by asynchronous copies on a side stream; "at most (model_layers -
# num_layers) sets of activations are on GPU at any time", and a layer's reload completes before its backward. So
# the N layers' saved activations leave the device (``cost.memory``), and a layer's copy costs the step only what it
# exceeds of the layer's own compute (``hidden`` with no SM share: the copy engines, not the SMs, move the bytes).
def offload_engine_refusal(framework: str, option: str, what: str) -> str | None:
    """Why ``framework``'s engine has no activation offloading (``Engine.cpu_offload``: the layer-level one above,
    and Megatron-core's fine-grained one, ``cost.offload``), stated by ``option`` (``what`` it is), in one line
    naming the fix, or None (an unknown engine too: TrainConfig names it)."""
    eng = ENGINES.get(ALIASES.get(framework, framework))
    if eng is None or eng.cpu_offload:
        return None
    return f"{option}: {what}; {framework} has none modelled; use --framework megatron or leave it out"


def cpu_offload_refusal(framework: str, pp: int, recompute: str) -> str | None:
    """Why ``framework``'s engine does not offload activations to the host at ``pp`` pipeline stages under
    ``recompute`` (``CPU_OFFLOAD`` above), in one line naming the fix, or None."""
    if ENGINES.get(ALIASES.get(framework, framework)) is None:
        return None  # (TrainConfig names an unknown engine)
    why = offload_engine_refusal(framework, "--cpu-offload-layers",
                                 "CPU activation offloading is Megatron-LM's (--cpu-offloading-num-layers)")
    if why is not None:
        return why
    if pp > 1:
        return ("--cpu-offload-layers: Megatron-LM has no CPU offloading with pipeline parallelism (TransformerConfig "
                "refuses it); use --pp 1 or leave it out")
    if recompute != "none":
        return (f"--cpu-offload-layers: Megatron-LM's CPU offloading does not run with activation recomputation "
                f"(recompute={recompute}; TransformerConfig refuses it); use --recompute none or leave it out")
    return None


def offload_count_refusal(n, layers: int | None = None) -> str | None:
    """A bad count of CPU-offloaded layers (``CPU_OFFLOAD`` above), in one line naming the fix, or None: not an
    integer >= 0, or, given the model's ``layers``, not fewer than them (TransformerConfig: 'CPU offloading can be
    done only for layers less than' num_layers)."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        return f"cpu_offload_layers={n!r}; use a layer count >= 0 (0: no CPU activation offloading)"
    if layers is not None and n >= layers:
        return (f"cpu_offload_layers={n}: Megatron-LM offloads fewer layers than the model's {layers} "
                f"(TransformerConfig: 'CPU offloading can be done only for layers less than {layers}'); choose at "
                f"most {layers - 1}")
    return None


def host_link_refusal(device) -> str | None:
    """Why ``device`` cannot carry offloaded activations (no ``Device.host_bandwidth`` stated), or None."""
    if device.host_bandwidth:
        return None
    return (f"activation offloading: device {device.name} states no host link bandwidth; add host_gbps (GB/s each "
            "way) to the cluster file's device, or leave --cpu-offload-layers and --offload-modules out")


def engine_of(train) -> Engine:
    """The engine ``train`` runs under: its framework's, as it runs FP16 where ``train.precision`` is fp16."""
    eng = ENGINES[train.framework]
    return eng.fp16 if train.precision == "fp16" and eng.fp16 is not None else eng


def engine_named(framework: str) -> Engine:
    """The engine ``framework`` names, an alias (``ALIASES``: torch, torchtitan, ...) included."""
    return ENGINES[ALIASES.get(framework, framework)]


def sharded_parameters(zero: int, framework: str) -> bool:
    """Whether parameters are sharded over their replicas and gathered unit by unit for compute
    (``Engine.sharded_from``): ZeRO 3 under every engine; FSDP2 at every stage above 0 (ZeRO 1/2 =
    FSDP2 without resharding after forward)."""
    return engine_named(framework).shards(WEIGHTS, zero)


def reshards_after_forward(zero: int, framework: str = "fsdp2") -> bool:
    """Whether sharded parameters are freed after forward and gathered again for backward (FSDP2's
    ``reshard_after_forward``, ``Engine.reshards_from``): at ZeRO 3 only; FSDP2's ZeRO 1/2 keep them
    to backward. ``framework``: FSDP2 by default, the engine the runtime and torchtitan run."""
    return engine_named(framework).reshards(zero)


def schedules_refusal(framework: str, schedules: int) -> str | None:
    """One line where engine ``framework`` does not run a step's micro-batches as ``schedules`` pipeline schedules
    (``Stack.pp_schedules``), or None: Megatron and DeepSpeed's pipeline engine run one schedule per step."""
    if schedules != 1 and not engine_named(framework).pipeline_sync_once:
        return (f"{framework} runs a step's micro-batches as one pipeline schedule; --pp-schedules {schedules} is how "
                "torchtitan and NeMo AutoModel accumulate gradients over several: leave it out, or use --framework "
                "fsdp2")
    return None


def overlap_refusal(framework: str, stack) -> str | None:
    """One line where engine ``framework`` has no switch for the communication overlaps ``stack`` states
    (``Stack.tp_comm_overlap``, ``Stack.dp_comm_overlap``: Megatron-LM's flags), or None."""
    if framework != "megatron" and (stack.tp_comm_overlap is not None or stack.dp_comm_overlap is not None):
        return (f"--[no-]tp-comm-overlap and --[no-]dp-comm-overlap state Megatron-LM's overlap flags; {framework} "
                "runs its own overlaps: leave them out, or use --framework megatron")
    return None


def syncs_per_schedule(train) -> bool:
    """Whether a stage's sharded weights are synchronised once per pipeline schedule (``Engine.pipeline_sync_once``,
    under a pipeline): reduce-scattered after the schedule's last backward, gathered ``schedule_gathers`` times."""
    eng = engine_of(train)
    return train.pp > 1 and eng.pipeline_sync_once and eng.shards(WEIGHTS, train.zero)


def holds_one_unit(train) -> bool:
    """Whether the engine frees each unit's gathered weights after its forward and backward, holding only the unit
    in use and the one prefetched (resharding after forward, ZeRO 3), which FSDP2 under a pipeline does not
    (``syncs_per_schedule``: each backward leaves its unit gathered)."""
    return engine_of(train).reshards(train.zero) and not syncs_per_schedule(train)


def schedule_gathers(train) -> int:
    """All-gathers of each unit per pipeline schedule under ``syncs_per_schedule``: one where the engine keeps the
    weights gathered after forward (FSDP2's reshard_after_forward=False: ZeRO 1/2, torchtitan's default under a
    pipeline). Resharding after forward (ZeRO 3), pipelining still runs every backward with
    set_reshard_after_backward(False) (torch 2.13 stage.py ``backward_maybe_with_nosync``): a forward that follows a
    backward finds its unit gathered (and reshards it), a backward that follows a forward gathers it again. Every
    schedule makes that m + 1 gathers of m micro-batches: 1F1B's w warm-up forwards and its first steady one gather,
    its m - w steady backwards gather, its cool-down backwards (after a backward) do not; GPipe's m forwards and its
    first backward; the interleaved schedules the same per virtual stage."""
    return train.schedule_steps + 1 if engine_of(train).reshards(train.zero) else 1


def tp_overlapped(train) -> bool:
    """Whether tensor-parallel communication overlaps the GEMMs for this configuration."""
    return engine_of(train).tp_overlap if train.tp_overlap is None else train.tp_overlap


@dataclass(frozen=True, slots=True)
class Unit:
    """One unit of a pipeline stage, ``times`` identical copies; seconds per micro-batch for the
    compute and per single collective for the communication of the unit's own parameters."""

    times: int
    fwd_s: float
    bwd_s: float  # backward and recomputed forward
    gather_s: float  # one all-gather of the unit's parameters over their replicas
    reduce_s: float  # one reduction of its gradients (all-reduce at ZeRO 0, else reduce-scatter)
    grad_bytes: float  # bytes of its gradients entering the reduction (for the last bucket)
    copy_s: float = 0.0  # compute-stream seconds of copying one gather out (engines with copy_out)
    replicate_s: float = 0.0  # the part of reduce_s that is the all-reduce across replicas (hybrid sharding)


@dataclass(frozen=True, slots=True)
class Exposure:
    """Exposed seconds of a stage's data-parallel communication per step, and how many times per
    step each collective kind runs (for the byte counts)."""

    seconds: float
    calls: dict


def pipeline_window(train) -> float:
    """Micro-batches of a stage's compute that run while its once-per-step gradient reduction (in
    the cool-down) or parameter gather (in the warm-up) proceeds: 1 without a pipeline; the
    first stage's warm-up of 1F1B (pp - 1 micro-batches, plus the last one) and of the
    interleaved schedule (``TrainConfig.warmup_chunks``, each 1/vpp of a micro-batch), at most the
    micro-batches of a pipeline schedule (``TrainConfig.schedule_steps``: the step's, but for
    ``Stack.pp_schedules``)."""
    pp, v, m = train.pp, train.vpp, train.schedule_steps
    if pp == 1:
        return 1.0
    if v == 1:
        return float(min(m, pp))
    return min(float(m), 1 + train.warmup_chunks(0) / v)


# While a collective overlaps compute, NCCL's thread blocks hold SMs that the compute kernels cannot
# use: "NCCL uses the minimal number of SMs to achieve the performance of the platform ... on DGX with
# 8 NICs and a top speed of 190 GB/s, then it would use 16 SMs", and "NCCL CTAs won't share an SM
# with compute kernels" (NCCL maintainer, NVIDIA/nccl#689). 16 of an A100's 108 SMs is the prior of
# the end-to-end constant ``EndToEnd.comm_sm_fraction`` (the calibrated value is in cost.efficiency).
COMM_SM_FRACTION = 16 / 108


def hidden(comm: float, compute: float, share: float = COMM_SM_FRACTION) -> float:
    """Exposed part of ``comm`` running beside ``compute``: its excess over the compute, and at least
    the compute lost to the SMs (and memory bandwidth) the collective holds while it runs (``share``
    of ``comm``: compute of t seconds beside a collective of c runs t + share c when that exceeds c)."""
    return max(comm - compute, share * comm)


def _bucketed(units, reduce_total: float, hide: float, bucket: float, ends: bool, share: float) -> float:
    """Bucketed reduction behind ``hide`` seconds of backward: the excess is exposed, and so is
    the last bucket (it fills when backward ends). Never more than the reduction itself."""
    grad = sum(u.grad_bytes * u.times for u in units)
    last = reduce_total * min(1.0, bucket / grad) if grad and ends else 0.0
    return min(reduce_total, hidden(reduce_total, hide, share) + last)


def exposure(units: list[Unit], train, ends: bool = True, share: float = COMM_SM_FRACTION) -> Exposure:
    """Exposed data-parallel seconds per step of one stage under ``train``'s engine and ZeRO stage.

    ``ends=False`` leaves out what only a whole stage has (the last gradient bucket, the first
    unit's gather, the last unit's reduction): the per-op share the search charges an op.
    ``share``: the compute a collective beside it takes (``EndToEnd.comm_sm_fraction``)."""
    eng, m, z = engine_of(train), train.micro_steps, train.zero
    fwd = sum(u.fwd_s * u.times for u in units)
    bwd = sum(u.bwd_s * u.times for u in units)
    gather = sum(u.gather_s * u.times for u in units)
    reduce = sum(u.reduce_s * u.times for u in units)
    overlap = train.overlap_grad_reduce and not eng.reduce_after_backward
    if syncs_per_schedule(train):
        return _per_schedule(units, train, eng, (fwd, bwd, gather, reduce), overlap, ends, share)
    if eng.shards(WEIGHTS, z):
        return _sharded(units, train, eng, overlap, ends, share)
    # once per step, the reduction runs beside the pipeline's cool-down backward and the gather
    # beside its warm-up forward: micro-batches of the stage's compute to hide behind (ZeRO 2
    # reduces every micro-batch, beside that micro-batch's backward only)
    window = pipeline_window(train)
    reduce_window = 1.0 if eng.shards(GRADIENTS, z) else window
    if not eng.zero_sharded(z):
        seconds = _bucketed(units, reduce, reduce_window * bwd, eng.ddp_bucket_bytes, ends, share) \
            if overlap else reduce
        return Exposure(seconds, {"all_reduce": 1})
    # ZeRO 1/2: reduce-scatter (per step, or per micro-batch at stage 2), then the parameter gather
    times = m if eng.shards(GRADIENTS, z) else 1
    fwd *= window
    one = _bucketed(units, reduce, reduce_window * bwd, eng.ddp_bucket_bytes, ends, share) if overlap else reduce
    if eng.exposed_param_gather or not overlap:
        ag = gather
    else:  # overlapped with the next step's first forward, unit by unit; the first unit waits
        first = units[0].gather_s if units and ends else 0.0
        ag = min(gather, hidden(gather, fwd, share) + first)
    return Exposure(times * one + ag, {"all_reduce" if eng.zero_all_reduce else "reduce_scatter": times,
                                       "all_gather": 1})


def _per_schedule(units, train, eng, sums, overlap, ends, share) -> Exposure:
    """Sharded weights synchronised once per pipeline schedule (``Engine.pipeline_sync_once``): each unit is gathered
    at the schedule's first forward (and, resharding after forward, before each backward that follows a forward:
    ``schedule_gathers``), the next prefetched behind the unit's compute (the first waits), and reduce-scattered once
    after the schedule's last backward of its virtual stage;
    the last virtual stage to finish backward (1 / vpp of the rank's units) waits for its reduction, the others'
    run beside the cool-down's backward (``pipeline_window``). ``Stack.pp_schedules`` schedules a step, each paying
    its gathers, reductions and copies out of the gather buffers. ``sums``: the stage's forward, backward, gather and
    reduction seconds (``exposure``'s)."""
    fwd, bwd, gather, reduce = sums
    n = schedule_gathers(train)
    gather *= n
    last = reduce / train.vpp if ends else 0.0
    first = units[0].gather_s if units and ends else 0.0
    if overlap:  # (the regathers behind the backward each precedes)
        reduce = min(reduce, last + hidden(reduce - last, pipeline_window(train) * bwd, share))
        gather = min(gather, hidden(gather, fwd + (n - 1) * bwd, share) + first)
    copies = n * sum(u.times * u.copy_s for u in units) if eng.copy_out else 0.0
    k = train.schedules
    return Exposure(k * (reduce + gather + copies), {"all_gather": k * n, "reduce_scatter": k, "replicate": k})


def _sharded(units, train, eng, overlap, ends, share) -> Exposure:
    """Per-unit gathers every micro-batch (FSDP / ZeRO 3): the next unit's gather is prefetched
    behind this unit's compute; each unit's gradients are reduce-scattered behind the next unit's
    backward. The first gather of forward and the last reduction of backward wait. Under hybrid
    sharding an engine with ``replicate_once`` all-reduces each unit's shard across the replicas in
    the last micro-batch only (``Unit.replicate_s``), the other micro-batches reduce-scatter alone."""
    m = train.micro_steps
    regather = eng.reshards(train.zero)  # gather again for backward
    redo = eng.regather_recompute and regather and train.recompute == "full"
    gathers = 1 + (1 if regather else 0) + (1 if redo else 0)
    once = eng.replicate_once and any(u.replicate_s for u in units)

    def micro_batch(replicate: bool) -> float:
        exposed = total = 0.0
        for u in units:
            fwd_comm = u.gather_s
            reduce = u.reduce_s if replicate else u.reduce_s - u.replicate_s
            bwd_comm = reduce + (u.gather_s if regather else 0.0) + (u.gather_s if redo else 0.0)
            total += u.times * (fwd_comm + bwd_comm)
            exposed += u.times * (hidden(fwd_comm, u.fwd_s, share) + hidden(bwd_comm, u.bwd_s, share))
        if units and ends:
            exposed += units[0].gather_s + (units[-1].reduce_s if replicate else
                                            units[-1].reduce_s - units[-1].replicate_s)
        return min(exposed, total) if overlap else total

    copies = sum(u.times * gathers * u.copy_s for u in units) if eng.copy_out else 0.0
    if not once:
        return Exposure(m * (micro_batch(True) + copies), {"all_gather": m * gathers, "reduce_scatter": m})
    seconds = (m - 1) * (micro_batch(False) + copies) + micro_batch(True) + copies
    # (the replicas' all-reduce runs once per step: ``Params.dp_bytes``)
    return Exposure(seconds, {"all_gather": m * gathers, "reduce_scatter": m, "replicate": 1})
