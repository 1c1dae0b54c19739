"""Evaluate a plan: step time, its breakdown, communication volume and memory per device.

Objective for one training step (spec section 2.4), with m micro-batches, p pipeline stages and v
virtual stages per device:

    step = (m + (p-1)/v) * max_stage T_mb + pp_comm + (1 - overlap) * T_grad_sync + T_optimizer
    T_mb = sum_ops [T_fwd + T_bwd + T_recompute] + sum_edges [T_redis_fwd + T_redis_bwd]

Per-op times are rooflines of the op's local piece; edges pay the collectives that turn the
producer's layout into the consumer's (and back for gradients); gradient synchronisation runs once
per step over each parameter's replica group. Memory per device is parameters, gradients and
optimizer state (sharded by ZeRO), plus the saved activations of the in-flight micro-batches.

This module holds the evaluator (its memoised pieces and the graph's segments) and the assembly of
one evaluation (``_Accumulator``); the pieces it assembles live below it: ``segment`` (a layer's
costs), ``params`` (parameters, gradients, optimizer state, ZeRO), ``pipeline`` (the stages'
sums and the schedule), ``memory`` (the peak) and ``report`` (the ``CostReport``).
"""

from __future__ import annotations

from symtensor.cost import moe
from symtensor.cost.collectives import collective_time, level_counts
from symtensor.cost.efficiency import Efficiency, efficiency_for
from symtensor.cost.engine import ENGINES, cut_refusal, engine_of, exposure, hidden, host_link_refusal
from symtensor.cost.memory import memory_peak, offloaded, static_peak
from symtensor.cost.opcost import (
    collectives_time,
    extra_saved_bytes,
    input_layout,
    op_floor,
    op_time,
    output_layout,
    param_layout,
    redistribute,
)
from symtensor.cost.params import ParamCost, Params, ops_with_parameters, param_cost, weight_axes
from symtensor.cost.pipeline import Stage, bubble, merge, p2p, split_mesh
from symtensor.cost.precision import RECIPES
from symtensor.cost.recompute import MODULES_PREFIX, regions as module_regions
from symtensor.cost.report import CostReport
from symtensor.cost.segment import Segment, activation_key, out_slot, recompute_share, sac_mm_index
from symtensor.cost.stack_kernels import UNSTATED as _UNSTATED, op_facts
from symtensor.cost.train import SAC_OP, TrainConfig
from symtensor.errors import PlanError
from symtensor.graph import (
    Graph,
    grad_operands,
    kind_of,
    layer_repeat,
    model_flops,
    op_saved_activations,
    requires_grad,
)
from symtensor.hardware import MEMORY_HEADROOM, Cluster
from symtensor.layout import REPLICATED, OpLayout, check_layout


