"""Cost-model fidelity and evaluation speed, written as files.

    python benchmarks/cost_model_fidelity.py

Writes, under benchmarks/results/:
    cost_model_fidelity.csv   every calibration row (data/calibration.csv on A100, calibration_h100.csv on
                              H100): device, regime, source, model, metric, config, measured, predicted,
                              error (relative for relative metrics, points otherwise)
    cost_model_fidelity.md    the same as a table, then the mean and max |error| per device and metric
                              against its tolerance (symtensor.calibration.TOLERANCE); the end-to-end
                              constants with their physical ranges; the error per regime in-sample and
                              leave-one-source-out (v2's for comparison); the leave-one-source-out error of
                              every constant set the selection tried (calibration.select_constants); the
                              bands' rule, their residual ranges and their leave-one-source-out coverage
    evaluate_speed.md         seconds to cost one full LLaMA-3.1-405B Megatron configuration
                              (tp 8, pp 16, dp 128, sequence parallel, on 16,384 H100s; seq 8192,
                              global batch 2048, micro batch 1): median of 20 runs after one warm-up

Exits 1 when a memory row is outside its tolerance or a time row outside its band (calibration is a
command, STYLE habit 19).
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


# v2 (kernel fractions fitted end to end per device, main bb579c4): its rows' error in-sample, and with the
# other device's fitted fractions (the nearest v2 analogue of leaving a source out: each device had one source)
V2 = {"A100 dense 3D: iteration time (s)": ("2.44%", "4.06%", "21.29% (max 26.35%, bias +21.29%)"),
      "A100 dense 3D: MFU (%)": ("0.88 pt", "1.72 pt", "8.28 pt (max 11.56 pt, bias -8.28 pt)"),
      "H100 dense 3D: iteration time (s)": ("2.04%", "4.57%", "17.91% (max 21.82%, bias -17.91%)")}


# v3.0 (main 1755889: H100 BF16 GEMMs at the H100 SXM MAMF burst ceiling, kernel_gap_s the one fitted constant):
# in-sample and leave-one-source-out mean / max / bias, as this file printed them then
V3_0 = {"A100 dense 3D: iteration time (s)": ("3.66% / 10.20% / +2.86%", "3.66% / 10.20% / +2.86%"),
        "A100 dense 3D: MFU (%)": ("1.25 pt / 2.13 pt / +0.08 pt", "1.25 pt / 2.13 pt / +0.08 pt"),
        "H100 dense 3D: iteration time (s)": ("5.91% / 12.26% / -5.91%", "8.54% / 14.07% / -8.54%")}


def _fmt(key: str, v: float, signed: bool = False) -> str:
    mode, _ = calibration.TOLERANCE[key.split(": ", 1)[1]]
    sign = "+" if signed else ""
    return f"{100 * v:{sign}.2f}%" if mode == "rel" else f"{v:{sign}.2f} pt"


def _end_to_end_lines() -> list[str]:
    from symtensor.cost.efficiency import END_TO_END
    from symtensor.hardware.efficiency import END_TO_END_RANGES

    lines = ["## End-to-end constants", "",
             "What no kernel or collective microbenchmark sees, fitted on the time rows of both files together",
             "(`symtensor calibrate --fit`), each inside its physical range; kernel rates are the measured tables",
             "of `cost/kernels.py`, never fitted. Fitted: " + ", ".join(calibration.FIT_CONSTANTS) +
             " (the others keep their priors: see the selection below).", "",
             "| constant | value | range | why the range |", "|---|---:|---|---|"]
    for name, (lo, hi, why) in END_TO_END_RANGES.items():
        lines.append(f"| {name} | {getattr(END_TO_END, name):.4g} | {lo:g} .. {hi:g} | {why} |")
    return lines + [""]


def _regime_lines(results, loso) -> list[str]:
    ins, out = calibration.error_by_regime(results), calibration.error_by_regime(loso)
    lines = ["## Error per regime: in-sample and leave-one-source-out", "",
             "Leave-one-source-out: the end-to-end constants fitted without a source family's rows (KORTH22: "
             "Korthikanti et al. 2022, A100; ZERO: the ZeRO paper's memory; DGXC: NVIDIA dgxc-benchmarking "
             "NeMo runs, H100), its rows predicted with them. v3.0: main 1755889, H100 GEMMs at the burst "
             "ceiling (MAMF) instead of the sustained one (MSMF). v2: main bb579c4, kernel fractions fitted.", "",
             "| regime: metric | rows | in-sample mean / max / bias | LOSO mean / max / bias | "
             "v3.0 in-sample | v3.0 LOSO | v2 in-sample mean / max | v2 other device's fit |",
             "|---|---:|---|---|---|---|---|---|"]
    for key, s in ins.items():
        o = out[key]
        v2, v30 = V2.get(key, ("", "", "")), V3_0.get(key, ("", ""))
        lines.append(f"| {key} | {s['n']} | {_fmt(key, s['mean'])} / {_fmt(key, s['max'])} / "
                     f"{_fmt(key, s['bias'], True)} | {_fmt(key, o['mean'])} / {_fmt(key, o['max'])} / "
                     f"{_fmt(key, o['bias'], True)} | {v30[0]} | {v30[1]} | {v2[0]} / {v2[1]} | {v2[2]} |")
    return lines + [""]


def _selection_lines(selection) -> list[str]:
    kept, seen = selection
    lines = ["## Which constants go in (leave-one-source-out)", "",
             "Backward elimination from every candidate (`calibration.select_constants`): a constant whose",
             "removal does not raise the leave-one-source-out mean tolerance-scaled error of the time rows does",
             f"not go in. Kept: {', '.join(kept) or 'none'}.", "",
             "| constants fitted (others at their priors) | LOSO mean tolerance-scaled error |", "|---|---:|"]
    for names, err in sorted(seen.items(), key=lambda kv: kv[1]):
        lines.append(f"| {', '.join(names) or '(none)'} | {err:.4f} |")
    return lines + [""]


def write_markdown(results, path: Path, loso=None, selection=((), {})) -> None:
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
    lines += ["", f"{len(results) - outside} of {len(results)} rows within their v2 tolerance (time rows are now "
              "judged by their band, below).", ""]
    lines += _end_to_end_lines() + _regime_lines(results, loso) + _selection_lines(selection)
    lines += _band_lines(results, loso)
    path.write_text("\n".join(lines) + "\n")


def _band_lines(results, loso) -> list[str]:
    """The bands' rule, their base ranges, and their leave-one-source-out coverage."""
    cover = calibration.band_coverage(loso)
    lines = ["## Error bands", "",
             "A prediction's band is its device's residual range of the time rows (iteration time and MFU, "
             "in-sample and leave-one-source-out together), widened on each side per dimension it leaves the "
             "calibrated domain along (`symtensor.cost.bands`): " +
             ", ".join(f"{k} +-{100 * v:.0f}%" for k, v in bands.WIDEN.items()) +
             f"; domain: {bands.DOMAIN}, and per device table the tensor-parallel degrees of its time rows "
             f"{bands.TENSOR_PARALLEL} (parallelism). A device without rows takes the union of the calibrated ranges, "
             "widened by the device width.", "",
             "| device | regime | stored residual range | band of a 1 s prediction | calibrated |",
             "|---|---|---|---|:---:|"]
    for device in calibration.CALIBRATION_FILES:
        for regime in bands.REGIMES:
            b = bands.band(1.0, device, regime)
            lo, hi = bands.RESIDUALS[(device, "dense 3D")]
            lines.append(f"| {device} | {regime} | {100 * lo:+.2f}% .. {100 * hi:+.2f}% (widened: "
                         f"{', '.join(b.widened) or 'none'}) | [{b.low_s:.3f}, {b.high_s:.3f}] s | "
                         f"{'yes' if b.calibrated else 'no'} |")
    lines += ["", "Coverage (leave-one-source-out): each time row's band built from the other sources' residuals only "
              "(its own device uncalibrated when its source is the device's only one), around its "
              "leave-one-source-out prediction.", "", "| device | rows inside their band |", "|---|---:|"]
    for key, (hit, n) in cover.items():
        lines.append(f"| {key} | {hit} of {n} ({100 * hit / n:.0f}%) |")
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
    loso = calibration.loso()
    selection = calibration.select_constants()
    write_csv(fidelity_rows(results), RESULTS / "cost_model_fidelity.csv")
    write_markdown(results, RESULTS / "cost_model_fidelity.md", loso, selection)
    speed = time_evaluation()
    write_speed(speed, RESULTS / "evaluate_speed.md")
    outside = calibration.outside(results)
    for key, s in calibration.summary(results).items():
        print(f"{key}: mean |error| {s['mean']:.4g}, max {s['max']:.4g} (tolerance {s['tolerance']}, n={s['n']})")
    print(f"megatron_plan {SPEED_MODEL} on {SPEED_DEVICES} devices: median {speed['megatron_plan_s']:.4f} s")
    print(f"{len(outside)} calibration rows outside their tolerance (memory) or band (time); wrote {RESULTS}")
    return 1 if outside else 0


if __name__ == "__main__":
    sys.exit(main())
