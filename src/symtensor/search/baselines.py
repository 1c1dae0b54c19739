"""Baselines through the same cost model: the Megatron recipe, the Megatron grid best, FSDP.

- ``megatron_recipe``: the published Megatron-Bridge / NeMo recipe of the model (``search.recipes``:
  its TP/PP/VPP/CP/EP/ETP, sequence parallelism, recomputation and micro batch, each row cited),
  with data parallelism scaled to the devices at the plan's global batch: the recipe users copy,
  so "faster than the Megatron recipe" means faster than it. The first of the model's recipes
  (``recipes.candidates``: the cluster's GPU, the sequence, the library recipe) whose degrees run
  on the cluster's devices; where none does, where it does not fit, or where the model has none,
  NVIDIA's sizing rule (``sizing_rule``). The baseline's note (``plan.summary.RECIPE_NOTE``) says
  which it used, and why not the recipe.
- ``sizing_rule``: NVIDIA's sizing rules. Dense: tensor parallelism inside a node, growing
  with the model (1 below 3B parameters, 2 up to 13B, 4 up to 30B, 8 above); pipeline
  parallelism only when the model does not fit otherwise (the smallest pp that fits, across
  nodes); data parallelism for the rest; sequence parallelism with tensor parallelism; the
  distributed optimizer (ZeRO-1); selective recomputation, full recomputation if that does not
  fit. MoE: tensor parallelism by the active size, expert parallelism folded over every rank of
  a stage as far as the expert count allows (ep = the largest divisor of the experts that
  divides tp x dp) with expert TP 1, as the Megatron MoE model zoo's Qwen3 configurations fold
  EP over TP x CP x DP.
- ``megatron_grid``: the exhaustive Megatron grid with exact branch and bound (``search.grid``).
- ``fsdp``: pure data parallelism with ZeRO-3 (PyTorch FSDP), the best micro batch and recompute.
"""

from __future__ import annotations

import functools
import math

from symtensor.cost.recompute import refusal as modules_refusal
from symtensor.cost.stack import Stack
from symtensor.errors import PlanError, did_you_mean
from symtensor.hardware import Cluster, divisors
from symtensor.models import ModelConfig, build_graph, params_active
from symtensor.plan.plan import Plan
from symtensor.plan.summary import RECIPE_NOTE
from symtensor.search import recipes
from symtensor.search.grid import megatron_grid
from symtensor.search.megatron import MICRO_BATCHES
from symtensor.search.pool import Costed, EvaluatorPool

BASELINES = ("megatron_recipe", "megatron_grid_best", "fsdp", "drec")

def _best_over_recompute(pool: EvaluatorPool, base: dict) -> Costed | None:
    """The cheapest recomputation that fits; if none fits, the least memory."""
    best = None
    for rc in pool.recomputations():
        cand = pool.try_config(**base, recompute=rc)
        if cand is None:
            continue
        if cand.report.fits:
            return cand if best is None or not best.report.fits or cand.key < best.key else best
        if best is None or cand.report.memory_reserved < best.report.memory_reserved:
            best = cand
    return best


def _recipe_tp(cfg: ModelConfig, active_params: float, node: int) -> int:
    tp = 1 if active_params < 3e9 else 2 if active_params < 13.5e9 else 4 if active_params < 30e9 else 8
    tp = min(tp, node)
    while tp > 1 and (cfg.heads % tp or cfg.kv_heads % tp or cfg.ffn % tp):
        tp //= 2
    return tp


