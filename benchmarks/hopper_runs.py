"""This project's measured H200 runs against the cost model: a held-out test on runs nobody tuned it for.

    python benchmarks/hopper_runs.py      # writes benchmarks/results/hopper_runs.md and .csv

The measurements are ``benchmarks/hopper_measure.py``'s three runs on one H200 (2026-12-04, this project's
device machine; raw JSON in ``benchmarks/results/hopper_h200``): whole training steps of GPT-3 350M-2.7B in
eager PyTorch (fp32 parameters, BF16 autocast, SDPA, fused AdamW, no recomputation, one micro-batch of 16 x
2,048 tokens, 8 for 2.7B) with the vocabulary padded to 50,304 (round 2) and unpadded, 50,257 (round 1), and
the same steps under ``torch.compile`` (round 3), each with its kernel breakdown (torch.profiler) and the SM
clock and power sampled by NVML; GEMMs, attention and memory-bound kernels alone; the clock under back-to-back
GEMMs and by GEMM duty; the host time one GEMM per expert leaves exposed.

Each step is predicted by ``api.evaluate`` on ``dgx-h200`` with one device as the run was described:
engine ``fsdp2`` (PyTorch's own kernels, fp32 parameters, BF16 compute), the attention kernel that ran
(``Stack(attention="te")``: the profiles show cuDNN's SDPA kernels, which PyTorch 2.11 picks on Hopper, not
FlashAttention-2), ``elementwise="fused"`` for the compiled steps. Nothing here is fitted: the cost model is
the shipped one, and these rows are in none of its calibration files. Each run is described with the vocabulary
it ran (50,304 or 50,257): the fsdp2 engine runs the stated vocabulary (``Engine.pads_vocab`` False), and since the
seventeenth session the model charges an unaligned one's LM head at cuBLAS's unaligned rate measured on this same
H200 (round 2's alignment microbenchmark, ``cost.kernels.GH100_ALIGNMENT``). The unpadded round is reported apart:
with its kernel rate taken from this machine, and the change chosen after these rows were read (sixteenth session),
it is a consistency check of that charge, not a held-out test.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from symtensor import api
from symtensor.cost import kernels
from symtensor.cost.stack import Stack
from symtensor.graph import full_attention_ratio, kind_of
from symtensor.plan.document import evaluation_json

sys.path.insert(0, str(Path(__file__).parent))
from results_files import write_results  # noqa: E402

RAW = Path(__file__).parent / "results" / "hopper_h200"
GIB = 2**30
HBM_RATIO = 4800 / 3350  # H200 over H100 SXM HBM bandwidth (datasheets): memory-bound kernels' slow-down bound


def load():
    return tuple(json.loads((RAW / f"round{i}.json").read_text()) for i in (1, 2, 3))


def measured_split(run) -> dict:
    """Kernel milliseconds of one profiled step by class: GEMM (cuBLAS/CUTLASS), attention (cuDNN/flash) and
    the rest (memory-bound: elementwise, norms, casts, optimizer, loss)."""
    out = {"gemm": 0.0, "attention": 0.0, "memory": 0.0}
    top = run["kernels"]["top"]
    for name, _, us in top:
        low = name.lower()
        cls = "attention" if ("sdpa" in low or "cudnn" in low or "flash" in low) else \
            "gemm" if ("nvjet" in low or "gemm" in low or "cutlass" in low) else "memory"
        out[cls] += us / 1e3
    out["memory"] += run["kernels"]["total_us"] / 1e3 - sum(out.values())  # kernels below the top 60
    return out


def h100_mfu(run) -> float | None:
    """The run's MFU (causal attention counted in full) with its memory-bound kernels slowed by H100's lower HBM
    bandwidth (``HBM_RATIO``) and everything else as measured: a lower bound of what the same step does on an
    H100 SXM (the same GH100 die, SM count, clocks and 700 W; a kernel not wholly bandwidth-bound slows less)."""
    if "kernels" not in run:  # (round 1 profiled the 1.3B step only)
        return None
    memory_s = measured_split(run)["memory"] / 1e3
    return run["mfu_full_989"] * run["step_s"] / (run["step_s"] + memory_s * (HBM_RATIO - 1))


def predict(run):
    stack = Stack(attention="te", elementwise="fused" if run.get("compiled") else None)
    return api.evaluate(run["model"], "dgx-h200", 1, tp=1, zero=0, framework="fsdp2", micro_batch=run["micro_batch"],
                        global_batch=run["micro_batch"], seq=run["seq"], recompute="none", stack=stack,
                        overrides={"vocab": run.get("vocab", 50257)})


def charged_split(plan) -> dict:
    """The cost model's milliseconds per step by the same classes (``Evaluator.op_time`` of each op)."""
    ev, layouts, repeat = plan.evaluator(), plan.op_layouts(), plan.graph.meta.get("repeat", {})
    out = defaultdict(float)
    for op in plan.graph.ops:
        lay = layouts.get(op.name)
        if lay is None:
            continue
        t = ev.op_time(op, lay, stack=plan.train.stack)
        cls = "attention" if op.kind == "attention" else "gemm" if op.kind == "linear" else \
            "memory" if kind_of(op.kind).memory_bound else op.kind
        out[cls] += 1e3 * repeat.get(op.layer, 1) * (t.fwd_s + t.bwd_s)
    return out


