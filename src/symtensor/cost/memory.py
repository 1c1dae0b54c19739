"""Memory per device as the allocator sees it: the allocated peak (``torch.cuda.max_memory_allocated``), the
allocator's reserved peak (``torch.cuda.max_memory_reserved``) and the device's (what nvidia-smi shows: the
reserved peak, the CUDA context and NCCL's buffers), each a sum of named terms (``TERMS``: formula and source).

Allocated, per pipeline stage (the most loaded device of each; the peak is the larger of the forward-backward
peak and the optimizer step's):

    state               parameters, gradients and optimizer state, sharded as the engine shards them at the
                        ZeRO stage (``cost.params``)
    gathered_params     weights gathered for compute beyond the resident shards (ZeRO 3, FSDP units)
    activations         saved activations of the micro-batches in flight, by model chunk (``held_activations``)
    engine_buffers      the engine's own buffers besides the state (``engine_buffers``)
    transient           at the forward-backward peak, the larger of the loss's backward (``loss_transient``)
                        and one layer's recomputed activations plus its largest op's backward (gradient of
                        its output and of its input live at once: 2 x the largest saved tensor)
    optimizer_transient the optimizer step's temporaries (after backward: activations are freed by then)
    workspace           cuBLAS's workspace, allocated through the caching allocator (per device generation)

Under an engine that places the peak in time (``Engine.timed_peak``: torchtitan's FSDP2 step at ZeRO >= 1), the
allocated peak is instead the largest of what is live at the loss's backward, in the layers' backward and at the
optimizer step (``timed_positions``), and the terms reported are those live there (``peak_*``); the fragmentation
then holds what FSDP2's side streams keep reserved (``side_streams``).

Reserved by the allocator: allocated + ``fragmentation``. The device: + ``cuda_context`` + ``nccl``.
``fits`` judges the device's peak against the capacity times ``hardware.MEMORY_HEADROOM`` (the margin left
for the spread of what is modelled at its average).

Terms that do not grow with the micro-batch (the state, gathered parameters, buffers, workspace, context,
NCCL and the fragmentation of the gathered units) make ``fixed``; the activations and transients with their
fragmentation make ``scaled``, linear in the batch: fixed + scaled is at most the device's peak, and the search
extrapolates it to other batches from below (``search.outer``).
"""

from __future__ import annotations

from symtensor.cost.engine import (
    GRAD_REDUCE_STEP_BYTES,
    GRADIENTS,
    WEIGHTS,
    engine_of,
    holds_one_unit,
    syncs_per_schedule,
)
from symtensor.cost.pipeline import Stage, held_activations, inflight
from symtensor.cost.precision import RECIPES, weight_copy_bytes
from symtensor.cost.stack_kernels import LOSSES
from symtensor.cost.train import RECOMPUTE, TrainConfig

MIB = 2**20

# The CUDA context (driver state and the kernels loaded into it): "around 400MB if CUDA >= 11.7 is used and lazy
# module loading enabled (default in PyTorch)" (PyTorch maintainer ptrblck, pytorch/pytorch#109888; before 11.7
# every kernel was loaded, "> 1000MB", pytorch#107667). Outside the caching allocator: nvidia-smi shows it,
# torch.cuda.max_memory_reserved does not.
CUDA_CONTEXT_BYTES = 400e6

# cuBLAS's workspace, taken from the caching allocator per handle and stream (one: the compute stream):
# PyTorch's default CUBLAS_WORKSPACE_CONFIG is ":4096:8" (8 x 4096 KiB = 32 MiB) on Hopper and later and
# ":4096:2:16:8" (2 x 4096 KiB + 8 x 16 KiB) before (aten/src/ATen/cuda/CublasHandlePool.cpp,
# getChosenWorkspaceSize).
CUBLAS_WORKSPACE_BYTES = {"hopper": 8 * 4096 * 1024, "ampere": 2 * 4096 * 1024 + 8 * 16 * 1024}
_HOPPER_OR_LATER = ("H100", "H200", "H800", "H20", "B200", "B100", "GB200", "GB300", "B300")

