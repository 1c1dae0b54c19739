"""Why this plan: per layer type and mesh axis, the candidates, their cost terms and the winner.

The recursion decides one mesh axis at a time, outermost (slowest links) first: at axis k every op
keeps the cuts it chose on the outer axes and adds the cut of one legal dim by axis k, or none
(``search.partition.candidates``). ``explain_plan`` replays that decision for the finished plan:

    for each layer type (one op position of the layer, per run of layers with the same cuts)
      for each mesh axis k, outermost first
        state:       the op holds the plan's cuts on axes < k; its neighbours hold the plan's
                     cuts on axes <= k (what the recursion sees when it decides axis k)
        candidates:  no cut, or one more cut of each legal dim by axis k
        terms:       compute, communication (inside the op, gradient sync), redistribution with
                     the neighbours, memory (analysis/terms.py), seconds per step
        winner:      the plan's choice; the cheapest in time is marked too, and when they differ
                     the verdict says what the plan's choice buys (memory) or that a coordinated
                     move (a whole-level template, a Megatron seed, the final refinement) chose it

Times are seconds per training step summed over the layers the op stands for; bytes are per
device. With ``formulas`` the final layout's terms are also given as sympy expressions.
"""

from __future__ import annotations

from symtensor.analysis.formula import collective_formula, compute_formula, memory_formula
from symtensor.analysis.terms import TIME_TERMS, OpTerms, op_terms, problem_of
from symtensor.cost.params import dense_group
from symtensor.errors import PlanError, did_you_mean
from symtensor.hardware import GIB
from symtensor.layout import REPLICATED, OpLayout
from symtensor.plan.document import description_notes
from symtensor.plan.summary import axis_names, degrees, layer_types
from symtensor.search.grid import hybrid_note

# What cutting each dim means, in the words of the parallelisms (graph/ir.py legend).
MEANING = {"b": "data", "s": "sequence/context", "t": "key sequence", "c": "context (expert slots)",
           "e": "expert", "n": "tensor (heads)", "g": "tensor (kv heads)", "d": "tensor (head dim)",
           "h": "tensor (hidden)", "f": "tensor (MLP)", "v": "tensor (vocabulary)", "r": "tensor (LoRA rank)"}
TERM_WORDS = {"compute_s": "compute", "intra_s": "in-op communication", "grad_sync_s": "gradient sync",
              "optimizer_s": "optimizer", "redistribution_s": "redistribution"}


def meaning(dim: str | None) -> str:
    return "replicate (no cut)" if dim is None else f"{dim}: {MEANING.get(dim, 'dim ' + dim)}"


def dim_on_axis(layout: OpLayout, axis: int) -> str | None:
    """The dim that ``axis`` cuts in ``layout``, or None."""
    return next((d for d, axes in layout.cuts if axis in axes), None)


def explain_plan(plan, op: str | None = None, formulas: bool = False) -> dict:
    """Explain every layer type of ``plan`` (a ``plan.Plan``), or the ops named ``op``.

    Args:
        plan: a searched or loaded plan (``plan.io.load_plan``).
        op: an op name (``layers.1.q_proj``) or a block name (``q_proj``); None for all.
        formulas: add the sympy formulas of the final layout's terms.

    Example:
        >>> from symtensor.plan import load_plan                     # doctest: +SKIP
        >>> explain_plan(load_plan("plan.json"), op="q_proj")["layer_types"][0]["levels"][0]["chosen"]  # doctest: +SKIP
        'b'
    """
    problem = problem_of(plan)
    layouts = plan.op_layouts()
    groups = _groups(plan, problem)
    if op is not None:
        groups = _select(groups, op, plan)
    bought = {"precision": fp8_bought(plan, problem.ev, layouts)} if plan.train.fp8 is not None else {}
    out = {
        "model": plan.model.name, "cluster": plan.cluster.name, "devices": plan.cluster.n_devices,
        "config": plan.config, "step_time_s": plan.report.step_time_s, **bought,
        "mesh": [{"name": a.name, "size": a.size, "level": plan.cluster.levels[a.level].name} for a in plan.mesh],
        "units": "seconds per training step over the layers an op stands for; bytes per device",
        "layer_types": [explain_op(problem, plan, layouts, rep, ops, spans, formulas) for rep, ops, spans in groups],
        "memory": memory_terms(plan.report),
    }
    if plan.train.dp_replicate is not None:  # what hybrid sharding bought: the plan with ZeRO over the whole group
        flat = problem.ev.evaluate(layouts, plan.train.replace(dp_replicate=None), check=False)
        ev = problem.ev
        group = ev.mesh.size(tuple(dense_group(ev.graph, layouts, ev.param_ops)))  # (the group the search split)
        out["hybrid_sharding"] = hybrid_note(flat, plan.report, group // plan.train.dp_replicate, group,
                                             plan.train.zero)
    if plan.train.layer_split is not None:  # (a plan with the rule's split says nothing of it, as before)
        out["pipeline"] = pipeline_split_why(plan, problem.ev, layouts)
    if plan.train.vpp > 1:  # (the interleaved schedule's activations in flight, chunk by chunk)
        out["in_flight"] = in_flight(plan, problem.ev, layouts)
    assumed = description_notes(plan)  # (what the costing assumes of the run: packed documents)
    if assumed:
        out["assumptions"] = assumed
    return out


