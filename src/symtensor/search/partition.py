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

from symtensor.cost import Evaluator, TrainConfig
from symtensor.cost.model import _out_slot
from symtensor.cost.opcost import collectives_time, extra_saved_bytes, intra_collectives
from symtensor.graph import layer_repeat, op_no_cut, op_saves
from symtensor.layout import REPLICATED, OpLayout, cut_factor, linked_layout


@dataclass(frozen=True, slots=True)
class Edge:
    src: object  # producer op
    src_slot: int
    dst: object  # consumer op
    dst_slot: int
    tensor: str
    weight: float


class Problem:
    """Op and edge costs in seconds for one outer point; memoised."""

    def __init__(self, ev: Evaluator, train: TrainConfig, lam: float = 0.0):
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
        m, v = train.micro_steps, train.vpp
        self.inflight = min(m, pp) * (1 + (pp - 1) / (pp * v)) if v > 1 else min(m, pp)
        overlap = ev.eff.dp_overlap if train.dp_overlap is None else train.dp_overlap
        self.exposed = 1 - overlap
        self._op_cache: dict = {}
        self._edge_cache: dict = {}
        self._cand_cache: dict = {}
        self._legal_cache: dict = {}
        # per op: (edge, the other op's name, whether this op is the producer)
        self.links = {op.name: [(e, (e.dst if e.src is op else e.src).name, e.src is op) for e in self.nbrs[op.name]]
                      for op in self.ops}
        # small integer ids of equal ops and equal edges: cheap memo keys
        classes: dict = {}
        self.op_class = {op.name: classes.setdefault(
            (op.signature, ev.grad_operands[op.name], self.weight[op.name], self.redo(op)), len(classes))
            for op in self.ops}
        self._shared = ev.__dict__.setdefault("_search_edges", {}) if hasattr(ev, "__dict__") else {}
        self._edge_shared_key = {id(e): (id(e.src), e.src_slot, id(e.dst), e.dst_slot, e.weight, train.micro_steps,
                                         self.redo(e.dst), type(self).__name__) for e in self.edges}
        eclasses: dict = {}
        self.edge_class = {id(e): eclasses.setdefault(
            (self.op_class[e.src.name], e.src_slot, self.op_class[e.dst.name], e.dst_slot, e.weight), len(eclasses))
            for e in self.edges}

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
                out.append(Edge(u, _out_slot(u, t), v, slot, t, w))
        return out

    def legal(self, op, layout: OpLayout) -> bool:
        key = (self.op_class[op.name], layout)
        hit = self._legal_cache.get(key)
        if hit is None:
            hit = self._legal_cache[key] = legal(op, layout, self.ev.mesh)
        return hit

    def candidates(self, op, layout: OpLayout, axis: int) -> list[OpLayout]:
        key = (self.op_class[op.name], layout, axis)
        hit = self._cand_cache.get(key)
        if hit is None:
            hit = self._cand_cache[key] = list(candidates(op, layout, axis, self.ev.mesh))
        return hit

    def redo(self, op) -> bool:
        rc = self.train.recompute
        return 0 <= op.layer < self.layers and (rc == "full" or (rc == "selective" and bool(op.attr("core"))))

    def op_cost(self, op, layout: OpLayout) -> float:
        key = (self.op_class[op.name], layout)
        hit = self._op_cache.get(key)
        if hit is None:
            hit = self._op_cache[key] = self._op_cost(op, layout)
        return hit

    def _op_cost(self, op, layout: OpLayout) -> float:
        ev, train = self.ev, self.train
        m, redo = train.micro_steps, self.redo(op)
        t = ev.op_time(op, layout)
        per_mb = t.fwd_s + t.bwd_s + (t.fwd_s if redo else 0.0)
        intra = intra_collectives(op, layout, ev.mesh)
        if intra:
            per_mb += collectives_time(intra, ev.mesh, ev.levels, ev.eff) * (2 if redo else 1)
        per_step, static = 0.0, 0.0
        for slot, tname in enumerate(op.inputs):
            tensor = ev.tensors[tname]
            if tensor.param:
                pc = ev.param_cost(tensor, ev.param_layout(op, layout, slot), train, frozenset(layout.axes_of("b")))
                per_step += self.exposed * pc.sync_s + pc.opt_time
                static += pc.params + pc.grads + pc.optimizer
        saved = self.saved_bytes(op, layout) if self.lam else 0.0
        w = self.weight[op.name]
        return w * (m * per_mb + per_step + self.lam * (static + self.inflight * saved))

    def saved_bytes(self, op, layout: OpLayout) -> float:
        """Activation bytes one micro-batch of this op keeps for backward on one device (the search's
        estimate: recomputed ops keep nothing; tensors saved by several ops count for each)."""
        ev, train = self.ev, self.train
        if self.redo(op) and (train.recompute == "full" or op.attr("core")):
            return 0.0
        saved = 0.0
        for slot_name in op_saves(op):
            io, idx = slot_name[:-1], int(slot_name[-1])
            tname = op.inputs[idx] if io == "in" else op.outputs[idx]
            if ev.tensors[tname].param:
                continue
            view = ev.in_layout(op, layout, idx) if io == "in" else ev.out_layout(op, layout, idx, False)
            saved += ev.tensors[tname].nbytes / view.factor(ev.mesh)
        return saved + extra_saved_bytes(op, layout, ev.mesh)

    def edge_cost(self, e: Edge, lu: OpLayout, lv: OpLayout) -> float:
        key = (self.edge_class[id(e)], lu, lv)
        hit = self._edge_cache.get(key)
        if hit is None:
            # edges do not depend on the memory weight: share them across problems of one evaluator
            shared = (self._edge_shared_key[id(e)], lu, lv)
            hit = self._shared.get(shared)
            if hit is None:
                hit = self._shared[shared] = self._edge_cost(e, lu, lv)
            self._edge_cache[key] = hit
        return hit

    def _edge_cost(self, e: Edge, lu: OpLayout, lv: OpLayout) -> float:
        ev = self.ev
        src = ev.out_layout(e.src, lu, e.src_slot, partial=True)
        dst = ev.in_layout(e.dst, lv, e.dst_slot)
        fwd = ev.edge(src, dst, e.tensor)[0]
        bwd = 0.0
        if ev.needs_grad(e.tensor):
            gsrc = ev.in_layout(e.dst, lv, e.dst_slot, grad=True)
            gdst = ev.out_layout(e.src, lu, e.src_slot, partial=False)
            bwd = ev.edge(gsrc, gdst, e.tensor)[0]
        return e.weight * self.train.micro_steps * (fwd * (2 if self.redo(e.dst) else 1) + bwd)

    def total(self, layouts: dict[str, OpLayout]) -> float:
        """The decomposed objective of a complete assignment."""
        lay = lambda op: layouts.get(op.name, REPLICATED)  # noqa: E731
        return (sum(self.op_cost(op, lay(op)) for op in self.ops)
                + sum(self.edge_cost(e, lay(e.src), lay(e.dst)) for e in self.edges))


