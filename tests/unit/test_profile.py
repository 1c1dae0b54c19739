"""`symtensor profile`: the fits recover known curves, the cluster file round-trips through the
loader, bad requests and files get one line, and a real --quick profile on 4 gloo processes
writes a file whose curves change the plan's costs as the measured fractions say."""

from __future__ import annotations

import os
import re
from types import SimpleNamespace

import pytest
import yaml

from symtensor.cli import main
from symtensor.cost.collectives import collective_time
from symtensor.cost.efficiency import efficiency_for
from symtensor.cost.opcost import attention_shape_factor
from symtensor.errors import PlanError
from symtensor.hardware import PRESETS, Level, load_cluster
from symtensor.profile import build, curves, write
from symtensor.profile.fit import BUS_FACTOR, Point, collective_points, fit_curve
from symtensor.profile.grid import KINDS
from symtensor.profile.run import check_request

# -- synthetic measurements from known constants ---------------------------------------------------
PEAK, KNEE, ATT_KNEE, HBM = 100e12, 1e9, 300.0, 2e12  # FLOP/s, FLOPs, tokens, B/s
LINK = {0: (200e9, 5e-6), 1: (20e9, 20e-6)}  # level -> (bus bandwidth B/s, latency s)


def _gemm_s(flops: float, a: float) -> float:
    return (flops + KNEE) / a  # rate a F / (F + knee)


def synthetic(device: str = "CPU test", gemm: float = 0.8, groups=((0, 4), (1, 2))) -> dict:
    """Measurements that follow the fitted laws exactly (as symtensor.profile.worker.measure returns)."""
    att = [{"batch": 1, "heads": 8, "seq": s, "head_dim": d, "causal": c} for s in (256, 1024, 4096) for d in (64, 128)
           for c in (False, True)]
    for r in att:  # the planner's law: (FLOPs + gemm knee) / (peak x fraction x shape factor)
        flops = 4 * r["heads"] * r["seq"] ** 2 * r["head_dim"] * (0.5 if r["causal"] else 1) + KNEE
        shape = attention_shape_factor({"t": r["seq"], "d": r["head_dim"]}, SimpleNamespace(attention_knee=ATT_KNEE))
        r["fwd_seconds"] = flops / (0.5 * PEAK * shape)
        r["bwd_seconds"] = 2.5 * flops / (0.4 * PEAK * shape)
    collectives = []
    for level, p in groups:
        bw, lat = LINK[level]
        curves_ = {"level": level, "group": p}
        for kind in KINDS:
            counts = [p if i == level else 1 for i in range(2)]
            levels = [Level(name=str(i), fanout=4 if i == 0 else 0, bandwidth=bw if i == level else 1, latency=lat)
                      for i in range(2)]
            curves_[kind] = [{"bytes": m, "seconds": collective_time(kind, m, counts, levels)}
                             for m in (2**10, 2**16, 2**22, 2**28)]
        collectives.append(curves_)
    return {"meta": {"date": "2026-01-01T00:00:00+00:00", "device": device, "torch": "2.13.0", "cuda": None,
                     "nccl": None, "backend": "gloo", "dtype": "bf16", "world_size": 8,
                     "ranks_per_node": dict(groups).get(0, 1)},
            "memory_bytes": 64 * 2**30,
            "tables": {"gemm": [{"m": n, "n": n, "k": n, "seconds": _gemm_s(2 * n**3, gemm * PEAK)}
                                for n in (128, 512, 2048, 8192)],
                       "bmm": [{"batch": 8, "m": 512, "n": 512, "k": 64, "seconds": _gemm_s(2 * 8 * 512**2 * 64,
                                                                                         0.3 * PEAK)}],
                       "attention": att,
                       "memory": [{"kernel": k, "elements": 2**24, "bytes": 2**26, "seconds": 2**26 / (0.9 * HBM)}
                                  for k in ("copy", "rmsnorm", "swiglu", "softmax")],
                       "collectives": collectives}}


def test_fit_recovers_a_saturating_law():
    points = [Point(str(x), x, 3 * x, 3 * (x + 5e4) / 7e9) for x in (1e3, 1e4, 1e5, 1e6, 1e7)]
    curve = fit_curve("toy", "FLOP/s", points)
    assert curve.a / 7e9 == pytest.approx(1, rel=1e-3)
    assert curve.knee / 5e4 == pytest.approx(1, rel=1e-3)
    assert max(abs(e) for e in curve.errors()) < 0.01


