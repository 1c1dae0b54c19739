"""The pipeline: the stages' share of the mesh (``split_mesh``), the sums of the segments on one
stage (``Stage``), and what the 1F1B schedule adds to them: the fill-and-drain bubble, the
stage-boundary transfers and the micro-batches a stage holds in flight."""

from __future__ import annotations

from symtensor.cost.engine import Unit
from symtensor.cost.params import Params
from symtensor.cost.segment import Segment, out_slot
from symtensor.cost.train import TrainConfig
from symtensor.errors import PlanError
from symtensor.hardware import Cluster, Mesh, prime_factors
from symtensor.layout import REPLICATED


def split_mesh(cluster: Cluster, pp: int):
    """Take the pipeline axes from the outermost levels; return (stage mesh, pipeline axes)."""
    mesh = list(cluster.mesh())
    need = prime_factors(pp) if pp > 1 else []
    if cluster.n_devices % pp:
        raise PlanError(f"pp={pp} does not divide the {cluster.n_devices} devices")
    taken = []
    for p in need:
        idx = next((i for i, a in enumerate(mesh) if a.size == p), None)
        if idx is None:
            raise PlanError(f"pp={pp} cannot be laid on the mesh {[a.size for a in cluster.mesh()]}")
        taken.append(mesh.pop(idx))
    return Mesh(mesh), Mesh(taken)


class Stage:
    """Sums of the segments on one pipeline stage, and its units in layer order (the engine's
    overlap works unit by unit)."""

    def __init__(self):
        self.compute = self.recompute = self.other_sync = self.opt_time = 0.0
        self.comm: dict[str, float] = {}
        self.bytes: dict[str, float] = {}
        self.static = dict(params=0.0, grads=0.0, optimizer=0.0)
        self.layer_saved: list[float] = []
        self.layer_inputs = 0.0
        self.other_saved = 0.0
        self.layer_state = 0.0  # params + grads + optimizer of the transformer layers only
        self.ties: set[str] = set()
        self.units: list[Unit] = []
        self.params: list[tuple[Params, int]] = []
        self.unsharded = 0.0  # the largest unit's gathered parameters
        self.unit_grads = 0.0  # the largest unit's gradients entering their reduction (bytes, unsharded)
        self.logits = 0.0  # local logit elements of the stage's loss (``cost.memory``)
        self.largest = 0.0  # the largest saved activation of one of its layers
        self.groups: set = set()  # mesh axes of the groups its collectives run over

    def add(self, seg: Segment, params: Params, times: int = 1):
        """``times`` identical layers with this segment and these parameters."""
        self.add_params(params, times, seg)
        self.compute += seg.compute * times
        self.recompute += seg.recompute * times
        merge(self.comm, seg.comm, times)
        merge(self.bytes, seg.bytes, times)
        self.logits += seg.logits * times
        self.groups |= seg.groups
        if seg.in_layer:
            self.largest = max(self.largest, seg.largest)
            self.layer_state += params.total * times
            self.layer_saved += [seg.saved_total] * times
            self.layer_inputs += seg.layer_input * times
        else:
            self.other_saved += seg.saved_total * times

    def add_params(self, params: Params, times: int = 1, seg: Segment | None = None):
        for k, v in params.static.items():
            self.static[k] += v * times
        self.other_sync += params.other_s * times
        self.opt_time += params.opt_time * times
        fwd, bwd = (seg.fwd, seg.bwd) if seg is not None else (0.0, 0.0)
        self.units.append(params.unit(times, fwd, bwd))
        self.params.append((params, times))
        self.unsharded = max(self.unsharded, params.unsharded)
        self.unit_grads = max(self.unit_grads, params.grad_bytes)
        self.groups |= params.groups
        for tie, tparams in params.tied.items():
            if tie not in self.ties:
                self.ties.add(tie)
                self.add_params(tparams)

    def dp_bytes(self, calls: dict) -> dict:
        out: dict = {}
        for params, times in self.params:
            merge(out, params.dp_bytes(calls), times)
        return out

    @property
    def per_microbatch_s(self) -> float:
        return self.compute + self.recompute + sum(self.comm.values())


def merge(into: dict, other: dict, times: float = 1) -> None:
    """Add ``times`` x ``other`` into ``into``, key by key."""
    for k, v in other.items():
        into[k] = into.get(k, 0.0) + v * times


def bubble(per_mb: list[float], pp: int, v: int) -> float:
    """Seconds of the pipeline bubble, given each stage's seconds per micro-batch: the fill and
    drain of 1F1B pass through every stage once, so the bubble costs the mean stage, (pp - 1) / v
    times (v virtual stages per device)."""
    return (pp - 1) / v * sum(per_mb) / pp


def p2p(ev, stage: dict[int, int], layouts) -> tuple[float, float]:
    """Seconds and bytes of one stage-boundary transfer (per micro-batch, one direction).

    Megatron's scatter-gather optimisation: the devices holding identical copies of the
    boundary activation each send a distinct slice across the pipeline link, and the receivers
    all-gather the slices over their replica axes. ``ev``: the evaluator; ``stage``: the stage of
    each layer index (``Evaluator.stage_of``).
    """
    for _, _ops, external, layer, repeated in ev.segments:
        for tname, prod in external:
            if stage[layer - 1 if repeated else prod.layer] == stage[layer]:
                continue
            view = ev.out_layout(prod, layouts.get(prod.name, REPLICATED), out_slot(prod, tname), partial=False)
            local = ev.tensors[tname].nbytes / view.factor(ev.mesh)
            used = {a for ax in view.axes for a in ax}
            replicas = tuple(a for a in range(len(ev.mesh)) if a not in used)
            r = 1
            for a in replicas:
                r *= ev.mesh[a].size
            lvl = ev.levels[max(a.level for a in ev.pp_axes)]
            seconds = lvl.latency + local / r / (lvl.bandwidth * ev.eff.link_gather)
            if replicas:
                seconds += ev.coll_time("all_gather", local, replicas)
            return seconds, local / r
    return 0.0, 0.0


def inflight(s: int, train: TrainConfig) -> float:
    """Micro-batches whose activations a stage holds at once under 1F1B (interleaved: more)."""
    pp, m, v = train.pp, train.micro_steps, train.vpp
    if v > 1 and s == 0:
        return min(m, pp) * (1 + (pp - 1) / (pp * v))
    return min(m, pp - s)
