"""How far the current cost model is from the measured kernel tables (issue 22, point 1).

    python benchmarks/kernel_table_check.py      # writes benchmarks/results/kernel_table_check.md

For each zoo model on dgx-a100-80g and dgx-h100 (64 GPUs) and two plans (data parallel, the planner's
micro batch; tensor parallel tp=8), every op the evaluator charges is compared with what
``symtensor.cost.kernels`` allows for its local shape on its device:

    ratio = table seconds / charged seconds      (> 1: the model costs the op faster than the table allows)

  GEMM (``linear``)    table s = FLOPs / (peak * gemm_efficiency(M, N, K)) forward, and for the backward the
                       input-gradient GEMM (M, K, N) plus, when the weight needs a gradient, the weight-
                       gradient GEMM (K, N, M), each at its own shape. Expert GEMMs (a dim ``e`` in input and
                       weight) read ``grouped_gemm_efficiency`` at their tokens per expert.
  attention            ``attention_efficiency`` of the kernel the engine runs: Megatron's fused attention is
                       Transformer Engine's (cuDNN on H100; FlashAttention-2 on A100, the table A100 has),
                       PyTorch stacks and ``kernel=flash2`` run FlashAttention-2; executed FLOPs both sides.
  memory-bound         the model charges bytes / (HBM bandwidth * Efficiency.hbm); the table allows
                       ``hbm_fraction`` of the op's streaming pattern (a residual add: triad; others: scale),
                       so the ratio is Efficiency.hbm / hbm_fraction for every such op.

The charged seconds are ``Evaluator.op_time`` of the plan's layout (the roofline with the calibrated
``Efficiency``: the same number ``evaluate`` sums). Nothing is fitted here and the cost model is unchanged.
MFU ranges are the published rows of ``benchmarks/heldout_runs.csv`` (each with repository and commit).
"""

from __future__ import annotations

import csv
import math
import sys
from collections import defaultdict
from pathlib import Path

from symtensor import api
from symtensor.cost import kernels
from symtensor.cost.efficiency import efficiency_for
from symtensor.cost.opcost import local_sizes
from symtensor.graph import kind_of

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "results" / "kernel_table_check.md"
MODELS = ("llama2-7b", "llama3-8b", "llama2-70b", "mixtral-8x7b")
CLUSTERS = ("dgx-a100-80g", "dgx-h100")
DEVICES = 64


def plans(model):
    """(label, evaluate kwargs): data parallel (ZeRO 3 where the replicas would not fit: 70B, Mixtral) and
    tensor parallel tp=8 within a node."""
    big = model in ("llama2-70b", "mixtral-8x7b")
    recompute = "full" if big else "none"
    return (("dp", {"tp": 1, "zero": 3 if big else 1, "recompute": recompute}),
            ("tp8", {"tp": 8, "zero": 1, "recompute": recompute}))


def _prod(sizes, dims):
    return math.prod(sizes[d] for d in dims)


def gemm_dims(op, sizes):
    """(M, N, K, groups) of a linear op: K the dims X and W share, N W's others, M X's others (expert dim
    ``e`` in both: groups, not reduced)."""
    x, w = op.in_dims[0], op.in_dims[1]
    groups = _prod(sizes, [d for d in x if d in w and d == "e"]) if "e" in x and "e" in w else 1
    k = _prod(sizes, [d for d in x if d in w and d != "e"])
    n = _prod(sizes, [d for d in w if d not in x])
    m = _prod(sizes, [d for d in x if d not in w])
    return m, n, k, groups


def table_seconds(op, sizes, t, device, peak, engine, grad_operands):
    """(class, table fwd s, table bwd s, note) of one op's local piece, or None when no table applies."""
    kind = kind_of(op.kind)
    if op.kind == "linear":
        m, n, k, groups = gemm_dims(op, sizes)
        f = 2.0 * m * n * k * groups
        if groups > 1:
            eff = kernels.grouped_gemm_efficiency(device, m)
            shape = f"{groups:.0f}x{m:.0f}x{n:.0f}x{k:.0f}"
            return "grouped", f / (peak * eff), grad_operands * f / (peak * eff), shape
        fwd = f / (peak * kernels.gemm_efficiency(device, m, n, k))
        bwd = f / (peak * kernels.gemm_efficiency(device, m, k, n))
        if grad_operands > 1:
            bwd += f / (peak * kernels.gemm_efficiency(device, k, n, m))
        return "gemm", fwd, bwd, f"{m:.0f}x{n:.0f}x{k:.0f}"
    if op.kind == "attention":
        kernel = {"flash2": "fa2", "flash1": None}.get(op.attr("kernel"))
        if op.attr("kernel") in (None, "flash"):
            kernel = "cudnn" if engine == "megatron" and "H100" in device else "fa2"
        if kernel is None:
            return None
        causal = op.attr("causal", True)
        seq, hd = sizes["t"], sizes["d"]
        fe = kernels.attention_efficiency(device, kernel, seq, hd, causal)
        be = kernels.attention_efficiency(device, kernel, seq, hd, causal, backward=True)
        shape = f"s{seq:.0f} hd{hd:.0f}"
        return f"attention ({kernel})", t.fwd_flops / (peak * fe), 2.5 * t.fwd_flops / (peak * be), shape
    if kind.memory_bound:
        return "memory", None, None, "triad" if op.attr("fn") == "add" else "scale"
    return None