def megatron_recipe(pool: EvaluatorPool, global_batch: int) -> tuple[Costed | None, str]:
    """The model's published recipe with dp scaled to the devices, else the sizing rule (see the
    module docstring), and the note that says which (``RECIPE_NOTE``, then the recipe's name and
    source, or ``sizing rule`` and why). The recipe is the best-ranked one whose degrees run on
    these devices; when it does not fit, the rule is the baseline (another recipe of the model,
    written for other GPU counts, is not what a user of this one would run instead)."""
    cfg, cluster, seq = pool.cfg, pool.cluster, pool.seq
    n = cluster.n_devices
    why = recipes.published_model(cfg)
    if why is None:
        ranked = recipes.candidates(cfg.name, cluster.device.name, seq, n)
        refused = []
        for r in ranked:
            try:
                c = recipes.scaled(r, cfg, n, global_batch, seq)
            except PlanError as e:
                refused.append(f"{r.cited} does not run here: {e}")
                continue
            c = _runs_modules(pool, c)
            # a recipe runs its own split: its layout string (``recipes.layout_split``, in ``c``), else Megatron's
            # (even, or the embedding and loss as layer slots: the rule's), never the planner's balanced one
            cand = pool.try_config(**c, balance=False)
            if cand is None:
                refused.append(f"{r.cited} cannot be laid on this cluster's mesh")
                continue
            if not cand.report.fits:
                why = f"{r.cited} {cand.report.overflow}"
                break
            nearer = f"; the nearer {refused[0]}" if refused else ""
            return cand, RECIPE_NOTE + _recipe_note(r, c, n) + nearer
        else:
            k = len(ranked) - 1
            others = {0: "", 1: f" (nor does the other recipe of {cfg.name})"}.get(
                k, f" (nor do the other {k} recipes of {cfg.name})")
            why = refused[0] + others
    return sizing_rule(pool, global_batch), f"{RECIPE_NOTE}{recipes.RULE} ({why})"


def _runs_modules(pool: EvaluatorPool, c: dict) -> dict:
    """Recipe configuration ``c`` with its Megatron module list (``cost.recompute``) where the search's stack runs it,
    else with the planner's ``selective`` (what the module list was costed as before it was modelled): another
    engine (``--framework``), FP8 delayed scaling with layernorm or moe_act, ... (``_recipe_note`` says so)."""
    held = pool.held(c)
    fp8 = held.get("fp8_recipe") if held.get("precision") == "fp8" else None
    why = modules_refusal(c["recompute"], framework=held.get("framework"), fp8_recipe=fp8,
                          shared_overlap=held.get("moe_shared_overlap", False),
                          ep_overlap=held.get("moe_ep_overlap", False))
    return c if why is None else {**c, "recompute": "selective"}


def _recipe_note(r: recipes.Recipe, c: dict, n: int) -> str:
    """How a baseline cites the recipe it runs: name and source, its degrees, the data-parallel
    degree it gets here, and what of it is not costed as stated."""
    parts = [f"{r.cited}: {r.degrees}, dp {c['dp']} on {n} devices ({r.devices} {r.gpu.upper()} in the recipe)"]
    if c["micro_batch"] != r.micro_batch:
        parts.append(f"micro batch 1 (the recipe's {r.micro_batch} does not divide a replica's batch)")
    if c["recompute"] != r.recompute:
        parts.append(f"recompute modules ({r.recompute_detail}) costed as the planner's selective: this stack does "
                     "not run them")
    if r.layout_string and "m" in r.layout_string:
        parts.append(f"pipeline layout {r.layout_string}: {recipes.MTP_NOTE}")
    return "; ".join(parts + ([r.notes] if r.notes else []))


@functools.lru_cache(maxsize=32)
def _active_params(cfg: ModelConfig, seq: int) -> float:
    """The model's parameters active per token, counted on a graph of one sequence of ``seq``
    tokens: the sizing rule sizes tensor parallelism by them."""
    return params_active(cfg, build_graph(cfg, micro_batch=1, seq=seq))


