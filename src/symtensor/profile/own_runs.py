"""Your own runs calibrate the model: ``symtensor calibrate --runs my_runs.csv --out cluster.yaml``.

A team gives a few measured steps of its own stack, one CSV row per run: the model, the cluster and
the devices, the ``evaluate`` options of the configuration, the measured step time and optionally
the measured peak memory. The model's free end-to-end constants (``FREE``: what microbenchmarks
cannot see, each inside a physical range it may not leave) are fitted to those rows, and the
fitted cluster file (the base cluster, its ``end_to_end:`` and ``efficiency:`` sections with the
fitted constants, and a ``band:`` from the residuals) is then taken by every command
(``--cluster cluster.yaml``).

    model,cluster,devices,tp,pp,zero,micro_batch,global_batch,seq,framework,step_time_s,peak_memory_gib
    llama2-7b,dgx-h100,64,1,1,1,1,512,4096,megatron,3.62,61.0
    llama2-7b,dgx-h100,64,2,1,1,1,512,4096,megatron,3.95,
    llama2-13b,dgx-h100,64,2,2,1,1,512,4096,megatron,7.40,

Columns: ``model`` (a preset or a config.json), ``cluster`` (a preset or a cluster file; one
device type for all rows), ``devices``, ``step_time_s`` (seconds per optimizer step, measured),
and optionally ``peak_memory_gib`` (what the run reserved at its peak), ``source`` (a note) and the
configuration's keys (``symtensor.plan.parallelism.KEYS``: tp, pp, dp, cp, ep, etp, sp, zero,
recompute, micro_batch, global_batch, seq, vpp, framework, and whatever a configuration gains);
a key left out takes ``evaluate``'s default (dp: the devices over tp x pp x cp; sp: tp > 1; seq and
global_batch: ``parallelism.default_seq`` and ``default_global_batch``; micro_batch 1). An
unknown column is an error (a misspelt key would silently fall back to a default).

The fit minimises the mean squared log error of the step times by coordinate search, one
constant at a time, over factors of its current value and steps of its range, clamped to the
range. With three rows or more every row is also
predicted by a fit that did not see it (leave-one-out), and the band of the cluster file is the
range of those residuals (with fewer rows, of the in-sample ones, widened to at least
``MIN_BAND``): a band from predictions the fit did not make is one that can cover the next run.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from dataclasses import dataclass, fields
from pathlib import Path

from symtensor.cost.efficiency import efficiency_for
from symtensor.errors import PlanError
from symtensor.hardware import GIB, load_cluster
from symtensor.hardware.cluster import cluster_dict
from symtensor.hardware.efficiency import END_TO_END_RANGES
from symtensor.models import build_graph, load_model_config
from symtensor.plan.parallelism import KEYS, Parallelism, evaluate_defaults
from symtensor.search.megatron import megatron_plan
from symtensor.validate import MAX_FILE_BYTES

# The free constants: name -> (the cluster file's section, lowest, highest value, why). The end-to-end
# constants of the cost model (``hardware.efficiency.EndToEnd``: per-step and per-micro-batch host work,
# the idle gap per op, the compute share a concurrent collective takes; their ranges are the model's own)
# and the collectives' achieved fraction of the link. What the kernel tables and ``symtensor profile``
# measure (GEMM, attention and memory-bound rates) is not here: a user's step times cannot tell kernel
# rates from overlap and overhead, and the kernels are measured.
FREE = {
    **{k: ("end_to_end", lo, hi, why) for k, (lo, hi, why) in END_TO_END_RANGES.items()},
    "link": ("efficiency", 0.3, 0.95, "all-reduce bus bandwidth as a fraction of the link: NCCL reaches 0.8-0.9 of "
                                      "it on large messages (nccl-tests), a congested fabric far less"),
    "link_gather": ("efficiency", 0.3, 0.95, "all-gather / reduce-scatter / point-to-point, as for link (both on "
                                             "the levels without a measured fraction: a preset's InfiniBand "
                                             "ring collectives keep NCCL's, hardware.cluster.IB_RING_EFFICIENCY)"),
}
FACTORS = (0.5, 0.8, 0.95, 0.99, 1.01, 1.05, 1.25, 2.0)
STEPS = (0.003, 0.02, 0.1, 0.3)  # additive moves, as fractions of a range (a constant may start at 0)
ROUNDS = 8  # at most; the search stops after a round that moved nothing
MIN_BAND = 0.03  # a band from fewer than 3 rows is at least +-3%: the run-to-run spread of a step
REQUIRED = ("model", "cluster", "devices", "step_time_s")
OPTIONAL = ("peak_memory_gib", "source") + KEYS
_INTS = {f.name for f in fields(Parallelism) if f.type in ("int", int)}
_BOOLS = {f.name for f in fields(Parallelism) if f.type in ("bool", bool)}


@dataclass(frozen=True)
class Run:
    """One measured run: where it ran, its configuration, and what was measured."""

    line: int
    model: str
    cluster: str
    devices: int
    config: dict
    step_time_s: float
    peak_memory_gib: float | None = None
    source: str = ""


@dataclass(frozen=True)
class Fit:
    """The fitted constants, each row's in-sample and leave-one-out predictions, and the band."""

    constants: dict  # every constant of FREE: the fitted ones and the base cluster's others
    predicted: tuple[float, ...]
    held_out: tuple[float, ...] | None
    band: tuple[float, float]
    runs: tuple[Run, ...]
    memory_errors: tuple[float | None, ...]  # predicted reserved peak / measured - 1 (None: not measured)

    def errors(self, held_out: bool = False) -> list[float]:
        """predicted / measured - 1 per row (leave-one-out when asked and available)."""
        pred = self.held_out if held_out and self.held_out is not None else self.predicted
        return [p / r.step_time_s - 1 for p, r in zip(pred, self.runs)]


