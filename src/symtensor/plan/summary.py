"""Describe a plan in the words users know: effective DP/TP/SP/CP/EP/PP degrees per layer type.

A SymTensor plan cuts iteration dims per op; Megatron's vocabulary is derived from those cuts:

    dp  the batch dim b                           cp  the query sequence s of attention (of its query
                                                      under all-to-all context parallelism, which cuts
                                                      the core's heads: ``all_to_all_context``)
    tp  model dims: heads n, kv heads g, head dim d, hidden h, MLP f, vocabulary v
    sp  sequence cuts of norms beyond cp          pp  pipeline stages (an outer choice)
    ep  the expert dim e of the expert GEMMs      etp their model dims (expert tensor parallel)

The expert GEMMs have their own grid (Megatron's MoE parallel folding): ep x etp x the ranks
that cut their tokens (b, c) regroup the tp x cp x dp ranks of a stage.
"""

from __future__ import annotations

import math

from symtensor.cost.engine import engine_named
from symtensor.cost.params import dense_group
from symtensor.cost.stack import DEFAULTS as STACK_DEFAULTS, KEYS as STACK_KEYS

MODEL_DIMS = ("n", "g", "d", "h", "f", "v", "r")
# the keys of a Megatron-LM configuration (``search.megatron.DEFAULTS``: megatron_plan's keywords)
# (``layer_split``: the layers per virtual stage, only where the plan states its split), then the stack's facts
MEGATRON_KEYS = ("tp", "pp", "dp", "cp", "ep", "etp", "sp", "zero", "dp_shard", "recompute", "micro_batch",
                 "global_batch", "seq", "vpp", "framework", "precision", "fp8_recipe", "layer_split", *STACK_KEYS)
# how the note of a ``megatron_recipe`` baseline begins (``search.baselines.megatron_recipe``): then
# the recipe's name and source, or ``sizing rule`` and why no recipe was used
RECIPE_NOTE = "Megatron recipe: "


def recipe_of(plan) -> tuple[str, str] | None:
    """What a ``megatron_recipe`` baseline used: the recipe's name (or ``sizing rule``) and the
    note that cites it (after ``RECIPE_NOTE``); None for a plan that is no such baseline."""
    for note in plan.notes:
        if note.startswith(RECIPE_NOTE):
            text = note[len(RECIPE_NOTE):]
            return text.split(" (", 1)[0], text
    return None


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


def _gridded(op) -> bool:
    """An op whose degrees are the grid a plan runs: attention, the matmuls with a model dim in
    their output (a router's [b, s, e] and MLA's latent down-projections are replicated by
    Megatron's TP and follow the sequence cut under SP), and the vocabulary ops (embedding, LM
    head and loss, which Megatron cuts by tp, dp and cp like the layers)."""
    if op.kind == "attention":
        return True
    if op.kind == "linear" and any(d in MODEL_DIMS for d in op.out_dims[0]):
        return True
    return op.kind in ("embedding", "cross_entropy") and "v" in op.dim_sizes


