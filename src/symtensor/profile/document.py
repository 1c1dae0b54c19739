"""The cluster file of a profile: measured curves in the preset schema, written and read back.

``build`` turns rank 0's measurements into a cluster document (``hardware.cluster_from_dict``'s
schema): the device's peaks (a preset's published ones when the device is a known preset, or
``--like PRESET``; otherwise this device's best measured rates, and the file says so), the levels
with their measured latency and per-kind ``link_efficiency``, the ``efficiency:`` fractions fitted
on those peaks (``symtensor.profile.fit``), and every raw table under ``measured:`` with the date,
device and software versions. ``curves`` recomputes, from a file, each curve the planner will use
(its constants through ``cost.efficiency_for``) against the file's own measurements: the
residuals ``symtensor calibrate --cluster`` prints.
"""

from __future__ import annotations

from pathlib import Path

from symtensor.errors import PlanError
from symtensor.hardware import PRESETS, cluster_from_dict
from symtensor.hardware.cluster import preset_for
from symtensor.profile.fit import (
    BUS_FACTOR,
    Curve,
    Point,
    alpha_beta,
    attention_points,
    bmm_points,
    collective_points,
    fit_curve,
    gemm_points,
    median,
    memory_points,
)
from symtensor.profile.grid import KINDS, MEMORY_KERNELS, aligned_twin

GB, TFLOPS, GIB, US = 1e9, 1e12, 2**30, 1e-6
# the columns of each measured table: name -> type (bool before int: a bool is an int)
COLUMNS = {"gemm": {"m": int, "n": int, "k": int, "seconds": float},
           "bmm": {"batch": int, "m": int, "n": int, "k": int, "seconds": float},
           "attention": {"batch": int, "heads": int, "seq": int, "head_dim": int, "causal": bool,
                         "fwd_seconds": float, "bwd_seconds": float},
           "memory": {"kernel": str, "elements": int, "bytes": int, "seconds": float}}
MESSAGE_COLUMNS = {"bytes": int, "seconds": float}
# the unaligned GEMMs and their aligned twins (``grid.Grid.unaligned``): a table files written before it lack
UNALIGNED_COLUMNS = {"m": int, "n": int, "k": int, "seconds": float, "aligned_seconds": float}
LEVEL_NAMES = {0: "intra", 1: "inter"}  # levels of a device without a preset: within a node, across nodes


def compute_points(tables: dict, gemm_knee: float) -> dict[str, tuple[str, str, list[Point]]]:
    """Per efficiency field: the curve's name, its rate unit and its points (attention's charge
    the GEMM knee, as the cost model does)."""
    att = tables["attention"]
    return {"gemm": ("gemm", "FLOP/s", gemm_points(tables["gemm"])),
            "bmm": ("bmm", "FLOP/s", bmm_points(tables["bmm"])),
            "attention": ("attention forward", "FLOP/s", attention_points(att, False, gemm_knee)),
            "attention_bwd": ("attention backward", "FLOP/s", attention_points(att, True, gemm_knee)),
            "hbm": ("memory-bound", "B/s", memory_points(tables["memory"]))}


def compute_curves(tables: dict) -> dict[str, Curve]:
    """Fitted compute and memory curves (rates in absolute units), keyed by efficiency field."""
    gemm = fit_curve("gemm", "FLOP/s", gemm_points(tables["gemm"]))
    pts = compute_points(tables, gemm.knee)
    fwd = fit_curve(*pts["attention"])
    # the cost model charges a batched product the GEMM knee, and memory-bound kernels
    # bytes / (HBM bandwidth x hbm) without a size curve
    return {"gemm": gemm, "bmm": fit_curve(*pts["bmm"], knee=gemm.knee), "attention": fwd,
            "attention_bwd": fit_curve(*pts["attention_bwd"], knee=fwd.knee), "hbm": fit_curve(*pts["hbm"], knee=0.0)}


