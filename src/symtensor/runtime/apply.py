"""Apply a RunSpec to the runtime's torch model with PyTorch's own distributed stack.

The order is fixed, as in torchtitan: tensor parallel (``parallelize_module``), then expert
parallel (experts cut on dim 0, tokens moved by all-to-all), then ``fully_shard`` (FSDP2: ZeRO-3,
or ZeRO-2 without resharding after forward) over ``fsdp_axes``, or, with a replicate axis in
``dp_axes``, over the 2-D mesh (replicate, shard): hybrid sharding (HSDP). A pipeline spec instead cuts the
layer stack into ``torch.distributed.pipelining`` stages. Data parallelism over ``dp_axes`` is a
plain gradient all-reduce after backward, so its bytes are exactly the gradients' size.

The tensor-parallel plan of one layer, for ``sequence_parallel`` off / on (Megatron-LM, Megatron-SP):

    attn_norm   -                               SequenceParallel (norm on the sequence shard)
    attn        input Replicate -> Replicate    input Shard(1) -> Replicate (all-gather)
    q/k/v_proj  ColwiseParallel                 ColwiseParallel
    o_proj      RowwiseParallel -> Replicate    RowwiseParallel -> Shard(1) (reduce-scatter)
    (the same for mlp_norm, mlp, gate/up_proj, down_proj)

Wrapping the whole block's input once (``PrepareModuleInput`` on ``attn``/``mlp``) makes q, k and v
share one input and one backward all-reduce (or reduce-scatter), as in Megatron, instead of one each.

A mixture-of-experts layer has no tensor-parallel MLP: under sequence parallelism its ``mlp`` takes
the rank's sequence shard as a local tensor (``mlp_norm`` SequenceParallel, ``mlp`` Shard(1) ->
local), routes those tokens, and its experts are cut over ``ep_axes`` (MoE parallel folding: the
tp axis, the dp axes or both), so each rank dispatches only its own tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from symtensor.runtime.spec import RunSpec
from symtensor.runtime.torch_models import MoE, loss_fn

EXPERT_PARAMS = ("w_gate", "w_up", "w_down")


def build_mesh(spec: RunSpec, device_type: str = "cpu") -> DeviceMesh:
    """The DeviceMesh of ``spec`` with named axes on ``cpu`` (gloo) or ``cuda`` (NCCL); the process
    group must be initialised."""
    names, sizes = zip(*spec.mesh)
    return init_device_mesh(device_type, tuple(sizes), mesh_dim_names=tuple(names))


def submesh(mesh: DeviceMesh, axes: tuple[str, ...]) -> DeviceMesh:
    """The 1-D mesh over ``axes`` (flattened when there are several)."""
    return mesh[axes[0]] if len(axes) == 1 else mesh[axes]._flatten("+".join(axes))


def axis_of_group(mesh: DeviceMesh, spec: RunSpec) -> dict[str, str]:
    """Process-group name -> mesh-axis name, for attributing bytes to axes (``CommCounter``)."""
    groups = {dist.group.WORLD.group_name: "world"}
    for axis, _ in spec.mesh:
        groups[mesh.get_group(axis).group_name] = axis
    reduce_axes = {spec.dp_axes, spec.fsdp_axes, spec.ep_axes, _dense_dp_axes(spec), _expert_dp_axes(spec)}
    for axes in reduce_axes:
        if len(axes) > 1:
            groups[submesh(mesh, axes).get_group().group_name] = "+".join(axes)
    return groups


# -- tensor parallel ---------------------------------------------------------------------------
def _block_plan(prefix: str, norm: str, block: str, cols: tuple[str, ...], row: str, sp: bool) -> dict:
    """Megatron column-then-row plan for one attention or MLP block (see the module docstring)."""
    stream = Shard(1) if sp else Replicate()  # layout of the residual stream
    plan = {f"{prefix}.{block}": PrepareModuleInput(input_layouts=(stream,), desired_input_layouts=(Replicate(),))}
    plan |= {f"{prefix}.{block}.{c}": ColwiseParallel() for c in cols}
    plan[f"{prefix}.{block}.{row}"] = RowwiseParallel(output_layouts=stream)
    if sp:
        plan[f"{prefix}.{norm}"] = SequenceParallel()
    return plan


def tp_plan(model: nn.Module, spec: RunSpec) -> dict:
    """The ``parallelize_module`` plan of ``spec`` for the layers present in ``model``.

    Args:
        model: a ``torch_models.Transformer``.
        spec: the layout; only its tp styles and ``sequence_parallel`` matter here.
    """
    sp, plan = spec.sequence_parallel, {}
    for name in model.layers:
        layer, prefix = int(name), f"layers.{name}"
        if spec.style(layer, "attn.q_proj") != "replicate":
            plan |= _block_plan(prefix, "attn_norm", "attn", ("q_proj", "k_proj", "v_proj"), "o_proj", sp)
        if spec.style(layer, "mlp.gate_proj") != "replicate":
            plan |= _block_plan(prefix, "mlp_norm", "mlp", ("gate_proj", "up_proj"), "down_proj", sp)
        elif sp and isinstance(model.layers[name].mlp, MoE):  # the experts route this rank's sequence shard
            plan[f"{prefix}.mlp_norm"] = SequenceParallel()
            plan[f"{prefix}.mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),),
                                                       use_local_output=True)
    stream = Shard(1) if sp else Replicate()
    if spec.style(None, "embed") == "rowwise":  # vocab cut: partial sums, reduced into the stream
        plan["embed"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
    elif sp:  # replicated table: keep this rank's sequence shard
        plan["embed"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=stream)
    if sp:
        plan["norm"] = SequenceParallel()
    if spec.style(None, "lm_head") == "colwise":  # vocab cut; logits gathered for the loss
        plan["lm_head"] = ColwiseParallel(input_layouts=stream, output_layouts=Replicate())
    elif sp:
        plan["lm_head"] = PrepareModuleInput(input_layouts=(stream,), desired_input_layouts=(Replicate(),),
                                             use_local_output=True)
    return plan


def apply_tp(model: nn.Module, spec: RunSpec, mesh: DeviceMesh) -> None:
    """Tensor (and sequence) parallel over ``spec.tp_axis``; a no-op without one."""
    plan = tp_plan(model, spec) if spec.tp_axis else {}
    if plan:
        # every rank built the same weights from the seed, so each keeps its slice: no scatter
        parallelize_module(model, mesh[spec.tp_axis], plan, src_data_rank=None)


# -- expert parallel ---------------------------------------------------------------------------
class AllToAllDispatch:
    """Moves expert slots to the rank owning the expert and back, over one process group.

    Rank r owns experts [r*e, (r+1)*e). ``dispatch`` turns this rank's slot buffer [E, C, H] into
    [e, P*C, H] (the slots of its e experts from all P ranks); ``combine`` is the inverse. Each is
    one ``all_to_all_single`` of E*C*H elements, and so is each one's backward.
    """

    def __init__(self, group: dist.ProcessGroup, ranks: int):
        self.group, self.ranks = group, ranks

    def _all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        out = funcol.all_to_all_single_autograd(x.contiguous(), None, None, self.group)
        return funcol.wait_tensor(out)

    def dispatch(self, x_ECH: torch.Tensor) -> torch.Tensor:
        experts, slots, hidden = x_ECH.shape
        local = experts // self.ranks
        x_PeCH = self._all_to_all(x_ECH).view(self.ranks, local, slots, hidden)
        return x_PeCH.transpose(0, 1).reshape(local, self.ranks * slots, hidden)

    def combine(self, y_eCH: torch.Tensor) -> torch.Tensor:
        local, all_slots, hidden = y_eCH.shape
        slots = all_slots // self.ranks
        y_PeCH = y_eCH.view(local, self.ranks, slots, hidden).transpose(0, 1)
        return self._all_to_all(y_PeCH).view(self.ranks * local, slots, hidden)


def moe_layers(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def apply_ep(model: nn.Module, spec: RunSpec, mesh: DeviceMesh) -> None:
    """Expert parallel over ``spec.ep_axes`` (flattened in mesh order): each rank keeps E/ep
    experts; a no-op without them."""
    if not spec.ep_axes:
        return
    ep_mesh, ranks = submesh(mesh, spec.ep_axes), spec.ep_size
    rank = ep_mesh.get_local_rank()
    for moe in moe_layers(model):
        local = moe.experts.w_gate.shape[0] // ranks
        moe.experts.set_dispatcher(AllToAllDispatch(ep_mesh.get_group(), ranks), rank * local, local)


# -- fully sharded data parallel -----------------------------------------------------------------
def apply_fsdp(model: nn.Module, spec: RunSpec, mesh: DeviceMesh) -> None:
    """FSDP2 over ``spec.fsdp_axes``: one FSDP group per layer, one for the rest (the root).

    Every group, the root included, takes ``spec.reshard_after_forward`` as the fsdp2 engine costs
    the ZeRO stage (``symtensor.cost.engine``): True (ZeRO-3) reshards after forward, so each
    layer's parameters are all-gathered twice per step (forward and backward) and the root's too;
    False (ZeRO-2, the engine's ZeRO 1/2) keeps them gathered from forward to backward, once per
    step. The root is given the value explicitly: fully_shard's default (None) would keep the
    root unsharded after forward whatever the layers do. Gradients are reduce-scattered once. On a
    2-D mesh fully_shard composes with the tensor-parallel DTensors. Under hybrid sharding
    (``spec.hybrid``) the mesh is (replicate, shard): parameters gathered and gradients
    reduce-scattered over the shard axis, the reduced shards then all-reduced over the replicate
    axis (torch.distributed.fsdp.fully_shard: "a 2D mesh ... uses HSDP").
    """
    if not spec.fsdp_axes:
        return
    reshard = spec.reshard_after_forward
    # HSDP: fully_shard shards over the last dim of a 2-D mesh and replicates over the first
    fsdp_mesh = mesh[spec.dp_axes[0], spec.fsdp_axes[0]] if spec.hybrid else submesh(mesh, spec.fsdp_axes)
    for layer in model.layers.values():
        fully_shard(layer, mesh=fsdp_mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=fsdp_mesh, reshard_after_forward=reshard)


# -- data parallel -----------------------------------------------------------------------------
def _dense_dp_axes(spec: RunSpec) -> tuple[str, ...]:
    return tuple(a for a, _ in spec.mesh if a in spec.dp_axes)


def _expert_dp_axes(spec: RunSpec) -> tuple[str, ...]:
    """Experts are cut over ``ep_axes``: their gradients are reduced over the other dp axes only."""
    return tuple(a for a in _dense_dp_axes(spec) if a not in spec.ep_axes)


def _is_expert(name: str) -> bool:
    return ".experts." in name and name.rsplit(".", 1)[-1] in EXPERT_PARAMS


def _partial_over_tp(name: str, spec: RunSpec) -> bool:
    """Whether a plain (not DTensor) weight's gradient is partial over ``tp_axis``, because the
    weight works on this rank's share of a tensor-parallel group's work: the Q/K norms of a
    tensor-parallel attention block (this rank's heads) and, under sequence parallelism, an MoE
    layer's router and (where the experts do not fold over the tp axis) its experts, which see
    this rank's sequence shard. DTensor weights (the norms under SequenceParallel) sum on their own."""
    if spec.tp_size == 1 or not name.startswith("layers."):
        return False
    _, layer, rest = name.split(".", 2)
    if rest.startswith(("attn.q_norm.", "attn.k_norm.")):
        return spec.style(int(layer), "attn.q_proj") != "replicate"
    if rest.startswith("mlp.router.") or (_is_expert(name) and spec.tp_axis not in spec.ep_axes):
        return spec.sequence_parallel
    return False


def sync_gradients(model: nn.Module, spec: RunSpec, mesh: DeviceMesh) -> None:
    """Average gradients over ``dp_axes``: one all-reduce (sum) per parameter, then divide; and
    sum, in one all-reduce of their own, the gradients that are partial over ``tp_axis``
    (``_partial_over_tp``: Megatron and DTensor reduce such weights over TP apart too; a DTensor
    weight's partial gradient is summed here as well).

    Each rank's loss is the mean over its own sequences, so the global mean's gradient is the sum
    over data-parallel ranks divided by the batch cut. An expert's gradient already sums the
    contributions of every rank of ``ep_axes`` (the all-to-all's backward brought them), so it is
    reduced over the other dp axes only, and divided by the same batch cut. Under ``fsdp_axes``
    fully_shard reduce-scatters and averages on its own.
    """
    groups = {}
    for axes in (_dense_dp_axes(spec), _expert_dp_axes(spec)):
        groups[axes] = submesh(mesh, axes).get_group() if axes else None
    tp_group = mesh.get_group(spec.tp_axis) if spec.tp_size > 1 else None
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        if isinstance(p.grad, DTensor) and isinstance(p, DTensor) and p.grad.placements != p.placements:
            # the gradient as its parameter is placed: a norm weight's partial gradient under
            # SequenceParallel is summed here, once, not in every optimizer op that reads it (AdamW
            # reads a gradient three times); a vocabulary-parallel embedding's gradient, which
            # DTensor's embedding backward leaves replicated, keeps this rank's rows (a local slice)
            p.grad = p.grad.redistribute(placements=p.placements)
        elif isinstance(p.grad, DTensor) and any(pl.is_partial() for pl in p.grad.placements):
            p.grad = p.grad.redistribute(placements=[Replicate() if pl.is_partial() else pl
                                                     for pl in p.grad.placements])
        grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        if spec.dp_axes and not spec.hybrid:  # (under HSDP fully_shard all-reduces the replicas)
            group = groups[_expert_dp_axes(spec) if _is_expert(name) else _dense_dp_axes(spec)]
            if group is not None:
                dist.all_reduce(grad, group=group)
            grad.div_(spec.batch_cut)
        if _partial_over_tp(name, spec):
            dist.all_reduce(grad, group=tp_group)


# -- pipeline parallel -------------------------------------------------------------------------
def cut_stage(model: nn.Module, stage: int, stages: int) -> nn.Module:
    """Keep the layers of ``stage`` (an even split), the embedding on the first stage, and the
    final norm and LM head on the last; the module keeps its parameter names."""
    per = len(model.layers) // stages
    for name in list(model.layers):
        if not stage * per <= int(name) < (stage + 1) * per:
            del model.layers[name]
    if stage > 0:
        model.embed = None
    if stage < stages - 1:
        model.norm, model.lm_head = None, None
    return model


def build_pipeline(model: nn.Module, spec: RunSpec, mesh: DeviceMesh, cfg, local_batch: int):
    """A pipelining schedule for this rank's stage of ``model`` (cut in place).

    Args:
        model: the whole model, as built on every rank.
        spec: the layout (``pp_axis``, ``pp_schedule``, ``microbatches``).
        mesh: the device mesh.
        cfg: the model config (for the static stage input/output shapes).
        local_batch: sequences per step on this data-parallel rank.
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage, stages = mesh.get_local_rank(spec.pp_axis), spec.pp_size
    cut_stage(model, stage, stages)
    mb = local_batch // spec.microbatches
    # static shapes (and requires_grad, which says which gradients travel back), so no metadata
    # is exchanged at run time
    device = next(model.parameters()).device
    hidden_mb = torch.empty(mb, spec.seq, cfg.hidden, requires_grad=True, device=device)
    inputs = torch.empty(mb, spec.seq, dtype=torch.long, device=device) if stage == 0 else hidden_mb
    outputs = (torch.empty(mb, spec.seq, cfg.vocab, requires_grad=True, device=device) if stage == stages - 1
               else hidden_mb)
    pipe_stage = PipelineStage(model, stage, stages, device, input_args=inputs, output_args=outputs,
                               group=mesh.get_group(spec.pp_axis))
    schedule = {"1f1b": Schedule1F1B, "gpipe": ScheduleGPipe}[spec.pp_schedule]
    return schedule(pipe_stage, n_microbatches=spec.microbatches, loss_fn=loss_fn)


# -- the whole thing ---------------------------------------------------------------------------
@dataclass
class ParallelModel:
    """A model with a RunSpec applied, and the one way to run a training step on it.

    Attributes:
        model: this rank's module (a pipeline stage, or the whole model with DTensor/FSDP params).
        spec: the layout.
        mesh: the device mesh.
        schedule: the pipelining schedule, or None without ``pp_axis``.
    """

    model: nn.Module
    spec: RunSpec
    mesh: DeviceMesh
    schedule: object = None

    @property
    def owns_loss(self) -> bool:
        """Whether this rank computes the loss (all ranks but the non-last pipeline stages)."""
        return self.schedule is None or self.mesh.get_local_rank(self.spec.pp_axis) == self.spec.pp_size - 1

    def forward_backward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor | None:
        """Run forward and backward on this rank's batch; the loss where this rank owns it."""
        if self.schedule is None:
            loss = loss_fn(self.model(ids), labels)
            loss.backward()
            return loss.detach()
        if self.mesh.get_local_rank(self.spec.pp_axis) == 0:
            self.schedule.step(ids)  # the first stage feeds the micro-batches in
            return None
        if not self.owns_loss:
            self.schedule.step()
            return None
        losses = []  # one per micro-batch, each the mean over its tokens
        self.schedule.step(target=labels, losses=losses)
        return torch.stack(losses).mean().detach()

    def sync_gradients(self) -> None:
        sync_gradients(self.model, self.spec, self.mesh)

    def full_state(self) -> dict[str, torch.Tensor] | None:
        """Every parameter, whole, on rank 0 (None elsewhere). A collective: call on all ranks."""
        local = {}
        for name, p in self.model.named_parameters():
            value = p.detach()
            if isinstance(value, DTensor):
                value = value.full_tensor()
            elif self.spec.ep_axes and _is_expert(name):
                value = funcol.all_gather_single(value, 0, submesh(self.mesh, self.spec.ep_axes).get_group())
            local[name] = value.clone()
        gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(local, gathered, dst=0)
        return None if gathered is None else {k: v for part in reversed(gathered) for k, v in part.items()}


def parallelize(model: nn.Module, spec: RunSpec, mesh: DeviceMesh, cfg, local_batch: int) -> ParallelModel:
    """Apply ``spec`` to ``model`` in the fixed order TP -> EP -> FSDP, or cut the pipeline.

    Args:
        model: a ``torch_models.Transformer`` with the same weights on every rank.
        spec: the layout (already checked against the model and world size).
        mesh: ``build_mesh(spec)``.
        cfg: the model config.
        local_batch: sequences per step on this rank.
    """
    if spec.pp_axis is not None:
        return ParallelModel(model, spec, mesh, build_pipeline(model, spec, mesh, cfg, local_batch))
    apply_tp(model, spec, mesh)
    apply_ep(model, spec, mesh)
    apply_fsdp(model, spec, mesh)
    return ParallelModel(model, spec, mesh)
