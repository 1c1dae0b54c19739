"""The library's entry points: what each command computes, as values (no printing). Plans are
``symtensor.plan.Plan`` objects, which ``symtensor.plan.document`` writes as the commands' JSON.

    >>> from symtensor.api import graph_summary
    >>> graph_summary("tiny-llama", micro_batch=1, seq=16)["layers"]
    2
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from symtensor.errors import PlanError
from symtensor.graph import model_flops
from symtensor.hardware import load_cluster
from symtensor.models import build_graph, load_model_config, params_active
from symtensor.plan import Parallelism, Plan, Stack
from symtensor.plan.parallelism import default_global_batch, default_seq, engine_refusal, evaluate_defaults
from symtensor.search.megatron import megatron_plan


def graph_summary(model, micro_batch: int = 1, seq: int | None = None, global_batch: int | None = None,
                  overrides=None) -> dict:
    """Parameter counts, operators, FLOPs and activation sizes of a model's training graph."""
    cfg = load_model_config(model, overrides)
    seq = seq or default_seq(cfg)
    global_batch = global_batch or micro_batch
    if global_batch % micro_batch:
        raise PlanError(f"global batch {global_batch} is not a multiple of the micro batch {micro_batch}")
    g = build_graph(cfg, micro_batch=micro_batch, seq=seq)
    flops_mb = model_flops(g)
    steps = global_batch // micro_batch
    act = sum(g.tensors[t].nbytes for op in g.ops for t in op.outputs)
    per_layer = sum(g.tensors[t].nbytes for op in g.layer_ops(0) for t in op.outputs) if cfg.layers else 0
    return {
        "model": cfg.name, "params_total": g.params_total(), "params_active": params_active(cfg, g),
        "layers": cfg.layers, "hidden": cfg.hidden, "heads": cfg.heads, "kv_heads": cfg.kv_heads,
        "ffn": cfg.ffn, "vocab": cfg.vocab, "experts": cfg.experts, "top_k": cfg.top_k,
        "ops": len(g.ops), "ops_by_kind": dict(Counter(op.kind for op in g.ops)),
        "tensors": len(g.tensors), "seq": seq, "micro_batch": micro_batch, "global_batch": global_batch,
        "flops_per_step": flops_mb * steps, "flops_per_token": flops_mb / (micro_batch * seq),
        "activation_bytes_per_microbatch": act, "activation_bytes_per_layer": per_layer,
        "source": cfg.source,
    }


def _best_micro_batch(cfg, cluster, config: Parallelism, layout: str | None) -> Plan:
    """``--micro-batch auto``: the plan of ``config`` at the fastest micro batch that fits (the
    fastest overall if none fits)."""
    per_replica = config.global_batch // config.dp
    best, why = None, None
    for mb in [d for d in range(1, min(per_replica, 64) + 1) if per_replica % d == 0]:
        try:
            plan = _configured_plan(cfg, cluster, config.replace(micro_batch=mb), layout)
        except PlanError as exc:
            why = why or exc
            continue
        key = (not plan.report.fits, plan.report.step_time_s)
        if best is None or key < best[0]:
            best = (key, plan)
    if best is None:
        raise PlanError(f"no micro batch size is valid for this configuration: {why}")
    return best[1]


LAYOUT_WORDS = ("balanced", "even")  # evaluate --pp-layout's words besides a split


