"""The pipeline: the stages' share of the mesh (``split_mesh``), the sums of the segments on one
stage (``Stage``), and what the 1F1B schedule adds to them: the fill-and-drain bubble, the
stage-boundary transfers and the micro-batches a stage holds in flight. And the layer split: the
split that balances the ranks' time (``balanced_split``), and Megatron's text form of a split
(``layout_string``, ``parse_layout``: --pipeline-model-parallel-layout).

A split is a tuple of layers per virtual stage in Megatron's layout order: virtual stage k is
chunk k // pp of pipeline rank k % pp (megatron/core/transformer/pipeline_parallel_layer_layout.py,
``PipelineParallelLayerLayout.__init__``); the embedding is work on virtual stage 0, the LM head
and loss on the last.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from itertools import accumulate

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
        self.layer_compute: list[tuple[float, float]] = []  # each layer's (forward, backward) compute seconds
        self.layer_offloaded: list[float] = []  # each layer's saved bytes its offloaded modules send to the host
        # per model chunk of the rank (interleaved schedule): its layers' saved bytes, inputs and what they keep
        # under torchtitan's checkpointing, per micro-batch (``held_activations``); empty under 1F1B
        self.chunk_saved: list[float] = []
        self.chunk_inputs: list[float] = []
        self.chunk_kept: list[float] = []
        self.layer_inputs = 0.0
        # under torchtitan's checkpointing (``Segment._kept``): what the layers keep from forward to backward,
        # and the most one layer's recomputation brings back at once
        self.layer_kept = self.rematerialised = 0.0
        self.other_saved = 0.0
        self.layer_state = 0.0  # params + grads + optimizer of the transformer layers only
        self.ties: set[str] = set()
        self.units: list[Unit] = []
        self.params: list[tuple[Params, int]] = []
        self.unsharded = 0.0  # the largest unit's gathered parameters
        self.unit_grads = 0.0  # the largest unit's gradients entering their reduction (bytes, unsharded)
        self.logits = 0.0  # local logit elements of the stage's loss (``cost.memory``)
        self.largest = 0.0  # the largest saved activation of one of its layers
        # where the peak is placed in time (``Engine.timed_peak``): the largest layer unit's gathered parameters,
        # the gathered parameters of the units holding the loss, the layers' gradients (bytes, as ``static``) and
        # the activations the segments holding the loss save
        self.layer_unsharded = self.loss_unsharded = self.layer_grads = self.loss_saved = 0.0
        self.groups: set = set()  # mesh axes of the groups its collectives run over
        # under quantized parameters (``TrainConfig.lowp_params``): the quantized weight copies resident, and the
        # most beside one gathered unit (``cost.memory``'s ``fp8_weights``)
        self.copies = self.unit_copies = 0.0
        self.bf16_params = 0.0  # resident weights of the layers kept in BF16 (``TrainConfig.bf16_span``): no copies
        self.local_experts = 0  # the local experts of its MoE layers, summed (``EndToEnd.expert_s``)

    def add(self, seg: Segment, params: Params, times: int = 1):
        """``times`` identical layers with this segment and these parameters."""
        self.add_params(params, times, seg)
        self.compute += seg.compute * times
        self.recompute += seg.recompute * times
        merge(self.comm, seg.comm, times)
        merge(self.bytes, seg.bytes, times)
        self.logits += seg.logits * times
        self.groups |= seg.groups
        if seg.logits:
            self.loss_unsharded = max(self.loss_unsharded, params.unsharded)
            self.loss_saved += seg.saved_total * times
        if seg.in_layer:
            self.local_experts += seg.local_experts * times
            self.layer_unsharded = max(self.layer_unsharded, params.unsharded)
            self.layer_grads += params.static["grads"] * times
            self.largest = max(self.largest, seg.largest)
            self.layer_state += params.total * times
            self.layer_saved += [seg.saved_total] * times
            self.layer_compute += [(seg.fwd, seg.bwd)] * times
            self.layer_offloaded += [seg.offloaded] * times
            self.layer_inputs += seg.layer_input * times
            self.layer_kept += seg.kept * times
            self.rematerialised = max(self.rematerialised, seg.rematerialised)
        else:
            self.other_saved += seg.saved_total * times

    def add_to_chunk(self, seg: Segment, chunk: int, vpp: int):
        """One layer of segment ``seg`` in the rank's model chunk ``chunk`` (of ``vpp``)."""
        if not self.chunk_saved:
            self.chunk_saved, self.chunk_inputs, self.chunk_kept = [0.0] * vpp, [0.0] * vpp, [0.0] * vpp
        self.chunk_saved[chunk] += seg.saved_total
        self.chunk_inputs[chunk] += seg.layer_input
        self.chunk_kept[chunk] += seg.kept

    def add_params(self, params: Params, times: int = 1, seg: Segment | None = None):
        for k, v in params.static.items():
            self.static[k] += v * times
        self.other_sync += params.other_s * times
        self.opt_time += params.opt_time * times
        fwd, bwd = (seg.fwd, seg.bwd) if seg is not None else (0.0, 0.0)
        self.units.append(params.unit(times, fwd, bwd))
        self.params.append((params, times))
        self.unsharded = max(self.unsharded, params.unsharded)
        self.copies += params.copies * times
        self.bf16_params += params.bf16_bytes * times
        self.unit_copies = max(self.unit_copies, params.gathered_copies)
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
    """Seconds and bytes of one stage-boundary transfer (per micro-batch, one direction): the
    first boundary between two transformer layers (the residual stream every boundary of an
    even pipeline sends), else the first boundary at all (the embedding's output where the
    first stage holds only the embedding).

    Megatron's scatter-gather optimisation: the devices holding identical copies of the
    boundary activation each send a distinct slice across the pipeline link, and the receivers
    all-gather the slices over their replica axes. ``ev``: the evaluator; ``stage``: the stage of
    each layer index (``Evaluator.stage_of``).
    """
    layers = ev.graph.meta["layers"]
    found = None
    for _, _ops, external, layer, repeated in ev.segments:
        for tname, prod in external:
            src = layer - 1 if repeated else prod.layer
            if stage[src] == stage[layer]:
                continue
            if src >= 0 and layer < layers:
                return _transfer(ev, prod, tname, layouts)
            found = found or (prod, tname)
    return (0.0, 0.0) if found is None else _transfer(ev, *found, layouts)


