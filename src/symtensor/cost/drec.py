"""D-Rec mode: the original unitless costs of D-Rec / MindSpore SAPP (spec section 2.2), for ablation.

Costs are element counts, compared only with each other. Per mesh axis (a binary level in the
original; here any prime factor), an op's candidate cut costs, at the local shapes before it:

    MatMul Y[I,J] = X[I,K] W[K,J]   cut I: mu * K*J / 2   cut J: I*K / 2   cut K: I*J / 2
                                    no cut: min(those)^2 / 25
    BatchMatMul / attention         cut batch: r*s_min    cut heads/experts: r*s_min - 1
                                    (r = 32-core occupancy ratio, s_min = 0.15 min(|L|,|R|,|O|)/2)
    elementwise, norm, softmax ...  0 (they follow their neighbours)
    redistribution                  rho * local size when the two ops' cuts of the shared tensor
                                    differ at this level (rho = 16)

with mu = 0.1 (MindSpore's default since 2024) and rho = 16 (since 2022). The total of a layout
is the sum of its per-level costs, so the search's greedy choices are D-Rec's.
"""

from __future__ import annotations

from symtensor.layout import OpLayout

MU = 0.1  # I-cut (data-parallel) memory coefficient, MindSpore costmodel_context.h default
RHO = 16.0  # redistribution multiplier, rec_cost.cc (2022+)
CORES = 32  # Ascend AI-core count in the BatchMatMul occupancy term
S_SCALE = 0.15


def _levels(layout: OpLayout):
    """(axis, dim) pairs of a layout in axis order (outermost first)."""
    return sorted((a, d) for d, axes in layout.cuts for a in axes)


def _matmul_dims(op):
    x, w, y = set(op.in_dims[0]), set(op.in_dims[1]), set(op.out_dims[0])
    i_dims = x & y - w  # rows: tokens
    k_dims = x & w - y  # reduction
    j_dims = w & y - x  # columns
    return i_dims, k_dims, j_dims


def _prod(sizes, dims):
    p = 1
    for d in dims:
        p *= sizes[d]
    return p


def _level_cost(op, sizes: dict, dim: str | None) -> float:
    """D-Rec cost of cutting ``dim`` (None: no cut) at local ``sizes``."""
    if op.kind == "linear" and len(op.inputs) >= 2:
        i_dims, k_dims, j_dims = _matmul_dims(op)
        I, K, J = _prod(sizes, i_dims), _prod(sizes, k_dims), _prod(sizes, j_dims)
        costs = {"I": MU * K * J / 2, "J": I * K / 2, "K": I * J / 2}
        if dim is None:
            return min(costs.values()) ** 2 / 25
        role = "I" if dim in i_dims else "K" if dim in k_dims else "J"
        return costs[role]
    if op.kind in ("bmm", "attention"):
        sizes_in = [_prod(sizes, dims) for dims in op.in_dims[:2]] + [_prod(sizes, op.out_dims[0])]
        s_min = S_SCALE * min(sizes_in) / 2
        bs = sizes.get("b", 1)
        r = CORES if bs == 1 else max(CORES / bs - 1, 0)
        if dim is None:
            return s_min ** 2 / 25
        if dim == "b":
            return r * s_min
        if dim in ("n", "e"):
            return r * s_min - 1
        return sizes_in[1] / 2 if dim in ("s",) else sizes_in[2] / 2
    return 0.0


def op_cost(op, layout: OpLayout, mesh) -> float:
    """Sum over the layout's levels of D-Rec's cost of that level's cut (or of no cut)."""
    sizes = {d: float(n) for d, n in op.dims}
    total = 0.0
    cut_at = {a: d for a, d in _levels(layout)}
    for a in range(len(mesh)):
        d = cut_at.get(a)
        total += _level_cost(op, sizes, d)
        if d is not None:
            for dd in {d} | {dst for src, dst in op.attr("linked", ()) + op.attr("carry", ()) if src == d}:
                if dd in sizes:
                    sizes[dd] /= mesh[a].size
    return total


def edge_cost(src_axes, dst_axes, numel: float, mesh) -> float:
    """rho x local size for every level at which producer and consumer cut the tensor differently.

    ``src_axes`` / ``dst_axes``: per tensor axis, the mesh axes cutting it (TensorLayout.axes).
    """
    where_src = {a: i for i, ax in enumerate(src_axes) for a in ax}
    where_dst = {a: i for i, ax in enumerate(dst_axes) for a in ax}
    total, local = 0.0, float(numel)
    for a in range(len(mesh)):
        if where_src.get(a) != where_dst.get(a):
            total += RHO * local
        if a in where_dst:
            local /= mesh[a].size
    return total