def memory_terms(report) -> dict:
    """The memory of the most loaded device, term by term (``cost.memory.TERMS``): GiB, formula and source of
    each, the allocated peak (what torch.cuda.max_memory_allocated shows) and the device's reserved peak (what
    nvidia-smi shows, the sum of the terms; ``fits`` judges it against ``usable_gib``)."""
    from symtensor.cost.memory import TERMS, peak_terms
    from symtensor.hardware import MEMORY_HEADROOM

    mem = report.memory
    detail = {"transient": "loss_transient" if mem["loss_transient"] >= mem["backward_transient"]
              else "backward_transient"}
    if "peak_transient" in mem:  # (the peak placed in time: its transient is the one live there)
        detail["transient"] = "loss_transient" if mem["peak_transient"] == mem["loss_transient"] \
            else "backward_transient"
    if mem["optimizer_transient"] and peak_terms(mem)["activations"] == 0.0 and mem["activations"]:
        detail["transient"] = "optimizer_transient"
    rows = []
    for term, nbytes in peak_terms(mem).items():
        formula, source = TERMS[detail.get(term, term)]
        rows.append({"term": term, "gib": nbytes / GIB, "formula": formula, "source": source,
                     "allocated": term not in ("fragmentation", "cuda_context", "nccl")})
    return {"terms": rows, "allocated_gib": report.memory_peak / GIB, "reserved_gib": report.memory_reserved / GIB,
            "usable_gib": MEMORY_HEADROOM * report.capacity / GIB, "fits": report.fits}


def fp8_bought(plan, ev, layouts) -> dict:
    """What FP8 (or FP4) bought an FP8 (FP4) plan: the same layouts and configuration re-costed in BF16 (``ev``:
    the plan's evaluator; ``layouts``: its ``Plan.op_layouts``), against the plan (step, compute, memory),
    and the numerics note (``cost.precision``); an FP4 plan also against FP8 (``fp4_bought``)."""
    from symtensor.cost.precision import NUMERICS_NOTE, fp8_gain

    if plan.train.precision == "fp4":
        return fp4_bought(plan, ev, layouts)
    bf16 = ev.evaluate(layouts, plan.train.replace(precision="bf16", fp8_recipe=None))
    rep = plan.report
    return {"precision": "fp8", "fp8_recipe": plan.train.fp8_recipe, "step_time_s": rep.step_time_s,
            "bf16_step_time_s": bf16.step_time_s, "speedup": bf16.step_time_s / rep.step_time_s,
            "compute_s": rep.breakdown["compute"], "bf16_compute_s": bf16.breakdown["compute"],
            "memory_gib": rep.memory_peak / GIB, "bf16_memory_gib": bf16.memory_peak / GIB, "bf16_fits": bf16.fits,
            "fp8_weights_gib": rep.memory.get("fp8_weights", 0.0) / GIB,
            "summary": f"FP8 GEMMs ({plan.train.fp8_recipe} scaling) run this plan in {rep.step_time_s:.4g} s "
                       f"against {bf16.step_time_s:.4g} s in BF16 ({fp8_gain(bf16.step_time_s, rep.step_time_s)}): "
                       f"compute {bf16.breakdown['compute']:.4g} -> {rep.breakdown['compute']:.4g} s; memory "
                       f"{bf16.memory_peak / GIB:.1f} -> {rep.memory_peak / GIB:.1f} GiB per device (FP8 weight "
                       "copies in, FP8 saved GEMM inputs out)",
            "note": NUMERICS_NOTE}