def _matmul_roles(op):
    """(reduction dims, output dims) of a linear op's weight; never cut both in one op."""
    if op.kind != "linear":
        return set(), set()
    x, w, y = set(op.in_dims[0]), set(op.in_dims[1]), set(op.out_dims[0])
    return (w & x) - y, (w & y) - x


def candidates(op, layout: OpLayout, axis: int, mesh):
    """Legal layouts after this axis: the current one (no cut) and one more cut of each dim."""
    yield layout
    size = mesh[axis].size
    full = linked_layout(op, layout)
    sizes = op.dim_sizes
    forbidden = op_no_cut(op)
    reduce_dims, out_dims = _matmul_roles(op)
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
    layouts = {op.name: REPLICATED for op in problem.ops}
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
            options = [layouts] + [_template(problem, before, axis, kind) for kind in TEMPLATES]
            layouts = min(options, key=problem.total)
    return layouts


# Level templates: the dim each op cuts when a whole level takes one parallelism (None: no cut).
TEMPLATES = ("data", "tensor", "context", "expert")


def _template_dim(op, kind: str) -> str | None:
    from symtensor.search.megatron import _tp_dim

    sizes = op.dim_sizes
    expert = op.kind in ("linear", "elementwise") and any(d and d[0] == "e" for d in op.in_dims)
    if kind == "data":
        return "b" if "b" in sizes else None
    if kind == "context":
        if op.kind == "moe_combine" or expert:
            return "c"
        return "s" if "s" in sizes else None
    if kind == "expert":
        return "e" if expert else ("b" if "b" in sizes else None)
    tdim = _tp_dim(op)  # Megatron's tensor (+ sequence) parallel cut
    if tdim and tdim in sizes:
        return tdim
    if op.kind in ("norm", "elementwise") and "s" in sizes and not expert:
        return "s"
    return None


def _template(problem: Problem, before: dict, axis: int, kind: str) -> dict:
    out = {}
    mesh = problem.ev.mesh
    for op in problem.ops:
        base = before[op.name]
        d = _template_dim(op, kind)
        cand = base.with_cut(d, axis) if d else base
        out[op.name] = cand if d and legal(op, cand, mesh) else base
    return out


