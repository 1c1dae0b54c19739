"""A plan as the JSON the commands print: ``symtensor plan --json`` and ``symtensor evaluate --json``.

The library returns ``Plan`` values (``symtensor.api``); this module writes them out, with what
every prediction states besides its numbers (the engine, the efficiency table and the error band
of its regime, ``cost.bands``) and the baselines beside a searched plan.
"""

from __future__ import annotations

from symtensor.cost.engine import context_of, engine_named
from symtensor.cost.kernels import ALIGN_ELEMENTS
from symtensor.cost.opcost import unaligned_factor
from symtensor.hardware import GIB
from symtensor.hardware.cluster import PRESET_DEVICES
from symtensor.plan.plan import Plan
from symtensor.plan.summary import layer_types, megatron_summary, recipe_of, repeated_work_note

# the baselines that are Megatron configurations report their Megatron arguments as ``config``
MEGATRON_BASELINES = ("megatron_recipe", "megatron_grid_best", "fsdp")


def prediction_terms(cfg, cluster, step_s: float, *, zero: int, seq: int, framework: str, graph,
                     precision: str = "bf16", tp: int | None = None, attention: str | None = None) -> dict:
    """What every prediction states besides its numbers: the engine, the efficiency table and its
    source, the attention kernel the graph was costed with (the stack's stated one, ``attention``, in place of the
    engine's own), and the error band of its regime (``cost.bands``)."""
    from symtensor.cost.efficiency import device_table, efficiency_for

    b = config_band(cfg, cluster, step_s, zero=zero, seq=seq, framework=framework, precision=precision, tp=tp)
    table = "measured (cluster file)" if cluster.efficiency else device_table(cluster.device.name)
    return {"framework": framework, "efficiency_table": table,
            "efficiency_source": efficiency_for(cluster).source, "attention_kernel": attention_kernel(graph, attention),
            "regime": b.regime, "step_time_band_s": b.as_list(), "band_calibrated": b.calibrated,
            "band_widened": list(b.widened)}


def attention_kernel(graph, stated: str | None = None) -> str:
    """The attention kernel(s) of ``graph`` as the cost model reads them (``models.config.ATTENTION``):
    each fused attention op's ``kernel`` attr (none: ``flash``, the engine's own, or the stack's ``stated`` kernel,
    ``Stack.attention``), ``unfused`` where attention is separate score and context matmuls; several are joined with
    commas."""
    own = stated or "flash"
    kernels = dict.fromkeys(op.attr("kernel") or own for op in graph.ops if op.kind == "attention")
    if any(op.kind == "bmm" and op.attr("core") for op in graph.ops):
        kernels["unfused"] = None
    return ",".join(kernels) or "none"


def config_band(cfg, cluster, step_s: float, *, zero: int, seq: int, framework: str, precision: str = "bf16",
                tp: int | None = None):
    """The error band (``cost.bands.Band``) of a prediction for ``cfg`` on ``cluster``: the
    residuals of the user's own runs where the cluster file was calibrated on them (``symtensor
    calibrate --runs``), else the shipped calibration's for its device and regime, widened along
    each dimension the prediction leaves the calibrated domain (precision, scale, network
    bandwidth per device: the outermost level's, the tensor-parallel degree ``tp``, the model's width)."""
    from symtensor.cost.bands import band_of, from_residuals

    if cluster.band is not None:
        return from_residuals(step_s, cluster.band, f"your runs ({cluster.name})", True)
    network = cluster.levels[-1].bandwidth / 1e9 if cluster.nodes > 1 else None
    return band_of(step_s, cluster.device.name, zero=zero, seq=seq, lora=cfg.lora_rank > 0, moe=cfg.is_moe,
                   framework=framework, precision=precision, devices=cluster.n_devices,
                   network_gbps_per_device=network, tp=tp, hidden=cfg.hidden)


