"""The adaptive recursive partitioner: the double recursion of D-Rec with SymTensor's time costs.

Objective, for one outer point (pipeline depth p, micro-batches m, recomputation, ZeRO stage):

    minimise   sum_o C_op(o, L_o) + sum_(u,v) C_edge(u, v, L_u, L_v)
    C_op   = w_o [ m (T_fwd + T_bwd + T_recompute + T_intra) + (1 - overlap) T_sync + T_optimizer
                   + lambda (M_static + inflight * M_saved) ]                 -> Problem.op_cost
    C_edge = w_e m [ T_redis_fwd (x2 under recomputation) + T_redis_bwd ]    -> Problem.edge_cost

over layouts L_o (iteration dim -> mesh axes) where every cut divides its dim (``candidates``).
w_o is how many real layers an op of the skeleton graph stands for, per pipeline stage.

The recursion (``partition``):
    for each mesh axis a, outermost level first            (outer recursion: devices)
        order ops by descending weight (cost at the current local shapes)
        for o in order:                                    (inner recursion: the graph)
            L_o += argmin over legal cuts of one dim by a, or none, of
                   C_op(o, L_o + x) + sum over neighbours already decided at this level of C_edge
        refinement: revisit every op once with all neighbours decided
Cost: O(axes x (ops log ops + edges x candidates)), i.e. near-linear in graph size and
logarithmic in the device count.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter, or_

from symtensor.cost import Evaluator, TrainConfig
from symtensor.cost.engine import cut_refusal
from symtensor.cost.moe import active as moe_active
from symtensor.cost.pipeline import inflight
from symtensor.cost.segment import forward_runs
from symtensor.cost.terms import edge_seconds, edge_terms, ep_edge_seconds, op_cost, saved_bytes
from symtensor.graph import layer_repeat, op_no_cut
from symtensor.layout import REPLICATED, OpLayout, cut_factor, linked_layout, matmul_roles, refusal
from symtensor.search.megatron import expert_op, sp_dim, tp_dim


@dataclass(frozen=True, slots=True)
class Edge:
    src: object  # producer op
    src_slot: int
    dst: object  # consumer op
    dst_slot: int
    tensor: str
    weight: float


class Problem:
    """Op and edge costs in seconds for one outer point; memoised.

    Args:
        ev: the evaluator of the point's graph and stage mesh.
        train: the point's training configuration.
        lam: the memory weight, seconds per byte.
        memo: the tables shared by the problems of one evaluator (``EvaluatorPool.problem`` passes
            its own; a fresh one when None): what does not depend on the memory weight.
    """

    # Costs that read only the levels and sizes of mesh axes, never their positions, may be shared
    # by the orbits of layouts under the mesh's symmetry (see ``_symmetry``); a subclass whose
    # costs read positions (D-Rec's) sets this False and its tables are keyed by layout uids.
    SYMMETRIC_COSTS = True

    def __init__(self, ev: Evaluator, train: TrainConfig, lam: float = 0.0, memo: dict | None = None):
        self.ev, self.train, self.lam = ev, train, lam
        g = ev.graph
        self.layers = g.meta["layers"]
        self.ops = list(g.ops)
        self.index = {op.name: i for i, op in enumerate(self.ops)}
        pp = train.pp
        self.weight = {op.name: (layer_repeat(g, op.layer) / pp if 0 <= op.layer < self.layers else 1.0)
                       for op in self.ops}
        self.edges = self._edges()
        self.nbrs: dict[str, list[Edge]] = {op.name: [] for op in self.ops}
        for e in self.edges:
            self.nbrs[e.src.name].append(e)
            self.nbrs[e.dst.name].append(e)
        self.inflight = inflight(0, train)  # (the first rank holds the most micro-batches: cost.pipeline)
        # per op: (edge, the other op's name, whether this op is the producer)
        self.links = {op.name: [(e, (e.dst if e.src is op else e.src).name, e.src is op) for e in self.nbrs[op.name]]
                      for op in self.ops}
        # small integer ids of equal ops and equal edges: cheap memo keys
        classes: dict = {}
        self.op_class = {op.name: classes.setdefault(
            (ev.op_sig(op), self.weight[op.name], self.redo(op)), len(classes)) for op in self.ops}
        eclasses: dict = {}
        self.edge_class = {id(e): eclasses.setdefault(
            (self.op_class[e.src.name], e.src_slot, self.op_class[e.dst.name], e.dst_slot, e.weight), len(eclasses))
            for e in self.edges}
        self._init_memos({} if memo is None else memo)

    def _init_memos(self, shared: dict):
        """Memo tables, keyed by layout uids (plain ints, see ``symtensor.layout``): the search asks
        each of them tens of thousands of times.

        In this problem equal ops share their tables, and so do equal edges (the level templates
        read an op's block, so each op has its own). What does not depend on the memory weight is
        shared by all problems of one evaluator, per op and edge: an edge's costs, an op's cost
        without the memory term and its saved bytes (per training configuration), and the
        placements a layout gives an edge's tensor at either end. The shared costs, and legality,
        are keyed by orbits of layouts under the mesh's symmetry rather than by uids (see
        ``_symmetry``): a miss of this problem's uid table computes a cost only for a new orbit.
        """
        ev, train = self.ev, self.train
        self.moe = moe_active(train)  # MoE options beyond today's costing: the candidates' costs follow them
        self._op_memo, self._legal_memo, self._cand_memo, self._move_memo = {}, {}, {}, {}
        per_class: dict = {}
        for name, c in self.op_class.items():
            # uid -> cost, uid -> legal, (uid, axis) -> [layouts], uid -> (layouts one move away)
            memos = per_class.setdefault(c, ({}, {}, {}, {}))
            self._op_memo[name], self._legal_memo[name], self._cand_memo[name], self._move_memo[name] = memos
        # the replicated layout the recursion starts from: this evaluator's own, so that what is
        # derived from it (memoised on the layout) is shared by its problems and dies with them
        self.root = shared.setdefault(("root",), OpLayout.family())
        self._template_memo = {op.name: {} for op in self.ops}  # (uid, axis, kind) -> layout
        self._template_dims = {op.name: {} for op in self.ops}  # kind -> dim or None
        self.templates = level_templates(self.ops)
        # (terms, saved bytes) by orbit id (by uid for position-dependent costs; see _symmetry), per cost class:
        # the same op in every layer of the skeleton shares them
        kind = type(self).__name__
        cls = _cost_classes(ev, shared)
        self._op_shared = {op.name: shared.setdefault(("op", cls[op.name], self.redo(op), train, kind), ({}, {}))
                           for op in self.ops}
        self._edge_memo, self._edge_shared, self._edge_scale, self._views = {}, {}, {}, {}
        per_eclass: dict = {}
        for e in self.edges:
            # costs: lu uid -> {lv uid -> seconds}; shared: orbit key (or uid pair) -> the cost
            # before the edge's weight and micro-batches (``_edge_scale``)
            self._edge_memo[id(e)] = per_eclass.setdefault(self.edge_class[id(e)], {})
            grad = ev.needs_grad(e.tensor)
            self._edge_shared[id(e)] = shared.setdefault(
                ("edge", cls[e.src.name], e.src_slot, cls[e.dst.name], e.dst_slot, grad, self.redo(e.dst), kind), {})
            self._edge_scale[id(e)] = self._edge_weight(e)
            # placements: uid -> (tensor layout, that of its gradient or None)
            self._views[id(e)] = (shared.setdefault(("out", cls[e.src.name], e.src_slot, grad), {}),
                                  shared.setdefault(("in", cls[e.dst.name], e.dst_slot, grad), {}))
        self._symmetry(shared)

    def _symmetry(self, shared: dict):
        """Keys of the shared tables: orbits of layouts under the symmetry of the mesh (``Orbits``).

        Axes of one level and size are interchangeable: the model never reads an axis's label,
        only its level and size, and per tensor axis the set of axes cutting it. Every size it
        derives is an integer product of axis sizes (exact in any order), every collective group
        a count of members per level, and its float sums run in an order fixed by the graph, never
        by the axes. So an op's terms, saved bytes and legality are bit-identical for a layout and
        any relabelling of its interchangeable axes (64 H100s: 3! x 3! relabellings), and an
        edge's cost for a pair of layouts and the same relabelling of both. A subclass whose costs
        read axis positions (D-Rec's) says so (``SYMMETRIC_COSTS = False``) and keeps uids, and so
        do edges on a mesh without two interchangeable axes (their orbits are single pairs, and
        uid pairs cost less).
        """
        orbits = shared.get(("orbits",))
        if orbits is None:
            orbits = shared[("orbits",)] = Orbits(self.ev)
        self.orbits = orbits
        # orbit id -> legal, per op signature (all that ``legal`` reads of an op)
        self._legal_shared = {op.name: shared.setdefault(("legal", op.signature), {}) for op in self.ops}
        symmetric = self.SYMMETRIC_COSTS
        self._op_key = orbits.op if symmetric else _uid
        self._edge_key = orbits.edge if symmetric and orbits.symmetric else _uid_pair

    def _edges(self) -> list[Edge]:
        """Producer -> consumer edges; an input of a repeated skeleton layer also comes, for all but
        its first copy, from the same block of the layer itself. Sibling consumers (same kind,
        same dims, like the Q, K and V projections) share one redistribution when they agree,
        so each carries its share of it."""
        ev, out = self.ev, []
        siblings: dict = {}
        for v in self.ops:
            for slot, t in enumerate(v.inputs):
                key = (t, v.kind, v.in_dims[slot])
                siblings[key] = siblings.get(key, 0) + 1
        for v in self.ops:
            for slot, t in enumerate(v.inputs):
                u = ev.producer.get(t)
                if u is None:
                    continue
                w = self.weight[v.name] / siblings[(t, v.kind, v.in_dims[slot])]
                if u.layer != v.layer and 0 <= v.layer < self.layers:
                    r = layer_repeat(ev.graph, v.layer)
                    twin = next((op for op in ev.graph.layer_ops(v.layer) if op.block == u.block), None)
                    if twin is not None and r > 1:
                        out.append(Edge(twin, 0, v, slot, t, w * (r - 1) / r))
                    w = w / r
                out.append(Edge(u, u.output_slot(t), v, slot, t, w))
        return out

    def legal(self, op, layout: OpLayout) -> bool:
        """``legal`` (the one legality rule) and what the engine runs (``cost.engine.cut_refusal``), memoised: the
        search asks it for every move."""
        memo = self._legal_memo[op.name]
        hit = memo.get(layout.uid)
        if hit is None:  # legality reads dim sizes and axis sizes only: one per orbit
            shared, key = self._legal_shared[op.name], self.orbits.op(layout)
            hit = shared.get(key)
            if hit is None:
                hit = shared[key] = legal(op, layout, self.ev.mesh) and cut_refusal(self.train, op, layout) is None
            memo[layout.uid] = hit
        return hit

    def candidates(self, op, layout: OpLayout, axis: int) -> list[OpLayout]:
        memo, key = self._cand_memo[op.name], (layout.uid, axis)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = [c for c in candidates(op, layout, axis, self.ev.mesh)
                               if cut_refusal(self.train, op, c) is None]
        return hit

    def moves(self, op, layout: OpLayout) -> tuple[OpLayout, ...]:
        """``_moves``, memoised."""
        memo = self._move_memo[op.name]
        hit = memo.get(layout.uid)
        if hit is None:
            hit = memo[layout.uid] = tuple(_moves(self, op, layout))
        return hit

    def template_cut(self, op, base: OpLayout, axis: int, kind: str) -> OpLayout:
        """``base`` plus the cut of ``axis`` that the level template ``kind`` gives this op, when
        legal (``none``, or no such cut: ``base``); memoised."""
        memo, key = self._template_memo[op.name], (base.uid, axis, kind)
        hit = memo.get(key)
        if hit is None:
            dims = self._template_dims[op.name]
            if kind not in dims:
                dims[kind] = None if kind == "none" else _template_dim(op, kind)
            d = dims[kind]
            cand = base.with_cut(d, axis) if d else base
            hit = memo[key] = cand if d and self.legal(op, cand) else base
        return hit

    def redo(self, op) -> float:
        """How many times a micro-batch runs ``op``'s forward (``segment.forward_runs``)."""
        return forward_runs(op, self.train.recompute, self.layers, self.ev.recompute_regions(self.train.recompute))

    def op_cost(self, op, layout: OpLayout) -> float:
        memo = self._op_memo[op.name]
        hit = memo.get(layout.uid)
        if hit is None:
            hit = memo[layout.uid] = self._op_cost(op, layout)
        return hit

    def _op_cost(self, op, layout: OpLayout) -> float:
        memo, key = self._op_shared[op.name][0], self._op_key(layout)
        terms = memo.get(key)
        if terms is None:
            terms = memo[key] = self._op_terms(op, layout)
        per_mb, per_step, static = terms
        saved = self.saved_bytes(op, layout) if self.lam else 0.0
        w = self.weight[op.name]
        return w * (self.train.micro_steps * per_mb + per_step + self.lam * (static + self.inflight * saved))

    def _op_terms(self, op, layout: OpLayout) -> tuple[float, float, float]:
        """(seconds per micro-batch, seconds per step, static bytes): the op's cost without the
        memory weight."""
        terms = op_cost(self.ev, op, layout, self.train)
        return terms.per_microbatch_s, terms.per_step_s, terms.params.static_bytes

    def saved_bytes(self, op, layout: OpLayout) -> float:
        """Activation bytes one micro-batch of this op keeps for backward on one device (the search's
        estimate: recomputed ops keep nothing; tensors saved by several ops count for each)."""
        memo, key = self._op_shared[op.name][1], self._op_key(layout)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = self._saved_bytes(op, layout)
        return hit

    def _saved_bytes(self, op, layout: OpLayout) -> float:
        return saved_bytes(self.ev, op, layout, self.train)

    def edge_cost(self, e: Edge, lu: OpLayout, lv: OpLayout) -> float:
        row = self._edge_memo[id(e)].get(lu.uid)
        hit = None if row is None else row.get(lv.uid)
        if hit is None:
            # edges do not depend on the memory weight: share them across problems of one evaluator
            shared, key = self._edge_shared[id(e)], self._edge_key(lu, lv)
            unit = shared.get(key)
            if unit is None:
                unit = shared[key] = self._edge_cost(e, lu, lv)
            hit = self._edge_memo[id(e)].setdefault(lu.uid, {})[lv.uid] = self._edge_scale[id(e)] * unit
        return hit

    def _edge_weight(self, e: Edge) -> float:
        """What ``_edge_cost`` is multiplied by: the edge's weight and the micro-batches per step."""
        return e.weight * self.train.micro_steps

    def _edge_cost(self, e: Edge, lu: OpLayout, lv: OpLayout) -> float:
        """Seconds of one micro-batch of one layer: the forward redistribution (twice under
        recomputation) and the backward one of the gradient."""
        src, gdst = self._view(e, lu, True)
        dst, gsrc = self._view(e, lv, False)
        fwd, fwd_c, bwd, bwd_c = edge_terms(self.ev, e.tensor, src, dst, gsrc, gdst)
        if self.moe:  # dispatch and combine under the MoE options, as the evaluator charges them
            fwd = ep_edge_seconds(self.ev, self.train, e.src, e.dst, lu, lv, fwd, fwd_c)
            bwd = ep_edge_seconds(self.ev, self.train, e.src, e.dst, lu, lv, bwd, bwd_c)
        return edge_seconds(fwd, bwd, self.redo(e.dst))

    def _view(self, e: Edge, layout: OpLayout, producer: bool):
        """How ``e``'s tensor is placed by its producer (``producer``) or its consumer with
        ``layout``, and how its gradient is (None when it has none); memoised, as each end's
        layout meets many layouts of the other end."""
        memo = self._views[id(e)][0 if producer else 1]
        hit = memo.get(layout.uid)
        if hit is None:
            ev = self.ev
            grad = ev.needs_grad(e.tensor)
            if producer:
                hit = (ev.out_layout(e.src, layout, e.src_slot, partial=True),
                       ev.out_layout(e.src, layout, e.src_slot, partial=False) if grad else None)
            else:
                hit = (ev.in_layout(e.dst, layout, e.dst_slot),
                       ev.in_layout(e.dst, layout, e.dst_slot, grad=True) if grad else None)
            memo[layout.uid] = hit
        return hit

    def total(self, layouts: dict[str, OpLayout], bound: float = float("inf")) -> float:
        """The decomposed objective of a complete assignment; once a partial sum reaches
        ``bound`` that partial sum (costs are never negative, so the total is no smaller)."""
        ops = 0.0
        for op in self.ops:
            ops += self.op_cost(op, layouts.get(op.name, REPLICATED))
            if ops >= bound:
                return ops
        edges = 0.0
        for e in self.edges:
            edges += self.edge_cost(e, layouts.get(e.src.name, REPLICATED), layouts.get(e.dst.name, REPLICATED))
            if ops + edges >= bound:
                return ops + edges
        return ops + edges


_uid = attrgetter("uid")


def _cost_classes(ev: Evaluator, shared: dict) -> dict[str, int]:
    """Per op, a small int naming everything its costs and its edges' read besides layouts: its
    equal-op id (signature and gradient operands, ``Evaluator.op_sig``) and its tensors' shapes,
    dtypes and roles. Equal ops
    of different layers of the skeleton (its first, repeated and last layers) share a class, and
    with it their memo tables. One numbering per evaluator (kept in ``shared``)."""
    hit = shared.get(("cost classes",))
    if hit is None:
        ids: dict = {}
        tensors = ev.tensors
        hit = shared[("cost classes",)] = {
            op.name: ids.setdefault((ev.op_sig(op), tuple(
                (t.shape, t.dtype, t.param, t.trainable, ev.needs_grad(t.name))
                for t in map(tensors.__getitem__, op.inputs + op.outputs))), len(ids))
            for op in ev.graph.ops}
    return hit


def _uid_pair(lu: OpLayout, lv: OpLayout) -> tuple[int, int]:
    return lu.uid, lv.uid


class Orbits:
    """Names of the orbits of layouts under relabellings of interchangeable mesh axes (same level,
    same size), for one evaluator (see ``Problem._symmetry``).

    A layout is, per mesh axis, the set of dims the axis cuts (the order of a dim's axes is
    canonical, and the costs read sets). Coded as a bit mask per axis, with the axis's class in
    the high bits, the multiset of codes over the axes names the orbit exactly; for a pair of
    layouts, the multiset of (class, mask at one end, mask at the other). Keys are tuples of
    small ints: cheap to build, hash and compare.
    """

    def __init__(self, ev: Evaluator):
        mesh = ev.mesh
        classes = sorted({(a.level, a.size) for a in mesh})
        self.symmetric = len(classes) < len(mesh)
        dims = sorted({d for op in ev.graph.ops for d, _ in op.dims})
        self.bit = {d: 1 << i for i, d in enumerate(dims)}
        self.width = len(dims)
        self.cls = tuple(classes.index((a.level, a.size)) << (2 * self.width) for a in mesh)  # class, shifted
        self._op: dict = {}  # uid -> orbit id
        self._op_ids: dict = {}  # orbit key -> orbit id
        self._src: dict = {}  # uid -> per axis, its class and its dims' mask (shifted)
        self._dst: dict = {}  # uid -> per axis, its dims' mask

    def _masks(self, layout: OpLayout) -> list[int]:
        masks = [0] * len(self.cls)
        bit = self.bit
        for d, axes in layout.cuts:
            for a in axes:
                masks[a] |= bit[d]
        return masks

    def op(self, layout: OpLayout) -> int:
        """The orbit of an op's layout, as a small int."""
        hit = self._op.get(layout.uid)
        if hit is None:
            key = tuple(sorted(c | m for c, m in zip(self.cls, self._masks(layout)) if m))
            hit = self._op[layout.uid] = self._op_ids.setdefault(key, len(self._op_ids))
        return hit

    def edge(self, lu: OpLayout, lv: OpLayout) -> tuple:
        """The orbit of a (producer, consumer) pair of layouts: one relabelling maps two pairs with
        the same key onto each other."""
        u = self._src.get(lu.uid)
        if u is None:
            w = self.width
            u = self._src[lu.uid] = tuple(c | m << w for c, m in zip(self.cls, self._masks(lu)))
        v = self._dst.get(lv.uid)
        if v is None:
            v = self._dst[lv.uid] = tuple(self._masks(lv))
        return tuple(sorted(map(or_, u, v)))


def candidates(op, layout: OpLayout, axis: int, mesh):
    """Legal layouts after this axis: the current one (no cut) and one more cut of each dim.

    The rules of ``legal`` are built in (no layout is built to be refused), except that linked
    and carried dims are never cut on their own: they follow their source."""
    yield layout
    size = mesh[axis].size
    full = linked_layout(op, layout)
    sizes = op.dim_sizes
    forbidden = op_no_cut(op)
    reduce_dims, out_dims = matmul_roles(op)
    cut = {d for d, _ in full.cuts}
    links = dict(op.attr("linked", ()) + op.attr("carry", ()))
    for d, n in op.dims:
        if d in forbidden or (n // cut_factor(full, d, mesh)) % size:
            continue
        if (d in reduce_dims and cut & out_dims) or (d in out_dims and cut & reduce_dims):
            continue
        other = links.get(d)
        if other and (sizes[other] // cut_factor(full, other, mesh)) % size:
            continue
        if d in links.values():
            continue  # linked or carried dims follow their source
        yield layout.with_cut(d, axis)


def partition(problem: Problem, order: str = "topological", refine: bool = True,
              templates: bool = True, levels: str = "outer") -> dict[str, OpLayout]:
    """The double recursion; returns a layout per op of the (skeleton) graph.

    Args:
        order: op order inside a level: ``topological``, ``weight`` (descending cost, the patent's)
            or ``reverse`` (MindSpore's default).
        refine: revisit every op once a level is complete.
        templates: also consider one parallelism for the whole level (data, tensor, context,
            expert) and keep whatever is cheapest.
        levels: ``outer`` decides the slowest axes first (D-Rec); ``inner`` the fastest first,
            which lets memory pressure put tensor parallelism on the fast links.
    """
    ev = problem.ev
    layouts = {op.name: problem.root for op in problem.ops}
    axes = range(len(ev.mesh)) if levels == "outer" else reversed(range(len(ev.mesh)))
    for axis in axes:
        if order == "weight":
            seq = sorted(problem.ops, key=lambda op: (-problem.op_cost(op, layouts[op.name]), problem.index[op.name]))
        elif order == "topological":
            seq = list(problem.ops)
        else:  # reverse topological, MindSpore's default
            seq = list(reversed(problem.ops))
        before = dict(layouts)
        decided: set[str] = set()
        for op in seq:
            layouts[op.name] = _best(problem, op, before[op.name], axis, layouts, decided)
            decided.add(op.name)
        if refine:
            for op in seq:
                layouts[op.name] = _best(problem, op, before[op.name], axis, layouts, None)
        if templates:
            # coordinated moves the op-by-op greedy cannot find: one parallelism for the whole level
            options = [layouts] + [_template(problem, before, axis, kind) for kind in problem.templates]
            best_total = problem.total(layouts)
            for option in options[1:]:  # the first of equals, like min(); hopeless ones stop early
                t = problem.total(option, best_total)
                if t < best_total:
                    layouts, best_total = option, t
    return layouts


# Level templates: the dim each op cuts when a whole level takes one parallelism (None: no cut).
# ``expert`` folds expert parallelism over a data-parallel level; on graphs with experts,
# ``tensor_ep`` and ``context_ep`` fold it over a level that attention cuts for tensor (with
# sequence parallel token ops) or context parallelism: the expert layers' own grid (Megatron's
# MoE parallel folding), which the op-by-op greedy reaches only once its neighbours follow.
TEMPLATES = ("data", "tensor", "context", "expert")
FOLDED = ("tensor_ep", "context_ep")


def level_templates(ops) -> tuple[str, ...]:
    """The level templates worth trying on a graph: the folded ones only where there are experts
    (elsewhere they equal ``tensor`` and ``context``)."""
    return TEMPLATES + (FOLDED if any(expert_op(op) for op in ops) else ())


def _template_dim(op, kind: str) -> str | None:
    sizes = op.dim_sizes
    expert = expert_op(op)
    if kind in FOLDED:
        if expert:
            return "e"
        kind = kind.removesuffix("_ep")
    if kind == "data":
        return "b" if "b" in sizes else None
    if kind == "context":
        if op.kind == "moe_combine" or expert:
            return "c"
        return "s" if "s" in sizes else None
    if kind == "expert":
        return "e" if expert else ("b" if "b" in sizes else None)
    tdim = tp_dim(op)  # Megatron's tensor (+ sequence) parallel cut
    if tdim and tdim in sizes:
        return tdim
    return sp_dim(op)


def _template(problem: Problem, before: dict, axis: int, kind: str) -> dict:
    return {op.name: problem.template_cut(op, before[op.name], axis, kind) for op in problem.ops}


def _best(problem: Problem, op, base: OpLayout, axis: int, layouts, decided) -> OpLayout:
    best, best_cost = base, None
    # the neighbours that count, with their layouts (fixed while this op chooses)
    nbrs = [(e, layouts[other], is_src) for e, other, is_src in problem.links[op.name]
            if decided is None or other in decided]
    op_cost, edge_cost = problem.op_cost, problem.edge_cost
    for cand in problem.candidates(op, base, axis):
        cost = op_cost(op, cand)
        for e, theirs, is_src in nbrs:
            if best_cost is not None and cost >= best_cost - 1e-15:
                break  # cannot win (see refine)
            cost += edge_cost(e, cand, theirs) if is_src else edge_cost(e, theirs, cand)
        if best_cost is None or cost < best_cost - 1e-15:
            best, best_cost = cand, cost
    return best


def legal(op, layout: OpLayout, mesh) -> bool:
    """Whether ``layout`` is legal for ``op`` (``symtensor.layout.refusal`` gives the reason)."""
    return refusal(op, layout, mesh) is None


def _moves(problem: Problem, op, layout: OpLayout):
    """Layouts one axis away: an axis moved to another dim, dropped, or a free axis added."""
    mesh, is_legal = problem.ev.mesh, problem.legal
    dims = [d for d, _ in op.dims if d not in dict(op.attr("linked", ()) + op.attr("carry", ())).values()]
    current = layout.as_dict()
    for a in range(len(mesh)):
        here = next((d for d, ax in current.items() if a in ax), None)
        base = layout.without_axes((a,)) if here else layout
        if here:
            yield base
        for d in dims:
            if d != here:
                cand = base.with_cut(d, a)
                if is_legal(op, cand):
                    yield cand


def refine(problem: Problem, layouts: dict[str, OpLayout], sweeps: int = 2) -> dict[str, OpLayout]:
    """Local search on the decomposed objective: each op in turn takes the best layout one axis away
    from its own, given all its neighbours; stops when a sweep changes nothing.

    Costs are times and bytes, never negative, so a partial sum only grows: once it reaches the
    cost to beat, the remaining edges (and their redistributions, the search's main expense) are
    skipped. The choices are those of the full sums."""
    return _refine_sweeps(problem, layouts, sweeps)[0]


def _refine_sweeps(problem: Problem, layouts: dict[str, OpLayout], sweeps: int) -> tuple[dict, bool]:
    """``refine``, and whether its last sweep changed nothing (a local optimum of op moves)."""
    layouts = dict(layouts)
    changed = True  # (no sweep: not known to be settled)
    op_cost, edge_cost = problem.op_cost, problem.edge_cost
    for _ in range(sweeps):
        changed = False
        for op in problem.ops:
            nbrs = [(e, layouts[other], is_src) for e, other, is_src in problem.links[op.name]]

            def local(cand, bound=float("inf")):
                """The op's cost and its edges' with ``cand``; any value >= ``bound`` once it reaches it."""
                cost = op_cost(op, cand)
                for e, theirs, is_src in nbrs:
                    if cost >= bound:
                        break
                    cost += edge_cost(e, cand, theirs) if is_src else edge_cost(e, theirs, cand)
                return cost

            cur = layouts[op.name]
            best, best_cost = cur, local(cur)
            for cand in problem.moves(op, cur):
                c = local(cand, best_cost * (1 - 1e-9))
                if c < best_cost * (1 - 1e-9):
                    best, best_cost = cand, c
            if best is not cur:
                layouts[op.name] = best
                changed = True
        if not changed:
            break
    return layouts, not changed


def _blocks(problem: Problem) -> list[list]:
    """Ops grouped into blocks: embedding, each layer's attention (up to its first residual add)
    and MLP, the head."""
    groups: dict = {}
    seen_residual: dict = {}
    for op in problem.ops:
        part = seen_residual.get(op.layer, 0)
        groups.setdefault((op.layer, part), []).append(op)
        if op.kind == "elementwise" and op.attr("fn") == "add" and op.block.endswith("residual"):
            seen_residual[op.layer] = part + 1
    return list(groups.values())


def refine_blocks(problem: Problem, layouts: dict[str, OpLayout], rounds: int = 3) -> dict[str, OpLayout]:
    """Coordinated local search: a whole block (attention, MLP, embedding or head) moves one mesh
    axis to one parallelism at once (the level templates), kept when the objective falls. Escapes
    the local optima of single-op moves, where a cut only pays once its neighbours follow."""
    layouts = dict(layouts)
    op_cost, edge_cost, template_cut = problem.op_cost, problem.edge_cost, problem.template_cut
    blocks = []  # (ops, the edges touching them, each once)
    for ops in _blocks(problem):
        edges = {id(e): e for op in ops for e, _, _ in problem.links[op.name]}
        blocks.append((ops, list(edges.values())))

    def local(ops, edges, lay, bound=float("inf")):
        """The block's cost; any value >= ``bound`` once it reaches it (see refine)."""
        cost = sum(op_cost(op, lay[op.name]) for op in ops)
        for e in edges:
            if cost >= bound:
                break
            cost += edge_cost(e, lay[e.src.name], lay[e.dst.name])
        return cost

    for _ in range(rounds):
        improved = False
        for ops, edges in blocks:
            # the block's cost, kept up to date as trials are taken (only they change its layouts)
            current = local(ops, edges, layouts)
            for axis in range(len(problem.ev.mesh)):
                # trials only move this axis: they all start from the block without it
                bases = [(op, layouts[op.name].without_axes((axis,))) for op in ops]
                for kind in problem.templates + ("none",):
                    moved = {op.name: template_cut(op, base, axis, kind) for op, base in bases}
                    if all(lay.uid == layouts[name].uid for name, lay in moved.items()):
                        continue  # no move: the trial would cost exactly ``current``
                    trial = dict(layouts)
                    trial.update(moved)
                    cost = local(ops, edges, trial, current * (1 - 1e-9))
                    if cost < current * (1 - 1e-9):
                        layouts, current, improved = trial, cost, True
        if not improved:
            break
    return layouts


def solve(problem: Problem, order: str = "topological") -> dict[str, OpLayout]:
    """The SymTensor per-op solver: the recursive partition, then ``polish``."""
    return polish(problem, partition(problem, order=order))


def polish(problem: Problem, layouts: dict[str, OpLayout]) -> dict[str, OpLayout]:
    """What ``solve`` does after the recursion: op moves, block moves, op moves (the last only
    when block moves changed something or the first did not settle: otherwise its first sweep
    would change nothing)."""
    layouts, settled = _refine_sweeps(problem, layouts, 2)
    moved = refine_blocks(problem, layouts)
    if settled and moved == layouts:
        return moved
    return refine(problem, moved)