class Evaluator:
    """Costs plans of one graph on one cluster with one pipeline depth; memoises per op and edge.

    Args:
        graph: the graph of one micro-step.
        cluster: devices and links.
        pp: pipeline stages (their axes are taken from the outermost levels).
        eff: efficiency constants (default: calibrated for the device).
        shared: caches that depend on the mesh but not on the batch (tensor placements, parameter
            costs, redistributions: their keys hold everything else they read), shared by the
            evaluators of one cluster, pipeline depth and efficiency (``EvaluatorPool``).
    """

    def __init__(self, graph: Graph, cluster: Cluster, pp: int = 1, eff: Efficiency | None = None,
                 shared: dict | None = None, framework: str = "megatron"):
        self.graph, self.cluster, self.pp = graph, cluster, pp
        self.mesh, self.pp_axes = split_mesh(cluster, pp)
        self.levels = cluster.levels
        self.framework = framework  # the engine whose kernels ``eff`` describes
        self.eff = eff or efficiency_for(cluster, framework)
        self.producer = graph.producers()
        self.tensors = graph.tensors
        self.dtype = graph.meta.get("dtype", "bf16")
        self._op_cache: dict = {}  # (equal-op id, layout uid) -> OpTime
        shared = {} if shared is None else shared
        self._edge_cache: dict = shared.setdefault("edges", {})  # (shape, dtype, src, dst) -> (s, collectives)
        self._param_cache: dict = shared.setdefault("params", {})  # see param_cost
        # (op structure id, layout uid, slot, what) -> TensorLayout: placements read the op's dim names,
        # tensors' dims and links, never sizes, so equal structures of any batch share them
        self._tl_cache: dict = shared.setdefault("placements", {})
        structures = shared.setdefault("structures", {})
        self._op_struct = {op.name: structures.setdefault(
            (op.kind, tuple(d for d, _ in op.dims), op.in_dims, op.out_dims, op.attrs), len(structures))
            for op in graph.ops}
        self.requires_grad = requires_grad(graph)
        self.grad_operands = grad_operands(graph, self.requires_grad)
        sigs: dict = {}
        self._op_sig = {op.name: sigs.setdefault((op.signature, self.grad_operands[op.name]), len(sigs))
                        for op in graph.ops}
        self.model_flops_per_microstep = model_flops(graph, self.grad_operands)
        self.param_ops = ops_with_parameters(graph)
        self._segment_cache: dict = {}
        self._boundary_seconds: dict = {}  # (signature id, layouts, activation key) -> layer_seconds' part
        self._segment_params_cache: dict = {}  # per segment (Params); _param_cache: per tensor
        self._wiring_cache: dict = {}
        self._floor_cache: dict = {}  # recomputation (, FP8 recipe) -> step_floor per micro-batch, all devices
        self._regions: dict = {}  # recomputation -> its checkpointed regions (``recompute_regions``)
        self._extra_cache: dict = {}  # (equal-op id, layout uid, loss kernel) -> ``extra_saved_bytes``
        self._factors: dict = {}  # TensorLayout -> devices that split it (``factor``)
        self._placements: dict = {}  # (pp, layers per virtual stage) -> ``placement``
        self.expert_ops = frozenset(op.name for op in graph.ops if moe.expert_op(op))  # ``moe.expert_op``, by name
        self.segments = self._index_segments()

    def release(self) -> None:
        """Drop this evaluator's own caches (not the shared ones), for an owner done with it
        (``EvaluatorPool.release``): a costed segment names its evaluator, a reference cycle that only
        Python's cyclic collector would free, and it is paused over a plan."""
        for cache in (self._op_cache, self._segment_cache, self._boundary_seconds, self._segment_params_cache,
                      self._wiring_cache, self._floor_cache, self._regions, self._extra_cache, self._factors,
                      self._placements):
            cache.clear()

    # -- graph facts ------------------------------------------------------------------------
    def needs_grad(self, tname: str) -> bool:
        return tname in self.requires_grad

    def _index_segments(self):
        """(signature id, ops, external inputs, layer) per real layer (skeleton runs expanded);
        equal layers share the signature id."""
        ids: dict = {}
        out = []
        repeat = self.graph.meta.get("repeat", {})
        for ops in _segments(self.graph):
            names = {t for op in ops for t in op.outputs}
            external = tuple(dict.fromkeys(
                (t, self.producer[t]) for op in ops for t in op.inputs if t in self.producer and t not in names))
            sig = (tuple(op.signature for op in ops), tuple(self.grad_operands[op.name] for op in ops),
                   tuple(ops[0].layer - p.layer for _, p in external))
            sig_id = ids.setdefault(sig, len(ids))
            first = ops[0].layer
            # a repeated skeleton layer's input comes from its own previous copy
            again = tuple((t, _same_block(ops, p)) for t, p in external)
            for k in range(repeat.get(first, 1)):
                out.append((sig_id, ops, external if k == 0 else again, first + k, k > 0))
        return out

    def op_sig(self, op) -> int:
        """A small int shared by equal ops (signature and gradient operands) of this graph."""
        return self._op_sig[op.name]

    # -- memoised pieces ----------------------------------------------------------------------
    def op_time(self, op, layout: OpLayout, fp8: str | None = None, stack=None):
        """``opcost.op_time``, memoised per equal ops (signature and gradient operands) and layout;
        ``fp8``: the FP8 recipe the linear GEMMs run under (``TrainConfig.fp8``), None in BF16; ``stack``: the
        stack's facts (``Stack``), of which its loss and elementwise kernels price the memory-bound ops and its
        attention kernel the attention (``stack_kernels.op_facts``)."""
        sig = self._op_sig[op.name]
        facts = op_facts(op.kind, kind_of(op.kind).memory_bound, stack)
        key = (sig, layout.uid) if fp8 is None and facts == _UNSTATED else (sig, layout.uid, fp8, facts)
        hit = self._op_cache.get(key)
        if hit is None:
            hit = self._op_cache[key] = op_time(op, layout, self.mesh, self.cluster.device, self.eff, self.tensors,
                                                self.grad_operands[op.name], self.dtype, self._fp8(fp8), *facts)
        return hit

    def _fp8(self, recipe: str | None):
        """``opcost.op_time``'s FP8 argument: the recipe, and whether weights are cast every
        micro-batch (engines on PyTorch's own kernels, torchao; Transformer Engine caches them)."""
        return None if recipe is None else (RECIPES[recipe], ENGINES[self.framework].pytorch_kernels)

    def extra_saved(self, op, layout: OpLayout, loss: str | None = None) -> float:
        """``opcost.extra_saved_bytes``, memoised per equal ops and layout (and the stated loss kernel)."""
        key = (self._op_sig[op.name], layout.uid, loss)
        hit = self._extra_cache.get(key)
        if hit is None:
            hit = self._extra_cache[key] = extra_saved_bytes(op, layout, self.mesh, loss)
        return hit

    def factor(self, tl) -> int:
        """``TensorLayout.factor`` on this evaluator's mesh, memoised per placement."""
        hit = self._factors.get(tl)
        if hit is None:
            hit = self._factors[tl] = tl.factor(self.mesh)
        return hit

    def edge(self, src, dst, tname):
        t = self.tensors[tname]
        key = (t.shape, t.dtype, src, dst)
        hit = self._edge_cache.get(key)
        if hit is None:
            colls = redistribute(src, dst, t.numel, t.itemsize, self.mesh)
            hit = (collectives_time(colls, self.mesh, self.levels, self.eff), colls)
            self._edge_cache[key] = hit
        return hit

    def in_layout(self, op, layout: OpLayout, slot: int, grad: bool = False):
        """Memoised ``input_layout``."""
        key = (self._op_struct[op.name], layout.uid, slot, grad)
        hit = self._tl_cache.get(key)
        if hit is None:
            hit = self._tl_cache[key] = input_layout(op, layout, slot, grad=grad)
        return hit

    def param_layout(self, op, layout: OpLayout, slot: int):
        key = (self._op_struct[op.name], layout.uid, slot, "param")
        hit = self._tl_cache.get(key)
        if hit is None:
            hit = self._tl_cache[key] = param_layout(op, layout, slot)
        return hit

    def out_layout(self, op, layout: OpLayout, slot: int = 0, partial: bool = True):
        key = (self._op_struct[op.name], layout.uid, slot, "out", partial)
        hit = self._tl_cache.get(key)
        if hit is None:
            hit = self._tl_cache[key] = output_layout(op, layout, slot, partial=partial)
        return hit

    def recompute_regions(self, recompute: str) -> dict | None:
        """The ops Megatron's ``modules:`` recomputation checkpoints, by region (``cost.recompute.regions``), once per
        mode; None for the other modes (``segment.recompute_share``'s ``regions``)."""
        if not recompute.startswith(MODULES_PREFIX):
            return None
        hit = self._regions.get(recompute)
        if hit is None:
            hit = self._regions[recompute] = module_regions(self.graph, recompute)
        return hit

    def wiring(self, ops, ext_producer: dict) -> tuple:
        """Per op of a segment: its produced inputs (slot, tensor, producer, producer's output
        slot, needs a gradient) and its saved activations (in/out, slot, tensor, bytes, producer,
        producer's slot). Fixed by the graph, so built once per segment."""
        key = (id(ops), tuple(ext_producer.items()))
        hit = self._wiring_cache.get(key)
        if hit is not None:
            return hit
        out = []
        for op in ops:
            inputs = []
            for slot, tname in enumerate(op.inputs):
                prod = ext_producer.get(tname) or self.producer.get(tname)
                if prod is not None:  # graph inputs cost no redistribution
                    inputs.append((slot, tname, prod, out_slot(prod, tname), tname in self.requires_grad))
            saves = []
            for io, idx, tname in op_saved_activations(op, self.tensors):
                t = self.tensors[tname]
                prod = ext_producer.get(tname) or self.producer.get(tname)
                saves.append((io, idx, tname, t.nbytes, prod, out_slot(prod, tname) if prod is not None else 0))
            out.append((op, tuple(inputs), tuple(saves)))
        hit = self._wiring_cache[key] = tuple(out)
        return hit

    def param_cost(self, t, tl, train: TrainConfig, data_axes: frozenset = None, quantized: bool = False) -> ParamCost:
        key = (t.shape, t.trainable, tl, train.zero, train.micro_steps, train.param_bytes, train.grad_bytes,
               train.optim_bytes, data_axes, train.dp_replicate, train.reduced_bytes, train.precision)
        if train.lowp_params:  # (quantized parameters: ``params.lowp``)
            key += (train.fp8, quantized)
        hit = self._param_cache.get(key)
        if hit is None:
            hit = self._param_cache[key] = param_cost(self, t, tl, train, data_axes, quantized and train.lowp_params)
        return hit

    def coll_time(self, kind, nbytes, axes) -> float:
        return collective_time(kind, nbytes, level_counts(axes, self.mesh, len(self.levels)), self.levels,
                               self.eff.link_for(kind))

    # -- the evaluation -----------------------------------------------------------------------
    def check(self, layouts: dict[str, OpLayout], train: TrainConfig) -> None:
        """A PlanError naming the first op whose layout is illegal (``layout.refusal``) or that ``train``'s engine
        does not run (``cost.engine.cut_refusal``)."""
        for op in self.graph.ops:
            layout = layouts.get(op.name, REPLICATED)
            check_layout(op, layout, self.mesh)
            why = cut_refusal(train, op, layout)
            if why is not None:
                raise PlanError(f"op {op.name}: {why}")

    def placement(self, train: TrainConfig) -> tuple[dict[int, int], dict[int, int]]:
        """The pipeline rank of each layer index (-1: the embedding, on the first; ``layers``: the head and loss,
        on the last) and the model chunk of its rank of each transformer layer: virtual stage k
        (``TrainConfig.chunk_layers``, Megatron's layout order) is chunk k // pp on rank k % pp, as Megatron's
        interleaved schedule places its chunks. Memoised per split (every evaluation reads it)."""
        layers = self.graph.meta["layers"]
        split = train.chunk_layers(layers)
        key = (train.pp, split)
        hit = self._placements.get(key)
        if hit is None:
            stage, chunk, start = {-1: 0, layers: train.pp - 1}, {}, 0
            for k, c in enumerate(split):
                for layer in range(start, start + c):
                    stage[layer], chunk[layer] = k % train.pp, k // train.pp
                start += c
            hit = self._placements[key] = (stage, chunk)
        return hit

    def stage_of(self, train: TrainConfig) -> dict[int, int]:
        """The pipeline rank of each layer index (``placement``)."""
        return self.placement(train)[0]

    def evaluate(self, layouts: dict[str, OpLayout], train: TrainConfig, check: bool = True) -> CostReport:
        if train.pp != self.pp:
            raise PlanError(f"evaluator built for pp={self.pp}, configuration has pp={train.pp}")
        if train.framework != self.framework:
            raise PlanError(f"evaluator built for the {self.framework} engine's kernels, configuration runs "
                            f"{train.framework}")
        if train.graph_batch != self.graph.meta["micro_batch"]:
            raise PlanError(f"graph built for {self.graph.meta['micro_batch']} sequences per micro-step, "
                            f"configuration has {train.graph_batch}")
        if check:
            self.check(layouts, train)
        return _Accumulator(self, layouts, train).run()

    def stages(self, layouts: dict[str, OpLayout], train: TrainConfig) -> list[Stage]:
        """The pipeline stages' sums of ``evaluate`` (what ``explain`` reads beside the report: each rank's model
        chunks)."""
        return _Accumulator(self, layouts, train).accumulate()

    def step_floor(self, train: TrainConfig) -> float:
        """A lower bound of the step time of every plan of this graph with ``train``'s micro-batches
        and recomputation, whatever its layouts, pipeline and ZeRO stage: every whole op (forward,
        backward, recomputed forward) on one device at its kernels' best rates, the larger of its
        FLOP time and its activations' memory time (``opcost.op_floor``), spread evenly over all
        devices, with no knee, communication or bubble. (A stage's time per micro-batch is at
        least its ops' share over its devices, the critical stage's at least the mean, and a step
        at least micro-batches times the critical stage.)"""
        attention = train.stack.attention
        key = train.recompute if train.fp8 is None and attention is None else (train.recompute, train.fp8, attention)
        per_mb = self._floor_cache.get(key)
        if per_mb is None:
            layers = self.graph.meta["layers"]
            per_mb = 0.0
            mms = sac_mm_index(self.graph.ops) if train.recompute == SAC_OP else {}
            regions = self.recompute_regions(train.recompute)
            for op in self.graph.ops:
                fwd, bwd = op_floor(op, self.cluster.device, self.eff, self.tensors, self.grad_operands[op.name],
                                    self.dtype, self._fp8(train.fp8), attention)
                share = recompute_share(op, train.recompute, layers, mms.get(op.name), regions)
                per_mb += (fwd * (1 + share) + bwd) * layer_repeat(self.graph, op.layer)
            self._floor_cache[key] = per_mb
        # every plan pays the host's work per step (its per micro-batch work is left out: the floor may not
        # depend on the micro-batch count)
        return train.micro_steps * per_mb / self.cluster.n_devices + self.eff.end_to_end.step_s

    def layer_seconds(self, layouts: dict[str, OpLayout], train: TrainConfig) -> dict[int, float]:
        """Per layer index (-1: the ops before the layers, ``layers``: those after), the seconds
        per micro-batch its segment adds to its stage (compute, recomputation and exposed
        communication) at most, under any pipeline split: costed as if a pipeline boundary
        came before it (a stage's inputs arrive point to point, so the segment pays no
        redistribution of them: a boundary only removes costs). A stage's time per micro-batch
        is the sum over its layers; the step is at least micro-batches times the largest plus the
        bubble (``_Accumulator._finish``), which is how the Megatron grid bounds a point before
        costing it (``search.grid``)."""
        layers = self.graph.meta["layers"]
        out: dict[int, float] = {}
        pieces: dict = {}  # (id(ops), BF16) -> seconds: a skeleton run's copies share their ops, so their seconds
        for sig_id, ops, external, layer, _ in self.segments:
            bf16 = train.in_bf16(layer, layers)  # (a layer kept in BF16: ``TrainConfig.bf16_span``)
            seconds = pieces.get((id(ops), bf16))
            if seconds is None:
                step = train.bf16 if bf16 else train
                akey = activation_key(step)
                lay = tuple(layouts.get(op.name, REPLICATED) for op in ops)
                # with every input arriving from another stage, the producers' layouts cost nothing:
                # equal layers share the seconds whatever precedes them
                key = (sig_id, lay, akey)
                seconds = self._boundary_seconds.get(key)
                if seconds is None:
                    ext = tuple(layouts.get(prod.name, REPLICATED) for _, prod in external)
                    cross = frozenset(t for t, _ in external)
                    seconds = self._boundary_seconds[key] = self.segment(sig_id, ops, external, lay, ext, cross,
                                                                         akey, layouts, step).seconds
                pieces[(id(ops), bf16)] = seconds
            out[layer] = out.get(layer, 0.0) + seconds
        return out

    def segment(self, sig_id, ops, external, lay, ext, cross: frozenset, akey, layouts, train) -> Segment:
        """The costed segment of ``ops`` (memoised: equal layers with equal layouts, inputs'
        layouts, inputs from another pipeline stage (by their position among the inputs) and
        activation semantics ``akey`` share it)."""
        crossing = tuple(i for i, (t, _) in enumerate(external) if t in cross) if cross else ()
        key = (sig_id, lay, ext, crossing, akey)
        seg = self._segment_cache.get(key)
        if seg is None:
            seg = self._segment_cache[key] = Segment(self, layouts, train, ops, cross, external).run()
        return seg

    def static_fits(self, layouts: dict[str, OpLayout], train: TrainConfig) -> bool:
        """False when parameters, gradients and optimizer state alone exceed the usable memory of
        a device (then no recomputation fits either)."""
        return _Accumulator(self, layouts, train).static_peak() <= self.cluster.device.memory * MEMORY_HEADROOM