def sizing_rule(pool: EvaluatorPool, global_batch: int, active_params: float | None = None) -> Costed | None:
    """NVIDIA's published sizing rules (see the module docstring). ``active_params``: the model's
    parameters active per token; None: counted here (memoised per model and sequence)."""
    cfg, n, seq = pool.cfg, pool.cluster.n_devices, pool.seq
    if active_params is None:
        active_params = _active_params(cfg, min(seq, 128))
    node = pool.cluster.levels[0].fanout or n
    tp = _recipe_tp(cfg, active_params, min(node, n))
    fallback = None
    for pp in pool.depths([p for p in divisors(n // tp) if p <= cfg.layers and cfg.layers % p == 0]):
        dp = n // (tp * pp)
        ep = max((e for e in divisors(tp * dp) if cfg.experts % e == 0), default=1) if cfg.is_moe else 1
        mb = 1
        if global_batch % dp:
            continue
        for rc in ("selective", "full"):
            # (the layers divide by pp: the recipe runs Megatron's own even split, no layout)
            cand = pool.try_config(tp=tp, pp=pp, dp=dp, ep=ep, sp=tp > 1, zero=1 if dp > 1 else 0, recompute=rc,
                                   micro_batch=mb, global_batch=global_batch, seq=seq, balance=False)
            if cand is None:
                continue
            if cand.report.fits:
                return cand
            if fallback is None or cand.report.memory_reserved < fallback.report.memory_reserved:
                fallback = cand
    return fallback


def fsdp(pool: EvaluatorPool, global_batch: int) -> Costed | None:
    """Pure data parallelism with ZeRO-3 (FSDP)."""
    n, seq = pool.cluster.n_devices, pool.seq
    best = None
    for mb in [m for m in MICRO_BATCHES if global_batch % (m * n) == 0]:
        cand = _best_over_recompute(pool, dict(dp=n, zero=3, micro_batch=mb, global_batch=global_batch, seq=seq))
        if cand is not None and (best is None or cand.key < best.key):
            best = cand
    return best


def baseline_plans(cfg: ModelConfig, cluster: Cluster, global_batch: int, seq: int, framework: str = "megatron",
                   names=BASELINES, fork: bool = False, pool: EvaluatorPool | None = None,
                   precision: str | None = None, fp8_recipe: str | None = None,
                   stack: Stack | None = None, beat: float = math.inf) -> dict[str, Plan | None]:
    """The named baselines as plans (None where a baseline has no valid configuration), through
    the same cost model and engine: the one place they are assembled (``symtensor plan``,
    ``compare`` and ``report`` read them). D-Rec's unitless costs have no engine: its layouts are
    costed under Megatron's. ``fork``: the grid shares its work with a forked child
    (``grid.megatron_grid``; not where torch may be loaded: ``search.parallel``). ``pool``: the
    caller's pool of this model, cluster, sequence and engine, to share its evaluators. ``precision``
    (``EvaluatorPool``): the baselines' precision; None: BF16 (the recipes' own). ``stack``: the stack facts
    (``cost.stack.Stack``) the baselines run with, as the plan does (D-Rec's too: its layouts costed with them).
    ``beat``: the grid's (``grid.megatron_grid``: only a best faster than it is exact)."""
    from symtensor.search.drec import drec_plan

    unknown = [n for n in names if n not in BASELINES]
    if unknown:
        raise PlanError(f"unknown baseline {unknown[0]!r}." + did_you_mean(unknown[0], BASELINES))
    pool = pool or EvaluatorPool(cfg, cluster, seq, framework=framework, precision=precision, fp8_recipe=fp8_recipe,
                                 stack=stack)
    out: dict[str, Plan | None] = {}
    for name in names:
        if name == "drec":
            out[name] = drec_plan(cfg, cluster, global_batch, seq, pool.precision, pool.fp8_recipe, pool.stack)
            continue
        note = ()
        if name == "megatron_recipe":
            costed, used = megatron_recipe(pool, global_batch)
            note = (used,)
        elif name == "megatron_grid_best":
            costed = megatron_grid(pool, global_batch, fork=fork, beat=beat)[0]
        else:
            costed = fsdp(pool, global_batch)
        out[name] = None if costed is None else pool.plan(costed, notes=note)
    return out