def check(model, cluster, label, kw):
    plan = api.evaluate(model, cluster, DEVICES, **kw)
    ev = plan.evaluator()
    layouts = plan.op_layouts()
    device = plan.cluster.device
    peak = device.flops(ev.dtype)
    eff = efficiency_for(plan.cluster, plan.engine)
    rows, seen = [], set()
    repeat = plan.graph.meta.get("repeat", {})
    m = plan.train.micro_steps
    acc = defaultdict(float)  # charged / bound / matched compute seconds per step, all ops
    for op in plan.graph.ops:
        lay = layouts.get(op.name)
        if lay is None:
            continue
        t = ev.op_time(op, lay)
        sizes = local_sizes(op, lay, ev.mesh)
        got = table_seconds(op, sizes, t, device.name, peak, plan.engine, ev.grad_operands[op.name])
        w = m * repeat.get(op.layer, 1)
        charged_s = t.fwd_s + t.bwd_s
        acc["charged"] += w * charged_s
        if got is None:
            acc["bound"] += w * charged_s
            acc["matched"] += w * charged_s
            continue
        cls, tf, tb, note = got
        if cls == "memory":
            frac = kernels.hbm_fraction(device.name, note)
            tf, tb = t.fwd_s * eff.hbm / frac, t.bwd_s * eff.hbm / frac
        acc["bound"] += w * max(charged_s, tf + tb)
        acc["matched"] += w * max(charged_s, matched_seconds(op, sizes, device.name, peak, ev.grad_operands[op.name])
                                  or (tf + tb))
        key = (op.kind, op.attr("fn"), note, cls)
        if key in seen:
            continue
        seen.add(key)
        if cls == "memory":
            ratio_f = ratio_b = eff.hbm / frac
            charged = f"hbm {eff.hbm:.3f}"
            allowed = f"hbm {frac:.3f} ({note})"
        else:
            ratio_f = tf / t.fwd_s
            ratio_b = tb / t.bwd_s if t.bwd_s else float("nan")
            bwd_flops = (2.5 if op.kind == "attention" else ev.grad_operands[op.name]) * t.fwd_flops
            charged = f"{t.fwd_flops / (t.fwd_s * peak):.3f} / {bwd_flops / (t.bwd_s * peak) if t.bwd_s else 0:.3f}"
            allowed = f"{t.fwd_flops / (tf * peak):.3f} / {bwd_flops / (tb * peak):.3f}"
        rows.append({"op": op.name.split(".")[-1], "kind": cls, "shape": note, "charged": charged,
                     "allowed": allowed, "ratio_f": ratio_f, "ratio_b": ratio_b, "seconds": t.fwd_s + t.bwd_s})
    rep = plan.report
    mfu = rep.model_flops / (rep.step_time_s * rep.n_devices * rep.peak_flops)
    return plan, mfu, rows, acc


def matched_seconds(op, sizes, device, peak, grad_operands):
    """Seconds of a dense GEMM at the measured row nearest its shape (``kernels.gemm_nearest``: a typical
    rate, not the envelope's bound), forward and backward shapes; None for other ops."""
    if op.kind != "linear":
        return None
    m, n, k, groups = gemm_dims(op, sizes)
    if groups > 1:
        return None
    f = 2.0 * m * n * k
    shapes = [(m, n, k), (m, k, n)] + ([(k, n, m)] if grad_operands > 1 else [])
    return sum(f / (peak * kernels.gemm_nearest(device, *sh)[1]) for sh in shapes)