@pytest.mark.parametrize("kind", KINDS)
def test_collective_fit_is_the_cost_models_alpha_beta(kind):
    """Bus bandwidth a m / (m + knee) with knee = p x latency x a is cost.collectives' formula."""
    level = Level(name="nvlink", fanout=8, bandwidth=100e9, latency=4e-6)
    rows = [{"bytes": m, "seconds": collective_time(kind, m, [8], [level])} for m in (2**12, 2**18, 2**24, 2**30)]
    curve = fit_curve(kind, "B/s (bus)", collective_points(kind, 8, rows))
    assert curve.a == pytest.approx(100e9, rel=1e-3)
    assert curve.knee / (8 * curve.a) == pytest.approx(4e-6, rel=1e-3)
    assert BUS_FACTOR[kind](8) in (2 * 7 / 8, 7 / 8)


@pytest.mark.parametrize("groups", [((0, 4), (1, 2)), ((0, 2), (1, 4))], ids=["4x2", "2x4-tree"])
def test_build_writes_measured_peaks_and_fractions_the_loader_reads(groups, tmp_path):
    """Latencies come back through the cost model's own steps (a tree across 4 nodes, rings inside)."""
    doc, fitted = build(synthetic(groups=groups))
    eff = doc["efficiency"]
    # without a preset the peaks are the device's best measured rates: gemm is then near 1
    assert doc["device"]["peak_tflops"]["bf16"] == pytest.approx(80, rel=0.01)
    assert eff["gemm"] == pytest.approx(1, rel=0.01) and eff["gemm_knee"] == pytest.approx(KNEE, rel=0.02)
    assert eff["attention"] / eff["gemm"] == pytest.approx(0.5 / 0.8, rel=0.01)
    assert eff["attention_bwd"] / eff["gemm"] == pytest.approx(0.4 / 0.8, rel=0.01)
    assert eff["attention_knee"] == pytest.approx(ATT_KNEE, rel=0.02)
    assert [lv["name"] for lv in doc["levels"]] == ["intra", "inter"] and doc["levels"][0]["fanout"] == groups[0][1]
    assert [lv["latency_us"] for lv in doc["levels"]] == pytest.approx([5, 20], rel=1e-3)
    assert "this CPU's" in doc["measured"]["note"]
    path = write(doc, str(tmp_path / "c.yaml"))
    cluster = load_cluster(str(path), devices=8)
    assert [lv.bandwidth for lv in cluster.levels] == pytest.approx([200e9, 20e9], rel=1e-3)
    assert efficiency_for(cluster).gemm == eff["gemm"] and cluster.efficiency_source.startswith("measured")
    assert dict(cluster.levels[0].link_efficiency)["all_reduce"] == pytest.approx(1.0, rel=1e-3)
    # the file's own curves reproduce its measurements (they were generated by the same laws)
    assert max(c.summary()["max_abs_error"] for c in curves(str(path))) < 0.01
    assert len(fitted) == 5 + 2 * len(KINDS)


def test_a_known_gpu_keeps_the_presets_published_peaks():
    doc, _ = build(synthetic(device="NVIDIA H100 80GB HBM3", gemm=0.7, groups=((0, 8),)))
    device, levels = PRESETS["dgx-h100"]
    assert doc["device"]["peak_tflops"]["bf16"] == 989 and doc["device"]["hbm_gbps"] == 3350
    assert doc["efficiency"]["gemm"] == pytest.approx(0.7 * PEAK / device.flops("bf16"), rel=0.01)
    nvlink, ib = doc["levels"]
    assert nvlink["bandwidth_gbps"] == 450 and nvlink["link_efficiency"]["all_reduce"] == pytest.approx(200 / 450,
                                                                                                          rel=1e-3)
    # not measured: published, the preset's stated fractions with it (NCCL's over InfiniBand, hardware.cluster)
    assert ib["link_efficiency"] == dict(levels[1].link_efficiency) and ib["latency_us"] == levels[1].latency * 1e6
    assert "published numbers of preset dgx-h100" in doc["measured"]["note"]