def steps_section(runs):
    rows, lines = [], ["## Training steps on one H200, predicted", "",
                       "| run | measured s | MFU (full) | SM MHz / W | MFU at H100's HBM | predicted s | error | "
                       "band | in band | reserved GiB measured / predicted |",
                       "|---|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for label, run in runs:
        plan = predict(run)
        doc = evaluation_json(plan)
        lo, hi = doc["step_time_band_s"]
        pred = plan.report.step_time_s
        err = pred / run["step_s"] - 1
        c = run.get("clocks") or {}
        h100 = h100_mfu(run)
        rows.append(dict(run=label, model=run["model"], compiled=bool(run.get("compiled")),
                         vocab=run.get("vocab", 50257),
                         micro_batch=run["micro_batch"], measured_step_s=round(run["step_s"], 4),
                         measured_mfu_full=round(run["mfu_full_989"], 4),
                         h100_mfu_full=None if h100 is None else round(h100, 4), predicted_step_s=round(pred, 4),
                         error=round(err, 4), band_lo_s=round(lo, 4), band_hi_s=round(hi, 4),
                         in_band=lo <= run["step_s"] <= hi,
                         predicted_mfu_full=round(plan.report.mfu * full_attention_ratio(plan.graph), 4),
                         measured_reserved_gib=round(run["max_reserved_gib"], 2),
                         predicted_reserved_gib=round(doc["memory_reserved_gib_per_device"], 2),
                         sm_mhz_median=c.get("sm_mhz_median"), power_w_median=c.get("power_w_median")))
        r = rows[-1]
        clock = f"{c['sm_mhz_median']:.0f} / {c['power_w_median']:.0f}" if c else "-"
        lines.append(f"| {label} | {run['step_s']:.3f} | {100 * run['mfu_full_989']:.1f}% | {clock} | "
                     f"{'-' if h100 is None else f'{100 * h100:.1f}%'} | {pred:.3f} | {100 * err:+.1f}% | "
                     f"{lo:.3f}-{hi:.3f} | {r['in_band']} | {r['measured_reserved_gib']:.1f} / "
                     f"{r['predicted_reserved_gib']:.1f} |")
    return rows, lines


def summary(rows, which) -> str:
    errs = [r["error"] for r in rows if which(r)]
    inb = sum(r["in_band"] for r in rows if which(r))
    return (f"MAPE {100 * statistics.mean(abs(e) for e in errs):.1f}%, "
            f"mean signed {100 * statistics.mean(errs):+.1f}%, {inb}/{len(errs)} in band")


def breakdown_section(runs):
    splits = [(label, run, predict(run)) for label, run in runs]  # (each run costed once, for both parts)
    splits = [(label, run, plan, measured_split(run), charged_split(plan)) for label, run, plan in splits]
    ratios = defaultdict(list)
    for _, run, _, got, charged in splits:
        kind = "compiled" if run.get("compiled") else "eager"
        ratios[("gemm", kind)].append(charged["gemm"] / got["gemm"])
        ratios[("memory", kind)].append((charged["memory"] + charged.get("embedding", 0)) / got["memory"])
    mean = {k: statistics.mean(v) for k, v in ratios.items()}
    lines = [f"Charged over measured kernel time: GEMMs {mean[('gemm', 'eager')]:.2f} (eager), "
             f"{mean[('gemm', 'compiled')]:.2f} (compiled); memory-bound {mean[('memory', 'eager')]:.2f} (eager), "
             f"{mean[('memory', 'compiled')]:.2f} (compiled). The eager totals agree because the two "
             "errors cancel: the GH100 GEMMs are charged at the power-limited clock of back-to-back products (the MSMF "
             "ceiling), where these steps ran at 1,935-1,965 MHz below 700 W, and the memory-bound kernels of an "
             "fp32-parameter autocast step (casts, fp32 norms and residual adds) are not the fused BF16 ones the "
             "engine's rule prices. Under torch.compile the memory-bound time falls and the step comes out slower "
             "than measured.", "",
             "| run | GEMM measured / charged | attention measured / charged | memory-bound measured / charged | "
             "GEMM rate in situ (of 989) |", "|---|---:|---:|---:|---:|"]
    for label, run, plan, got, charged in splits:
        cfg = plan.model  # (the zoo's GPT-3 dimensions, which hopper_measure.py's models copy)
        layers, h, f = cfg.layers, cfg.hidden, cfg.ffn
        tokens = run["micro_batch"] * run["seq"]
        flops = 3 * 2 * tokens * (layers * (4 * h * h + 2 * h * f) + run.get("vocab", 50257) * h)
        rate = flops / (got["gemm"] / 1e3) / 989e12
        lines.append(f"| {label} | {got['gemm']:.0f} / {charged['gemm']:.0f} | {got['attention']:.0f} / "
                     f"{charged['attention']:.0f} | {got['memory']:.0f} / "
                     f"{charged['memory'] + charged.get('embedding', 0):.0f} | {rate:.3f} |")
    return lines


def gemm_section(r1):
    by = defaultdict(list)
    for row in r1["gemm_bf16"]:
        if row["linear"] in ("square", "head"):
            continue
        eff = row["tflops"] / 989
        charged = kernels.gemm_shape_efficiency("H200", row["M"], row["N"], row["K"], "bf16", row["layout"])
        by[row["model"]].append((eff, charged))
    lines = ["## GEMMs alone (back to back, power-limited clock) against the model's charged rate", "",
             "| model | shapes | measured fraction of 989 (median, min-max) | charged (median) |",
             "|---|---:|---|---:|"]
    for model, v in by.items():
        meas = [a for a, _ in v]
        lines.append(f"| {model} | {len(v)} | {statistics.median(meas):.3f} ({min(meas):.3f}-{max(meas):.3f}) | "
                     f"{statistics.median(b for _, b in v):.3f} |")
    return lines


def clock_section(r1, r3):
    soak = r1["soak"]["samples"]
    lines = ["## The SM clock: back-to-back GEMMs, GEMMs by duty, training steps", "",
             f"8,192^3 BF16 products back to back for 30 s: {soak[0]['tflops']:.0f} TFLOP/s at {soak[0].get('sm_mhz')} "
             f"MHz after 0.5 s, {soak[-1]['tflops']:.0f} at {soak[-1].get('sm_mhz')} MHz at the end "
             f"({soak[-1].get('power_w', 0):.0f} W of {r1['soak'].get('power_limit_w', 0):.0f}).", "",
             "| GEMMs : 1 GiB copies per loop | GEMM share of the loop | GEMM TFLOP/s | SM MHz (median) | W (median) |",
             "|---|---:|---:|---:|---:|"]
    for row in r3["duty_sweep"]:
        gemm_ms, copy_ms = row["gemms"] * row["gemm_s"] * 1e3, row["copies"] * 2 * GIB / 4.3e12 * 1e3
        c = row["clocks"]
        lines.append(f"| {row['gemms']} : {row['copies']} | {gemm_ms / (gemm_ms + copy_ms):.2f} | "
                     f"{row['tflops']:.0f} | {c['sm_mhz_median']:.0f} | {c['power_w_median']:.0f} |")
    lines += ["", "(The copies' share is estimated at the 4.3 TB/s a 1 GiB copy moved here.)"]
    return lines


def attention_section(r1):
    lines = ["## Attention alone (16,384 tokens, hidden 2,048, causal), executed TFLOP/s against the model's tables",
             "", "| kernel | head dim | seq | fwd measured / table | bwd measured / table |",
             "|---|---:|---:|---:|---:|"]
    table = {"flash": "fa2", "cudnn": "cudnn"}
    for row in r1["attention"]:
        if not row.get("causal") or "error" in row or row["seq"] not in (1024, 2048, 4096):
            continue
        k = table[row["backend"]]
        f = 989 * kernels.attention_efficiency("H200", k, row["seq"], row["head_dim"], True)
        b = 989 * kernels.attention_efficiency("H200", k, row["seq"], row["head_dim"], True, backward=True)
        lines.append(f"| {row['backend']} ({k}) | {row['head_dim']} | {row['seq']} | "
                     f"{row['fwd_tflops']:.0f} / {f:.0f} | {row['bwd_tflops']:.0f} / {b:.0f} |")
    return lines


def expert_section(r1):
    lines = ["## Host time one GEMM per expert leaves exposed (Qwen3-235B-A22B's expert: hidden 4,096, FFN 1,536)", "",
             "Exposed = (the expert MLP's forward and backward GEMMs issued eagerly after a synchronisation) - (the "
             "same kernels replayed from a CUDA graph), per local expert, microseconds. `per_expert`: one `torch.mm` "
             "per expert and GEMM from a Python loop (as Transformer Engine's GroupedLinear runs BF16 on Hopper, "
             "but with Python's loop and view costs where TE loops in C++: an upper bound of TE's); `grouped_mm`: one "
             "`torch._grouped_mm` per GEMM group (torchtitan's path). Host: the device machine's 16-core Xeon VM, "
             f"where one small `torch.add` costs "
             f"{next(r['host_s'] for r in r1['expert_host_cublas'] if r.get('op') == 'add') * 1e6:.1f} us.", "",
             "| path | BLAS | local experts | tokens per expert | GPU ms (graph) | exposed us per expert |",
             "|---|---|---:|---:|---:|---:|"]
    for key in ("expert_host_cublas", "expert_host_cublaslt"):
        for row in r1[key]:
            if row["path"] == "call" or "exposed_per_expert_s" not in row:
                continue
            lines.append(f"| {row['path']} | {row['blas']} | {row['experts']} | {row['tokens']} | "
                         f"{row['graph_s'] * 1e3:.2f} | {row['exposed_per_expert_s'] * 1e6:.0f} |")
    return lines


def fp8_section(r1):
    """FP8 rows against the model's charged FP8 rate, and the FP8 over BF16 speedup where the BF16 sweep timed the
    same shape (forward layout; a square one in any) against the model's (``precision.gemm_speedup``'s rule: twice
    the ratio of the two envelopes at the GEMM's FLOPs)."""
    bf16 = {(r["M"], r["N"], r["K"]): r["tflops"] for r in r1["gemm_bf16"]
            if r["layout"] == "TN" or r["M"] == r["N"] == r["K"]}
    lines = ["## FP8 GEMMs alone (`torch._scaled_mm`, E4M3, one scale per tensor: the tensorwise recipes' cuBLASLt "
             "GEMM), back to back, against the model's charged FP8 rate and speedup over BF16", "",
             "| M x N x K | measured TFLOP/s (of 1,979) | charged | BF16 measured TFLOP/s | speedup measured | "
             "model's |", "|---|---:|---:|---:|---:|---:|"]
    for row in r1["fp8"]:
        if "tflops" not in row:
            continue
        m, n, k = row["M"], row["N"], row["K"]
        charged = kernels.gemm_shape_efficiency("H200", m, n, k, "fp8", "TN")
        model = 2 * kernels.gemm_efficiency("H200", m, n, k, "fp8") / kernels.gemm_efficiency("H200", m, n, k, "bf16")
        b = bf16.get((m, n, k))
        speedup = f"{row['tflops'] / b:.2f}" if b else "-"
        lines.append(f"| {m} x {n} x {k} | {row['tflops']:.0f} ({row['tflops'] / 1979:.3f}) | {charged:.3f} | "
                     f"{f'{b:.0f}' if b else '-'} | {speedup} | {max(1.0, model):.2f} |")
    return lines


def alignment_section(r2):
    lines = ["## The LM head by vocabulary alignment (16,384 tokens, hidden 2,048) and GPT-3 13B's hidden 5,140", "",
             "| out x in | TN / NN / NT TFLOP/s |", "|---|---|"]
    by = defaultdict(list)
    for row in r2["alignment"]:
        by[(row["out"], row["inp"])].append(f"{row['tflops']:.0f}")
    lines += [f"| {o} x {i} | {' / '.join(v)} |" for (o, i), v in by.items()]
    return lines


def main() -> int:
    r1, r2, r3 = load()
    runs = [(f"{r['model']} eager", r) for r in r2["training_steps_padded"]] + \
           [(f"{r['model']} compiled", r) for r in r3["training_steps_compiled"]]
    unpadded = [(f"{r['model']} eager, vocab 50,257", r) for r in r1["training_steps"]]
    rows, steps = steps_section(runs)
    urows, usteps = steps_section(unpadded)
    env = r2["environment"]
    lines = ["# This project's H200 runs against the cost model (held out: in no calibration file, nothing fitted)", "",
             f"Device: {env['gpu']} ({env['sms']} SMs, driver in `round1.json`), torch {env['torch']} (CUDA "
             f"{env['cuda']}), {env.get('cpu')} x {env.get('cpus')}. `python benchmarks/hopper_runs.py`; the module "
             "docstring says how each run is described.", ""] + steps + ["",
             f"Eager (vocabulary padded to 50,304): {summary(rows, lambda r: not r['compiled'])}. "
             f"Compiled: {summary(rows, lambda r: r['compiled'])}.", "",
             "Unpadded vocabulary (50,257: the head's GEMMs on cuBLAS's unaligned kernels, charged since the "
             "seventeenth session at the rate the alignment table below measured on this H200; a consistency check, "
             "not a held-out test, module docstring):", ""] + usteps[2:] + ["",
             f"Unpadded: {summary(urows, lambda r: True)}.", ""]
    lines += ["## Where the time goes: measured kernels against the model's charge (ms per step)", ""]
    lines += breakdown_section(runs) + ["", "GEMM rate in situ: the layers' and head's GEMM FLOPs (forward and both "
                                        "backward GEMMs) over the profiled GEMM kernels' time.", ""]
    lines += gemm_section(r1) + [""] + clock_section(r1, r3) + [""] + attention_section(r1) + [""]
    lines += fp8_section(r1) + [""] + alignment_section(r2) + [""] + expert_section(r1)
    write_results("hopper_runs", lines, rows + urows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