def published_mfu():
    """Published MFU by (gpu, model) from benchmarks/heldout_runs.csv: (min, max, n, sources)."""
    out = defaultdict(list)
    with open(ROOT / "heldout_runs.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            if r["measured_mfu_pct"]:
                out[(r["gpu"], r["model"])].append((float(r["measured_mfu_pct"]), f"{r['repo']}@{r['commit'][:7]}"))
    return out


def main(argv=None) -> int:
    lines = [__doc__.split("\n\n", 1)[0].replace('"""', ""), "",
             "Generated by `python benchmarks/kernel_table_check.py` (tables: `src/symtensor/cost/kernels.py`).", ""]
    summary = defaultdict(list)
    mfus = []
    detail = []
    for model in MODELS:
        for cluster in CLUSTERS:
            for label, kw in plans(model):
                plan, mfu, rows, acc = check(model, cluster, label, kw)
                dev = plan.cluster.device.name
                step = plan.report.step_time_s
                bound = mfu * step / (step + acc["bound"] - acc["charged"])
                matched = mfu * step / (step + acc["matched"] - acc["charged"])
                mfus.append((model, cluster, label, plan.config, mfu, step, plan.report.fits, acc, bound, matched))
                detail.append(f"\n### {model} on {DEVICES} x {cluster}, {label} ({kw})\n")
                detail.append("| op | class | local shape | charged fwd / bwd | table allows fwd / bwd "
                              "| table s / charged s fwd | bwd |")
                detail.append("|---|---|---|---|---|---|---|")
                for r in rows:
                    worst = max(r["ratio_f"], 0 if math.isnan(r["ratio_b"]) else r["ratio_b"])
                    flag = " **faster**" if worst > 1.0 + 1e-9 else ""
                    detail.append(f"| {r['op']} | {r['kind']} | {r['shape']} | {r['charged']} | {r['allowed']} | "
                                  f"{r['ratio_f']:.2f}{flag} | {r['ratio_b']:.2f} |")
                    cls = r["kind"].split(" ")[0]
                    summary[(dev, cls)].append((r["ratio_f"], r["ratio_b"], r["seconds"], f"{model} {label} {r['op']}"))
    lines += ["## Summary: how much faster than the tables the current model costs each class", "",
              "ratio = table seconds / charged seconds of an op's local piece; > 1: the model is faster than the",
              "table allows (the issue's must-show test fails for that op). Weighted by the op's charged seconds.",
              "", "| device | class | ops | faster than table | max ratio (op) | charged-time-weighted mean ratio |",
              "|---|---|---|---|---|---|"]
    for (dev, cls), vals in sorted(summary.items()):
        ratios = [(max(f, 0 if math.isnan(b) else b), s, who) for f, b, s, who in vals]
        n_fast = sum(1 for r, _, _ in ratios if r > 1 + 1e-9)
        top = max(ratios)
        wmean = sum(r * s for r, s, _ in ratios) / sum(s for _, s, _ in ratios)
        lines.append(f"| {dev} | {cls} | {len(ratios)} | {n_fast} | {top[0]:.2f} ({top[2]}) | {wmean:.2f} |")
    pub = published_mfu()
    lines += ["", "## Predicted MFU against published runs", "",
              "Predicted: `evaluate` of the plan (MFU = model FLOPs / (step x devices x peak)). Published: every row "
              "of",
              "`benchmarks/heldout_runs.csv` for the device (min-max MFU, rows, sources); issue 22 quotes 45-55% for",
              "7B-class A100 runs.", "",
              "With kernels at the tables: every op's seconds raised to what the table allows where the model is "
              "faster",
              "(bound: GEMMs at the envelope; matched: dense GEMMs at the measured row nearest their shape, other",
              "ops at the bound), the difference added to the step (compute is on the critical path; nothing else",
              "changes). Compute s: the ops' charged seconds per step on one device.", "",
              ("| model | cluster | plan | config | predicted MFU | step s | fits | compute s | MFU, kernels at bound |"
               " MFU, GEMMs shape-matched |"), "|---|---|---|---|---|---|---|---|---|---|"]
    for model, cluster, label, config, mfu, step, fits, acc, bound, matched in mfus:
        keys = ("tp", "pp", "dp", "zero", "micro_batch", "recompute")
        cfg = ", ".join(f"{k}={config[k]}" for k in keys if k in config)
        lines.append(f"| {model} | {cluster} | {label} | {cfg} | {100 * mfu:.1f}% | {step:.2f} | {fits} | "
                     f"{acc['charged']:.2f} | {100 * bound:.1f}% | {100 * matched:.1f}% |")
    lines += ["", "| device | published model | MFU min-max | rows | sources |", "|---|---|---|---|---|"]
    for (gpu, model), vals in sorted(pub.items()):
        if gpu in ("a100_80gb", "h100_80gb"):
            lo, hi = min(v for v, _ in vals), max(v for v, _ in vals)
            sources = ", ".join(sorted({s for _, s in vals}))
            lines.append(f"| {gpu} | {model} | {lo:.1f}-{hi:.1f}% | {len(vals)} | {sources} |")
    lines += ["", "## Per op (one row per distinct op shape)"] + detail
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