def fp4_bought(plan, ev, layouts) -> dict:
    """What NVFP4 bought an FP4 plan: the same layouts and configuration re-costed in BF16 and in FP8 under the
    device's FP8 recipe (MXFP8 on Blackwell, ``precision.default_recipe``), against the plan."""
    from symtensor.cost.precision import default_recipe, numerics_note

    fp8_recipe = default_recipe(ev.cluster.device, plan.train.framework)
    bf16 = ev.evaluate(layouts, plan.train.replace(precision="bf16", fp8_recipe=None))
    fp8 = ev.evaluate(layouts, plan.train.replace(precision="fp8", fp8_recipe=fp8_recipe))
    rep = plan.report
    return {"precision": "fp4", "fp8_recipe": plan.train.fp8_recipe, "step_time_s": rep.step_time_s,
            "bf16_step_time_s": bf16.step_time_s, "speedup": bf16.step_time_s / rep.step_time_s,
            "fp8_step_time_s": fp8.step_time_s, "fp8_speedup": fp8.step_time_s / rep.step_time_s,
            "compute_s": rep.breakdown["compute"], "bf16_compute_s": bf16.breakdown["compute"],
            "fp8_compute_s": fp8.breakdown["compute"], "memory_gib": rep.memory_peak / GIB,
            "bf16_memory_gib": bf16.memory_peak / GIB, "bf16_fits": bf16.fits, "fp8_memory_gib": fp8.memory_peak / GIB,
            "fp8_weights_gib": rep.memory.get("fp8_weights", 0.0) / GIB,
            "summary": f"NVFP4 GEMMs ({plan.train.fp8_recipe}) run this plan in {rep.step_time_s:.4g} s against "
                       f"{bf16.step_time_s:.4g} s in BF16 ({bf16.step_time_s / rep.step_time_s:.2f}x) and "
                       f"{fp8.step_time_s:.4g} s in FP8 ({fp8_recipe} scaling, "
                       f"{fp8.step_time_s / rep.step_time_s:.2f}x): compute {bf16.breakdown['compute']:.4g} (BF16), "
                       f"{fp8.breakdown['compute']:.4g} (FP8) -> "
                       f"{rep.breakdown['compute']:.4g} s; memory {bf16.memory_peak / GIB:.1f} (BF16), "
                       f"{fp8.memory_peak / GIB:.1f} (FP8) -> {rep.memory_peak / GIB:.1f} GiB per device (NVFP4 "
                       "weight copies in, NVFP4 saved GEMM inputs out)",
            "note": numerics_note(plan.train.fp8_recipe)}


def pipeline_split_why(plan, ev, layouts) -> dict:
    """Why the plan's stated layer split: its pipeline ranks' seconds per micro-batch against
    those of the rule's split (``cost.train.rule_split``: even, or Megatron's own), costed with
    the same layouts; the step pays micro-batches x the slowest rank, the bubble their mean."""
    from symtensor.cost.pipeline import layout_string

    train = plan.train
    rule = ev.evaluate(layouts, train.replace(layer_split=None), check=False)
    ours, theirs = plan.report.stage_times_s, rule.stage_times_s
    split, even = train.chunk_layers(plan.model.layers), train.replace(layer_split=None).chunk_layers(plan.model.layers)
    verdict = (f"the split {layout_string(split)} balances the pipeline: its slowest rank takes {max(ours):.4g} s "
               f"per micro-batch, {max(theirs):.4g} s under the rule's split {list(even)} (the embedding and the LM "
               f"head and loss are work on the first and last stage); the step {plan.report.step_time_s:.4g} s "
               f"against {rule.step_time_s:.4g} s" + ("" if rule.fits else " (which does not fit)"))
    return {"layer_split": list(split), "layout": layout_string(split), "rank_seconds": list(ours),
            "rule_split": list(even), "rule_rank_seconds": list(theirs), "rule_step_time_s": rule.step_time_s,
            "verdict": verdict}