def stated_split(text: str, cfg, pp: int, vpp: int) -> tuple[int, tuple[int, ...] | None]:
    """``--pp-layout``: (vpp, layers per virtual stage) of Megatron's layout string
    (``cost.pipeline.parse_layout``; its stages give vpp) or of ``FIRST,LAST`` layers of the
    first and last stages (Megatron's --decoder-first/last-pipeline-num-layers, either may be
    empty; ``cost.pipeline.ends_split``); (vpp, None) for ``even`` (Megatron's own split without
    a layout argument: ``TrainConfig.chunk_layers``)."""
    from symtensor.cost.pipeline import ends_split, parse_layout

    if pp == 1:
        raise PlanError("--pp-layout splits the layers over pipeline stages: it needs --pp > 1")
    text = text.strip()
    if text == "even":
        return vpp, None
    if "," in text and all(part.strip().isdigit() or not part.strip() for part in text.split(",")):
        first, last = (int(x) if x.strip() else None for x in (text.split(",") + [""])[:2])
        return vpp, ends_split(first, last, cfg.layers, pp, vpp)
    split = parse_layout(text, pp, cfg.layers)
    stages = len(split) // pp
    if vpp not in (1, stages):
        raise PlanError(f"--pp-layout has {len(split)} stages, pp={pp} x vpp={stages}, but --vpp is {vpp}; drop --vpp "
                        "or give a layout of pp x vpp stages")
    return stages, split


def _configured_plan(cfg, cluster, config: Parallelism, layout: str | None) -> Plan:
    """The plan of ``config`` with its pipeline split: the stated one (``config.layer_split``,
    or ``layout`` ``even``), the balanced one (``layout`` ``balanced``), or by default the better
    of Megatron's own split and the balanced one (``search.megatron.balanced_layer_split``),
    whose note says which and why."""
    from symtensor.cost.pipeline import layout_string
    from symtensor.search.megatron import balanced_layer_split

    ruled = config.pp > 1 and engine_refusal(config.replace(layer_split=(0,)))  # an engine that splits by its rule
    if ruled and layout == "balanced":
        raise PlanError(ruled)
    if config.pp == 1 or config.layer_split is not None or layout == "even" or ruled:
        return megatron_plan(cfg, cluster, **config.as_dict())
    # one skeleton graph for the split and both plans (the one each would build: the layer split
    # changes neither the batch nor the sequence)
    graph = build_graph(cfg, micro_batch=config.micro_batch * config.dp, seq=config.seq, skeleton=True)
    split = balanced_layer_split(cfg, cluster, graph, **config.as_dict())
    if layout != "balanced" and split == config.train.chunk_layers(cfg.layers):
        return megatron_plan(cfg, cluster, graph, **config.as_dict())  # (the balanced plan would be the rule's)
    balanced = megatron_plan(cfg, cluster, graph, **config.replace(layer_split=split).as_dict())
    says = f"the balanced layer split {layout_string(split)} (layers per virtual stage {list(split)})"
    if layout == "balanced":
        return replace(balanced, notes=(f"{says}, as --pp-layout balanced asks",))
    rule = megatron_plan(cfg, cluster, graph, **config.as_dict())
    if not _beats(balanced, rule):
        return rule
    how = f"{rule.report.step_time_s:.4g} s" if rule.report.fits else "does not fit"
    return replace(balanced, notes=(f"{says}: its slowest pipeline rank is faster than under the even split "
                                    f"{list(rule.train.chunk_layers(cfg.layers))} ({how}, --pp-layout even); the "
                                    "exports state it (Megatron's --pipeline-model-parallel-layout, torchtitan's "
                                    "module_fqns_per_model_part)",))


def _beats(a: Plan, b: Plan) -> bool:
    """Whether ``a`` fits where ``b`` does not, or both fit (or neither) and it is faster."""
    if a.report.fits != b.report.fits:
        return a.report.fits
    return a.report.step_time_s < b.report.step_time_s