# NCCL's buffers per communicator, allocated by NCCL itself (outside the caching allocator): for each channel
# and each peer connection, the SIMPLE FIFO (NCCL_BUFFSIZE, 4 MiB), LL128 (120 x 640 x 8 x 8 B = 4.7 MiB) and
# LL (8 x 512 x 8 x 16 B = 0.5 MiB) buffers, one 10 MiB allocation per channel and peer (NCCL_DEBUG_SUBSYS=ALLOC
# in NVIDIA/nccl#1685); "linearly tied to the number of channels ... Ring uses a limited amount of memory as it
# only has 2 connections regardless of the scale ... beyond 2 nodes it should no longer increase" (NCCL
# maintainer, NVIDIA/nccl#864, #986). Measured with PyTorch on 4 NVLink A100s, one communicator after a 4 MB
# all-reduce: 544 MB for a group of 2 ranks, 688 MB for larger groups (NVIDIA/nccl#964; 688 MB ~ 32 channels x
# 2 connections x 10 MiB). Used for every device (a transfer: H100 NVLS and inter-node proxies can add more).
NCCL_PAIR_BYTES = 544e6
NCCL_GROUP_BYTES = 688e6

# The caching allocator's fragmentation: the reserved memory it cannot hand out at the peak, a share of what is
# allocated and freed over and over (activations, transients, gathered units; the state is allocated once).
# GMLake (Guo et al., ASPLOS 2024, arXiv:2401.08156) measured PyTorch's allocator on eight LLM trainings on A100
# 80 GB at 15% fragmentation on average (reserved - allocated over reserved; up to 33%), gone with virtual-memory
# stitching; PyTorch's expandable_segments maps segments the same way (one growing virtual segment per stream),
# which torchtitan turns on (run_train.sh: PYTORCH_ALLOC_CONF="expandable_segments:True"): the rest there is the
# 2 MiB page rounding of live blocks, not modelled.
FRAGMENTATION = 0.15

TERMS = {
    "state": ("params + grads + optimizer, sharded by ZeRO as the engine shards them",
              "Engine.state_bytes, Engine.sharded_from (cost/engine.py)"),
    "gathered_params": ("2 x the largest unit gathered (resharding after forward), else every unit",
                        "FSDP2 prefetch / DeepSpeed ZeRO 3 (cost/engine.py)"),
    "fp8_weights": ("FP8 copies of the resident and gathered weights (and their transposes) under an FP8 recipe; "
                    "with quantized parameters (--fp8-param-gather) the quantized weights themselves, the "
                    "transposes of the gathered units under Megatron-FSDP",
                    "Transformer Engine's cached FP8 weights (cost/precision.py weight_copy_bytes, cost/params.py "
                    "lowp)"),
    "activations": ("saved activations x micro-batches in flight (1F1B)", "Korthikanti et al. 2022; "
                    "megatron/core/pipeline_parallel/schedules.py"),
    "engine_buffers": ("DeepSpeed: 2 (ZeRO 1/2) or 1 x min(reduce bucket, gradients); DDP: a copy of the "
                       "gradients; FSDP2 and Megatron-FSDP (ZeRO 2, 3): the largest unit's gradients in the "
                       "reduce dtype; Megatron ZeRO 1: none (buckets are views of the contiguous gradient buffer)",
                       "engine_buffers (cost/memory.py)"),
    "loss_transient": ("seq x micro_batch x vocab/tp x Engine.loss_grad_bytes (a stated loss kernel's: "
                       "cost.stack_kernels)",
                       "megatron/core/tensor_parallel/cross_entropy.py; torch log_softmax backward"),
    "backward_transient": ("recomputed layer + 2 x its largest saved tensor (gradients of an op's output "
                           "and input)", "autograd: an op's input gradient is allocated while its output's lives"),
    "optimizer_transient": ("owned parameters x Engine.step_temp_bytes (DeepSpeed's fp32 gradient partition)",
                            "deepspeed/runtime/zero/stage_1_and_2.py"),
    "workspace": ("cuBLAS workspace: 32 MiB (Hopper and later) or 8.1 MiB", "aten/src/ATen/cuda/CublasHandlePool.cpp"),
    "fragmentation": (f"{FRAGMENTATION} / (1 - {FRAGMENTATION}) x (activations + transients + gathered units); "
                      "0 with expandable segments; FSDP2: + its side streams' reserved blocks (all-gather buffers, "
                      "gradients freed by zero_grad)", "GMLake, ASPLOS 2024 (arXiv:2401.08156); "
                      "torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py"),
    "cuda_context": ("400 MB (CUDA >= 11.7, lazy module loading)", "pytorch/pytorch#109888"),
    "nccl": ("per communicator: 544 MB (2 ranks) or 688 MB", "NVIDIA/nccl#964, #986, #1685"),
}