def evaluation_json(plan: Plan) -> dict:
    """The JSON of ``symtensor evaluate``: a Megatron configuration's plan."""
    out = plan.report.as_dict()
    out.update(model=plan.model.name, cluster=plan.cluster.name, devices=plan.cluster.n_devices,
               config=megatron_summary(plan))
    out.update(prediction_terms(plan.model, plan.cluster, plan.report.step_time_s, zero=plan.train.zero,
                                seq=plan.seq, framework=plan.engine, graph=plan.graph, precision=plan.train.precision,
                                tp=out["config"]["tp"], attention=plan.train.stack.attention))
    said = [*plan.notes, *description_notes(plan)]  # (the pipeline split evaluate chose, when not Megatron's own)
    if said:
        out["notes"] = said
    return out


def plan_json(plan: Plan, baselines: dict | None = None, *, space: str = "symtensor", captured: bool = False,
              detail: bool = False) -> dict:
    """The JSON of ``symtensor plan``; ``baselines`` (``api.baselines``) adds their block, with
    each baseline's breakdown and memory when ``detail``."""
    cl = plan.cluster
    result = plan.report.as_dict()
    result.update(model=plan.model.name, cluster=cl.name, devices=cl.n_devices, space=space, captured=captured,
                  search_time_s=plan.search_time_s, search_phases_s=dict(plan.search_phases_s),
                  evaluations=plan.evaluations, partitions=plan.partitions, config=plan.config, notes=notes(plan),
                  mesh=[{"name": a.name, "size": a.size, "level": cl.levels[a.level].name} for a in plan.mesh],
                  pipeline_axes=list(plan.pipeline.names),
                  layouts={name: {d: list(axes) for d, axes in cuts.items()} for name, cuts in plan.layouts.items()},
                  layer_types=layer_types(plan))
    result.update(prediction_terms(plan.model, cl, plan.report.step_time_s, zero=plan.train.zero, seq=plan.seq,
                                   framework=plan.engine, graph=plan.graph, precision=plan.train.precision,
                                   tp=result["config"]["tp"], attention=plan.train.stack.attention))
    if baselines is not None:
        result["baselines"] = baselines_json(plan, baselines, _band(result), detail)
    return result


def notes(plan: Plan) -> list[str]:
    """The search's notes, ``summary.repeated_work_note`` when devices repeat work, and what the description
    assumes (``description_notes``)."""
    repeat = repeated_work_note(plan)
    return [*plan.notes, *([repeat] if repeat else []), *description_notes(plan)]


# the device names of PRESET_DEVICES that are NVIDIA GPUs (cuBLAS's kernels; not Ascend's)
CUBLAS_DEVICES = tuple(key for key, _ in PRESET_DEVICES if key != "910B")