def evaluate(model, cluster: str, devices: int | None = None, nodes: int | None = None, *, tp=1, pp=1, dp=None,
             cp=1, ep=1, etp=1, sp=None, zero=0, recompute="none", micro_batch="auto", global_batch=None, seq=None,
             vpp=1, overrides=None, framework: str = "megatron", precision: str = "bf16",
             fp8_recipe: str | None = None, dp_shard: int | None = None, pp_layout: str | None = None,
             stack: Stack | None = None) -> Plan:
    """The plan of a Megatron-style configuration, costed under ``framework``'s engine semantics
    (``plan.document.evaluation_json`` is the JSON of ``symtensor evaluate``). ``ep`` and ``etp``:
    the expert layers' grid, folded over the tp x cp x dp ranks of a stage (``search.megatron``).
    ``precision``: ``bf16`` or ``fp8`` (the layers' linear GEMMs, ``cost.precision``) under
    ``fp8_recipe`` (default: the device's, ``precision.default_recipe``), ``fp4`` (the same GEMMs in NVFP4 on
    Blackwell, recipe ``nvfp4``), or ``fp16`` (dynamic loss
    scaling, where the engine models it: ``cost.engine.Engine.fp16``, megatron-deepspeed). ``dp_shard``: hybrid
    sharding, ZeRO over the innermost dp_shard ranks of dp x cp, replicated across the rest
    (``Parallelism.dp_shard``). ``pp_layout``: the layer split over the pipeline (``stated_split``:
    Megatron's layout string, ``FIRST,LAST`` stage layers, ``even`` or ``balanced``); by default the
    better of Megatron's own split and the balanced one, and the plan's note says when that is the
    balanced one. ``stack``: the facts of the user's stack the configuration runs with (``cost.stack.Stack``: how
    the MoE layers run, the gradient reduction's dtype, the allocator's expandable segments); default: today's."""
    cfg = load_model_config(model, overrides)
    cl = load_cluster(cluster, devices=devices, nodes=nodes)
    filled = evaluate_defaults(cfg, cl.n_devices, tp=tp, pp=pp, cp=cp, dp=dp, sp=sp, seq=seq,
                               global_batch=global_batch, framework=framework)
    dp, sp, seq, global_batch = filled["dp"], filled["sp"], filled["seq"], filled["global_batch"]
    split, mode = None, pp_layout if pp_layout in LAYOUT_WORDS else None
    if pp_layout is not None and mode != "balanced":
        vpp, split = stated_split(pp_layout, cfg, pp, vpp)
    config = Parallelism(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, sp=sp, zero=zero, dp_shard=dp_shard,
                         recompute=recompute,
                         micro_batch=1 if micro_batch == "auto" else int(micro_batch), global_batch=global_batch,
                         seq=seq, vpp=vpp, framework=framework, precision=precision,
                         fp8_recipe=fp8_recipe_for(precision, fp8_recipe, cl.device, framework), layer_split=split,
                         stack=stack or Stack())
    why = config.refusal(cfg, cl.n_devices, cl.device)  # the one configuration rule, before any costing
    if why is not None:
        raise PlanError(why)
    if micro_batch == "auto":
        return _best_micro_batch(cfg, cl, config, mode)
    return _configured_plan(cfg, cl, config, mode)


def fp8_recipe_for(precision: str | None, recipe: str | None, device, framework: str = "megatron") -> str | None:
    """The FP8 recipe a run names or, under ``--precision fp8`` without one, the device's and the
    engine's default (``cost.precision.named_recipe``); under ``--precision fp4`` without one, NVFP4;
    None in BF16."""
    from symtensor.cost.precision import has_fp8, named_recipe

    if precision == "fp8" and has_fp8(device):
        return named_recipe(recipe, device, framework)
    if precision == "fp4":
        return named_recipe(recipe, device, framework, precision)
    return recipe


def captured_graphs(model, seq: int, overrides=None):
    """A graph factory over micro-step batch sizes from one torch.export capture of the Hugging Face
    model (built from its config on fake tensors; needs the torch extra)."""
    from symtensor.frontends import capture_hf
    from symtensor.graph import rescale_dim

    cfg = load_model_config(model, overrides)
    base = capture_hf(cfg, micro_batch=1, seq=seq)
    return lambda batch: rescale_dim(base, "b", batch)