def gathered_transient(st: Stage, train: TrainConfig) -> float:
    """Parameters gathered for compute beyond the resident shards, when the engine shards them at
    this ZeRO stage (``Engine.sharded_from``: ZeRO 3; FSDP2 at any stage > 0): an engine that
    reshards after forward holds the unit being computed and the one prefetched, two of the
    largest unit; one that does not (FSDP2 at ZeRO 1/2) keeps every unit gathered from its forward
    to its backward, and so does FSDP2 under a pipeline at ZeRO 3 (each backward leaves its unit
    gathered until the next forward: ``cost.engine.schedule_gathers``)."""
    eng, z = engine_of(train), train.zero
    if not eng.shards(WEIGHTS, z):
        return 0.0
    if holds_one_unit(train):
        return 2 * st.unsharded
    return sum(p.unsharded * times for p, times in st.params)


def fp8_copies(weight_bytes: float, train: TrainConfig) -> float:
    """The FP8 copies of ``weight_bytes`` of resident (or gathered) weights an engine keeps under an
    FP8 recipe (``precision.weight_copy_bytes``: Transformer Engine's cached FP8 weights and their
    transposes). Charged on every weight of the stage, the embedding and LM head (which stay BF16)
    included: an upper bound by their share."""
    per = weight_copy_bytes(RECIPES[train.fp8], not engine_of(train).pytorch_kernels)
    return weight_bytes / train.param_bytes * per


def engine_buffers(st: Stage, train: TrainConfig) -> float:
    """Bytes the engine allocates for its gradient reduction besides the gradients themselves.

    DeepSpeed ZeRO 1/2 with overlap_comm reduces out of two flat IPG buckets of reduce_bucket_size elements
    (``Engine.bucket_buffers`` x ``ddp_bucket_bytes``; deepspeed/runtime/zero/stage_1_and_2.py), never more than
    the stage's gradients; stage 3 (one reduce bucket, stage3.py) and stage 0 (the flattened bucket it
    all-reduces) hold one. PyTorch DDP (FSDP2's ZeRO 0) copies every gradient into its buckets unless
    gradient_as_bucket_view=True ("the saved memory size will be equal to the total gradients size", the DDP
    docs). FSDP2 reduce-scatters a unit's gradients out of a buffer in the reduce dtype (torchtitan's
    mixed_precision_reduce float32): the largest unit's; so does Megatron-FSDP at ZeRO 2 and 3 (its sharded gradient
    buffer fetches an unsharded bucket per unit, in the main-gradient dtype: ``cost.engine``). Megatron's ZeRO 1
    buckets are views of its contiguous gradient buffer, and the distributed optimizer gathers into its parameter
    buffer in place: nothing. FSDP2 under a pipeline (``Engine.pipeline_sync_once``) accumulates every unit's
    unsharded gradients, in the gathered weights' dtype, until the schedule's reduction: of its trainable
    parameters (a frozen weight, LoRA's base, has none)."""
    eng, z = engine_of(train), train.zero
    grads = sum(u.grad_bytes * u.times for u in st.units)
    double = eng.zero_sharded(z) and not eng.shards(WEIGHTS, z)  # ZeRO 1/2: the double-buffered IPG buckets
    out = (eng.bucket_buffers if double else min(eng.bucket_buffers, 1)) * min(eng.ddp_bucket_bytes, grads)
    if eng.ddp_bucket_copy and not eng.zero_sharded(z):
        out += st.static["grads"]
    if eng.unit_reduce_buffer and eng.shards(GRADIENTS, z):  # (a unit's bucket, where gradients are sharded)
        out += st.unit_grads
    if syncs_per_schedule(train):
        # unsharded gradients until the schedule reduces (trainable parameters only: ``params.param_cost``)
        out += sum(p.unsharded_grads * times for p, times in st.params)
    return out