def unaligned_fractions(rows: list[dict]) -> dict[str, float]:
    """The ``gemm_unaligned_*`` efficiency fields of the measured unaligned GEMMs: per alignment class of the
    weight (``cost.kernels.alignment_class``), the mean over its rows of the GEMM's FLOP/s over its aligned
    twin's (``grid.aligned_twin``)."""
    from symtensor.cost.kernels import ALIGN_ELEMENTS, alignment_class

    by: dict[int, list[float]] = {}
    for r in rows:
        n, k = r["n"], r["k"]
        ratio = (n * k / r["seconds"]) / (aligned_twin(n) * aligned_twin(k) / r["aligned_seconds"])
        by.setdefault(alignment_class(n, k), []).append(ratio)
    return {f"gemm_unaligned_{c}": _sig(min(1.0, sum(v) / len(v))) for c, v in sorted(by.items())
            if c < ALIGN_ELEMENTS}


def link_curves(level_tables: list[dict], names: dict[int, str]) -> dict[tuple[int, str], Curve]:
    """Fitted bus-bandwidth curves per (measured level index, kind)."""
    return {(t["level"], kind): fit_curve(f"{names[t['level']]} {kind}", "B/s (bus)",
                                          collective_points(kind, t["group"], t[kind]))
            for t in level_tables for kind in KINDS}


def link_constants(curve: Curve, kind: str, p: int, level: int) -> tuple[float, float]:
    """(latency s, bandwidth x efficiency B/s) of a fitted bus-bandwidth curve of ``p`` members."""
    c_a, c_b = alpha_beta(kind, p, level)
    factor = BUS_FACTOR[kind](p)
    return factor * curve.knee / (curve.a * c_a), curve.a * c_b / factor


def link_curve(name: str, kind: str, p: int, level: int, latency: float, bandwidth: float, points) -> Curve:
    """The bus-bandwidth curve the planner charges: ``link_constants`` inverted."""
    c_a, c_b = alpha_beta(kind, p, level)
    factor = BUS_FACTOR[kind](p)
    a = bandwidth * factor / c_b
    return Curve(name, "B/s (bus)", tuple(points), a, c_a * latency * a / factor)


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def _levels(meta: dict, groups: dict[int, int], links: dict, preset: str | None) -> list[dict]:
    """Level entries: a preset's published bandwidths and fanouts, or (without a preset) the
    measured levels at their best bus bandwidth; measured levels get their latency and link
    efficiencies. ``groups``: members per measured level index (0 within a node, 1 across)."""
    if preset:  # (with the preset's stated fractions: its InfiniBand ring collectives', hardware.cluster)
        base = [(i, {"name": lv.name, "fanout": lv.fanout, "bandwidth": lv.bandwidth, "latency": lv.latency,
                     "link_efficiency": dict(lv.link_efficiency), "source": f"published ({preset}: {lv.source})"})
                for i, lv in enumerate(PRESETS[preset][1])]
    else:
        base = [(i, {"name": LEVEL_NAMES[i], "fanout": meta["ranks_per_node"] if i == 0 else 0, "latency": 0.0,
                     "source": "best measured bus bandwidth of this level"}) for i in sorted(groups)]
    out = []
    for j, (i, lv) in enumerate(base):  # i: the measured level, j: its place in the file
        entry = {"name": lv["name"]} | ({"fanout": lv["fanout"]} if j < len(base) - 1 else {})
        latency, fractions, source = lv["latency"], lv.get("link_efficiency", {}), lv["source"]
        if i in groups:
            pairs = {k: link_constants(links[(i, k)], k, groups[i], j) for k in KINDS}  # (latency, B x eff)
            lv.setdefault("bandwidth", max(bw for _, bw in pairs.values()))
            latency = median(lat for lat, _ in pairs.values())
            fractions = {k: _sig(bw / lv["bandwidth"]) for k, (_, bw) in pairs.items()}
            source += f"; latency and link_efficiency measured over {groups[i]} ranks {meta['date']}"
        entry |= {"bandwidth_gbps": _sig(lv["bandwidth"] / GB), "latency_us": _sig(latency / US)}
        out.append(entry | ({"link_efficiency": fractions} if fractions else {}) | {"source": source})
    return out


