"""The cost of one segment (a layer, or the ops before or after the layers) on its stage: compute,
recomputation, the communication of its ops and edges (exposed after the engine's overlap) and
its saved activations. The evaluator (``cost.model``) builds segments and sums them per stage."""

from __future__ import annotations

from symtensor.cost import moe, offload
from symtensor.cost.engine import engine_of, hidden, tp_overlapped
from symtensor.cost.opcost import OpTime, collectives_time, intra_collectives, local_sizes
from symtensor.cost.precision import RECIPES, fp8_gemm
from symtensor.cost.recompute import MODULES_PREFIX, position
from symtensor.cost.stack_kernels import runs_eager
from symtensor.cost.train import SAC_OP, TrainConfig, layer_every
from symtensor.layout import REPLICATED, OpLayout

_CATEGORY_BY_KIND = {"attention": "cp_comm", "moe_dispatch": "ep_comm", "moe_combine": "ep_comm"}
# the compute each communication category can hide behind (see Segment._overlap)
_HIDES = {"linear": "tp_comm", "attention": "cp_comm"}
# Transformer Engine userbuffers split a tensor-parallel GEMM and its collective into 4 chunks
# (NeMo's tp_comm_overlap configs for H100: num_splits 4 for the pipelined reduce-scatters)
TP_OVERLAP_SPLITS = 4
# the tensor-parallel collectives userbuffers overlap: sequence parallelism's all-gather before a column-parallel
# GEMM and reduce-scatter after a row-parallel one (and their backward duals). Without sequence parallelism the
# row-parallel GEMM's all-reduce runs as it is: Megatron-LM asserts --sequence-parallel under --tp-comm-overlap
# (megatron/training/arguments.py), and an all-to-all of a redistribution is nobody's GEMM pipeline
TP_OVERLAPPED = ("all_gather", "reduce_scatter")
# per communication category, the collective kinds its overlap treats apart (``Segment._overlap``, by their share of
# the category's seconds, by bytes): userbuffers hide only sequence parallelism's tensor-parallel collectives
# (``TP_OVERLAPPED``); ring attention hides context parallelism's key/value passes, never an all-to-all into or out
# of an attention core (all-to-all context parallelism's: exposed)
APART = {"tp_comm": TP_OVERLAPPED, "cp_comm": ("all_to_all",)}


def _ulysses_out(prod, colls) -> str | None:
    """``cp_comm`` for the all-to-all that takes an attention core's output (or brings its gradient) from the
    head cut back to the sequence cut (all-to-all context parallelism's), else None (the consumer's category)."""
    return "cp_comm" if prod.kind == "attention" and all(c.kind == "all_to_all" for c in colls) else None


def activation_key(train: TrainConfig) -> tuple:
    """What a segment's cost depends on besides layouts: recomputation, the engine's semantics, the stated kernels
    and the FP8 recipe (the parameters' part: ``_Accumulator.pkey``; data-parallel overlap and the
    schedule only enter the step)."""
    s = train.stack
    return train.recompute, train.framework, tp_overlapped(train), train.fp8, \
        (s.moe_dispatcher, s.moe_routing, s.moe_capacity_factor, s.moe_shared_overlap, s.moe_ep_overlap), \
        s.offload_modules, s.loss, s.elementwise, s.attention


def recomputed(op, recompute: str, layers: int, regions=None) -> bool:
    """Whether backward re-runs ``op``'s forward (some of it, ``recompute_share``) under ``recompute``: every
    transformer-layer op under full recomputation, the attention core's unfused ops (marked ``core``) under
    selective; never the ops before or after the ``layers`` layers."""
    return recompute_share(op, recompute, layers, regions=regions) > 0.0


