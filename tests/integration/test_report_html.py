"""``symtensor report``: one self-contained HTML page with the plan's plots and tables, rendered in
headless Chromium without console errors; a screenshot shows the plots.

The Chromium test skips when no Chromium binary is installed (``.ci/run`` installs Debian's
``chromium``); networking is off and the profile is fresh, so nothing outside the page can load.
"""

import json
import re
import shutil
import subprocess

import pytest

from symtensor.cli import main

REPORT = ["report", "tiny-llama", "--cluster", "dgx-h100", "--devices", "8", "--seq", "512", "--global-batch", "64",
          "--sweep", "seq=256..1024"]
PLOTS = ("breakdown", "memory", "layout-map", "sweep")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--enable-logging=stderr", "--v=0"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """(path of the page, the JSON of the command)."""
    import contextlib
    import io

    path = tmp_path_factory.mktemp("report") / "report.html"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(REPORT + ["--html", str(path), "--json"]) == 0
    return path, json.loads(buf.getvalue())


def test_report_json(report):
    path, out = report
    assert out["html"] == str(path) and path.exists()
    plan = out["plan"]
    assert {"step_time_s", "breakdown", "memory_gib", "layer_types", "config", "baselines"} <= set(plan)
    assert set(plan["baselines"]) == {"megatron_recipe", "megatron_grid_best", "fsdp", "drec"}
    for b in plan["baselines"].values():
        assert b["step_time_s"] is None or {"breakdown", "memory_gib", "speedup_of_plan"} <= set(b)
    assert [p["seq"] for p in out["sweep"]["points"]] == [256, 512, 1024]
    assert "breakpoints" in out["sweep"] and out["explain"]["layer_types"]


def test_page_is_self_contained(report):
    text = report[0].read_text()
    assert text.startswith("<!DOCTYPE html>")
    for name in PLOTS:
        assert re.search(rf"<figure class='plot' id='plot-{name}'><svg", text), name
    # nothing is fetched: no external scripts, styles, images or fonts
    assert "<link" not in text and "@import" not in text
    assert not re.search(r"""\b(?:src|href)\s*=\s*["'](?!#)""", text)
    for table in ("step time breakdown", "baselines (same cost model)", "layouts per layer type", "Why these cuts",
                  "Breakpoints"):
        assert table in text


def test_report_console(capsys, tmp_path):
    argv = REPORT[:-2] + ["--sweep", "none", "--html", str(tmp_path / "r.html")]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "report written to" in out and (tmp_path / "r.html").exists()
    assert "id='plot-sweep'" not in (tmp_path / "r.html").read_text()
    assert main(REPORT[:-2] + ["--sweep", "batch=1..2", "--html", str(tmp_path / "x.html")]) == 2
    assert "expected PARAM=RANGE" in capsys.readouterr().err


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _run_chromium(binary, tmp_path, *args) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile{len(list(tmp_path.iterdir()))}"
    return subprocess.run([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=180, check=False)


@pytest.mark.skipif(_chromium() is None, reason="no chromium binary (apt-get install chromium; .ci/run does)")
def test_renders_in_headless_chromium(report, tmp_path):
    from matplotlib.image import imread

    binary, page = _chromium(), report[0].resolve().as_uri()
    dom = _run_chromium(binary, tmp_path, "--dump-dom", page)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    assert not re.search(r"<html[^>]*data-errors=", dom.stdout), "a script error was recorded"
    rendered = re.search(r'data-plots-rendered="(\d+)"', dom.stdout)
    assert rendered and int(rendered.group(1)) == len(PLOTS), "every plot has a rendered size"

    shot = tmp_path / "report.png"
    run = _run_chromium(binary, tmp_path, f"--screenshot={shot}", "--window-size=1400,6000", page)
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    assert [line for line in run.stderr.splitlines() if ":CONSOLE" in line] == []
    img = imread(str(shot))[..., :3]
    assert img.shape[:2] == (6000, 1400)

    boxes = re.search(r'data-plot-boxes="([^"]*)"', dom.stdout).group(1).split(";")
    assert len(boxes) == len(PLOTS)
    for name, box in zip(PLOTS, boxes):
        x, y, w, h = (int(v) for v in box.split(","))
        assert y + h <= img.shape[0], f"plot {name} lies below the screenshot"
        region = img[y:y + h, x:x + w]
        inked = (region.min(axis=-1) < 0.9).mean()
        colored = (region.max(axis=-1) - region.min(axis=-1) > 0.2).mean()
        # a drawn plot: axes and labels (ink) and colored marks, not a blank or a broken-image box
        assert inked > 0.03 and colored > 0.001, (name, inked, colored)
    # the component colors of the step-time bars and the layout map are on screen
    blue = (abs(img - [0x4e / 255, 0x79 / 255, 0xa7 / 255]).max(axis=-1) < 0.03).sum()
    assert blue > 2000