def ep_overlap_layer(st: Stage, train: TrainConfig, held: float) -> float:
    """Activation bytes a stage holds beyond 1F1B's under ``moe_ep_overlap``: one layer's, the paired forward's
    (NVIDIA/Megatron-LM@d98e8a64dd megatron/core/models/common/model_chunk_schedule_plan.py
    ``TransformerModelChunkSchedulePlan.run``: each combined step runs the forward micro-batch's layer i beside the
    backward micro-batch's layer n - 1 - i and releases the backward's layer after the pair, ``release_state``, so one
    micro-batch's activations fill as the other's drain). The extra warm-up forward Megatron schedules before the
    combined steps (pipeline_parallel/schedules.py, ``num_warmup_microbatches + 1``) is the forward plain 1F1B runs
    at the start of its steady state, which ``pipeline.inflight`` already counts; without a pipeline
    (combined_1f1b.py ``combined_1f1b_schedule_for_no_pipelining``) the first forward runs alone and each combined
    step pairs the next forward with its backward the same way. The largest of the stage's layers (with dense first
    layers they differ), less what lives in host memory; none when every micro-batch of the step is in flight already
    (no combined step runs) or where the stage has no expert-parallel communication to overlap."""
    if not train.stack.moe_ep_overlap or not st.comm.get("ep_comm") or train.micro_steps <= held:
        return 0.0
    host = offloaded(st, train)
    return max((saved - (host[i] if i < len(host) else 0.0) for i, saved in enumerate(st.layer_saved)), default=0.0)


def offloaded(st: Stage, train: TrainConfig) -> list[float]:
    """Saved activation bytes of each layer of stage ``st`` that go to host memory: all of the first
    ``train.stack.cpu_offload_layers`` (Megatron-LM's CPU offloading, ``cost.engine.CPU_OFFLOAD``), or in every
    layer its ``train.stack.offload_modules``' inputs (fine-grained offloading, ``cost.offload``); none without."""
    if train.stack.offload_modules:
        return st.layer_offloaded
    return st.layer_saved[:train.stack.cpu_offload_layers]


def step_temp_bytes(train: TrainConfig) -> int:
    """Bytes per owned parameter the optimizer step allocates (``Engine.step_temp_bytes``), and Megatron's fp32
    copy of its owned gradient shard when the gradient buffer is bf16 (``--grad-reduce-in-bf16``,
    ``cost.engine.GRAD_REDUCE_STEP_BYTES``)."""
    eng = engine_of(train)
    bf16_buffer = train.stack.grad_reduce_bf16 and eng.grad_reduce_bf16 == "buffer"
    return eng.step_temp_bytes + (GRAD_REDUCE_STEP_BYTES if bf16_buffer else 0)


def workspace_bytes(device) -> float:
    """cuBLAS's workspace on ``device`` (``CUBLAS_WORKSPACE_BYTES``: Hopper and later, or before)."""
    if device is None:
        return 0.0
    hopper = any(tag in device.name for tag in _HOPPER_OR_LATER)
    return CUBLAS_WORKSPACE_BYTES["hopper" if hopper else "ampere"]


def nccl_bytes(groups) -> float:
    """NCCL's buffers for communicators of ``groups`` ranks each (``NCCL_PAIR_BYTES``, ``NCCL_GROUP_BYTES``)."""
    return sum(NCCL_PAIR_BYTES if g == 2 else NCCL_GROUP_BYTES for g in groups if g > 1)


