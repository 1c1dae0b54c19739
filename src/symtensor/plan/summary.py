"""Describe a plan in the words users know: effective DP/TP/SP/CP/EP/PP degrees per layer type.

A SymTensor plan cuts iteration dims per op; Megatron's vocabulary is derived from those cuts:

    dp  the batch dim b                           cp  the query sequence s of attention
    tp  model dims: heads n, kv heads g, head dim d, hidden h, MLP f, vocabulary v
    sp  sequence cuts of norms beyond cp          pp  pipeline stages (an outer choice)
    ep  the expert dim e of the expert GEMMs      etp their model dims (expert tensor parallel)

The expert GEMMs have their own grid (Megatron's MoE parallel folding): ep x etp x the ranks
that cut their tokens (b, c) regroup the tp x cp x dp ranks of a stage.
"""

from __future__ import annotations

MODEL_DIMS = ("n", "g", "d", "h", "f", "v", "r")
# the keys of a Megatron-LM configuration (``search.megatron.ParallelConfig``'s fields)
MEGATRON_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "sp", "zero", "recompute", "micro_batch", "global_batch", "seq",
                 "vpp", "framework")


def axis_names(layout, mesh) -> dict[str, list[str]]:
    """An ``OpLayout``'s cuts (mesh positions) by axis names, as the JSON lists them."""
    return {d: [mesh[a].name for a in axes] for d, axes in layout.cuts}


def _factor(cuts: dict, dims, mesh) -> int:
    """Devices that cut any of ``dims`` in ``cuts`` (dim -> axis names)."""
    f = 1
    for d in dims:
        f *= mesh.size_of(cuts.get(d, ()))
    return f


def degrees(op, cuts: dict, mesh) -> dict[str, int]:
    """Effective parallel degrees of one op whose cuts are ``cuts`` (dim -> axis names)."""
    return {"dp": _factor(cuts, ("b",), mesh), "cp": _factor(cuts, ("s", "c"), mesh),
            "tp": _factor(cuts, MODEL_DIMS, mesh), "ep": _factor(cuts, ("e",), mesh)}


def layer_types(plan) -> list[dict]:
    """One row per distinct op position (block) and layer run, with its cuts and degrees."""
    g, mesh = plan.graph, plan.mesh
    repeat = g.meta.get("repeat", {})
    rows = []
    for op in g.ops:
        cuts = plan.layouts.get(op.name)
        if cuts is None:
            continue
        first = op.layer
        rows.append({"op": op.name, "block": op.block, "kind": op.kind,
                     "layers": _layer_span(first, repeat.get(first, 1), g.meta["layers"]),
                     "cuts": {d: list(names) for d, names in cuts.items()}, **degrees(op, cuts, mesh)})
    return rows


def _layer_span(first: int, count: int, layers: int) -> str:
    if first < 0:
        return "embedding"
    if first >= layers:
        return "head"
    return f"{first}" if count == 1 else f"{first}-{first + count - 1}"


def _expert_gemm(op) -> bool:
    return op.kind == "linear" and op.in_dims[0][:1] == ("e",)


def config_summary(plan) -> dict:
    """The Megatron-style ``config`` block: degrees of the heaviest op family (attention core and
    MLP) and of the expert GEMMs (their own grid), plus the plan's outer choices;
    ``heterogeneous`` when ops of one grid disagree."""
    g, mesh, train = plan.graph, plan.mesh, plan.train
    ops = [op for op in g.ops if 0 <= op.layer < g.meta["layers"]]
    core = next((op for op in ops if op.kind in ("attention", "bmm")), ops[0] if ops else g.ops[0])
    deg = degrees(core, plan.layouts.get(core.name, {}), mesh)
    experts = [op for op in ops if _expert_gemm(op)]
    edeg = degrees(experts[0], plan.layouts[experts[0].name], mesh) if experts else {"ep": 1, "tp": 1}
    norms = [op for op in ops if op.kind == "norm"]
    sp = any(_factor(plan.layouts[op.name], ("s",), mesh) > deg["cp"] for op in norms)
    # the grid a plan runs, per grid (attention's, the experts'): the degrees of attention and of the
    # matmuls with a model dim in their output (a router's [b, s, e] and MLA's latent
    # down-projections are replicated by Megatron's TP and follow the sequence cut under SP)
    gridded = [op for op in ops if op.kind == "attention"
               or (op.kind == "linear" and any(d in MODEL_DIMS for d in op.out_dims[0]))]
    signatures = {(_expert_gemm(op), tuple(sorted(degrees(op, plan.layouts[op.name], mesh).items())))
                  for op in gridded}
    grids = {expert for expert, _ in signatures}
    return {"tp": deg["tp"], "pp": train.pp, "dp": deg["dp"], "cp": deg["cp"], "ep": edeg["ep"], "etp": edeg["tp"],
            "sp": sp, "zero": train.zero, "recompute": train.recompute,
            "micro_batch": max(1, g.meta["micro_batch"] // max(deg["dp"], 1)),
            "global_batch": train.global_batch, "seq": plan.seq, "vpp": train.vpp,
            "micro_steps": train.micro_steps, "heterogeneous": len(signatures) > len(grids),
            "framework": train.framework}


def megatron_summary(plan) -> dict:
    """The Megatron-LM configuration of a plan (``config_summary`` without what Megatron has no
    argument for): the ``config`` of a Megatron configuration's JSON."""
    c = config_summary(plan)
    return {k: c[k] for k in MEGATRON_KEYS}
