"""``symtensor sweep``: ranges, the JSON's points and breakpoints, and each breakpoint's explanation.

The LLaMA-3-8B sweep is the issue's acceptance case: on 64 H100 from 2K to 128K tokens per sequence
(about 4M tokens per step) the plan must change at least once, and say why. At 128K the global
batch is 32 sequences, so the 64-way data parallelism of short sequences is impossible there.
"""

import json
import re

import pytest

from symtensor.analysis.sweep import headline, layout_label
from symtensor.cli import main
from symtensor.errors import PlanError
from symtensor.validate import parse_range


def run_json(capsys, argv) -> dict:
    assert main(argv + ["--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return json.loads(out)


@pytest.mark.parametrize("text, values", [
    ("2048..131072", [2048, 4096, 8192, 16384, 32768, 65536, 131072]),
    ("8..64:4", [8, 32]),
    ("1024,4096,8192", [1024, 4096, 8192]),
    ("512", [512]),
    (16, [16]),
    (None, None),
])
def test_parse_range(text, values):
    assert parse_range(text, "--seq") == values


@pytest.mark.parametrize("text", ["4096..2048", "a..b", "8..64:1", "0,8", ""])
def test_parse_range_refuses(text):
    with pytest.raises(PlanError, match=r"--seq"):
        parse_range(text, "--seq")


def test_headline_and_label():
    assert headline({"tp": [1, 2], "dp": [64, 32]}) == "data parallel 64->32 gives way to tensor parallel 1->2"
    assert headline({"cp": [1, 2], "zero": [2, 3]}) == "context parallel 1->2; ZeRO 2->3"
    assert layout_label({"tp": 2, "pp": 1, "dp": 32, "cp": 1, "ep": 1, "sp": True, "zero": 1,
                         "recompute": "none", "vpp": 1, "heterogeneous": True}) == "tp2 dp32 sp zero1*"


def test_llama3_8b_sweep_has_an_explained_breakpoint(capsys):
    out = run_json(capsys, ["sweep", "llama3-8b", "--cluster", "dgx-h100", "--devices", "64",
                            "--seq", "2048,16384,131072"])
    assert (out["model"], out["param"], out["values"]) == ("llama3-8b", "seq", [2048, 16384, 131072])
    pts = out["points"]
    assert [p["seq"] for p in pts] == [2048, 16384, 131072]
    for p in pts:
        assert {"step_time_s", "memory_gib_per_device", "fits", "breakdown", "config", "layout",
                "layer_types"} <= set(p)
        assert p["global_batch"] * p["seq"] == 2**22, "about 4M tokens per step at every point"
        assert p["fits"]
    assert pts[-1]["config"]["dp"] <= 32, "128K x 32 sequences cannot be 64-way data parallel"
    assert out["breakpoints"], "the plan must change between 2K and 128K"
    for b in out["breakpoints"]:
        assert b["changes"] and b["reason"] in ("memory", "constraint", "speed")
        lo, hi = b["between"]
        assert f"seq {lo} -> {hi}" in b["explanation"] and b["headline"] in b["explanation"]
        assert b["term_deltas"] and abs(b["term_deltas"][0]["delta_s"]) >= abs(b["term_deltas"][-1]["delta_s"])
        kept = b["previous_plan_here"]
        assert kept["valid"] is False and kept["error"] or {"step_time_s", "fits"} <= set(kept)
    for b in out["breakpoints"]:
        prev = next(p for p in pts if p["seq"] == b["between"][0])
        if prev["config"]["dp"] > 2**22 // b["between"][1]:  # more replicas than sequences at the new point
            assert b["reason"] == "constraint" and "not divisible" in b["explanation"]


def test_devices_sweep_console(capsys):
    argv = ["sweep", "tiny-llama", "--devices", "8,16", "--seq", "512", "--global-batch", "64"]
    out = run_json(capsys, argv)
    assert [p["devices"] for p in out["points"]] == [8, 16] and out["param"] == "devices"
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "plans across devices" in text and ("breakpoint" in text)


@pytest.mark.parametrize("argv, match", [
    (["sweep", "tiny-llama", "--devices", "8..16", "--seq", "256..1024"], r"one parameter at a time"),
    (["sweep", "tiny-llama", "--devices", "8"], r"nothing to sweep"),
    (["sweep", "tiny-llama", "--devices", "8", "--seq", "2048..1024"], r"--seq 2048\.\.1024: expected"),
], ids=["two-ranges", "no-range", "bad-range"])
def test_user_errors_are_one_line(capsys, argv, match):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert re.search(match, err), err


def test_keeping_a_plan_that_cannot_exist_is_a_constraint():
    """64-way data parallelism has no sequence to give every replica at 128K x 32 sequences."""
    from symtensor.analysis.sweep import breakpoint_reason, keep_config
    from symtensor.models import load_model_config

    config = {"tp": 1, "pp": 1, "dp": 64, "cp": 1, "ep": 1, "sp": False, "zero": 3, "recompute": "full", "vpp": 1}
    point = {"devices": 64, "global_batch": 32, "seq": 131072, "breakdown": {}, "step_time_s": 1.0}
    kept = keep_config(load_model_config("llama3-8b"), "dgx-h100", config, point)
    assert kept["valid"] is False and "global batch 32" in kept["error"]
    reason, text = breakpoint_reason(kept, point, "dp64 zero3 rc-full")
    assert reason == "constraint" and text.startswith("Keeping dp64 zero3 rc-full is impossible here")
    kept = keep_config(load_model_config("llama3-8b"), "dgx-h100", {**config, "recompute": "none", "zero": 1},
                       {**point, "global_batch": 64})
    assert kept["valid"] and not kept["fits"]
    assert breakpoint_reason(kept, point, "dp64 zero1")[0] == "memory"