def _value(key: str, text: str, where: str):
    text = text.strip()
    try:
        if key in _INTS or key == "devices":
            value = int(text)
            if value < (0 if key == "zero" else 1):
                raise ValueError
            return value
        if key in _BOOLS:
            if text.lower() not in ("yes", "no", "true", "false", "1", "0"):
                raise ValueError
            return text.lower() in ("yes", "true", "1")
        if key in ("step_time_s", "peak_memory_gib"):
            value = float(text)
            if not (math.isfinite(value) and value > 0):
                raise ValueError
            return value
    except ValueError:
        kind = "yes or no" if key in _BOOLS else "a positive number" if key.endswith(("_s", "_gib")) else \
            "a non-negative integer" if key == "zero" else "a positive integer"
        raise PlanError(f"{where}: {key}={text!r} is not {kind}") from None
    return text


def read_runs(path: str | Path) -> list[Run]:
    """The rows of a runs CSV (see the module docstring), checked: one-line errors name the line."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"runs file {path} does not exist; give a CSV of measured runs (symtensor calibrate --help)")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise PlanError(f"runs file {path} is larger than {MAX_FILE_BYTES} bytes")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        columns = [c.strip() for c in reader.fieldnames or ()]
        missing = [c for c in REQUIRED if c not in columns]
        if missing:
            raise PlanError(f"{path}: missing column(s) {', '.join(missing)}; a runs CSV needs "
                            f"{', '.join(REQUIRED)} and takes {', '.join(OPTIONAL)}")
        unknown = [c for c in columns if c not in REQUIRED + OPTIONAL]
        if unknown:
            raise PlanError(f"{path}: unknown column(s) {', '.join(unknown)}; use {', '.join(REQUIRED + OPTIONAL)}")
        runs = []
        for i, raw in enumerate(reader, start=2):
            row = {k.strip(): (v or "").strip() for k, v in raw.items() if k is not None}
            where = f"{path} line {i}"
            for key in REQUIRED:
                if not row.get(key):
                    raise PlanError(f"{where}: {key} is empty")
            values = {k: _value(k, v, where) for k, v in row.items() if v}
            config = {k: values[k] for k in KEYS if k in values}
            runs.append(Run(i, values["model"], values["cluster"], values["devices"], config,
                            values["step_time_s"], values.get("peak_memory_gib"), values.get("source", "")))
    if not runs:
        raise PlanError(f"{path}: no runs; give one row per measured run")
    return runs


def configuration(run: Run, cfg) -> Parallelism:
    """The run's configuration with ``evaluate``'s defaults for the keys it leaves out
    (``parallelism.evaluate_defaults``)."""
    c = dict(run.config)
    keys = {k: c[k] for k in ("tp", "pp", "cp", "dp", "sp", "seq", "global_batch", "framework") if k in c}
    return Parallelism.from_dict({**c, **evaluate_defaults(cfg, run.devices, **keys)})


class _Rows:
    """The rows' models, base clusters and configurations, loaded once; predictions under trial
    constants (a cluster with the constants as its measured ``efficiency`` fields)."""

    def __init__(self, runs: list[Run], base: str | None):
        self.runs = runs
        self.items = []
        self.graphs = {}
        self.predicted: dict = {}  # (row, constants) -> step (predict)
        devices = set()
        for r in runs:
            try:
                cfg = load_model_config(r.model)
                cluster = load_cluster(base or r.cluster, devices=r.devices)
                config = configuration(r, cfg)
                why = config.refusal(cfg, r.devices)
            except PlanError as exc:
                raise PlanError(f"line {r.line}: {exc}") from None
            if why:
                raise PlanError(f"line {r.line}: {why}")
            devices.add(cluster.device.name)
            self.items.append((cfg, cluster, config))
        if len(devices) > 1:
            raise PlanError(f"the runs are on {len(devices)} device types ({', '.join(sorted(devices))}); calibrate "
                            "one cluster file per device type")

    def start(self) -> dict:
        """The constants of the base cluster's table (a cluster file's own values first)."""
        eff = efficiency_for(self.items[0][1])
        return {k: getattr(eff.end_to_end if FREE[k][0] == "end_to_end" else eff, k) for k in FREE}

    def predict(self, i: int, constants: dict) -> float:
        """Row ``i``'s step at ``constants``, each point costed once (the fits and their leave-one-out refits
        revisit the points the coordinate search has costed)."""
        key = (i, tuple(sorted(constants.items())))
        if key not in self.predicted:
            self.predicted[key] = self._predict(i, constants)
        return self.predicted[key]

    def _predict(self, i: int, constants: dict) -> float:
        cfg, cluster, config = self.items[i]
        sections = {"efficiency": dict(cluster.efficiency), "end_to_end": dict(cluster.end_to_end)}
        for k, v in constants.items():
            sections[FREE[k][0]][k] = v
        tuned = dataclasses.replace(cluster, **{name: tuple(sorted(values.items()))
                                                for name, values in sections.items()})
        return megatron_plan(cfg, tuned, self.graph(i), **config.as_dict()).report.step_time_s

    def graph(self, i: int):
        """Row ``i``'s graph, built once (the constants change the costs, not the graph)."""
        if i not in self.graphs:
            cfg, _, config = self.items[i]
            self.graphs[i] = build_graph(cfg, micro_batch=config.micro_batch * config.dp, seq=config.seq,
                                         skeleton=True)
        return self.graphs[i]

    def memory_error(self, i: int) -> float | None:
        """Row ``i``'s predicted reserved peak / its measured peak - 1 (None when none was measured);
        memory does not depend on the fitted constants."""
        measured = self.runs[i].peak_memory_gib
        if measured is None:
            return None
        cfg, cluster, config = self.items[i]
        report = megatron_plan(cfg, cluster, self.graph(i), **config.as_dict()).report
        return report.memory_reserved / GIB / measured - 1