def _peaks(meta: dict, compute: dict[str, Curve], preset: str | None) -> dict:
    """The device's peaks (published, or this device's best measured rates) and the note saying which."""
    dtype = meta["dtype"]
    best_flops = max(p.rate for p in compute["gemm"].points)
    best_bytes = max(p.rate for p in compute["hbm"].points)
    if preset:
        device = PRESETS[preset][0]
        return {"flops": device.flops(dtype), "hbm": device.hbm_bandwidth, "best_flops": best_flops,
                "best_bytes": best_bytes, "tflops": {k: _sig(v / TFLOPS) for k, v in device.peak_flops.items()},
                "basis": f"published ({preset}: {device.source})",
                "note": f"peak_tflops, hbm_gbps and bandwidth_gbps are the published numbers of preset {preset}; "
                        "efficiency, link_efficiency, latencies and memory are measured."}
    flops, hbm = max(compute["gemm"].a, best_flops), max(compute["hbm"].a, best_bytes)
    what = "CPU" if meta["backend"] == "gloo" else "device"
    # the planner costs bf16 by default: where fp32 was measured (CPUs), bf16 gets its rate
    tflops = {dtype: _sig(flops / TFLOPS)} | ({"bf16": _sig(flops / TFLOPS)} if dtype == "fp32" else {})
    return {"flops": flops, "hbm": hbm, "best_flops": best_flops, "best_bytes": best_bytes, "tflops": tflops,
            "basis": "measured (best GEMM rate and best memory-bound bandwidth of this device)",
            "note": f"The numbers are this {what}'s, measured by {meta['world_size']} {meta['backend']} processes at "
                    "once: peaks are its best measured GEMM FLOP/s and memory-bound bytes/s, level bandwidths its "
                    "best measured bus bandwidths" + ("; bf16 is costed at the measured fp32 rate." if dtype == "fp32"
                                                      else ".")}


def _efficiency(meta: dict, compute: dict[str, Curve], links: dict, peaks: dict) -> dict:
    """The efficiency: section, fractions of ``peaks``, with its provenance."""
    source = (f"measured by symtensor profile {meta['date']} on {meta['world_size']} x {meta['device']} "
              f"({meta['backend']}, {meta['dtype']}), torch {meta['torch']}, CUDA {meta['cuda']}, NCCL {meta['nccl']}")
    out = {"source": source} | {k: _sig(c.a / (peaks["hbm"] if k == "hbm" else peaks["flops"]))
                                for k, c in compute.items()}
    out |= {"gemm_knee": _sig(compute["gemm"].knee), "attention_knee": _sig(compute["attention"].knee)}
    # one message-size curve for every level and kind: the median of the measured ones (none measured: the preset's)
    return out | ({"link_half_bytes": _sig(median(c.knee for c in links.values()))} if links else {})


def links_preset(device_name: str, like: str | None, devices: int) -> str | None:
    """The preset whose published peaks and levels the file keeps (``preset_for``); a PlanError where one device
    is profiled (it measures no link) and no preset names the network it sits in."""
    preset = preset_for(device_name, like)
    if devices < 2 and preset is None:
        what = f"device {device_name!r}" if device_name else "this machine"
        raise PlanError(f"a one-device profile measures no links and {what} matches no preset: name the cluster "
                        "whose network the file keeps with --like PRESET (e.g. --like dgx-h100)")
    return preset