def in_flight(plan, ev, layouts) -> dict:
    """Under the interleaved schedule, what each pipeline rank holds where it holds the most (``cost.memory``'s
    activations, ``cost.memory.stage_activations``): the layers of each of its model chunks (virtual stages s,
    s + pp, ...) and the micro-batches of each in flight then, its activations in GiB; and a line for the rank that
    holds the most."""
    from symtensor.cost.memory import stage_activations

    train, pp = plan.train, plan.train.pp
    chunks = train.chunk_layers(plan.model.layers)
    ranks = []
    for s, st in enumerate(ev.stages(layouts, train)):
        layers, other, _, counts = stage_activations(s, st, train)
        ranks.append({"rank": s, "chunk_layers": list(chunks[s::pp]), "micro_batches": list(counts),
                      "activations_gib": (layers + other) / GIB})
    top = max(ranks, key=lambda r: r["activations_gib"])
    runs: list = []  # consecutive chunks of equal layers and micro-batches: [first, last, layers, micro-batches]
    for c, (k, n) in enumerate(zip(top["chunk_layers"], top["micro_batches"])):
        if runs and runs[-1][2:] == [k, n]:
            runs[-1][1] = c
        else:
            runs.append([c, c, k, n])
    held = ", ".join(f"{n} of chunk{f's {a}-{b}' if b > a else f' {a}'} ({k} layer{'s' if k != 1 else ''}"
                     f"{' each' if b > a else ''})" for a, b, k, n in runs)
    verdict = (f"pipeline rank {top['rank']} holds the most activations, {top['activations_gib']:.2f} GiB, where its "
               f"held model chunks weigh the most in the interleaved schedule: micro-batches {held}")
    return {"ranks": ranks, "verdict": verdict}


def _groups(plan, problem) -> list[tuple]:
    """(representative op, op names, layer spans) per (block, kind, cuts): the plan table's rows."""
    ops = {o.name: o for o in plan.graph.ops}
    groups: dict = {}
    for row in layer_types(plan):
        key = (row["block"], row["kind"], tuple(sorted((d, tuple(a)) for d, a in row["cuts"].items())))
        groups.setdefault(key, []).append(row)
    out = []
    for rows in groups.values():
        rep = max((ops[r["op"]] for r in rows), key=lambda o: problem.weight[o.name])
        out.append((rep, [r["op"] for r in rows], [r["layers"] for r in rows]))
    return out


def _select(groups: list[tuple], name: str, plan) -> list[tuple]:
    by_name = {o.name: o for o in plan.graph.ops}
    for _, ops, spans in groups:
        if name in ops:
            return [(by_name[name], [name], [spans[ops.index(name)]])]
    chosen = [g for g in groups if g[0].block == name]
    if not chosen:
        blocks = sorted({g[0].block for g in groups})
        raise PlanError(f"no op or block {name!r} in the plan of {plan.model.name}." + did_you_mean(name, blocks))
    return chosen


def explain_op(problem, plan, layouts, op, ops=None, spans=None, formulas: bool = False) -> dict:
    """One layer type: the final layout's terms and, per mesh axis, the candidates and the winner
    (``layouts``: the plan's, by mesh position, ``Plan.op_layouts``)."""
    mesh = plan.mesh
    final = layouts.get(op.name, REPLICATED)
    terms = op_terms(problem, op, final, layouts)
    out = {"op": op.name, "block": op.block, "kind": op.kind, "layers": spans or [], "ops": ops or [op.name],
           "cuts": axis_names(final, mesh), **degrees(op, plan.layouts.get(op.name, {}), mesh),
           "terms": terms.as_dict(), "transfers": _transfers(terms, mesh),
           "levels": [_level(problem, plan, layouts, op, final, k) for k in range(len(mesh))]}
    if formulas:
        out["formulas"] = op_formulas(problem.ev, op, final, terms, problem.train)
    return out


