"""Cost-model fidelity and evaluation speed, written as files.

    python benchmarks/cost_model_fidelity.py

Writes, under benchmarks/results/:
    cost_model_fidelity.csv   every calibration row (data/calibration.csv on A100, calibration_h100.csv on
                              H100): device, regime, source, model, metric, config, measured, predicted,
                              error (relative for relative metrics, points otherwise)
    cost_model_fidelity.md    the same as a table, then the mean and max |error| per device and metric
                              against its tolerance (symtensor.calibration.TOLERANCE), and the residual
                              range and error band of each regime (symtensor.cost.bands)
    evaluate_speed.md         seconds to cost one full LLaMA-3.1-405B Megatron configuration
                              (tp 8, pp 16, dp 128, sequence parallel, on 16,384 H100s; seq 8192,
                              global batch 2048, micro batch 1): median of 20 runs after one warm-up

Exits 1 when a calibration row is outside its tolerance (calibration is a command, STYLE habit 19).
"""

from __future__ import annotations

import csv
import platform
import statistics
import sys
import time
from pathlib import Path

from symtensor import api, calibration
from symtensor.cost import bands
from symtensor.hardware import GIB, load_cluster
from symtensor.models import load_model_config
from symtensor.search.megatron import megatron_plan

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ("device", "regime", "source", "model", "metric", "config", "measured", "predicted", "error")
RUNS = 20

# the speed case: LLaMA-3.1-405B pretraining layout (Llama 3 paper, arXiv:2407.21783, Table 4)
SPEED_MODEL, SPEED_CLUSTER, SPEED_DEVICES = "llama3-405b", "dgx-h100", 16384
SPEED_CONFIG = dict(tp=8, pp=16, dp=128, sp=True, micro_batch=1, global_batch=2048, seq=8192)  # megatron_plan keys


def _config(fields: dict) -> str:
    """The parallel configuration of a calibration row, in Megatron terms."""
    keys = ("gpus", "tp", "pp", "dp", "cp", "vpp", "sp", "recompute", "micro_batch", "global_batch", "seq")
    return " ".join(f"{k}={fields[k]}" for k in keys if fields.get(k))


def fidelity_rows(results) -> list[dict]:
    return [{"device": r.row.device, "regime": r.row.regime, "source": r.row.source, "model": r.row.model,
             "metric": r.row.metric, "config": _config(r.row.fields),
             "measured": r.row.measured, "predicted": r.predicted, "error": r.error} for r in results]


def write_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({**row, "predicted": f"{row['predicted']:.6g}", "error": f"{row['error']:.6g}"})


def _error_text(metric_key: str, error: float) -> str:
    mode, _ = calibration.TOLERANCE[metric_key]
    return f"{100 * error:+.2f}%" if mode == "rel" else f"{error:+.2f} pt"


def write_markdown(results, path: Path) -> None:
    lines = ["# Cost-model fidelity", "",
             "Predicted vs published, every row of `data/calibration.csv` (A100: Korthikanti et al. 2022, the",
             "ZeRO paper) and `data/calibration_h100.csv` (H100: NeMo 2 Llama 3.1 runs); written by",
             "`python benchmarks/cost_model_fidelity.py`. The efficiency constants were fitted on these rows, one",
             "table per device (`symtensor calibrate --fit`). Errors are relative for times and memory, in points",
             "for MFU and for activation memory as a % of the baseline.", "",
             "| device | model | metric | config | measured | predicted | error | within |",
             "|---|---|---|---|---:|---:|---:|:---:|"]
    for r in results:
        lines.append(f"| {r.row.device} | {r.row.model} | {r.row.metric} | {_config(r.row.fields)} | "
                     f"{r.row.measured:.4g} | {r.predicted:.4g} | {_error_text(r.metric_key, r.error)} | "
                     f"{'yes' if r.within else '**no**'} |")
    lines += ["", "## Error per metric", "", "| metric | rows | mean abs error | max abs error | tolerance |",
              "|---|---:|---:|---:|---:|"]
    for key, s in calibration.summary(results).items():
        mode, tol = calibration.TOLERANCE[key.split(" ", 1)[1]]
        fmt = (lambda v: f"{100 * v:.2f}%") if mode == "rel" else (lambda v: f"{v:.2f} pt")
        lines.append(f"| {key} | {s['n']} | {fmt(s['mean'])} | {fmt(s['max'])} | {fmt(tol)} |")
    outside = sum(not r.within for r in results)
    lines += ["", f"{len(results) - outside} of {len(results)} rows within tolerance.", ""]
    lines += _band_lines(results)
    path.write_text("\n".join(lines) + "\n")