def build(result: dict, like: str | None = None) -> tuple[dict, list[Curve]]:
    """The cluster document of a profile and the fitted curves behind it.

    Args:
        result: ``{"meta": provenance, "memory_bytes": per device, "tables": measured tables}`` as
            ``symtensor.profile.worker.measure`` returns it (collectives on the levels with two members or more:
            none where one device was profiled, whose file then keeps its preset's levels as published).
        like: a preset whose published peaks to keep (default: matched by the device name).
    """
    meta, tables = result["meta"], result["tables"]
    preset = links_preset(meta["device"], like, meta["world_size"])
    groups = {t["level"]: t["group"] for t in tables["collectives"]}
    names = {i: lv.name for i, lv in enumerate(PRESETS[preset][1])} if preset else LEVEL_NAMES
    compute = compute_curves(tables)
    links = link_curves(tables["collectives"], names)
    peaks = _peaks(meta, compute, preset)
    measured = meta | {"note": peaks["note"], "peaks": {
        "basis": peaks["basis"], "best_gemm_tflops": _sig(peaks["best_flops"] / TFLOPS),
        "best_memory_gbps": _sig(peaks["best_bytes"] / GB),
        "best_bus_gbps": {names[i]: _sig(max(links[(i, k)].a for k in KINDS) / GB) for i in sorted(groups)}}}
    measured |= {name: [_rounded(r) for r in tables[name]] for name in COLUMNS}
    if tables.get("unaligned"):
        measured["unaligned"] = [_rounded(r) for r in tables["unaligned"]]
    measured["collectives"] = {names[t["level"]]: {"group": t["group"]} | {k: [_rounded(r) for r in t[k]]
                                                                           for k in KINDS}
                               for t in tables["collectives"]}
    doc = {"name": f"profiled-{preset or meta['backend']}-{meta['world_size']}",
           "device": {"name": meta["device"], "peak_tflops": peaks["tflops"], "hbm_gbps": _sig(peaks["hbm"] / GB),
                      "memory_gib": _sig(result["memory_bytes"] / GIB),
                      "source": f"peaks {peaks['basis']}; memory measured {meta['date']}"},
           "levels": _levels(meta, groups, links, preset),
           "efficiency": _efficiency(meta, compute, links, peaks) | unaligned_fractions(tables.get("unaligned", [])),
           "measured": measured}
    cluster_from_dict(doc, 1, "the profile")  # the schema is the loader's
    return doc, list(compute.values()) + list(links.values())


def _rounded(row: dict) -> dict:
    return {k: _sig(v) if isinstance(v, float) else v for k, v in row.items()}


HEADER = """\
# A cluster file written by `symtensor profile` (the preset schema; `symtensor clusters --show FILE`).
# efficiency: fractions of the peaks below, fitted on the measured: tables; each level's
# link_efficiency: fractions of its bandwidth_gbps per collective kind. Residuals of the fits:
# `symtensor calibrate --cluster FILE`. Plan with it: `symtensor plan MODEL --cluster FILE --devices N`.
"""


def check_writable(path: str, force: bool) -> Path:
    """``path`` as a writable new cluster file (or an existing one with ``force``)."""
    from symtensor.output import target

    if Path(path).suffix not in (".yaml", ".yml"):
        raise PlanError(f"--out {path}: a cluster file is YAML; name it *.yaml")
    out = target(path, "--out", force)
    if out.exists() and not force:
        raise PlanError(f"--out {path} exists; give --force to overwrite it")
    return out