def _transfer(ev, prod, tname, layouts) -> tuple[float, float]:
    """Seconds and bytes of sending ``tname`` (produced by ``prod``) across the pipeline link."""
    view = ev.out_layout(prod, layouts.get(prod.name, REPLICATED), out_slot(prod, tname), partial=False)
    local = ev.tensors[tname].nbytes / view.factor(ev.mesh)
    used = {a for ax in view.axes for a in ax}
    replicas = tuple(a for a in range(len(ev.mesh)) if a not in used)
    r = ev.mesh.size(replicas)
    lvl = ev.levels[max(a.level for a in ev.pp_axes)]
    seconds = lvl.latency + local / r / (lvl.bandwidth * ev.eff.link_gather)
    if replicas:
        seconds += ev.coll_time("all_gather", local, replicas)
    return seconds, local / r


def inflight(s: int, train: TrainConfig) -> float:
    """Micro-batches (of the stage's layers) whose activations pipeline rank ``s`` holds at once, of one pipeline
    schedule (``TrainConfig.schedule_steps``): the forwards it runs before its first backward and the steady state's
    one more: pp - s micro-batches under 1F1B (megatron/core/pipeline_parallel/schedules.py
    ``get_pp_rank_microbatches``: pp - s - 1 warm-up); under the interleaved schedule its warm-up model chunks
    (``TrainConfig.warmup_chunks``) and one more, each 1/vpp of the rank's layers (the chunks taken alike): pp +
    (pp - 1) / vpp micro-batches on the first rank, ((vpp - 1) pp + 1) / vpp on the last (until the twelfth session
    every rank but the first was counted as under 1F1B: the last held 1). At most every micro-batch of the
    schedule."""
    pp, m, v = train.pp, train.schedule_steps, train.vpp
    if v > 1:
        return min(m * v, train.warmup_chunks(s) + 1) / v
    return min(m, pp - s)