def torch_model(spec: str):
    """``package.module:factory`` returning (a Hugging Face style nn.Module, example inputs): its
    ModelConfig (from ``module.config``), sequence length and a graph factory over batch sizes."""
    from symtensor.frontends import capture_hf
    from symtensor.frontends.hf import call_factory
    from symtensor.graph import rescale_dim
    from symtensor.models import from_hf_dict

    module, _ = call_factory(spec)
    config = getattr(module, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise PlanError(f"{spec}: --torch plans modules with a Hugging Face config (module.config); for any other "
                        "nn.Module use symtensor.frontends.capture_module and the library's search")
    cfg = from_hf_dict(config.to_dict(), name=type(module).__name__, path=spec)
    base = capture_hf(spec)
    if "b" not in {d for op in base.ops for d, _ in op.dims}:
        raise PlanError(f"{spec}: the captured graph has no batch dim (token ids [b, s] as first input)")
    return cfg, base.meta["seq"], lambda batch: rescale_dim(base, "b", batch)


def plan(model, cluster: str, devices: int | None = None, nodes: int | None = None, micro_batch="auto",
         global_batch=None, seq=None, space: str = "symtensor", overrides=None, capture: bool = False,
         torch: str | None = None, framework: str = "megatron", precision: str | None = None,
         fp8_recipe: str | None = None, stack: Stack | None = None) -> Plan:
    """Search the best plan under ``framework``'s engine semantics (``plan.document.plan_json`` is
    the JSON of ``symtensor plan``); never worse than the Megatron grid's best
    (``plan_with_baselines``). With ``capture`` the graph is the model's own PyTorch forward,
    captured by torch.export, instead of the builders'; ``torch``: a module factory to capture.
    ``precision``: ``bf16`` or ``fp8`` (under ``fp8_recipe``); None: the search chooses (FP8 where
    the device has it and it wins, ``search.planner`` step 6). ``stack``: the stated facts of the user's stack
    (``cost.stack.Stack``) that every point of the search runs with (the gradient reduction where the engine runs
    it at the point's ZeRO stage, the expert all-to-all overlap where Megatron runs it)."""
    return plan_with_baselines(model, cluster, devices, nodes, micro_batch, global_batch, seq, space, overrides,
                               capture, torch, framework, names=(), precision=precision, fp8_recipe=fp8_recipe,
                               stack=stack)[0]


def plan_with_baselines(model, cluster: str, devices: int | None = None, nodes: int | None = None,
                        micro_batch="auto", global_batch=None, seq=None, space: str = "symtensor", overrides=None,
                        capture: bool = False, torch: str | None = None, framework: str = "megatron",
                        names=None, precision: str | None = None,
                        fp8_recipe: str | None = None,
                        stack: Stack | None = None) -> tuple[Plan, dict[str, Plan | None]]:
    """``plan`` and the baselines ``names`` (default all of ``search.BASELINES``) beside it. A
    builders' plan of the whole space keeps the promises of ``search.guarantee``: never worse
    than the Megatron grid's best (costed either way, once) and monotone in devices. A captured
    graph's costs are its own (the grid's are the builders'), and a fixed micro batch holds the
    search to it: their plans are the search's. A stated ``precision`` holds the baselines too;
    without one they keep BF16 (the recipes'). ``stack``: the facts of the user's stack (``cost.stack.Stack``)
    the search, the grid and the baselines run with."""
    from symtensor.search import BASELINES, search
    from symtensor.search.guarantee import GRID, guaranteed_plan

    why = engine_refusal(Parallelism(framework=framework, zero=2))
    if why is not None:
        raise PlanError(f"plan does not search under {framework} (its search would try what the engine does not run: "
                        f"{why}); cost a configuration with "
                        f"evaluate --framework {framework}")
    cl = load_cluster(cluster, devices=devices, nodes=nodes)
    if torch:
        cfg, seq, factory = torch_model(torch)
    else:
        cfg = load_model_config(model, overrides)
        seq = seq or default_seq(cfg)
        factory = captured_graphs(model, seq, overrides) if capture else None
    global_batch = global_batch or default_global_batch(seq)
    mb = None if micro_batch in (None, "auto") else int(micro_batch)
    names = BASELINES if names is None else tuple(names)

    held = _held(precision, fp8_recipe, stack)

    def run(on, pool=None):
        return search(cfg, on, global_batch, seq, micro_batch=mb, space=space, graph_factory=factory,
                      framework=framework, precision=precision, fp8_recipe=fp8_recipe, stack=stack, pool=pool)

    if space == "symtensor" and factory is None and mb is None:
        return guaranteed_plan(cfg, cl, global_batch, seq, framework, run, names, precision=held)
    p = run(cl)
    if not names:
        return p, {}
    if space == "megatron" and factory is None and mb is None and GRID in names and (precision or p.train.fp8 is None):
        # the plan is the grid's best (the same grid of the same cost model): costed once
        rest = baselines(p, [n for n in names if n != GRID], **held) if len(names) > 1 else {}
        grid = replace(p, notes=()).with_account(None)
        return p, {n: grid if n == GRID else rest[n] for n in names}
    return p, baselines(p, names, **held)


def _held(precision: str | None, fp8_recipe: str | None, stack: Stack | None) -> dict:
    """What a search holds its baselines to besides its own (``plan_with_baselines``, ``sweep``): a
    stated precision with its FP8 recipe, and the stack's facts where one differs from the defaults
    (``cost.stack.Stack``); empty for neither."""
    held = {"precision": precision, "fp8_recipe": fp8_recipe} if precision else {}
    if stack is not None and stack.differing():
        held["stack"] = stack
    return held


def baselines(p: Plan, names=None, precision: str | None = None, fp8_recipe: str | None = None,
              stack: Stack | None = None) -> dict:
    """The Megatron recipe, the Megatron grid best, FSDP and D-Rec (or those ``names``) for ``p``'s
    model, cluster, batch, sequence and engine (None where one has no valid configuration), in
    ``precision`` (default BF16, the recipes') and with the stack's facts ``stack`` (``cost.stack.Stack``)."""
    from symtensor.search import BASELINES, baseline_plans

    return baseline_plans(p.model, p.cluster, p.train.global_batch, p.seq, p.engine, names or BASELINES,
                          precision=precision, fp8_recipe=fp8_recipe, stack=stack)


def explain(plan_file: str, op: str | None = None, formulas: bool = False) -> dict:
    """Why a plan: per layer type and mesh axis, the candidates, their cost terms and the winner;
    the JSON of ``symtensor explain`` (see ``symtensor.analysis.explain``)."""
    from symtensor.analysis.explain import explain_plan
    from symtensor.plan import load_plan

    return explain_plan(load_plan(plan_file), op=op, formulas=formulas)


def compare(a: str, b: str, precision: str | None = None, fp8_recipe: str | None = None) -> dict:
    """Two plans (files, or a file and a baseline name, costed in ``precision``: default BF16):
    where they differ and what it costs; the JSON of ``symtensor compare`` (see
    ``symtensor.analysis.compare``)."""
    from symtensor.analysis.compare import compare_specs

    return compare_specs(a, b, precision, fp8_recipe)


def sweep(model, cluster: str, devices=None, nodes=None, seq=None, global_batch=None, micro_batch="auto",
          space: str = "symtensor", overrides=None, on_point=None, precision: str | None = None,
          fp8_recipe: str | None = None, stack: Stack | None = None) -> dict:
    """Plans across a range of one of ``seq``, ``devices``, ``nodes`` or ``global_batch`` (each an int, a
    list, or a range string ``A..B``, ``A..B:F``, ``A,B,C``); the JSON of ``symtensor sweep``.
    Without ``global_batch`` every point keeps about 4M tokens per step. ``precision`` and ``stack`` as
    ``plan``'s."""
    from symtensor.analysis.sweep import run_sweep
    from symtensor.validate import parse_range

    cfg = load_model_config(model, overrides)
    given = {"seq": parse_range(seq, "--seq"), "devices": parse_range(devices, "--devices"),
             "nodes": parse_range(nodes, "--nodes"), "global_batch": parse_range(global_batch, "--global-batch")}
    ranged = [k for k, v in given.items() if v and len(v) > 1]
    if len(ranged) > 1:
        raise PlanError(f"sweep one parameter at a time: {' and '.join('--' + k.replace('_', '-') for k in ranged)} "
                        "are both ranges")
    if not ranged:
        raise PlanError("nothing to sweep: give one range, e.g. --seq 2048..131072, --devices 8..512 or "
                        "--global-batch 64..1024")
    if not (given["devices"] or given["nodes"]):
        raise PlanError("give the devices: --devices N (or a range) or --nodes N")
    param = ranged[0]
    grid = []
    for v in given[param]:
        point = {k: (v if k == param else (vals[0] if vals else None)) for k, vals in given.items()}
        s = point["seq"] or default_seq(cfg)
        grid.append({"value": v, "devices": point["devices"], "nodes": point["nodes"], "seq": s,
                     "global_batch": point["global_batch"] or default_global_batch(s)})
    mb = None if micro_batch in (None, "auto") else int(micro_batch)
    held = _held(precision, fp8_recipe, stack)
    return run_sweep(cfg, cluster, param, grid, micro_batch=mb, space=space, on_point=on_point, precision=held)


SWEEP_PARAMS = ("seq", "devices", "nodes", "global_batch")


def report(model, cluster: str, devices: int | None = None, nodes: int | None = None, micro_batch="auto",
           global_batch=None, seq=None, space: str = "symtensor", overrides=None, html: str = "report.html",
           sweep_spec: str | None = None, on_point=None) -> dict:
    """Search a plan and write one self-contained HTML page: the plan's tables, its step time and
    memory against the baselines, the per-layer layout map, why each cut won, and a sweep.

    Args:
        sweep_spec: ``PARAM=RANGE`` (``seq=2048..32768``, ``devices=8..64``), ``none``, or None for
            the sequence from half to twice the plan's.
    """
    from symtensor.analysis.explain import explain_plan
    from symtensor.plan.document import plan_json
    from symtensor.report.html import write

    cfg = load_model_config(model, overrides)
    cl = load_cluster(cluster, devices=devices, nodes=nodes)
    seq = seq or default_seq(cfg)
    fixed_batch = global_batch
    global_batch = global_batch or default_global_batch(seq)
    searched = plan(model, cluster, devices=devices, nodes=nodes, micro_batch=micro_batch, global_batch=global_batch,
                    seq=seq, space=space, overrides=overrides)
    result = plan_json(searched, baselines(searched), space=space, detail=True)
    spec = f"seq={max(1, seq // 2)}..{seq * 2}" if sweep_spec is None else sweep_spec
    swept = None
    if spec != "none":
        param, _, rng = spec.partition("=")
        if param not in SWEEP_PARAMS or not rng:
            raise PlanError(f"--sweep {spec}: expected PARAM=RANGE with PARAM one of {', '.join(SWEEP_PARAMS)} "
                            "(e.g. seq=2048..32768), or none")
        where = {"devices": None if param == "nodes" else cl.n_devices, "nodes": None, "seq": seq,
                 "global_batch": fixed_batch}
        where[param] = rng
        swept = sweep(model, cluster, micro_batch=micro_batch, space=space, overrides=overrides, on_point=on_point,
                      **where)
    data = {"plan": result, "layers": cfg.layers, "explain": explain_plan(searched), "sweep": swept}
    path = write(html, data)
    return {"html": str(path), **data}