def description_notes(plan: Plan) -> list[str]:
    """What the costing assumes of the run beyond the model's architecture: a vocabulary, hidden or FFN width no
    multiple of 8 (``cost.kernels.ALIGN_ELEMENTS``) on an NVIDIA GPU (cuBLAS's unaligned kernels): costed at the
    device's measured unaligned rate where it has one (``cost.kernels.alignment_factor``: the GH100), noted as
    costed at aligned rates elsewhere; a vocabulary padded by an engine that pads (``Engine.pads_vocab``) is costed
    aligned and not noted;
    packed documents, as the graph's attention carries them
    (``ModelConfig.doc_tokens`` shorter than the sequence: ``models.builder``), and context parallelism run as
    all-to-alls (``plan.summary.all_to_all_context``: DeepSpeed-Ulysses, Megatron's a2a)."""
    from symtensor.cost.efficiency import efficiency_for

    out = []
    cublas = any(key in plan.cluster.device.name for key in CUBLAS_DEVICES)
    eff = efficiency_for(plan.cluster, plan.train.framework)
    if eff.unaligned:
        how = "are costed at the unaligned rate the cluster file measured (symtensor profile)"
    elif unaligned_factor(eff, 1, ALIGN_ELEMENTS) < 1:  # (an odd width: the device's table prices it)
        how = ("are costed at cuBLAS's unaligned rate measured on the GH100 (one H200, "
               "benchmarks/results/hopper_runs.md)")
    else:
        how = ("are costed at aligned rates (no measured unaligned rate for this device's GEMMs: symtensor profile "
               "measures it; on the GH100, one H200, they ran about three times slower: benchmarks/results/"
               "hopper_runs.md)")
    built = plan.graph.meta.get("config")  # (None for a captured model: its graph has the module's own shapes)
    stated = plan.model.vocab
    padded = built.vocab if built is not None else stated
    pads = engine_named(plan.train.framework).pads_vocab
    if cublas and padded != stated and stated % ALIGN_ELEMENTS and not pads:
        out.append(f"vocabulary {stated:,} (no multiple of {ALIGN_ELEMENTS}) runs unpadded on this engine: its LM "
                   f"head's GEMMs {how}, 0.15-0.43 of the aligned rate; pad the vocabulary (e.g. "
                   "resize_token_embeddings(pad_to_multiple_of=128)) to run them aligned")
    odd = [f"{name} {size:,}" for name, size in (("hidden", plan.model.hidden), ("FFN", plan.model.ffn))
           if cublas and size % ALIGN_ELEMENTS]
    if odd:
        out.append(f"{' and '.join(odd)} no multiple of {ALIGN_ELEMENTS}: the layers' GEMMs over it {how} (0.35 of "
                   "the aligned rate for a 5,140-wide layer against 5,120); a width that is a multiple of 8 runs "
                   "them aligned")
    doc = next((op.attr("document") for op in plan.graph.ops if op.attr("document")), None)
    if doc is not None:
        out.append(f"packed sequences: attention costed per document of {doc:,} tokens (doc_tokens), not per "
                   f"{plan.seq:,}-token sequence, as variable-length fused kernels run it (THD / cu_seqlens, "
                   "block-causal masks); the other ops cost the whole sequence")
    c = plan.config if "a2a" in engine_named(plan.train.framework).contexts else {}  # (where it can matter)
    if c.get("cp", 1) > 1 and context_of(plan.train.framework, c.get("cp_comm")) == "a2a":
        cp = c["cp"]
        how = (f"DeepSpeed-Ulysses (sequence parallel size {cp})" if engine_named(plan.train.framework).a2a_only else
               "all-to-all (Megatron-LM's --cp-comm-type a2a, DeepSpeed-Ulysses' scheme)")
        out.append(f"context parallelism {cp} runs as {how}: the attention core cut by heads, all-to-alls of its "
                   "query, key, value and output between it and the sequence-cut projections (exposed: cp_comm); "
                   "no ring attention")
    return out


def baselines_json(plan: Plan, baselines: dict, plan_band, detail: bool = False) -> dict:
    """Each baseline beside ``plan``: its step time, fit, configuration, MFU, memory, the plan's
    speedup over it and whether that speedup is within the model's error (``cost.bands``)."""
    from symtensor.cost.bands import verdict

    ref, out = plan.report.step_time_s, {}
    for name, b in baselines.items():
        if b is None:
            out[name] = {"step_time_s": None, "fits": False, "config": None, "note": "no valid configuration"}
            continue
        rep = b.report
        config = megatron_summary(b) if name in MEGATRON_BASELINES else b.config
        entry = {"step_time_s": rep.step_time_s, "fits": rep.fits, "config": config, "mfu": rep.mfu,
                 "memory_gib_per_device": rep.memory_peak / GIB}
        entry["speedup_of_plan"] = rep.step_time_s / ref if rep.fits else None
        band = config_band(plan.model, plan.cluster, rep.step_time_s, zero=b.train.zero, seq=plan.seq,
                           framework=b.engine, precision=b.train.precision, tp=config["tp"])
        entry["step_time_band_s"] = band.as_list()
        entry["verdict_of_plan"] = verdict(plan_band, band, ref, rep.step_time_s) if rep.fits else \
            "baseline does not fit"
        used = recipe_of(b)
        if used is not None:  # the Megatron recipe: which published recipe, or the sizing rule
            entry["recipe"], entry["recipe_note"] = used
        if detail:
            entry.update(breakdown=dict(rep.breakdown), memory_gib={k: v / GIB for k, v in rep.memory.items()})
        out[name] = entry
    return out


def _band(result: dict):
    """The band a plan's JSON states (``prediction_terms``), as a ``cost.bands.Band``."""
    from symtensor.cost.bands import Band

    return Band(*result["step_time_band_s"], result["regime"], result["band_calibrated"],
                tuple(result.get("band_widened", ())))