def test_one_device_keeps_its_presets_levels_and_measures_its_kernels(tmp_path):
    """One GPU measures its kernels and no link: the file takes the published levels of its preset (matched by the
    device's name, or --like) and its kernel fractions, and loads; without a preset it is one line naming --like.
    A one-process request with --like passes the checks."""
    result = synthetic(device="NVIDIA H200", gemm=0.7, groups=())
    result["meta"]["world_size"] = 1
    doc, fitted = build(result)
    device, levels = PRESETS["dgx-h200"]
    assert [lv["name"] for lv in doc["levels"]] == [lv.name for lv in levels]
    assert [lv["bandwidth_gbps"] for lv in doc["levels"]] == [lv.bandwidth / 1e9 for lv in levels]
    assert doc["efficiency"]["gemm"] == pytest.approx(0.7 * PEAK / device.flops("bf16"), rel=0.01)
    assert "link_half_bytes" not in doc["efficiency"] and doc["measured"]["collectives"] == {}
    assert len(fitted) == 5
    cluster = load_cluster(str(write(doc, str(tmp_path / "one.yaml"))), devices=64)
    assert efficiency_for(cluster).gemm == doc["efficiency"]["gemm"] and cluster.device.name == "NVIDIA H200"
    assert curves(str(tmp_path / "one.yaml"))
    bare = synthetic(groups=())
    bare["meta"]["world_size"] = 1
    with pytest.raises(PlanError, match="one-device profile measures no links and device 'CPU test' matches no "
                                        "preset: name the cluster whose network the file keeps with --like"):
        build(bare)
    assert build(bare, like="dgx-a100-80g")[0]["levels"][0]["name"] == PRESETS["dgx-a100-80g"][1][0].name
    assert check_request(str(tmp_path / "c.yaml"), 1, "gloo", False, "dgx-h100", None) == (1, "gloo")


# -- one line per bad request or file ------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    ({"backend": "mpi"}, "unknown backend 'mpi': use nccl"),
    ({"backend": "gloo", "devices": 10_000}, "--devices 10000: gloo runs at most 4 processes per CPU core"),
    ({"backend": "gloo", "devices": 0}, "give a number of devices, 1 or more"),
    ({"backend": "gloo", "devices": 1}, "a one-device profile measures no links and this machine matches no preset"),
    ({"backend": "gloo", "devices": 4, "ranks_per_node": 3}, "--ranks-per-node 3 must divide --devices 4"),
    ({"backend": "gloo", "like": "dgx-h10"}, "not a cluster preset. Did you mean dgx-h100"),
], ids=["backend", "too-many", "none", "one-without-preset", "ranks-per-node", "like"])
def test_bad_requests_fail_before_any_process(kwargs, match, tmp_path):
    with pytest.raises(PlanError, match=match):
        check_request(str(tmp_path / "c.yaml"), kwargs.get("devices", 2), kwargs.get("backend"), False,
                      kwargs.get("like"), kwargs.get("ranks_per_node"))


def test_unwritable_or_existing_out(tmp_path):
    (tmp_path / "file").write_text("")
    (tmp_path / "old.yaml").write_text("")
    for out, match in ((tmp_path / "file" / "c.yaml", "does not exist; create it first"),
                       (tmp_path / "old.yaml", "exists; give --force"), (tmp_path / "c.json", "name it \\*.yaml")):
        with pytest.raises(PlanError, match=match):
            check_request(str(out), 2, "gloo", False, None, None)


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.pop("measured"), "has no measured: section"),
    (lambda d: d["measured"].pop("gemm"), "lacks the curve\\(s\\) gemm"),
    (lambda d: d["measured"]["gemm"][0].pop("k"), "measured.gemm\\[0\\]: a row has exactly the keys m, n, k, seconds"),
    (lambda d: d["measured"]["memory"][0].update(seconds=-1), "measured.memory\\[0\\]: seconds must be a positive"),
    (lambda d: d["measured"]["collectives"]["intra"].pop("all_to_all"), "needs exactly group and the curves"),
    (lambda d: d["efficiency"].update(gemm="fast"), "efficiency: gemm must be a positive number"),
    (lambda d: d["efficiency"].update(gem=0.5), "efficiency: unknown key\\(s\\) \\['gem'\\]"),
    (lambda d: d["levels"][0]["link_efficiency"].update(all_reduce=0), "link_efficiency: all_reduce must be a"),
    (lambda d: d["efficiency"].update(pads_vocab=0), "efficiency: unknown key\\(s\\) \\['pads_vocab'\\]"),
], ids=["no-measured", "missing-curve", "row-keys", "negative", "collective", "efficiency", "unknown", "link",
        "engine-field"])