def _best(problem: Problem, op, base: OpLayout, axis: int, layouts, decided) -> OpLayout:
    best, best_cost = base, None
    links = problem.links[op.name]
    op_cost, edge_cost = problem.op_cost, problem.edge_cost
    for cand in problem.candidates(op, base, axis):
        cost = op_cost(op, cand)
        for e, other, is_src in links:
            if decided is not None and other not in decided:
                continue
            cost += edge_cost(e, cand, layouts[other]) if is_src else edge_cost(e, layouts[other], cand)
        if best_cost is None or cost < best_cost - 1e-15:
            best, best_cost = cand, cost
    return best


def legal(op, layout: OpLayout, mesh) -> bool:
    """Whether every cut divides its dim, no forbidden dim is cut and a matmul does not cut both
    its weight's reduction and output dims (the rules ``candidates`` builds in)."""
    full = linked_layout(op, layout)
    forbidden = op_no_cut(op)
    seen = set()
    for d, axes in layout.cuts:
        if d in forbidden or seen & set(axes):
            return False
        seen.update(axes)
    sizes = op.dim_sizes
    for d, _ in full.cuts:
        if sizes[d] % cut_factor(full, d, mesh):
            return False
    reduce_dims, out_dims = _matmul_roles(op)
    cut = {d for d, _ in layout.cuts}
    return not (cut & reduce_dims and cut & out_dims)


def _moves(op, layout: OpLayout, mesh, is_legal):
    """Layouts one axis away: an axis moved to another dim, dropped, or a free axis added."""
    dims = [d for d, _ in op.dims if d not in dict(op.attr("linked", ()) + op.attr("carry", ())).values()]
    current = layout.as_dict()
    for a in range(len(mesh)):
        here = next((d for d, ax in current.items() if a in ax), None)
        base = layout.without_axes({a}) if here else layout
        if here:
            yield base
        for d in dims:
            if d != here:
                cand = base.with_cut(d, a)
                if is_legal(op, cand):
                    yield cand


def refine(problem: Problem, layouts: dict[str, OpLayout], sweeps: int = 2) -> dict[str, OpLayout]:
    """Local search on the decomposed objective: each op in turn takes the best layout one axis away
    from its own, given all its neighbours; stops when a sweep changes nothing."""
    layouts = dict(layouts)
    mesh = problem.ev.mesh
    for _ in range(sweeps):
        changed = False
        for op in problem.ops:
            links = problem.links[op.name]

            def local(cand):
                cost = problem.op_cost(op, cand)
                for e, other, is_src in links:
                    cost += (problem.edge_cost(e, cand, layouts[other]) if is_src
                             else problem.edge_cost(e, layouts[other], cand))
                return cost

            cur = layouts[op.name]
            best, best_cost = cur, local(cur)
            for cand in _moves(op, cur, mesh, problem.legal):
                c = local(cand)
                if c < best_cost * (1 - 1e-9):
                    best, best_cost = cand, c
            if best is not cur:
                layouts[op.name] = best
                changed = True
        if not changed:
            break
    return layouts


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
    mesh = problem.ev.mesh
    blocks = _blocks(problem)

    def local(ops, lay):
        cost = sum(problem.op_cost(op, lay[op.name]) for op in ops)
        seen = set()
        for op in ops:
            for e, other, is_src in problem.links[op.name]:
                if id(e) in seen:
                    continue
                seen.add(id(e))
                cost += problem.edge_cost(e, lay[e.src.name], lay[e.dst.name])
        return cost

    for _ in range(rounds):
        improved = False
        for ops in blocks:
            for axis in range(len(mesh)):
                current = local(ops, layouts)
                for kind in TEMPLATES + ("none",):
                    trial = dict(layouts)
                    for op in ops:
                        base = layouts[op.name].without_axes({axis})
                        d = None if kind == "none" else _template_dim(op, kind)
                        cand = base.with_cut(d, axis) if d else base
                        trial[op.name] = cand if d and legal(op, cand, mesh) else base
                    cost = local(ops, trial)
                    if cost < current * (1 - 1e-9):
                        layouts, current, improved = trial, cost, True
        if not improved:
            break
    return layouts


def solve(problem: Problem, order: str = "topological") -> dict[str, OpLayout]:
    """The SymTensor per-op solver: the recursive partition, then op moves, block moves, op moves."""
    layouts = refine(problem, partition(problem, order=order))
    return refine(problem, refine_blocks(problem, layouts))