def layer_activations(st: Stage, train: TrainConfig) -> tuple[float, float, list[float]]:
    """What stage ``st``'s transformer layers hold of one micro-batch under ``train``'s recomputation, the most one
    layer's recomputation brings back at once, and the first per model chunk in its proportions (empty under
    1F1B): the layers' inputs under full recomputation, what torchtitan's checkpointing keeps under its modes, else
    what they save, less what lives in host memory."""
    if train.recompute == "full":
        redo = max(st.layer_saved, default=0.0)
        if engine_of(train).timed_peak and st.layer_saved:  # torchtitan: the checkpoint keeps the block's input,
            # which the re-run forward reads in place (counted once, as under layer:N: ``Segment._kept``)
            redo -= st.layer_inputs / len(st.layer_saved)
        return st.layer_inputs, redo, st.chunk_inputs
    if train.recompute not in RECOMPUTE:  # torchtitan's per-op or every-N-th-layer checkpointing
        return st.layer_kept, st.rematerialised, st.chunk_kept
    # less what lives in host memory: the first N layers' saved activations (at most layers - N sets on the device
    # at once: ``cost.engine.CPU_OFFLOAD``) or the offloaded modules' inputs of every layer (``cost.offload``);
    # nothing without offloading (what lives in host memory taken from each chunk alike)
    return sum(st.layer_saved) - sum(offloaded(st, train)), 0.0, st.chunk_saved


def stage_activations(s: int, st: Stage, train: TrainConfig) -> tuple[float, float, float, list]:
    """What pipeline rank ``s`` (stage ``st``) holds where it holds the most: its layers' activations, those of
    the ops before and after them (the embedding's on its first model chunk, the loss's on its last), the most one
    layer's recomputation brings back at once (``layer_activations``), and the micro-batches of each model chunk
    it holds then (``pipeline.held_activations``). ``memory_peak`` and ``explain`` read it."""
    total, redo, chunks = layer_activations(st, train)
    layers, other, counts = held_activations(s, train, chunks, total, st.other_saved - st.loss_saved, st.loss_saved)
    return layers, other, redo, counts