def test_missing_or_malformed_curves_are_one_line(edit, match, tmp_path, capsys):
    doc, _ = build(synthetic())
    edit(doc)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["calibrate", "--cluster", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and re.search(match, err), err


TORCHRUN_TAIL = """\
W1201 .../torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 1 closing signal SIGTERM
Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================"""


@pytest.mark.parametrize("workers, shown", [
    ("worker.py: error: argument --dtype: invalid choice: 'int4'", "invalid choice: 'int4'"),
    ("[rank1]: Traceback (most recent call last):\n[rank1]: torch.OutOfMemoryError: CUDA out of memory",
     "OutOfMemoryError: CUDA out of memory"),
], ids=["argparse", "traceback"])
def test_failed_workers_are_one_line_with_their_log(workers, shown):
    """The workers' own last error, not torchrun's report of their exit; everything in the log."""
    from symtensor.profile.run import failure_line

    line = failure_line(1, workers + "\n" + TORCHRUN_TAIL)
    assert "\n" not in line and shown in line and "=====" not in line
    log = line.rsplit("their output: ", 1)[1]
    with open(log) as f:
        assert f.read().startswith(workers)
    os.unlink(log)


def test_the_profile_measures_what_unaligned_gemms_cost_and_the_planner_charges_it(tmp_path, capsys):
    """``symtensor profile`` times GEMMs whose weight is no multiple of 8 wide against their aligned twins (the
    grids' ``unaligned``); the file keeps the rows under ``measured: unaligned`` and, per alignment class, the mean
    FLOP/s ratio as ``efficiency: gemm_unaligned_1/2/4``. The planner then charges a model's unaligned widths at
    those fractions on that cluster (an A100, which has no alignment table of its own), says so in the plan, and
    keeps an aligned model as it was. A file without the table (written before the probe) still reads."""
    from symtensor import api
    from symtensor.plan.document import description_notes
    from symtensor.profile.grid import GRIDS

    assert all(g.unaligned for g in GRIDS.values()) and all(n % 8 or k % 8 for g in GRIDS.values()
                                                            for _, n, k in g.unaligned)
    result = synthetic(device="NVIDIA A100-SXM4-80GB")
    flops = 2 * 8192 * 4096 * 4096  # the aligned twin's
    result["tables"]["unaligned"] = [
        {"m": 8192, "n": 4097, "k": 4096, "seconds": 8192 * 4097 * 4096 * 2 / (0.2 * flops / 1e-3),
         "aligned_seconds": 1e-3},
        {"m": 8192, "n": 4100, "k": 4096, "seconds": 8192 * 4100 * 4096 * 2 / (0.5 * flops / 1e-3),
         "aligned_seconds": 1e-3}]
    doc, _ = build(result, like="dgx-a100-80g")
    assert doc["efficiency"]["gemm_unaligned_1"] == pytest.approx(0.2, rel=1e-3)
    assert doc["efficiency"]["gemm_unaligned_4"] == pytest.approx(0.5, rel=1e-3)
    assert "gemm_unaligned_2" not in doc["efficiency"] and len(doc["measured"]["unaligned"]) == 2
    path = write(doc, str(tmp_path / "a100.yaml"))
    assert main(["calibrate", "--cluster", str(path)]) == 0  # (the file reads back, its curves against it)
    capsys.readouterr()
    eff = efficiency_for(load_cluster(str(path), devices=8))
    assert eff.unaligned == ((1, doc["efficiency"]["gemm_unaligned_1"]), (4, doc["efficiency"]["gemm_unaligned_4"]))

    def step(cluster, **over):
        return api.evaluate("gpt3-13b", str(cluster), 8, zero=1, recompute="full", overrides=over or None)

    stated, aligned = step(path), step(path, hidden=5120)
    assert stated.report.step_time_s > 1.5 * aligned.report.step_time_s  # (5,140: class 4, at 0.5)
    notes = description_notes(stated)
    assert any(n.startswith("hidden 5,140") and "the cluster file measured (symtensor profile)" in n for n in notes)
    del doc["measured"]["unaligned"]
    for key in ("gemm_unaligned_1", "gemm_unaligned_4"):
        del doc["efficiency"][key]
    older = write(doc, str(tmp_path / "older.yaml"))
    assert main(["calibrate", "--cluster", str(older)]) == 0
    assert efficiency_for(load_cluster(str(older), devices=8)).unaligned == ()
    assert step(older, hidden=5120).report.step_time_s == aligned.report.step_time_s  # (aligned: unchanged)
    assert step(older).report.step_time_s < 0.7 * stated.report.step_time_s  # (no measurement: aligned rates)
    broken, _ = build(result, like="dgx-a100-80g")
    broken["measured"]["unaligned"][0]["aligned_seconds"] = -1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(broken))
    capsys.readouterr()
    assert main(["calibrate", "--cluster", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "measured.unaligned[0]: aligned_seconds must be a positive number" in err, err