def _yaml(doc: dict) -> str:
    """Block-style YAML with every measured row and level entry's ``link_efficiency`` on one line."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def mapping(dumper, data):
        one_line = "source" not in data and all(not isinstance(v, (dict, list)) for v in data.values())
        return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=one_line)

    Dumper.add_representer(dict, mapping)
    return yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=120)


def write(doc: dict, path: str, force: bool = False, header: str = HEADER) -> Path:
    """Write ``doc`` as YAML after ``header`` (comment lines), atomically (an interrupted write
    leaves no partial file)."""
    from symtensor.output import write_atomic

    return write_atomic(check_writable(path, force), header + _yaml(doc), "cluster file")


def read(path: str) -> dict:
    """A cluster file's document, checked by the loader's schema."""
    from symtensor.validate import read_mapping

    doc = read_mapping(path, "cluster file")
    cluster_from_dict(doc, 1, path)
    return doc


def _rows(rows, columns: dict, where: str) -> list[dict]:
    """A measured table: a non-empty list of rows with exactly ``columns``, sizes positive."""
    if not isinstance(rows, list) or not rows:
        raise PlanError(f"{where}: expected a non-empty list of rows {{{', '.join(columns)}}}")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or set(row) != set(columns):
            raise PlanError(f"{where}[{i}]: a row has exactly the keys {', '.join(columns)}, got {row!r}")
        for key, kind in columns.items():
            value = row[key]
            ok = isinstance(value, bool) if kind is bool else (
                isinstance(value, str) if kind is str else
                not isinstance(value, bool) and isinstance(value, (int, float)) and value > 0
                and (kind is float or float(value).is_integer()))
            if not ok:
                rule = "a positive number" if kind in (int, float) else kind.__name__
                raise PlanError(f"{where}[{i}]: {key} must be {rule}, got {value!r}")
        if "kernel" in columns and row["kernel"] not in MEMORY_KERNELS:
            raise PlanError(f"{where}[{i}]: kernel {row['kernel']!r} is not one of {', '.join(MEMORY_KERNELS)}")
    return rows


def measured_tables(doc: dict, path: str) -> dict:
    """The measured tables of a profiled cluster file, checked (a missing or malformed curve is a
    PlanError naming it)."""
    measured = doc.get("measured")
    if not measured:
        raise PlanError(f"{path} has no measured: section, so no curves to compare; write one with "
                        "symtensor profile --out FILE")
    missing = [k for k in (*COLUMNS, "collectives", "dtype") if k not in measured]
    if missing:
        raise PlanError(f"{path}: measured: lacks the curve(s) {', '.join(missing)}; profile again")
    tables = {k: _rows(measured[k], cols, f"{path}: measured.{k}") for k, cols in COLUMNS.items()}
    if "unaligned" in measured:  # (optional: files written before the probe lack it)
        tables["unaligned"] = _rows(measured["unaligned"], UNALIGNED_COLUMNS, f"{path}: measured.unaligned")
    names = [lv["name"] for lv in doc["levels"]]
    colls = measured["collectives"]
    if not isinstance(colls, dict):
        raise PlanError(f"{path}: measured.collectives must map level names to curves")
    tables["collectives"] = []
    for name, curves in colls.items():
        where = f"{path}: measured.collectives.{name}"
        if name not in names:
            raise PlanError(f"{where}: no such level; the levels are {', '.join(names)}")
        if not isinstance(curves, dict) or set(curves) != {"group", *KINDS}:
            raise PlanError(f"{where}: needs exactly group and the curves {', '.join(KINDS)}")
        if not isinstance(curves["group"], int) or isinstance(curves["group"], bool) or curves["group"] < 2:
            raise PlanError(f"{where}: group must be an integer of at least 2, got {curves['group']!r}")
        tables["collectives"].append({"level": names.index(name), "group": curves["group"]}
                                     | {k: _rows(curves[k], MESSAGE_COLUMNS, f"{where}.{k}") for k in KINDS})
    return tables


def curves(path: str) -> list[Curve]:
    """Each curve the planner uses with this file (``cost.efficiency_for`` over its device and
    levels), against the file's own measurements."""
    from symtensor.cost.efficiency import efficiency_for

    doc = read(path)
    tables = measured_tables(doc, path)
    cluster = cluster_from_dict(doc, 1, path)
    eff = efficiency_for(cluster)
    peak, hbm = cluster.device.flops(doc["measured"]["dtype"]), cluster.device.hbm_bandwidth
    knees = {"gemm": eff.gemm_knee, "bmm": eff.gemm_knee, "attention": eff.attention_knee,
             "attention_bwd": eff.attention_knee, "hbm": 0.0}
    out = [Curve(name, unit, tuple(points), getattr(eff, k) * (hbm if k == "hbm" else peak), knees[k])
           for k, (name, unit, points) in compute_points(tables, eff.gemm_knee).items()]
    for t in tables["collectives"]:
        level = cluster.levels[t["level"]]
        for kind in KINDS:
            bandwidth = level.bandwidth * dict(level.link_efficiency).get(kind, eff.link_for(kind))
            out.append(link_curve(f"{level.name} {kind}", kind, t["group"], t["level"], level.latency, bandwidth,
                                  collective_points(kind, t["group"], t[kind])))
    return out
