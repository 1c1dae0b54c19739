"""`symtensor profile` for real: a --quick profile on 4 gloo processes (two simulated nodes of 2)
writes a file whose curves change the plan's costs as the measured fractions say, and a profile
stopped by its timeout leaves no process and no file."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from symtensor.cli import main
from symtensor.cost.efficiency import efficiency_for
from symtensor.errors import PlanError
from symtensor.hardware import load_cluster
from symtensor.profile import read
from symtensor.profile.grid import KINDS, grid_for

pytestmark = pytest.mark.dist


# -- a real profile: 4 gloo processes, two simulated nodes of 2 ----------------------------------
@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    pytest.importorskip("torch")
    path = tmp_path_factory.mktemp("profile") / "cpu.yaml"
    assert main(["profile", "--devices", "4", "--backend", "gloo", "--quick", "--ranks-per-node", "2",
                 "--out", str(path), "--json"]) == 0
    return path


def _variant(doc: dict, path, strip: bool = False, latency_us: float | None = None, efficiency=None) -> str:
    """The profiled file, without its measured fractions, with zero latency or other efficiencies."""
    doc = copy.deepcopy(doc)
    if strip:
        doc.pop("efficiency")
        for lv in doc["levels"]:
            lv.pop("link_efficiency", None)
    if efficiency is not None:
        doc["efficiency"] = efficiency
    for lv in doc["levels"]:
        lv["latency_us"] = lv["latency_us"] if latency_us is None else latency_us
    path.write_text(yaml.safe_dump(doc))
    return str(path)


@pytest.mark.dist
def test_profile_writes_every_curve_and_refuses_to_overwrite(profiled, capsys):
    capsys.readouterr()
    doc = read(str(profiled))
    assert {"gemm", "gemm_knee", "bmm", "attention", "attention_bwd", "attention_knee", "hbm",
            "link_half_bytes"} <= set(doc["efficiency"])
    assert [lv["name"] for lv in doc["levels"]] == ["intra", "inter"]
    assert all(set(lv["link_efficiency"]) == set(KINDS) for lv in doc["levels"])
    assert doc["measured"]["backend"] == "gloo" and doc["measured"]["torch"] and "this CPU's" in doc["measured"]["note"]
    # the unaligned GEMMs against their aligned twins (grid.Grid.unaligned), and their fraction (capped at 1)
    assert [(r["m"], r["n"], r["k"]) for r in doc["measured"]["unaligned"]] == list(grid_for("cpu", True).unaligned)
    assert 0 < doc["efficiency"]["gemm_unaligned_1"] <= 1
    assert main(["clusters", "--show", str(profiled)]) == 0 and "intra" in capsys.readouterr().out
    assert main(["calibrate", "--cluster", str(profiled), "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)
    assert len(fit["curves"]) == 5 + 2 * len(KINDS) and all(c["points"] for c in fit["curves"])
    assert main(["profile", "--devices", "2", "--backend", "gloo", "--quick", "--out", str(profiled)]) == 2
    assert "exists; give --force" in capsys.readouterr().err


@pytest.mark.dist
def test_one_process_profiles_its_kernels_under_a_presets_network(tmp_path, capsys):
    """One device (a workstation's one GPU; here one gloo process) measures its kernels and no link: the file keeps
    the --like preset's levels as published, shows, and plans."""
    pytest.importorskip("torch")
    path = tmp_path / "one.yaml"
    assert main(["profile", "--devices", "1", "--backend", "gloo", "--quick", "--like", "dgx-h100", "--out",
                 str(path), "--json"]) == 0
    doc = read(str(path))
    assert doc["measured"]["world_size"] == 1 and doc["measured"]["collectives"] == {}
    assert [lv["name"] for lv in doc["levels"]] == [lv.name for lv in load_cluster("dgx-h100", devices=8).levels]
    assert {"gemm", "attention", "hbm"} <= set(doc["efficiency"])
    capsys.readouterr()
    assert main(["plan", "llama2-7b", "--cluster", str(path), "--devices", "16", "--no-baselines", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] > 0


@pytest.mark.dist
def test_plan_uses_the_profiled_curves(profiled, tmp_path, capsys):
    from symtensor import api

    doc = read(str(profiled))
    assert main(["plan", "llama3-8b", "--cluster", str(profiled), "--devices", "4", "--json",
                 "--no-baselines"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["efficiency_source"] == doc["efficiency"]["source"].strip()
    assert planned["efficiency_source"].startswith("measured by symtensor profile")
    plain = _variant(doc, tmp_path / "plain.yaml", strip=True)
    assert efficiency_for(load_cluster(str(profiled), devices=4)).gemm == doc["efficiency"]["gemm"]
    kw = dict(devices=4, tp=4, pp=1, dp=1, micro_batch=1, global_batch=8, seq=2048)
    measured, default = (api.evaluate("llama3-8b", c, **kw).report.breakdown for c in (str(profiled), plain))
    assert measured["compute"] != default["compute"] and measured["tp_comm"] != default["tp_comm"]


@pytest.mark.dist
def test_compute_scales_by_the_measured_gemm_fraction(profiled, tmp_path):
    """A measured GEMM fraction g takes the GEMMs out of the kernel tables (the user's measurement
    wins): GEMM-rated ops then take A + L / g (L their FLOP time at peak, A the rest), so halving g
    again and again adds L / g, then 2 L / g (g / 2, g / 4, g / 8: every GEMM compute-bound)."""
    from symtensor import api

    doc = read(str(profiled))
    g = doc["efficiency"]["gemm"]
    files = {"default": _variant(doc, tmp_path / "d.yaml", strip=True)}
    for k in (2, 4, 8):
        files[k] = _variant(doc, tmp_path / f"g{k}.yaml", strip=True, efficiency={"gemm": g / k})
    kw = dict(devices=4, tp=1, pp=1, dp=4, micro_batch=1, global_batch=8, seq=2048)
    t = {k: api.evaluate("llama3-8b", f, **kw).report.breakdown["compute"] for k, f in files.items()}
    assert t[8] - t[4] == pytest.approx(2 * (t[4] - t[2]), rel=1e-6)
    assert t[2] != pytest.approx(t["default"], rel=1e-3)  # the tables' rates are not the measured one


@pytest.mark.dist
def test_communication_follows_the_measured_link_efficiencies(profiled, tmp_path):
    """Without latency, tensor-parallel time is the sum over kinds of wire bytes / (bandwidth x
    fraction): its ratio between the measured and the default fractions is known in closed form."""
    from symtensor import api

    doc = read(str(profiled))
    files = {"measured": _variant(doc, tmp_path / "m.yaml", latency_us=0),
             "default": _variant(doc, tmp_path / "d.yaml", strip=True, latency_us=0)}
    kw = dict(devices=2, tp=2, pp=1, dp=1, micro_batch=1, global_batch=8, seq=2048)  # one intra-node pair
    out = {k: api.evaluate("llama3-8b", f, **kw).report for k, f in files.items()}
    wire = out["measured"].comm_bytes
    measured = dict(load_cluster(files["measured"], devices=2).levels[0].link_efficiency)
    default = efficiency_for(load_cluster(files["default"], devices=2))
    expected = sum(b / measured[k] for k, b in wire.items()) / sum(b / default.link_for(k) for k, b in wire.items())
    ratio = out["measured"].breakdown["tp_comm"] / out["default"].breakdown["tp_comm"]
    assert ratio == pytest.approx(expected, rel=1e-3)


@pytest.mark.dist
def test_a_stopped_profile_leaves_no_process_and_no_file(tmp_path):
    """The timeout path is the Ctrl-C path (run_process_group): every worker is gone after it."""
    pytest.importorskip("torch")
    from pathlib import Path

    from symtensor.profile import profile

    out = tmp_path / "stopped.yaml"
    with pytest.raises(PlanError, match="did not finish in 6 s; its processes were stopped"):
        profile(str(out), devices=2, backend="gloo", timeout_s=6)
    left = [p for p in Path("/proc").glob("[0-9]*") if str(out) in _cmdline(p)]
    assert not left and not out.exists()


def _cmdline(proc) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