def config_summary(plan) -> dict:
    """The Megatron-style ``config`` block: degrees of the heaviest op family (attention core and
    MLP) and of the expert GEMMs (their own grid), plus the plan's outer choices.

    ``heterogeneous`` when the summary does not describe every op, and ``differs`` says what, in
    short phrases (``differences``): ops of one grid whose degrees differ (an LM head cut over
    nodes the layers leave alone), ops whose cuts span fewer devices than a stage has (the
    others repeat their work), or tp*pp*dp*cp other than the device count. ``precision`` and
    ``fp8_recipe`` are there only under FP8 (BF16, the default, reads as before).
    """
    g, mesh, train = plan.graph, plan.mesh, plan.train
    ops = [op for op in g.ops if 0 <= op.layer < g.meta["layers"]]
    core, a2a = _core_a2a(plan)
    deg = degrees(core, plan.layouts.get(core.name, {}), mesh)
    experts = [op for op in ops if _expert_gemm(op)]
    edeg = degrees(experts[0], plan.layouts[experts[0].name], mesh) if experts else {"ep": 1, "tp": 1}
    norms = [op for op in ops if op.kind == "norm"]
    sp = any(_factor(plan.layouts[op.name], ("s",), mesh) > deg["cp"] for op in norms)
    differs = differences(plan, deg, edeg if experts else None, a2a)
    # all-to-all context parallelism the search found where the engine's own is ring attention (a stated one is a
    # stack fact, ``_stack``)
    kind = {"cp_comm": "a2a"} if a2a and deg["cp"] > 1 and train.context != "a2a" else {}
    # hybrid sharding: the dense data-parallel group (``cost.params.dense_group``, dp x cp where the plan is
    # homogeneous) over the replicas (the key only under HSDP)
    hybrid = {} if train.dp_replicate is None else \
        {"dp_shard": mesh.size(tuple(dense_group(g, plan.op_layouts()))) // train.dp_replicate}
    return {"tp": deg["tp"], "pp": train.pp, "dp": deg["dp"], "cp": deg["cp"], "ep": edeg["ep"], "etp": edeg["tp"],
            "sp": sp, "zero": train.zero, **hybrid, "recompute": train.recompute,
            "micro_batch": max(1, g.meta["micro_batch"] // max(deg["dp"], 1)),
            "global_batch": train.global_batch, "seq": plan.seq, "vpp": train.vpp,
            "micro_steps": train.micro_steps, "heterogeneous": bool(differs), "differs": differs,
            "framework": train.framework, **_precision(train),
            **({} if train.layer_split is None else {"layer_split": list(train.layer_split)}),
            **_stack(train, edeg["ep"]), **kind}


def _stack(train, ep: int = 2) -> dict:
    """The summary's stack facts (``cost.stack``): those that differ from the defaults (none by default); the expert
    all-to-all overlap only where there is expert parallelism (``ep``) to overlap, the low-precision facts only
    where they hold (``TrainConfig.lowp_params``, ``TrainConfig.bf16_span``: not on a BF16 point of a search);
    the BF16 layer counts as a list, as JSON writes them."""
    held = {**train.stack.as_dict(), "fp8_param_gather": train.lowp_params,
            "bf16_layers": train.bf16_span}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in held.items()
            if v != STACK_DEFAULTS[k] and not (k == "moe_ep_overlap" and ep <= 1)}


def _precision(train) -> dict:
    """The summary's precision keys: none in BF16 (the default), else the precision and its recipe (FP8's)."""
    if train.precision == "fp16":
        return {"precision": "fp16"}
    return {} if train.fp8 is None else {"precision": train.precision, "fp8_recipe": train.fp8_recipe}


def _core(plan):
    """The op whose degrees the summary gives: the first layer's attention core (the heaviest op
    family), or the first op of the layers. Under all-to-all context parallelism (``all_to_all_context``),
    whose core cuts by heads what the layer cuts by sequence, the op that makes the core's query (its rotary
    embedding or projection: the sequence cut by cp, the heads by tp)."""
    return _core_a2a(plan)[0]


def _core_a2a(plan) -> tuple:
    """``_core`` and whether the plan's context parallelism runs as all-to-alls (``all_to_all_context``)."""
    g = plan.graph
    ops = [op for op in g.ops if 0 <= op.layer < g.meta["layers"]]
    core = next((op for op in ops if op.kind in ("attention", "bmm")), ops[0] if ops else g.ops[0])
    if core.kind == "attention" and all_to_all_context(plan, core):
        return g.producers()[core.inputs[0]], True
    return core, False


def all_to_all_context(plan, core) -> bool:
    """Whether ``plan``'s context parallelism runs as all-to-alls around its attention core ``core`` (Megatron-LM's
    --cp-comm-type a2a, DeepSpeed-Ulysses): where its step says so (``TrainConfig.context``: DeepSpeed's, or a
    stack that states a2a), or, where the engine runs a2a and the stack states no kind (the per-op search is free
    to find either), where the core's query sequence is not cut and its heads are cut on every device that cuts
    the sequence of the op making its query."""
    train = plan.train
    if train.context == "a2a":
        return True
    if train.stack.cp_comm is not None or "a2a" not in engine_named(train.framework).contexts:
        return False
    cuts = plan.layouts.get(core.name, {})
    query = plan.graph.producers().get(core.inputs[0])
    seq = set(plan.layouts.get(query.name, {}).get("s", ())) if query is not None else set()
    return bool(seq) and not cuts.get("s") and seq <= set(cuts.get("n", ()))


def role_axes(plan) -> dict[str, tuple[str, ...]]:
    """The names of the mesh axes that play each role of the summary, in mesh order: ``dp`` (the
    batch), ``cp`` (the sequence) and ``tp`` (model dims) of the op the summary reads (``_core``),
    and ``pp``, the pipeline's axes. What the runtime names its mesh by (``runtime.lower``)."""
    cuts = plan.layouts.get(_core(plan).name, {})

    def on(dims) -> tuple[str, ...]:
        used = {a for d in dims for a in cuts.get(d, ())}
        return tuple(a for a in plan.mesh.names if a in used)

    return {"pp": plan.pipeline.names, "dp": on(("b",)), "cp": on(("s", "c")), "tp": on(MODEL_DIMS)}


def differences(plan, deg: dict, edeg: dict | None, a2a: bool = False) -> list[str]:
    """What a Megatron-style summary with degrees ``deg`` (attention's grid) and ``edeg`` (the
    experts', None without experts) does not say about ``plan``, as short phrases; [] when it
    describes every op (see ``config_summary``). ``a2a``: its context parallelism runs as all-to-alls
    (``all_to_all_context``)."""
    g, mesh = plan.graph, plan.mesh
    stage = mesh.size()
    # all-to-all context parallelism's attention core: its heads cut by the cp devices too, its query sequence not
    core = {**deg, "cp": 1, "tp": deg["tp"] * deg["cp"]} if a2a else deg
    odd: dict = {}  # (expert grid, degrees) -> blocks
    short: dict = {}  # devices an op's cuts span (< stage) -> blocks
    for op in g.ops:
        cuts = plan.layouts.get(op.name)
        if cuts is None or not _gridded(op):
            continue
        expert = _expert_gemm(op)
        d = degrees(op, cuts, mesh)
        if d != (edeg if expert else core if op.kind == "attention" else deg):
            odd.setdefault((expert, tuple(d.items())), []).append(op.block)
        used = mesh.size_of(tuple(a for names in cuts.values() for a in names))
        if used < stage:
            short.setdefault(used, []).append(op.block)
    out = []
    world = deg["tp"] * plan.train.pp * deg["dp"] * deg["cp"]
    if world != plan.cluster.n_devices:
        out.append(f"tp*pp*dp*cp = {deg['tp']}*{plan.train.pp}*{deg['dp']}*{deg['cp']} = {world}, not the "
                   f"{plan.cluster.n_devices} devices")
    for used, blocks in sorted(short.items()):
        out.append(f"{_blocks(blocks)} use {used} of the {stage} devices of a stage: x{stage // used} repeated work")
    for (expert, d), blocks in odd.items():
        ref = edeg if expert else deg
        out.append(f"{_blocks(blocks)}: {_degrees(dict(d), ref, expert)} (the summary's "
                   f"{_degrees(ref, dict(d), expert)})")
    return out


def _blocks(blocks: list[str], shown: int = 3) -> str:
    """Op blocks, each once, the first ``shown`` by name."""
    names = list(dict.fromkeys(blocks))
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _degrees(d: dict, other: dict, expert: bool) -> str:
    """``d`` as ``dp=8 tp=3``: the degrees above 1 or unlike ``other``'s (``etp`` for the
    experts' model dims)."""
    keys = [k for k in ("dp", "cp", "tp", "ep") if d.get(k, 1) > 1 or d.get(k, 1) != other.get(k, 1)]
    return " ".join(f"{'etp' if expert and k == 'tp' else k}={d.get(k, 1)}" for k in keys) or "replicated"


def repeated_work(plan) -> tuple[int, int, int] | None:
    """When the layers' cuts span fewer devices than a stage has (the others repeat their work):
    (the devices they span, a stage's devices, the least global batch that is a multiple of the
    plan's and lets a batch cut use every device); None when every device has its own share."""
    g, mesh, train = plan.graph, plan.mesh, plan.train
    stage = mesh.size()
    layers = [op for op in g.ops if 0 <= op.layer < g.meta["layers"] and _gridded(op) and op.name in plan.layouts]
    if not layers:
        return None
    spans = {op.name: mesh.size_of(tuple(a for names in plan.layouts[op.name].values() for a in names))
             for op in layers}
    least = min(layers, key=lambda op: spans[op.name])
    used = spans[least.name]
    if used >= stage:
        return None
    dp = _factor(plan.layouts[least.name], ("b",), mesh)
    return used, stage, math.lcm(train.global_batch, dp * (stage // used) * train.micro_steps)


def repeated_work_note(plan) -> str | None:
    """``repeated_work`` as a plan note, or None."""
    repeat = repeated_work(plan)
    if repeat is None:
        return None
    used, stage, batch = repeat
    return (f"devices repeat work: the layers' cuts span {used} of the {stage} devices of a stage, so each op "
            f"runs {stage // used} times over; a global batch of {batch} (--global-batch {batch}) would let data "
            "parallelism use every device")


def megatron_summary(plan) -> dict:
    """The Megatron-LM configuration of a plan (``config_summary`` without what Megatron has no
    argument for): the ``config`` of a Megatron configuration's JSON (``dp_shard`` only under
    hybrid sharding)."""
    c = config_summary(plan)
    return {k: c[k] for k in MEGATRON_KEYS if k in c}