def memory_peak(stages: list[Stage], train: TrainConfig, device=None, communicators=None) -> tuple[dict, float, float]:
    """Per-stage memory; returns the terms of the stage whose device peak is the largest (bytes; ``TERMS``),
    the allocated peak and the device's reserved peak (both the largest over the stages).

    ``device``: the accelerator (its generation sets the workspace; None: no workspace, context or NCCL, the
    allocated terms alone); ``communicators``: per stage, the ranks of each NCCL communicator its ranks use."""
    eng = engine_of(train)
    # the peak placed in time where the engine says so and its weights are sharded (FSDP2; its ZeRO 0 is DDP)
    timed = eng.timed_peak and eng.shards(WEIGHTS, train.zero)
    frag = 0.0 if train.allocator_expandable else FRAGMENTATION / (1 - FRAGMENTATION)
    work = workspace_bytes(device)
    context = CUDA_CONTEXT_BYTES if device is not None else 0.0
    best, alloc_peak, peak = None, -1.0, -1.0
    for s, st in enumerate(stages):
        layers_held, other, redo, _ = stage_activations(s, st, train)
        held = inflight(s, train)
        paired = ep_overlap_layer(st, train, held)
        gathered = gathered_transient(st, train)
        state = st.static["params"] + st.static["grads"] + st.static["optimizer"]
        mem = {"params": st.static["params"], "grads": st.static["grads"], "optimizer": st.static["optimizer"],
               "activations": layers_held + other + paired,
               "activations_layers": layers_held + paired,
               "recompute_transient": redo, "gathered_params": gathered, "layer_state": st.layer_state}
        # what does not grow with the micro-batch: the state and the gathered parameters
        mem["static"] = state + gathered
        if train.fp8 is not None:  # Transformer Engine's cached FP8 weight copies (precision.weight_copy_bytes)
            # (none for the layers kept in BF16: ``TrainConfig.bf16_span``)
            mem["fp8_weights"] = fp8_copies(mem["params"] - st.bf16_params + gathered, train)
            if train.lowp_params:  # the weights held quantized: their copies are the weights (``params.lowp``)
                mem["fp8_weights"] = st.copies + (2 * st.unit_copies if gathered else 0.0)
            mem["static"] += mem["fp8_weights"]
        mem["engine_buffers"] = engine_buffers(st, train)
        mem["loss_transient"] = st.logits * (eng.loss_grad_bytes if train.stack.loss is None
                                             else LOSSES[train.stack.loss].grad)
        mem["backward_transient"] = redo + 2 * st.largest
        mem["optimizer_transient"] = st.static["optimizer"] / train.optim_bytes * step_temp_bytes(train) \
            if train.optim_bytes else 0.0
        mem["workspace"] = work
        if timed:  # what is live where the peak is (``timed_positions``), as ``peak_*`` terms
            positions = timed_positions(st, train, mem, held)
            at = max(positions, key=lambda name: sum(positions[name].values()))
            mem.update({f"peak_{term}": v for term, v in positions[at].items()})
        persistent, transient, allocated, _ = _peak(mem)
        mem["total"] = mem["allocated"] = allocated
        churn = allocated - persistent  # activations and transients: allocated and freed every micro-batch
        mem["fragmentation"] = frag * (churn + gathered)
        if timed:  # (the state and the workspace are allocated once; everything else churns)
            mem["fragmentation"] = frag * (mem["peak_gathered_params"] + mem["peak_activations"]
                                           + mem["peak_engine_buffers"] + mem["peak_transient"]) \
                + side_streams(st, train, mem)
        mem["allocator_reserved"] = allocated + mem["fragmentation"]
        mem["cuda_context"] = context
        mem["nccl"] = nccl_bytes(communicators[s]) if communicators else 0.0
        mem["reserved"] = mem["allocator_reserved"] + context + mem["nccl"]
        # the part that does not grow with the micro-batch, and the part that grows linearly with it: their sum
        # is at most the peak (the optimizer step's may exceed it), so search.outer extrapolates from below
        mem["fixed"] = persistent + frag * gathered + context + mem["nccl"]
        mem["scaled"] = (mem["activations"] + transient) * (1 + frag)
        if timed:  # where the peak is, what does not grow with the batch (the gradients, live there or not by
            # the micro-batches, left out) and what does
            mem["fixed"] = mem["params"] + mem["optimizer"] + mem["peak_gathered_params"] \
                + mem.get("fp8_weights", 0.0) + work + context + mem["nccl"] + copy_in_stream(st, train)
            mem["scaled"] = mem["peak_activations"] + mem["peak_transient"]
        alloc_peak = max(alloc_peak, allocated)
        if mem["reserved"] > peak:
            best, peak = mem, mem["reserved"]
    return best, alloc_peak, peak


def static_peak(stages: list[Stage]) -> float:
    """The largest parameter + gradient + optimizer bytes of a stage: a lower bound of the memory
    peak under any recomputation."""
    return max(sum(st.static.values()) for st in stages)