def _loss(rows: _Rows, idx: list[int], constants: dict) -> float:
    return sum(math.log(rows.predict(i, constants) / rows.runs[i].step_time_s) ** 2 for i in idx) / len(idx)


def _fit_on(rows: _Rows, idx: list[int], start: dict, names) -> dict:
    """Coordinate search over ``names`` (of ``FREE``) on the rows ``idx``, each inside its range."""
    best, best_loss = dict(start), _loss(rows, idx, start)
    for _ in range(ROUNDS):
        before = best_loss
        for name in names:
            _section, lo, hi, _why = FREE[name]
            v = best[name]
            moves = [v * f for f in FACTORS] + [v + sign * d * (hi - lo) for d in STEPS for sign in (1, -1)]
            for value in sorted({min(hi, max(lo, m)) for m in moves} - {v}):
                trial = {**best, name: value}
                loss = _loss(rows, idx, trial)
                if loss < best_loss - 1e-15:
                    best, best_loss = trial, loss
        if best_loss >= before:
            break
    return best


def fit(runs: list[Run], base: str | None = None, names: tuple[str, ...] | None = None) -> Fit:
    """Fit the constants ``names`` (default: every one of ``FREE``; the others keep the base
    cluster's values) to the runs; with 3 rows or more, also leave-one-out (each row predicted by a
    fit of the others). ``base``: the cluster the constants refine (default: each row's own)."""
    names = tuple(FREE) if names is None else tuple(names)
    unknown = [n for n in names if n not in FREE]
    if unknown:
        raise PlanError(f"{unknown[0]!r} is not a constant calibrate --runs fits; use {', '.join(FREE)}")
    rows = _Rows(runs, base)
    everything = list(range(len(runs)))
    start = {k: min(FREE[k][2], max(FREE[k][1], v)) for k, v in rows.start().items()}
    constants = _fit_on(rows, everything, start, names)
    predicted = tuple(rows.predict(i, constants) for i in everything)
    held_out = None
    if len(runs) >= 3:
        held_out = tuple(rows.predict(i, _fit_on(rows, [j for j in everything if j != i], constants, names))
                         for i in everything)
    fitted = Fit(constants, predicted, held_out, (0.0, 0.0), tuple(runs),
                 tuple(rows.memory_error(i) for i in everything))
    errors = fitted.errors(held_out=True)  # the in-sample ones without leave-one-out
    lo, hi = min(errors), max(errors)
    if held_out is None:
        lo, hi = min(lo, -MIN_BAND), max(hi, MIN_BAND)
    return dataclasses.replace(fitted, band=(lo, hi))