def forward_runs(op, recompute: str, layers: int, regions=None) -> float:
    """How many times a micro-batch runs ``op``'s forward: once, and again for the share backward re-runs
    (``recompute_share``; the op-local terms' estimate under torchtitan's per-op policy); a whole number is
    an int (1 or 2 under none, selective, full and modules), a fraction stays one (``layer:N``, ``selective-op``)."""
    runs = 1.0 + recompute_share(op, recompute, layers, regions=regions)
    return int(runs) if runs.is_integer() else runs


def sac_mm(op) -> bool:
    """Whether torchtitan's per-op policy counts ``op`` among a block's matmuls (``aten.mm``): a linear op
    without an experts dim. The router's GEMM is forced to recompute (per_op_sac_force_recompute_mm_shapes_by_fqns
    "moe.router.gate") and the experts' run ``torch._grouped_mm``, which its save list lacks: both recomputed."""
    return op.kind == "linear" and "e" not in dict(op.dims)


def sac_mm_index(ops) -> dict:
    """Position (1, 2, ...) of each counted matmul (``sac_mm``) among its layer's, in forward order: what
    torchtitan's per-op policy counts in each checkpointed block's forward (``meta["forward_mm_count"]``)."""
    out, count = {}, {}
    for op in ops:
        if sac_mm(op):
            count[op.layer] = count.get(op.layer, 0) + 1
            out[op.name] = count[op.layer]
    return out


def recompute_share(op, recompute: str, layers: int, mm_index: int | None = None, regions=None) -> float:
    """The share of ``op``'s forward that backward re-runs under ``recompute`` (0 outside the ``layers``
    layers): 1 under ``full``; the attention core's unfused ops (``core``) under ``selective`` (Megatron's);
    under ``layer:N`` 1/N of every layer (torchtitan's layer SAC checkpoints every N-th block whole:
    ``_apply_layer_sac``, ``_layer_sac_count % ac_freq == 0``; costed as that share of each layer); under
    ``selective-op`` torchtitan's per-op policy (``_apply_op_sac``, the llama3 ``_op_sac_save_list``: aten.mm,
    the SDPA kernels, reduce_scatter, max): "Saves output of all compute ops, except every second mm", so
    the 1st, 3rd, ... counted matmul of a block (``mm_index``, ``sac_mm_index``) and the fused attention are
    kept, every other op (the even matmuls, the router and expert GEMMs, norms, RoPE, activations, residual
    adds) re-runs; a matmul whose position is not given counts half (the op-local terms' estimate).
    Source: pytorch/torchtitan@238fa9953e4aec2a62582121564273d7cbb1e9f1 torchtitan/distributed/
    activation_checkpoint.py, torchtitan/models/llama3/infra/parallelize.py, torchtitan/config/job_config.py
    (ActivationCheckpoint: mode "selective", selective_ac_option "op" or an integer, default "2").
    Under Megatron's ``modules:`` list (``cost.recompute``) 1 for the ops of the named modules' regions
    (``regions``: ``Evaluator.recompute_regions``, which every caller passes in that mode), 0 for the rest."""
    if not 0 <= op.layer < layers or recompute == "none":
        return 0.0
    if recompute == "full":
        return 1.0
    if recompute == "selective":
        return 1.0 if op.attr("core") else 0.0
    if recompute == SAC_OP:
        if sac_mm(op):
            return 0.5 if mm_index is None else float(mm_index % 2 == 0)
        return 0.0 if op.kind == "attention" else 1.0
    if recompute.startswith(MODULES_PREFIX):
        if regions is None:
            raise ValueError(f"recompute_share under {recompute!r} needs the regions (Evaluator.recompute_regions)")
        return 1.0 if op.name in regions else 0.0
    return 1.0 / layer_every(recompute)


def out_slot(prod, tname) -> int:
    """The output slot of ``prod`` that holds ``tname`` (slot 0 for a stand-in producer)."""
    return prod.outputs.index(tname) if tname in prod.outputs else 0


