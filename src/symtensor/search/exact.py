"""The exact optimum of the per-operator problem, by integer linear programming (HiGHS), as an
oracle for small graphs and clusters.

For one outer point (a ``Problem``: pipeline depth, micro-batches, recomputation, ZeRO, memory
weight), minimise the same decomposed objective the recursive partitioner minimises:

    min  sum_o sum_l c(o, l) x[o, l] + sum_(e = u -> v) sum_(l, l') c(e, l, l') y[e, l, l']
    s.t. sum_l x[o, l] = 1                                   every op takes one layout
         sum_l' y[e, l, l'] = x[u, l],  sum_l y[e, l, l'] = x[v, l']   edges agree with both ends
         x, y binary

over every legal full layout l of every op (each mesh axis assigned to one dim, or to none).
Layouts whose own cost exceeds the op's cheapest by more than (upper bound - lower bound) cannot
be in an optimum (all other terms are non-negative) and are dropped before the solve.
"""

from __future__ import annotations

import itertools

from symtensor.errors import PlanError
from symtensor.layout import OpLayout
from symtensor.search.partition import Problem, legal

MAX_PAIRS = 1_000_000  # refuse problems too large for an oracle (the LP stays a few seconds)


def all_layouts(op, mesh) -> list[OpLayout]:
    """Every legal assignment of the mesh axes to the op's dims (or to none)."""
    dims = [d for d, _ in op.dims if d not in dict(op.attr("linked", ()) + op.attr("carry", ())).values()]
    out = []
    for choice in itertools.product([None] + dims, repeat=len(mesh)):
        m: dict[str, list[int]] = {}
        for a, d in enumerate(choice):
            if d is not None:
                m.setdefault(d, []).append(a)
        lay = OpLayout.of({d: tuple(v) for d, v in m.items()})
        if legal(op, lay, mesh):
            out.append(lay)
    return list(dict.fromkeys(out))


def exact_layouts(problem: Problem, upper: dict[str, OpLayout] | None = None) -> tuple[dict, float]:
    """The optimal layouts and objective of ``problem``; ``upper`` (any feasible assignment, e.g.
    the partitioner's) tightens the pruning."""
    import highspy
    import numpy as np

    mesh = problem.ev.mesh
    cands = {op.name: [lay for lay in all_layouts(op, mesh) if problem.legal(op, lay)] for op in problem.ops}
    own = {op.name: [problem.op_cost(op, lay) for lay in cands[op.name]] for op in problem.ops}
    lower = sum(min(v) for v in own.values())
    ub = problem.total(upper) if upper is not None else float("inf")
    slack = ub - lower
    for op in problem.ops:
        best = min(own[op.name])
        keep = [i for i, c in enumerate(own[op.name]) if c <= best + slack * (1 + 1e-9) + 1e-15]
        if upper is not None and upper[op.name] not in [cands[op.name][i] for i in keep]:
            keep.append(cands[op.name].index(upper[op.name]))
        cands[op.name] = [cands[op.name][i] for i in keep]
        own[op.name] = [own[op.name][i] for i in keep]
    pairs = sum(len(cands[e.src.name]) * len(cands[e.dst.name]) for e in problem.edges)
    if pairs > MAX_PAIRS:
        raise PlanError(f"exact oracle: {pairs} layout pairs exceed {MAX_PAIRS}; use a smaller graph or cluster")

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("log_to_console", False)
    h.setOptionValue("mip_rel_gap", 1e-7)
    col = 0
    xidx = {}
    costs, lowers, uppers = [], [], []
    for op in problem.ops:
        for i, c in enumerate(own[op.name]):
            xidx[(op.name, i)] = col
            costs.append(c)
            col += 1
    yblocks = []
    for e in problem.edges:
        lu, lv = cands[e.src.name], cands[e.dst.name]
        base = col
        for a in lu:
            for b in lv:
                costs.append(problem.edge_cost(e, a, b))
                col += 1
        yblocks.append((e, base, len(lu), len(lv)))
    n = col
    lowers, uppers = np.zeros(n), np.ones(n)
    h.addVars(n, lowers, uppers)
    h.changeColsCost(n, np.arange(n, dtype=np.int32), np.array(costs, dtype=float))
    starts, index, value, lo = [], [], [], []

    def row(idx, val, rhs):
        starts.append(len(index))
        index.extend(idx)
        value.extend(val)
        lo.append(rhs)

    for op in problem.ops:
        row([xidx[(op.name, i)] for i in range(len(own[op.name]))], [1.0] * len(own[op.name]), 1.0)
    for e, base, nu, nv in yblocks:
        for i in range(nu):  # sum_j y[i, j] - x_u[i] = 0
            row([base + i * nv + j for j in range(nv)] + [xidx[(e.src.name, i)]], [1.0] * nv + [-1.0], 0.0)
        for j in range(nv):
            row([base + i * nv + j for i in range(nu)] + [xidx[(e.dst.name, j)]], [1.0] * nu + [-1.0], 0.0)
    bounds = np.array(lo, dtype=float)
    h.addRows(len(lo), bounds, bounds, len(index), np.array(starts, dtype=np.int32),
              np.array(index, dtype=np.int32), np.array(value, dtype=float))
    # the local-polytope LP relaxation is usually integral on these near-tree graphs: solve it
    # first, and only when its solution is fractional solve the integer program
    h.run()
    sol = h.getSolution().col_value
    if any(1e-6 < v < 1 - 1e-6 for v in sol):
        h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.ones(n, dtype=np.uint8))
        h.run()
        sol = h.getSolution().col_value
    layouts = {}
    for op in problem.ops:
        i = max(range(len(own[op.name])), key=lambda k: sol[xidx[(op.name, k)]])
        layouts[op.name] = cands[op.name][i]
    return layouts, problem.total(layouts)