def timed_positions(st: Stage, train: TrainConfig, mem: dict, held: float) -> dict:
    """What is live at each moment of a step that can hold its peak, under an engine that places the peak in time
    (``Engine.timed_peak``: torchtitan's FSDP2 step), each a dict of the ``peak_terms`` allocated terms but the
    FP8 copies and the workspace (which every moment holds). Sources: pytorch/torchtitan@238fa9953e4aec2a62582121
    564273d7cbb1e9f1 (torchtitan/train.py train_step, torchtitan/models/llama3/infra/parallelize.py apply_fsdp) and
    PyTorch 2.13's FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_state.py, _fsdp_param_group.py):

    loss    the loss's backward (``loss_transient`` on the stage holding the loss): ``optimizers.zero_grad()``
            opens every step, setting the gradients to None (torch.optim.Optimizer.zero_grad, set_to_none=True),
            and FSDP2 gives a unit its sharded gradients in its post-backward reduce-scatter: in a one-micro-batch
            step no gradient is live yet (later micro-batches accumulate into them). Gathered: the LM head's unit
            only, which apply_fsdp does not reshard after forward ([norm, output], reshard_after_forward only under
            the "always" policy); the root's post-forward frees the last all-gather buffer before the loss runs.
            No reduce-scatter buffer yet.
    layers  the first layer's backward (its activations at their largest): the units after the layers reduced
            (their gradients, and the reduce-scatter buffer FSDP2 holds until the next reduce-scatter:
            ``engine_buffers``), the layer's unit and the prefetched next (2 x the largest layer unit), the
            loss's saved activations freed, the layer's recomputation and its largest op's backward
            (``backward_transient``).
    last    the last layer's backward, in a one-micro-batch step: every gradient but one layer's activations (the
            gradients grow as backward goes and the activations shrink; the two ends bound the layers between).
    step    the optimizer step: the whole state and the step's temporaries; the root's post-backward resharded
            every unit and waited for the last reduce-scatter (nothing gathered, no buffer)."""
    one = train.micro_steps == 1
    base = mem["params"] + mem["optimizer"]
    reshard = holds_one_unit(train)
    gathered = mem["gathered_params"]
    out = {}
    if st.logits:
        out["loss"] = {"state": base + (0.0 if one else mem["grads"]),
                       "gathered_params": st.loss_unsharded if reshard else gathered,
                       "activations": mem["activations"], "engine_buffers": 0.0, "transient": mem["loss_transient"]}
    in_layers = 2 * st.layer_unsharded if reshard else gathered
    freed = st.loss_saved  # (one micro-batch in backward; the others in flight keep theirs)
    out["layers"] = {"state": base + (mem["grads"] - st.layer_grads if one else mem["grads"]),
                     "gathered_params": in_layers, "activations": max(mem["activations"] - freed, 0.0),
                     "engine_buffers": mem["engine_buffers"], "transient": mem["backward_transient"]}
    if one and st.layer_saved:
        one_layer = mem["activations_layers"] / held / len(st.layer_saved)
        rest = mem["activations"] - freed - mem["activations_layers"]
        out["last"] = {"state": base + mem["grads"], "gathered_params": in_layers,
                       "activations": max(rest + one_layer, 0.0), "engine_buffers": mem["engine_buffers"],
                       "transient": mem["backward_transient"]}
    out["step"] = {"state": base + mem["grads"], "gathered_params": 0.0, "activations": 0.0, "engine_buffers": 0.0,
                   "transient": mem["optimizer_transient"]}
    return out


def copy_in_stream(st: Stage, train: TrainConfig) -> float:
    """Bytes FSDP2's all-gather copy-in stream keeps reserved: ``foreach_all_gather`` allocates each unit's flat
    all-gather buffer on that stream (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, ``with
    device_handle.stream(all_gather_copy_in_stream)``), and in forward ``wait_for_unshard`` keeps the current
    unit's buffer until the next unit's copy-out (_fsdp_param_group.py, ``comm_ctx.all_gather_state``): two
    consecutive units at once, at most the largest unit and a layer's. The caching allocator serves a stream from
    its own blocks (and under expandable segments, its own segment), so the compute stream's peak cannot use them.
    0 where the weights are not sharded (DDP)."""
    eng = engine_of(train)
    if not eng.shards(WEIGHTS, train.zero):
        return 0.0
    return st.unsharded + (st.layer_unsharded or st.unsharded)