class Segment:
    """The cost of one segment (a layer, or the ops before or after the layers) on its stage, per
    micro-batch where it repeats and per step where it does not. Identical layers with identical
    layouts and inputs have the same segment, so a 126-layer model costs a few segment walks.
    ``ev``: the evaluator whose memoised pieces (op times, edges, placements, wiring) it reads."""

    def __init__(self, ev, layouts, train: TrainConfig, ops, cross_stage: frozenset, external=()):
        self.ev, self.layouts, self.train, self.ops = ev, layouts, train, ops
        self.ext_producer = dict(external)
        self.charged: set = set()  # (tensor, layout) redistributions already paid
        self.cross_stage = cross_stage  # input tensors that arrive from another pipeline stage
        self.compute = self.recompute = self.fwd = 0.0
        self.overlap_compute: dict[str, float] = {}  # per comm category: compute it can hide behind
        self.comm: dict[str, float] = {}  # exposed seconds per micro-batch, per category
        self.raw_comm: dict[str, float] = {}  # before overlap
        self.apart: dict[str, float] = {}  # per category: seconds of the collective kinds of APART
        self.bytes: dict[str, float] = {}  # per micro-batch
        self.saved: dict[str, float] = {}
        self.layer_input = 0.0
        self.logits = 0.0  # local elements of the logits a loss op reads (``cost.memory``'s loss transient)
        self.groups: set = set()  # the mesh axes of each group its collectives run over (NCCL communicators)
        self.in_layer = bool(ops) and 0 <= ops[0].layer < ev.graph.meta["layers"]
        self.moe = moe.active(train)  # MoE options beyond today's costing (``cost.moe``)
        self.local_experts = 0  # experts a device holds of the layer (host work per expert: EndToEnd.expert_s)
        self._loads: dict[str, float] = {}  # expert op -> its load factor (``_load``)
        # Megatron's recompute modules: op -> (region, module, discards its outputs) (``cost.recompute.regions``)
        self.regions = ev.recompute_regions(train.recompute) if train.recompute.startswith(MODULES_PREFIX) else None
        self.region_bytes: dict = {}  # region -> the local bytes of its ops' outputs (what its re-run brings back)
        self.engine = engine_of(train)
        # eager PyTorch's SwiGLU keeps its silu's output too (``Engine.unfused_swiglu``)
        self.eager_swiglu = runs_eager(train.stack.elementwise, self.engine.unfused_swiglu)

    def layout(self, op) -> OpLayout:
        return self.layouts.get(op.name, REPLICATED)

    def producer(self, tname):
        return self.ext_producer.get(tname) or self.ev.producer.get(tname)

    def add_comm(self, category, colls, seconds, times=1.0):
        self.comm[category] = self.comm.get(category, 0.0) + seconds * times
        total = sum(c.nbytes for c in colls)
        kinds = APART.get(category)
        if kinds and total:  # (their share of the seconds, by bytes)
            part = seconds * times * sum(c.nbytes for c in colls if c.kind in kinds) / total
            self.apart[category] = self.apart.get(category, 0.0) + part
        for c in colls:
            self.bytes[c.kind] = self.bytes.get(c.kind, 0.0) + c.nbytes * times
            self.groups.add(tuple(sorted(c.axes)))

    def run(self) -> Segment:
        recompute, layers = self.train.recompute, self.ev.graph.meta["layers"]
        wiring = self.ev.wiring(self.ops, self.ext_producer)
        mms = sac_mm_index(op for op, _, _ in wiring) if recompute == SAC_OP else {}
        kept, kept_ops = 0.0, []  # per-op checkpointing: the outputs of the ops it keeps, and those ops
        for op, inputs, saves in wiring:
            layout = self.layout(op)
            t = self.ev.op_time(op, layout, self.train.fp8, self.train.stack)
            if op.name in self.ev.expert_ops:
                self.local_experts = max(self.local_experts, local_sizes(op, layout, self.ev.mesh).get("e", 1))
                if self.moe:  # the most-loaded expert rank paces the step
                    f = self._load(op, layout)
                    t = OpTime(t.fwd_s * f, t.bwd_s * f, t.fwd_flops)
            self.compute += t.fwd_s + t.bwd_s
            self.fwd += t.fwd_s
            share = recompute_share(op, recompute, layers, mms.get(op.name), self.regions)
            if share:
                self.recompute += t.fwd_s * share
            hides = _HIDES.get(op.kind)
            if self.moe and self.train.stack.moe_shared_overlap and "shared_expert" in op.name:
                hides = "ep_comm"  # Megatron --moe-shared-expert-overlap: beside the dispatch and combine
            if hides is not None:
                busy = t.fwd_s * (1 + share) + t.bwd_s
                self.overlap_compute[hides] = self.overlap_compute.get(hides, 0.0) + busy
            self._edges(op, layout, share, inputs)
            self._saved(op, layout, saves)
            if self.regions and op.name in self.regions:
                self._region_inputs(op, layout, inputs)
            if mms and not share and 0 <= op.layer < layers:
                kept += self._outputs(op, layout)
                kept_ops.append(op)
            if op.kind == "cross_entropy":
                ev = self.ev
                self.logits += ev.tensors[op.inputs[0]].numel / ev.in_layout(op, layout, 0).factor(ev.mesh)
        self.saved_total = sum(self.saved.values())
        # Megatron's fine-grained offloading (``cost.offload``): the saved bytes that go to host memory
        # (none under full recomputation: the layer's forward runs without saving, its input alone is kept)
        offloads = self.train.stack.offload_modules and self.in_layer and recompute != "full"
        self.offloaded = self._offloaded() if offloads else 0.0
        self.largest = max(self.saved.values(), default=0.0)  # its largest saved activation
        self._kept(recompute, kept, kept_ops)
        self.bwd = self.compute - self.fwd + self.recompute
        self._overlap()
        return self

    def _outputs(self, op, layout) -> float:
        """Local bytes of ``op``'s outputs (and of what its kernel saves besides, the attention's log-sum-exp)."""
        ev = self.ev
        out = sum(ev.tensors[t].nbytes / ev.factor(ev.out_layout(op, layout, i, partial=False))
                  for i, t in enumerate(op.outputs))
        return out + ev.extra_saved(op, layout, self.train.stack.loss)

    def _offloaded(self) -> float:
        """Bytes of what the layer saves that its offloaded modules' inputs are (``Stack.offload_modules``,
        ``cost.offload``): each saved tensor once (with its FP8 copy), none of fewer local elements than
        ``offload.MIN_OFFLOADED_ELEMENTS``; a tensor backward does not keep (recomputed) is not offloaded."""
        ev, named = self.ev, set(self.train.stack.offload_modules)
        cfg, mla = ev.graph.meta["config"], bool(ev.graph.meta["config"].kv_latent)
        out, seen = 0.0, set()
        for op in self.ops:
            if offload.module_of(position(op), op, cfg.is_moe_layer(op.layer), mla) not in named:
                continue
            for idx, tname in enumerate(op.inputs):
                prod = self.producer(tname)
                if (op.attr("core") and prod is not None and prod.attr("core")) or tname in seen:
                    continue  # (the attention core's own intermediates are not its inputs)
                seen.add(tname)
                elements = ev.tensors[tname].numel / ev.in_layout(op, self.layout(op), idx).factor(ev.mesh)
                if elements >= offload.MIN_OFFLOADED_ELEMENTS:
                    out += self.saved.get(tname, 0.0) + self.saved.get(f"{tname}#fp8", 0.0)
        return out

    def _kept(self, recompute: str, kept: float, kept_ops=()):
        """What a layer keeps from its forward to its backward (``kept``) and what its backward's recomputation
        brings back at once (``rematerialised``), read by ``cost.memory`` under torchtitan's checkpointing: per
        op, the layer's input and the kept ops' outputs, and the rest of what the layer would save (what it saves
        but its input and the kept outputs it saves: torch.utils.checkpoint re-runs the whole block's forward at
        its first unpack, early_stop False in torchtitan, and the kept outputs come out of the policy's cache);
        every N-th layer whole, 1/N of the layer input and (N - 1)/N of what a layer saves, and a whole layer's
        set but its input (kept by the checkpoint)."""
        every = layer_every(recompute)
        if every:
            self.kept = self.layer_input / every + self.saved_total * (every - 1) / every
            self.rematerialised = max(self.saved_total - self.layer_input, 0.0)
        elif recompute == SAC_OP:
            self.kept = self.layer_input + kept
            cached = sum(self.saved.get(t, 0.0) for op in kept_ops for t in op.outputs) \
                + sum(self.saved.get(f"{op.name}#extra", 0.0) for op in kept_ops)
            self.rematerialised = max(self.saved_total - self.layer_input - cached, 0.0)
        elif self.regions is not None:  # Megatron's modules: one region re-runs at a time (the attention core's
            self.kept = self.saved_total  # is not counted, as under selective)
            self.rematerialised = max((b for (_, m, _), b in self.region_bytes.items() if m != "core_attn"),
                                      default=0.0)
        else:
            self.kept, self.rematerialised = self.saved_total, 0.0

    @property
    def seconds(self) -> float:
        """What the segment adds to its stage's time per micro-batch."""
        return self.compute + self.recompute + sum(self.comm.values())

    def _overlap(self):
        """Exposed communication per category. Transformer Engine overlaps tensor-parallel
        collectives (``TP_OVERLAPPED``: sequence parallelism's; an all-reduce stays exposed) with the GEMMs they
        feed or follow, split in ``TP_OVERLAP_SPLITS`` chunks of which the first cannot be hidden; ring context
        parallelism exchanges the next key/value block while attention runs on this one (all-to-alls into and
        out of the attention core are exposed: ``APART``). What is hidden still
        takes its share of the compute (``engine.hidden``). Under ``moe_ep_overlap`` the expert dispatch and
        combine of the 1F1B steady state run beside the paired micro-batch's compute of the layer
        (``cost.moe.ep_overlap_share``). Other communication is exposed."""
        self.raw_comm = dict(self.comm)
        share = self.ev.eff.end_to_end.comm_sm_fraction  # the compute a collective beside it takes (engine.hidden)
        tp = self.comm.get("tp_comm", 0.0)
        over = min(self.apart.get("tp_comm", 0.0), tp)
        if over and tp_overlapped(self.train):
            gemm = self.overlap_compute.get("tp_comm", 0.0)
            self.comm["tp_comm"] = tp - over + max(over / TP_OVERLAP_SPLITS, hidden(over, gemm, share))
        cp = self.comm.get("cp_comm", 0.0)
        if cp:  # (all-to-alls run before and after the attention core, not beside it)
            exposed = min(self.apart.get("cp_comm", 0.0), cp)
            self.comm["cp_comm"] = exposed + hidden(cp - exposed, self.overlap_compute.get("cp_comm", 0.0), share)
        ep = self.comm.get("ep_comm", 0.0)
        if ep and self.overlap_compute.get("ep_comm"):
            self.comm["ep_comm"] = hidden(ep, self.overlap_compute["ep_comm"], share)
        if ep and self.moe and self.train.stack.moe_ep_overlap:  # beside the paired micro-batch's compute (cost.moe)
            f = moe.ep_overlap_share(self.train)
            self.comm["ep_comm"] = f * hidden(ep, self.compute + self.recompute, share) + (1.0 - f) * ep

    def _load(self, op, layout) -> float:
        """The load factor (``cost.moe.load_factor``) of expert op ``op`` under ``layout`` (its layout in this
        segment): once per op, as its time, its saved buffers and its dispatch edges all read it."""
        hit = self._loads.get(op.name)
        if hit is None:
            ev = self.ev
            hit = self._loads[op.name] = moe.op_load_factor(self.train, op, local_sizes(op, layout, ev.mesh),
                                                            ev.graph.meta["config"].experts)
        return hit

    def _edge_seconds(self, seconds, colls, op, prod) -> float:
        """An ``ep_comm`` edge's seconds under the MoE options (``cost.moe.edge_seconds``): the
        dispatcher's, times the load of the expert op at its end."""
        if not self.moe:
            return seconds
        experts = self.ev.expert_ops
        expert = op if op.name in experts else prod
        load = self._load(expert, self.layout(expert)) if expert.name in experts else 1.0
        return moe.edge_seconds(seconds, colls, self.ev, self.train, load)

    def _edges(self, op, layout, share, inputs):
        """The op's own collectives and its inputs' redistributions (again for the ``share`` of its forward
        that backward re-runs), and its input gradients'."""
        ev = self.ev
        category = _CATEGORY_BY_KIND.get(op.kind, "tp_comm")
        intra = intra_collectives(op, layout, ev.mesh)
        if intra:
            self.add_comm("tp_comm", intra, collectives_time(intra, ev.mesh, ev.levels, ev.eff), 1.0 + share)
        charged, layouts = self.charged, self.layouts
        for slot, tname, prod, pslot, grad in inputs:
            if tname in self.cross_stage:
                continue  # pipeline boundaries are point-to-point, charged per step
            playout = layouts.get(prod.name, REPLICATED)
            dst = ev.in_layout(op, layout, slot)
            cat = "ep_comm" if prod.kind == "moe_dispatch" else category
            # consumers that need the same layout share one collective (Q, K and V projections
            # read one gathered input; their partial input gradients add up before one reduction)
            if (tname, dst) not in charged:
                charged.add((tname, dst))
                seconds, colls = ev.edge(ev.out_layout(prod, playout, pslot, partial=True), dst, tname)
                if colls:
                    if cat == "ep_comm":
                        seconds = self._edge_seconds(seconds, colls, op, prod)
                    self.add_comm(_ulysses_out(prod, colls) or cat, colls, seconds, 1.0 + share)
            if grad:
                gsrc = ev.in_layout(op, layout, slot, grad=True)
                if (tname, gsrc, "grad") in charged:
                    continue
                charged.add((tname, gsrc, "grad"))
                seconds, colls = ev.edge(gsrc, ev.out_layout(prod, playout, pslot, partial=False), tname)
                if colls:
                    if cat == "ep_comm":
                        seconds = self._edge_seconds(seconds, colls, op, prod)
                    self.add_comm(_ulysses_out(prod, colls) or cat, colls, seconds)

    def _region_inputs(self, op, layout, inputs):
        """Under Megatron's modules, what op ``op`` of a checkpointed region adds: the region keeps its inputs from
        outside it (``tensor_parallel.checkpoint`` and CheckpointWithoutOutput save them), as produced, unless an
        output-discarding region produced them (freed there); its re-run brings back its ops' outputs."""
        ev, regions = self.ev, self.regions
        region = regions[op.name][0]
        self.region_bytes[region] = self.region_bytes.get(region, 0.0) + self._outputs(op, layout)
        for _slot, tname, prod, pslot, _grad in inputs:
            outer = regions.get(prod.name)
            if (outer is not None and (outer[0] == region or outer[2])) or tname in self.saved:
                continue
            view = ev.out_layout(prod, self.layout(prod), pslot, partial=False)
            self.saved[tname] = ev.tensors[tname].nbytes / view.factor(ev.mesh)

    def _saved(self, op, layout, saves):
        ev = self.ev
        # selective recomputation re-runs the attention core: of its ops' saved tensors only the
        # region's inputs (Q, K, V) stay, what the core produces itself is recomputed
        selective = self.train.recompute == "selective" and bool(op.attr("core")) and self.in_layer
        # Megatron's modules (``cost.recompute``): a region's ops keep only what comes from outside the region, and
        # what an output-discarding region produced is freed whoever saved it
        regions = self.regions or {}
        region = regions.get(op.name)
        engine, regather = self.engine, self.engine.keeps_sp_shard
        fp8 = self.train.fp8 is not None and fp8_gemm(op)
        # the most-loaded rank's buffers
        load = self._load(op, layout) if self.moe and op.name in ev.expert_ops else 1.0
        for io, idx, tname, tbytes, prod, pslot in saves:
            keeps = moe.saved_scale(op, io, idx, engine)  # what the engine keeps of it (the MoE combine's, cost.moe)
            if not keeps:
                continue
            view = ev.in_layout(op, layout, idx) if io == "in" else ev.out_layout(op, layout, idx, partial=False)
            nbytes = tbytes / ev.factor(view) * keeps
            if selective and (io == "out" or (prod is not None and prod.attr("core"))):
                continue
            if regions:
                origin = regions.get(prod.name) if prod is not None else None
                if (origin is not None and origin[2]) or (region is not None and (
                        io == "out" or (origin is not None and origin[0] == region[0]))):
                    continue
            # (not the permuted tokens: Megatron's dispatcher gathers them over expert-TP itself, outside the grouped
            # GEMM, which keeps the whole gathered input; NVIDIA/Megatron-LM@d98e8a64 moe/token_dispatcher.py
            # dispatch_postprocess L741-750, extensions/transformer_engine.py TEGroupedLinear L2459-2475)
            if prod is not None and io == "in" and tname not in self.cross_stage and prod.kind != "moe_dispatch":
                pview = ev.out_layout(prod, self.layout(prod), pslot, partial=False)
                pbytes = tbytes / ev.factor(pview)
                if regather and pbytes < nbytes and (tname, view, "saved") not in self.charged:
                    # keep the smaller shard and gather it again in backward (Megatron-SP)
                    self.charged.add((tname, view, "saved"))
                    _, colls = ev.edge(pview, view, tname)
                    gathers = tuple(c for c in colls if c.kind == "all_gather")
                    self.add_comm(_CATEGORY_BY_KIND.get(op.kind, "tp_comm"), gathers,
                                  collectives_time(gathers, ev.mesh, ev.levels, ev.eff))
                if regather and pbytes < nbytes:
                    nbytes = pbytes
            if fp8 and io == "in" and region is None:  # an FP8 GEMM keeps its own FP8 copy of the input
                # (cost.precision; a checkpointed region keeps the input itself)
                tname, nbytes = f"{tname}#fp8", nbytes * RECIPES[self.train.fp8].saved_fraction
            nbytes *= load
            prev = self.saved.get(tname)
            if prev is None or nbytes < prev:
                self.saved[tname] = nbytes
        extra = 0.0 if selective or region is not None else ev.extra_saved(op, layout, self.train.stack.loss)
        if extra:
            self.saved[f"{op.name}#extra"] = extra
        if self.eager_swiglu and op.attr("fn") == "swiglu" and not selective and region is None:
            # eager PyTorch keeps the silu's output as well, an output-sized tensor (``Engine.unfused_swiglu``)
            view = ev.out_layout(op, layout, 0, partial=False)
            self.saved[f"{op.name}#silu"] = ev.tensors[op.outputs[0]].nbytes / ev.factor(view) * load
        if self.in_layer and op.inputs and not self.layer_input:
            # the residual stream entering the layer: what full recomputation keeps (an input
            # from outside the segment; a repeated skeleton layer's comes from its own copy)
            x = op.inputs[0]
            prod = self.producer(x)
            if prod is not None and (prod.layer != op.layer or x in self.ext_producer):
                v = ev.out_layout(prod, self.layout(prod), out_slot(prod, x), partial=False)
                self.layer_input = ev.tensors[x].nbytes / ev.factor(v)