def _band_lines(results) -> list[str]:
    """Residual range of the iteration-time rows per (device, regime): the error band every
    prediction of that regime carries (symtensor.cost.bands), and the regimes without rows."""
    lines = ["## Error bands per regime (iteration time)", "",
             "A prediction's band is the residual range of its regime's rows on its device; a regime without",
             f"rows takes {100 * bands.UNCALIBRATED[0]:+.0f}% .. {100 * bands.UNCALIBRATED[1]:+.0f}% and is marked "
             "extrapolated (symtensor.cost.bands).", "",
             "| device | regime | rows | residuals (predicted / measured - 1) | stored band | calibrated |",
             "|---|---|---:|---|---|:---:|"]
    for device in calibration.CALIBRATION_FILES:
        for regime in bands.REGIMES:
            errs = [r.error for r in results if r.row.device == device and r.row.regime == regime
                    and r.row.metric == "iteration time (s)"]
            stored = bands.RESIDUALS.get((device, regime))
            b = bands.band(1.0, device, regime)
            band_text = f"step x [{b.low_s:.3f}, {b.high_s:.3f}]"
            seen = f"{100 * min(errs):+.2f}% .. {100 * max(errs):+.2f}%" if errs else "none"
            lines.append(f"| {device} | {regime} | {len(errs)} | {seen} | {band_text} | "
                         f"{'yes' if stored else 'no'} |")
    return lines


def time_evaluation() -> dict:
    """Median seconds of one full evaluation (graph build, layouts, cost), and of the library entry point."""
    cfg = load_model_config(SPEED_MODEL)
    cluster = load_cluster(SPEED_CLUSTER, devices=SPEED_DEVICES)
    api_args = {"devices": SPEED_DEVICES, **SPEED_CONFIG}

    def median_seconds(fn) -> float:
        fn()  # warm-up: imports, first-touch allocations
        times = []
        for _ in range(RUNS):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    report = megatron_plan(cfg, cluster, **SPEED_CONFIG).report
    return {"megatron_plan_s": median_seconds(lambda: megatron_plan(cfg, cluster, **SPEED_CONFIG)),
            "api_evaluate_s": median_seconds(lambda: api.evaluate(SPEED_MODEL, SPEED_CLUSTER, **api_args)),
            "step_time_s": report.step_time_s, "mfu": report.mfu, "memory_gib": report.memory_peak / GIB,
            "fits": report.fits}


def write_speed(speed: dict, path: Path) -> None:
    c = SPEED_CONFIG
    config = (f"tp={c['tp']} pp={c['pp']} dp={c['dp']} sp={c['sp']} seq={c['seq']} global batch={c['global_batch']} "
              f"micro batch={c['micro_batch']}")
    verdict = (f"The configuration costs {speed['step_time_s']:.3f} s per step, MFU {100 * speed['mfu']:.1f}%, "
               f"{speed['memory_gib']:.1f} GiB per device (fits: {speed['fits']}).")
    lines = ["# Evaluation speed", "",
             f"One full evaluation of {SPEED_MODEL} on {SPEED_DEVICES:,} x {SPEED_CLUSTER}: {config}.",
             f"Median of {RUNS} runs after one warm-up (`time.perf_counter`), one process.", "",
             "| entry point | median seconds |", "|---|---:|",
             f"| `megatron_plan(...)`: skeleton graph, layouts, cost | {speed['megatron_plan_s']:.4f} |",
             f"| `api.evaluate(...)`: also loads model and cluster, builds the JSON | {speed['api_evaluate_s']:.4f} |",
             "", verdict, "",
             f"Machine: {platform.machine()}, Python {platform.python_version()}, {platform.platform()}."]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = calibration.predict()
    write_csv(fidelity_rows(results), RESULTS / "cost_model_fidelity.csv")
    write_markdown(results, RESULTS / "cost_model_fidelity.md")
    speed = time_evaluation()
    write_speed(speed, RESULTS / "evaluate_speed.md")
    outside = [r for r in results if not r.within]
    for key, s in calibration.summary(results).items():
        print(f"{key}: mean |error| {s['mean']:.4g}, max {s['max']:.4g} (tolerance {s['tolerance']}, n={s['n']})")
    print(f"megatron_plan {SPEED_MODEL} on {SPEED_DEVICES} devices: median {speed['megatron_plan_s']:.4f} s")
    print(f"{len(results) - len(outside)} of {len(results)} calibration rows within tolerance; wrote {RESULTS}")
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