def _level(problem, plan, layouts, op, final: OpLayout, k: int) -> dict:
    mesh, n = plan.mesh, len(plan.mesh)
    base = final.without_axes(set(range(k, n)))
    later = set(range(k + 1, n))
    nbrs = {other: layouts.get(other, REPLICATED).without_axes(later) for _, other, _ in problem.links[op.name]}
    chosen = dim_on_axis(final, k)
    rows, seen = [], set()
    for cand in problem.candidates(op, base, k):
        dim = dim_on_axis(cand, k)
        seen.add(dim)
        rows.append((dim, cand, op_terms(problem, op, cand, nbrs), False))
    if chosen not in seen:  # a move the candidate rules do not generate (refinement, seeds)
        cand = base.with_cut(chosen, k)
        rows.append((chosen, cand, op_terms(problem, op, cand, nbrs), True))
    cheapest = min(rows, key=lambda r: r[2].time_s)[0]
    pick = next(r for r in rows if r[0] == chosen)
    others = [r for r in rows if r[0] != chosen]
    runner = min(others, key=lambda r: r[2].time_s) if others else None
    axis = mesh[k]
    return {
        "axis": axis.name, "size": axis.size, "level": plan.cluster.levels[axis.level].name,
        "before": axis_names(base, mesh), "chosen": chosen, "cheapest": cheapest,
        "runner_up": runner[0] if runner else None,
        "candidates": [{"cut": dim, "meaning": meaning(dim), "layout": axis_names(cand, mesh), **t.as_dict(),
                        "chosen": dim == chosen, "cheapest": dim == cheapest, "outside_candidates": extra}
                       for dim, cand, t, extra in rows],
        "verdict": verdict(chosen, pick[2], cheapest, next(r[2] for r in rows if r[0] == cheapest), runner),
    }


def largest_term(a: OpTerms, b: OpTerms) -> tuple[str, float]:
    """The time term that differs most from ``a`` to ``b`` (name, b - a seconds)."""
    key = max(TIME_TERMS, key=lambda k: abs(getattr(b, k) - getattr(a, k)))
    return TERM_WORDS[key], getattr(b, key) - getattr(a, key)


def verdict(chosen, chosen_terms: OpTerms, cheapest, cheapest_terms: OpTerms, runner) -> str:
    """One sentence: why the plan's cut on this axis wins (or what it buys if it is not the cheapest)."""
    if runner is None:
        return f"{meaning(chosen)}: the only legal choice"
    if chosen == cheapest:
        dim, _, t, _ = runner
        word, delta = largest_term(chosen_terms, t)
        return (f"{meaning(chosen)}: cheapest; next best {meaning(dim)} costs {t.time_s - chosen_terms.time_s:+.4g} s "
                f"({word} {delta:+.4g} s)")
    extra = chosen_terms.time_s - cheapest_terms.time_s
    saved = cheapest_terms.memory_bytes - chosen_terms.memory_bytes
    if saved > 0:
        return (f"{meaning(chosen)}: {extra:+.4g} s against {meaning(cheapest)}, but saves {saved / GIB:.2f} GiB "
                "per device (memory pressure)")
    return (f"{meaning(chosen)}: {extra:+.4g} s against {meaning(cheapest)} for this op alone; a coordinated move "
            "(whole-level template, Megatron seed or final refinement) chose it for the plan as a whole")


def _transfers(terms: OpTerms, mesh) -> list[dict]:
    return [{"kind": t.kind, "bytes": t.nbytes, "calls_per_step": t.calls, "axes": [mesh[a].name for a in t.axes],
             "why": t.why} for t in terms.transfers]


def op_formulas(ev, op, layout: OpLayout, terms: OpTerms, train) -> dict:
    """Sympy formulas of the op's compute, saved activations and each distinct collective it pays under the plan's
    training configuration ``train`` (its FP8 recipe, engine and loss kernel)."""
    colls, seen = [], set()
    for t in terms.transfers:
        key = (t.kind, t.nbytes, t.axes)
        if key in seen or not t.axes:
            continue
        seen.add(key)
        colls.append({"why": t.why, "axes": [ev.mesh[a].name for a in t.axes],
                      **collective_formula(ev, t.kind, t.nbytes, t.axes)})
    return {"compute": compute_formula(ev, op, layout, train.fp8, train.stack),
            "memory": memory_formula(ev, op, layout, train.fp8, train.framework, train.stack.loss),
            "collectives": colls}