def _same_block(ops, producer):
    """In a repeated skeleton layer, the op of the layer itself that plays ``producer``'s role."""
    return next((op for op in ops if op.block == producer.block), producer)


def _segments(graph: Graph) -> list[tuple]:
    """Contiguous runs of ops with the same layer index."""
    out, cur, layer = [], [], None
    for op in graph.ops:
        if op.layer != layer and cur:
            out.append(tuple(cur))
            cur = []
        layer = op.layer
        cur.append(op)
    if cur:
        out.append(tuple(cur))
    return out


class _Accumulator:
    """One evaluation: costs each segment (memoised), sums per stage, then the step."""

    def __init__(self, ev: Evaluator, layouts, train: TrainConfig):
        self.ev, self.layouts, self.train = ev, layouts, train
        self.stage = ev.stage_of(train)
        self.stages = [Stage() for _ in range(train.pp)]
        # what a segment's parameters depend on besides their layouts (see Params)
        self.waxes = weight_axes(ev.param_ops, layouts)
        self.pkey = (train.zero, train.micro_steps, train.param_bytes, train.grad_bytes, train.optim_bytes,
                     train.framework, self.waxes, train.dp_replicate, train.stack.grad_reduce_bf16)

    def layout(self, op) -> OpLayout:
        return self.layouts.get(op.name, REPLICATED)

    def run(self) -> CostReport:
        self.accumulate()
        return self._finish()

    def accumulate(self) -> list[Stage]:
        """Each pipeline stage's sums of its segments (costed, memoised), before the step is put together."""
        ev, train = self.ev, self.train
        layers = ev.graph.meta["layers"]
        pieces: dict = {}  # (id(ops), id(external), cross, BF16) -> (segment, params), once per evaluation
        counts: dict = {}  # (stage, segment, params) -> identical layers
        stage = self.stage
        chunk = ev.placement(train)[1] if train.vpp > 1 else None
        for sig_id, ops, external, layer, repeated in ev.segments:
            s = stage[layer]
            # the producer of a repeated layer's input is the layer just before it
            cross = frozenset(t for t, prod in external
                              if stage[layer - 1 if repeated else prod.layer] != s) if train.pp > 1 else frozenset()
            bf16 = train.in_bf16(layer, layers)  # (a layer kept in BF16 runs as ``TrainConfig.bf16``)
            local = (id(ops), id(external), cross, bf16)
            hit = pieces.get(local)
            if hit is None:
                step = train.bf16 if bf16 else train
                lay = tuple(self.layout(op) for op in ops)
                ext = tuple(self.layout(prod) for _, prod in external)
                seg = ev.segment(sig_id, ops, external, lay, ext, cross, activation_key(step), self.layouts, step)
                hit = pieces[local] = (seg, self._params(sig_id, ops, lay, not bf16))
            seg, params = hit
            ck = (s, id(seg), id(params))
            prev = counts.get(ck)
            counts[ck] = (seg, params, 1 if prev is None else prev[2] + 1)
            if chunk is not None and seg.in_layer:  # (the interleaved schedule holds its chunks unalike)
                self.stages[s].add_to_chunk(seg, chunk[layer], train.vpp)
        for (s, _, _), (seg, params, times) in counts.items():
            self.stages[s].add(seg, params, times)
        return self.stages

    def _params(self, sig_id, ops, lay, low: bool = True) -> Params:
        """The segment's parameters; ``low``: not a layer kept in BF16 (``TrainConfig.bf16_span``), so under
        quantized parameters (``TrainConfig.lowp_params``) its GEMM weights are held quantized."""
        ev = self.ev
        quantized = low and self.train.lowp_params
        key = (sig_id, lay, self.pkey)
        if self.train.lowp_params:  # (what quantized parameters read besides: the recipe, ``params.lowp``)
            key += (self.train.fp8, quantized)
        if not low:
            key += ("bf16",)
        hit = ev._segment_params_cache.get(key)
        if hit is None:
            hit = ev._segment_params_cache[key] = Params(ev, self.layouts, self.train, ops, self.waxes, quantized,
                                                         bf16=not low)
        return hit

    def static_peak(self) -> float:
        """``memory.static_peak`` of this plan's stages, at a fraction of an evaluation's cost."""
        seen: dict = {}
        counts: dict = {}  # (stage, id(ops), BF16) -> [params, identical layers]
        layers = self.ev.graph.meta["layers"]
        for sig_id, ops, _, layer, _ in self.ev.segments:
            bf16 = self.train.in_bf16(layer, layers)
            params = seen.get((id(ops), bf16))
            if params is None:
                params = seen[(id(ops), bf16)] = self._params(sig_id, ops, tuple(self.layout(op) for op in ops),
                                                              not bf16)
            counts.setdefault((self.stage[layer], id(ops), bf16), [params, 0])[1] += 1
        for (s, _, _), (params, times) in counts.items():
            self.stages[s].add_params(params, times)
        return static_peak(self.stages)

    def _communicators(self) -> list[list[int]]:
        """Per stage, the ranks of each NCCL communicator a device of it uses (``cost.memory.nccl_bytes``): one
        per group of mesh axes its collectives run over (PyTorch creates a group's communicator at its first
        collective), the pipeline's (pp > 1), the embedding group joining the stages that hold a tied embedding
        (Megatron's, pp > 1), and the world's (launchers' barriers; the same as the data-parallel group when
        that spans every device)."""
        ev, pp = self.ev, self.train.pp
        everything = tuple(range(len(ev.mesh)))
        out = []
        for st in self.stages:
            groups = [g for g in st.groups if g]
            sizes = [ev.mesh.size(g) for g in groups]
            if pp > 1:
                sizes.append(pp)
                if st.ties:
                    sizes.append(2)
            if pp > 1 or everything not in groups:
                sizes.append(ev.cluster.n_devices)
            out.append(sizes)
        return out

    def _finish(self) -> CostReport:
        ev, train = self.ev, self.train
        pp, m, v = train.pp, train.micro_steps, train.vpp
        e2e = ev.eff.end_to_end
        # each stage's seconds per micro-batch, with the host's work per micro-batch (EndToEnd.microbatch_s) and
        # per local expert of its MoE layers (EndToEnd.expert_s)
        host = [e2e.microbatch_s + e2e.expert_s * st.local_experts for st in self.stages]
        per_mb = [st.per_microbatch_s + h for st, h in zip(self.stages, host)]
        crit = max(range(pp), key=lambda s: per_mb[s])
        cs = self.stages[crit]
        bubble_s = bubble(per_mb, pp, v) * train.schedules  # each pipeline schedule fills and drains
        p2p_s = p2p_bytes = 0.0
        if pp > 1:
            p2p_s, p2p_bytes = p2p(ev, self.stage, self.layouts)
            # activations forward and their gradients backward, every micro-batch: on a stage's critical path,
            # two transfers (a send batched with the opposite receive) or the engine's (Engine.p2p_transfers)
            p2p_s *= ENGINES[train.framework].p2p_transfers * m
        # data-parallel synchronisation as the engine overlaps it, plus the all-reduce of gradients
        # over partial axes outside the data-parallel group (after backward, exposed)
        exposures = [exposure(st.units, train, share=e2e.comm_sm_fraction) for st in self.stages]
        dp_exposed = max(e.seconds + st.other_sync for e, st in zip(exposures, self.stages))
        breakdown = {"compute": m * cs.compute, "recompute": m * cs.recompute}
        for cat in ("tp_comm", "cp_comm", "ep_comm"):
            breakdown[cat] = m * cs.comm.get(cat, 0.0)
        optimizer = max(st.opt_time for st in self.stages)
        flags = engine_of(train).overflow_flags[train.zero > 0]
        if flags:  # the loss-scale check's one-byte flag all-reduces (FP16: Engine.overflow_flags), their latency
            optimizer += flags * ev.coll_time("all_reduce", 1.0, tuple(range(len(ev.mesh))))  # over a stage's ranks
        breakdown.update(dp_comm=dp_exposed, pp_comm=p2p_s, pp_bubble=bubble_s, optimizer=optimizer,
                         overhead=e2e.step_s + m * host[crit])
        if train.stack.offloads:  # (a key only with offloading: the default's breakdown is unchanged)
            breakdown["cpu_offload"] = m * max(offload_seconds(st, train, ev.cluster.device) for st in self.stages)
        step = sum(breakdown.values())
        memory, allocated, reserved = memory_peak(self.stages, train, ev.cluster.device, self._communicators())
        comm_bytes = {k: val * m for k, val in cs.bytes.items()}
        merge(comm_bytes, cs.dp_bytes(exposures[crit].calls))
        if pp > 1:
            comm_bytes["send_recv"] = 2 * m * p2p_bytes
        model_flops = ev.model_flops_per_microstep * m
        cap = ev.cluster.device.memory
        # MFU is over the peak of the GEMMs' precision: FP8's under FP8, as NVIDIA's FP8 benchmarks report it
        # (dgxc-benchmarking llama3.1/README.md: "peak theoretical throughput for H100 FP8 is 1979 TFLOPS"); FP4's
        # under NVFP4 by the same rule
        return CostReport(
            step_time_s=step, breakdown=breakdown, memory=memory, memory_peak=allocated, capacity=cap,
            fits=reserved <= cap * MEMORY_HEADROOM, model_flops=model_flops, memory_reserved=reserved,
            tokens=train.global_batch * ev.graph.meta["seq"], n_devices=ev.cluster.n_devices,
            peak_flops=ev.cluster.device.flops(ev.dtype if train.fp8 is None else RECIPES[train.fp8].precision),
            comm_bytes=comm_bytes,
            stage_times_s=per_mb)


def offload_seconds(st: Stage, train: TrainConfig, device) -> float:
    """Seconds per micro-batch CPU activation offloading adds to stage ``st`` (``cost.engine.CPU_OFFLOAD``; the
    fine-grained modules' inputs alike, ``cost.offload``): each layer's offloaded activations (``offloaded``) cross
    the host link once each way, device to host beside the layer's forward and back beside its backward, on a side
    stream whose copy engines hold no SMs: what a copy exceeds of its layer's compute (``hidden`` with no share) is
    exposed."""
    why = host_link_refusal(device)
    if why is not None:
        raise PlanError(why)
    out = 0.0
    for saved, (fwd, bwd) in zip(offloaded(st, train), st.layer_compute):
        copy = saved / device.host_bandwidth
        out += hidden(copy, fwd, 0.0) + hidden(copy, bwd, 0.0)
    return out