HEADER = """\
# A cluster file written by `symtensor calibrate --runs` (the preset schema; `symtensor clusters --show FILE`).
# efficiency: the end-to-end constants fitted to the runs (the rest of the device's table is unchanged);
# band: the residuals (predicted / measured - 1) of the runs, left out one at a time when there were 3
# or more, which every prediction on this file takes as its error band. Plan with it:
# `symtensor plan MODEL --cluster FILE --devices N`.
"""


def check_writable(path: str, force: bool) -> Path:
    """``path`` as a new cluster file (or an existing one with ``force``), checked before fitting."""
    from symtensor.profile.document import check_writable as check

    return check(path, force)


def write(fitted: Fit, base: str, path: str, source: str, force: bool = False) -> Path:
    """Write the fitted cluster file (``cluster_document``) to ``path``."""
    from symtensor.profile.document import write as write_document

    return write_document(cluster_document(fitted, base, source), path, force, header=HEADER)


def cluster_document(fitted: Fit, base: str, source: str) -> dict:
    """The fitted cluster file: ``base``'s device and levels (a preset or a file), the fitted
    constants as its ``efficiency:`` section and the residual range as its ``band:``."""
    doc = cluster_dict(load_cluster(base, devices=fitted.runs[0].devices))
    for section in ("efficiency", "end_to_end"):
        values = dict(doc.get(section, {}))
        values.update({k: float(f"{v:.6g}") for k, v in fitted.constants.items() if FREE[k][0] == section})
        doc[section] = values
    doc["efficiency"]["source"] = source
    lo, hi = fitted.band
    doc["band"] = {"low": round(lo, 6), "high": round(hi, 6), "rows": len(fitted.runs),
                   "held_out": fitted.held_out is not None, "source": source}
    return doc