def _entry_chunk(i: int, pp: int, v: int, m: int) -> int:
    """The model chunk of the ``i``-th forward of Megatron's interleaved schedule table (groups of pp micro-batches,
    the last group the micro-batches left, each group through chunks 0, 1, ..., v - 1; megatron/core/
    pipeline_parallel/schedules.py ``get_schedule_table``); its backwards run in the same order, chunks reversed."""
    full = (m // pp) * v * pp
    if i < full:
        return (i % (v * pp)) // pp
    return (i - full) // (m - (m // pp) * pp)


def chunk_inflight(s: int, train: TrainConfig, weights: list[float] | None = None) -> list[int] | list[float]:
    """Per model chunk of pipeline rank ``s`` (its virtual stages s, s + pp, ...), the micro-batches of it the rank
    holds where it holds the most: under 1F1B one chunk, ``inflight``'s. Under the interleaved schedule the rank runs
    ``TrainConfig.warmup_chunks`` forwards, then a forward and a backward per step (the table's order,
    ``_entry_chunk``); with ``weights`` (bytes per micro-batch of each chunk) the step whose held chunks weigh the
    most, else (or where they weigh alike) the first step's, which holds the most chunks: on the first rank 2 pp - 1
    of chunk 0 and pp of each other, on the last pp of every chunk but the last and one of the last. A heavier first
    chunk peaks later, once backwards have freed last chunks that forwards replace with first ones. While every
    group is whole the steps repeat every vpp x pp, so those are enough."""
    pp, m, v = train.pp, train.schedule_steps, train.vpp
    if v == 1:
        return [inflight(s, train)]
    total = m * v
    first = min(total, train.warmup_chunks(s) + 1)  # forwards held at the first step
    counts = [0] * v
    for i in range(first):
        counts[_entry_chunk(i, pp, v, m)] += 1
    if weights is None or len(set(weights)) <= 1:
        return counts
    best, held = list(counts), sum(w * n for w, n in zip(weights, counts))
    top, steps = held, total - first  # (the steps that run a forward after a backward)
    for t in range(1, (steps if m % pp else min(steps, v * pp)) + 1):
        out, enter = v - 1 - _entry_chunk(t - 1, pp, v, m), _entry_chunk(first + t - 1, pp, v, m)
        counts[out] -= 1
        counts[enter] += 1
        held += weights[enter] - weights[out]
        if held > top:
            top, best = held, list(counts)
    return best


def held_activations(s: int, train: TrainConfig, acts: list[float], total: float, first: float = 0.0,
                     last: float = 0.0) -> tuple[float, float, list]:
    """Activation bytes rank ``s`` holds where it holds the most: of its transformer layers, and of the ops before
    and after them (the embedding's ``first``, on the first model chunk, and the loss's ``last``, on the last);
    and the micro-batches of each model chunk it holds then (``chunk_inflight``).
    ``acts``: per model chunk, its layers' bytes per micro-batch in their proportions (empty under 1F1B), scaled to
    ``total``, the rank's layers' bytes per micro-batch; each chunk counts the micro-batches of it in flight
    (``chunk_inflight``). Where the chunks weigh alike, the layers' ``total`` times ``inflight``, as every chunk was
    taken until the fifteenth session (which miscounted uneven layouts: Megatron's first rank holds its chunk 0
    2 pp - 1 times, its others pp, and a heavier chunk 0 more than that later in its steady state)."""
    if train.vpp == 1 or not acts or not sum(acts):
        n = chunk_inflight(s, train)
        return total * inflight(s, train), first * n[0] + last * n[-1], n
    scaled = [a * total / sum(acts) for a in acts]
    weights = [a + (first if c == 0 else 0.0) + (last if c == len(acts) - 1 else 0.0) for c, a in enumerate(scaled)]
    n = chunk_inflight(s, train, weights)
    layers = total * inflight(s, train) if len(set(acts)) <= 1 else sum(k * a for k, a in zip(n, scaled))
    return layers, first * n[0] + last * n[-1], n


def rank_seconds(seconds: dict[int, float], counts: tuple[int, ...], pp: int) -> list[float]:
    """Seconds per micro-batch of each pipeline rank under the split ``counts`` (layers per
    virtual stage), from ``seconds`` per layer index (``Evaluator.layer_seconds``: -1 the
    embedding, ``layers`` the head and loss)."""
    layers = sum(counts)
    w = [seconds.get(i, 0.0) for i in range(layers)]
    out, start = [0.0] * pp, 0
    for k, c in enumerate(counts):
        out[k % pp] += sum(w[start:start + c])
        start += c
    out[0] += seconds.get(-1, 0.0)
    out[(len(counts) - 1) % pp] += seconds.get(layers, 0.0)
    return out


def balanced_split(seconds: dict[int, float], layers: int, pp: int, vpp: int = 1) -> tuple[int, ...]:
    """The layers per virtual stage (pp x vpp, Megatron's layout order) that balance the pipeline
    ranks' time per micro-batch: the step pays micro-batches x the slowest rank, the bubble the
    mean (``bubble``), which no split changes. ``seconds``: per layer index, with the embedding
    (-1) and the head and loss (``layers``) as work on the first and last virtual stage
    (Megatron's account_for_embedding/loss_in_pipeline_split, weighed by their time).

    The items (embedding, layers, head) are cut into pp x vpp contiguous virtual stages, none
    empty (a stage may hold the embedding or the head alone): the cut whose slowest stage is
    fastest (bisection on that time with a greedy fill), optimal without interleaving (to a
    hundredth of a layer), filled from the last stage so that the slack goes to the first stages,
    which hold the most micro-batches in flight. With interleaving a rank sums vpp stages:
    single-layer moves across stage boundaries then balance the sums, sweep after sweep, while
    they lower the slowest rank or, at an equal slowest rank, the sum of squares of the ranks'
    times (spreading the slack).

    >>> balanced_split({-1: 0.0, 0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 2.0}, 6, 2)
    (4, 2)
    """
    chunks = pp * vpp
    if chunks == 1:
        return (layers,)
    if chunks > layers + 2:
        raise PlanError(f"pp*vpp = {chunks} virtual stages exceed the {layers} layers and the embedding and loss "
                        "stages; choose a smaller vpp")
    w = [seconds.get(-1, 0.0)] + [seconds.get(i, 0.0) for i in range(layers)] + [seconds.get(layers, 0.0)]
    if vpp > 1:
        ends = _balance_ranks(w, _min_max_cut(w, chunks), pp)
    else:  # filled from the last stage back: the slack goes to the first stages, which hold the
        # most micro-batches in flight under 1F1B (``inflight``)
        ends = [len(w) - e for e in reversed(_min_max_cut(w[::-1], chunks)[:-1])] + [len(w)]
    bounds = [0] + ends
    counts = [bounds[k + 1] - bounds[k] for k in range(chunks)]
    counts[0] -= 1  # the embedding
    counts[-1] -= 1  # the head and loss
    return tuple(counts)


def _min_max_cut(w: list[float], chunks: int) -> list[int]:
    """End indices of ``chunks`` contiguous non-empty groups of the items ``w`` whose largest sum
    is least, to a hundredth of an item: the least feasible bound by bisection (feasible: a
    greedy fill, group ends found on the prefix sums, needs at most ``chunks`` groups; the bound
    lies between the mean group and the mean plus the largest item), then the greedy fill at
    that bound, closing groups early where the rest must still give one item to each group left."""
    prefix = list(accumulate(w, initial=0.0))
    n, total, top = len(w), prefix[-1], max(w)

    def fill(bound: float) -> list[int]:
        ends, at = [], 0
        while at < n and len(ends) < chunks:
            left = chunks - len(ends) - 1  # groups still to open after this one
            end = bisect_right(prefix, prefix[at] + bound, at + 1) - 1
            end = min(max(end, at + 1), n - left)
            ends.append(end)
            at = end
        return ends if at == n else []

    lo, hi = max(top, total / chunks), total / chunks + top
    while hi - lo > 1e-2 * top:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fill(mid) else (mid, hi)
    return fill(hi)


def _balance_ranks(w: list[float], ends: list[int], pp: int) -> list[int]:
    """Move single items across the boundaries of the groups ending at ``ends`` (group k on rank
    k % pp), sweep after sweep, where a move lowers the slowest rank or, at an equal slowest
    rank, the sum of squares of the ranks' times; every group keeps an item."""
    chunks = len(ends)
    ranks = [0.0] * pp
    start = 0
    for k, e in enumerate(ends):
        ranks[k % pp] += sum(w[start:e])
        start = e
    tol = 1e-12 * sum(ranks)
    moved_any = True
    for _ in range(len(w)):  # (each sweep moves a layer at least once; a layer crosses few boundaries)
        if not moved_any:
            break
        moved_any = False
        top = max(ranks)
        for k in range(chunks - 1):
            a, b = k % pp, (k + 1) % pp
            lo = ends[k - 1] if k else 0
            for step in (-1, 1):
                e = ends[k] + step
                if e <= lo or e >= ends[k + 1]:
                    continue
                # -1: group k's last item joins group k + 1; +1: group k + 1's first joins group k
                moved = w[ends[k] - 1] if step == -1 else -w[ends[k]]  # seconds rank b gains, rank a loses
                ra, rb = ranks[a] - moved, ranks[b] + moved
                if max(ra, rb) > top + tol:
                    continue
                new_top = top if max(ranks[a], ranks[b]) < top - tol else max(ra, rb, *(
                    r for i, r in enumerate(ranks) if i not in (a, b)))
                gain = ranks[a] ** 2 + ranks[b] ** 2 - ra * ra - rb * rb  # the fall in the sum of squares
                if new_top < top - tol or gain > tol * top:
                    ends[k], ranks[a], ranks[b], top, moved_any = e, ra, rb, new_top, True
    return ends


def layout_string(counts: tuple[int, ...]) -> str:
    """A split (layers per virtual stage) as Megatron's --pipeline-model-parallel-layout: stages
    separated by ``|``, ``E`` the embedding (first), ``t`` a transformer layer, ``L`` the loss
    (last), ``t*n`` n layers, ``(...|)*n`` a repeated run of stages, ``,`` cosmetic
    (``PipelineParallelLayerLayout.parse_str_to_list``).

    >>> layout_string((3, 2, 2, 2, 1))
    'Et*3|(t*2|)*3,tL'
    """
    last = len(counts) - 1
    stages = [("E" if k == 0 else "") + ("t" * c if c < 2 else f"t*{c}") + ("L" if k == last else "")
              for k, c in enumerate(counts)]
    runs: list[list] = []
    for st in stages:
        if runs and runs[-1][0] == st:
            runs[-1][1] += 1
        else:
            runs.append([st, 1])
    out = []
    for i, (st, n) in enumerate(runs):
        tail = i == len(runs) - 1
        if n > 1 and not (tail and n == 2):
            reps = n - 1 if tail else n
            out.append(f"({st}|)*{reps}," + (st if tail else ""))
        else:
            out.append("|".join([st] * n) + ("" if tail else "|"))
    return "".join(out)


def parse_layout(text: str, pp: int, layers: int) -> tuple[int, ...]:
    """Megatron's --pipeline-model-parallel-layout as a split (layers per virtual stage), with
    the checks Megatron-LM makes at launch (arguments.py: the stages divide by pp;
    ``PipelineParallelLayerLayout.validate_layer_layout``: the embedding first and once, the loss
    last and once, as many ``t`` as layers); ``m`` (multi-token prediction) layers are not part
    of the models planned here. A one-line PlanError naming the fix otherwise.

    >>> parse_layout("Et*3|(tt|)*29,|L", 16, 61)[-3:]  # DeepSeek-V3's, its MTP stage left empty
    (2, 0, 0)
    """
    flat = text.replace(",", "").replace(" ", "")
    flat = re.sub(r"\(([^)]+)\)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), flat)
    flat = re.sub(r"(.)\*(\d+)", lambda g: g.group(1) * int(g.group(2)), flat)
    stages = flat.split("|")
    bad = set(flat) - set("ELtm|")
    fix = "; write it as Megatron does, e.g. 'Et*3|(tt|)*29,t|L'"
    if bad:
        raise PlanError(f"pipeline layout {text!r}: unknown layer character(s) {''.join(sorted(bad))} (E embedding, "
                        f"t transformer layer, L loss){fix}")
    if "m" in flat:
        raise PlanError(f"pipeline layout {text!r}: the model has no multi-token-prediction (m) layers; drop them")
    if len(stages) % pp:
        raise PlanError(f"pipeline layout {text!r} has {len(stages)} stages, not a multiple of pp={pp}{fix}")
    if flat.count("E") != 1 or not flat.startswith("E"):
        raise PlanError(f"pipeline layout {text!r}: the embedding E must come first, once{fix}")
    if flat.count("L") != 1 or not flat.endswith("L"):
        raise PlanError(f"pipeline layout {text!r}: the loss L must come last, once{fix}")
    counts = tuple(st.count("t") for st in stages)
    if sum(counts) != layers:
        raise PlanError(f"pipeline layout {text!r} holds {sum(counts)} transformer layers, the model {layers}")
    return counts


def ends_split(first: int | None, last: int | None, layers: int, pp: int, vpp: int = 1) -> tuple[int, ...]:
    """Megatron's --decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers as a
    split (layers per virtual stage): the named ranks hold those layers, the others an equal share
    of the rest, each rank's layers in vpp equal chunks; with the checks Megatron-core's
    TransformerConfig makes at launch (each > 0 and divisible by vpp, the rest divisible by the
    middle ranks and theirs by vpp).

    >>> ends_split(5, 2, 61, 8)
    (5, 9, 9, 9, 9, 9, 9, 2)
    """
    ranks = [None] * pp
    rest, middle = layers, pp
    for idx, count, what in ((0, first, "first"), (pp - 1, last, "last")):
        if count is None:
            continue
        if count <= 0 or count % vpp:
            raise PlanError(f"{what} stage layers {count} must be > 0 and divisible by vpp={vpp} (Megatron-core's "
                            "TransformerConfig)")
        ranks[idx] = count
        rest, middle = rest - count, middle - 1
    if middle and (rest <= 0 or rest % middle or (rest // middle) % vpp):
        raise PlanError(f"the {rest} layers left for the {middle} middle stages must divide evenly, into vpp={vpp} "
                        "chunks each (Megatron-core's TransformerConfig); choose other first/last counts")
    if not middle and rest:
        raise PlanError(f"first and last stage layers must sum to the {layers} layers with pp={pp}")
    ranks = [rest // middle if r is None else r for r in ranks]
    return tuple(ranks[k % pp] // vpp for k in range(pp * vpp))