def side_streams(st: Stage, train: TrainConfig, mem: dict) -> float:
    """Memory reserved on FSDP2's side streams at the peak (``peak_*``) beyond what they hold allocated
    there: the copy-in stream's all-gather buffers (``copy_in_stream``) and the reduce-scatter stream's sharded
    gradients. ``foreach_reduce`` allocates each unit's reduce-scatter output, whose views become the sharded
    gradients, on the reduce-scatter stream (``with device_handle.stream(reduce_scatter_stream): reduce_output =
    ...allocate(...)``); zero_grad(set_to_none) frees them at the step's start, back to that stream's blocks, so
    where the peak holds no gradient (``peak_state``, ``timed_positions``) their bytes stay reserved all the same.
    This is what
    torchtitan logs as memory (torch.cuda.memory_stats ``reserved_bytes.all.peak``, in GiB: pytorch/torchtitan@
    238fa9953e4aec2a62582121564273d7cbb1e9f1 torchtitan/components/metrics.py DeviceMemoryMonitor.get_peak_stats
    and MetricsProcessor.log, ``memory: {max_reserved_gib:5.2f}GiB``)."""
    if not engine_of(train).shards(WEIGHTS, train.zero):
        return 0.0
    live_grads = mem["peak_state"] - mem["params"] - mem["optimizer"]
    return copy_in_stream(st, train) + max(mem["grads"] - live_grads, 0.0)


def _timed_peak(mem: dict) -> tuple[float, float, float, bool]:
    """``_peak`` under ``Engine.timed_peak``: the terms live where the peak is (``peak_*``, ``timed_positions``)."""
    persistent = mem.get("fp8_weights", 0.0) + mem["workspace"] + mem["peak_state"] + mem["peak_gathered_params"] \
        + mem["peak_engine_buffers"]
    in_step = mem["peak_activations"] == 0.0 and mem["peak_transient"] == mem["optimizer_transient"]
    return persistent, mem["peak_transient"], persistent + mem["peak_activations"] + mem["peak_transient"], in_step


def _peak(mem: dict) -> tuple[float, float, float, bool]:
    """The one rule for a stage's allocated peak (``memory_peak``'s terms): the larger of the forward-backward
    peak (the persistent terms, the activations and the larger of the loss's and the backward's transient) and
    the optimizer step's (the persistent terms and the step's temporaries: activations are freed by then).
    Returns the persistent bytes, the forward-backward transient, the allocated peak and whether it is the
    step's. Under an engine that places the peak in time, ``_timed_peak``."""
    if "peak_state" in mem:
        return _timed_peak(mem)
    persistent = mem["static"] + mem["engine_buffers"] + mem["workspace"]
    transient = max(mem["loss_transient"], mem["backward_transient"])
    fwd_bwd, step = persistent + mem["activations"] + transient, persistent + mem["optimizer_transient"]
    return persistent, transient, max(fwd_bwd, step), step > fwd_bwd


def peak_terms(mem: dict) -> dict:
    """The terms of a stage's device peak (``memory_peak``'s dict), each in bytes, in the order they add up:
    the allocated terms (summing to ``allocated``), then ``fragmentation``, ``cuda_context`` and ``nccl``
    (summing to ``reserved``). At the optimizer step's peak (``_peak``) the activations are freed (0) and the
    transient is the step's; at the forward-backward peak it is the larger of the loss's and the backward's."""
    _, transient, _, in_step = _peak(mem)
    if "peak_state" in mem:  # (Engine.timed_peak: the terms live where the peak is, ``timed_positions``)
        return {"state": mem["peak_state"], "gathered_params": mem["peak_gathered_params"],
                "fp8_weights": mem.get("fp8_weights", 0.0), "activations": mem["peak_activations"],
                "engine_buffers": mem["peak_engine_buffers"], "transient": mem["peak_transient"],
                "workspace": mem["workspace"],
                "fragmentation": mem["fragmentation"], "cuda_context": mem["cuda_context"], "nccl": mem["nccl"]}
    return {"state": mem["params"] + mem["grads"] + mem["optimizer"], "gathered_params": mem["gathered_params"],
            "fp8_weights": mem.get("fp8_weights", 0.0),
            "activations": 0.0 if in_step else mem["activations"], "engine_buffers": mem["engine_buffers"],
            "transient": mem["optimizer_transient"] if in_step else transient, "workspace": mem["workspace"],
            "fragmentation": mem["fragmentation"], "cuda_context": mem["cuda_context"], "nccl": mem["nccl"]}
