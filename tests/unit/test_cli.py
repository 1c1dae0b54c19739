"""The command line: every command runs, --json prints the contract's keys, and every user error is
one line on stderr (``error: ...``) with exit status 2 (DESIGN.md, "Contracts others rely on")."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from symtensor.cli import main

EVALUATE = ["evaluate", "llama2-7b", "--cluster", "dgx-h100", "--devices", "16", "--tp", "8", "--pp", "1",
            "--dp", "2", "--global-batch", "64", "--seq", "4096", "--micro-batch", "1"]
CONFIG_KEYS = {"tp", "pp", "dp", "cp", "ep", "sp", "zero", "recompute", "micro_batch", "global_batch"}
BREAKDOWN_KEYS = {"compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "dp_comm", "pp_comm", "pp_bubble"}


def run_json(capsys, argv) -> dict:
    assert main(argv + ["--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return json.loads(out)


def test_models(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "llama3-405b" in out and "mixtral-8x7b" in out
    rows = run_json(capsys, ["models"])
    assert {r["name"] for r in rows} >= {"llama2-7b", "gpt3-175b", "qwen2-72b", "tiny-llama"}
    assert all(r["source"] for r in rows)


def test_clusters(capsys):
    assert main(["clusters"]) == 0
    assert "dgx-h100" in capsys.readouterr().out
    rows = {r["name"]: r for r in run_json(capsys, ["clusters"])}
    assert set(rows) == {"dgx-a100-80g", "dgx-h100", "dgx-h200", "dgx-b200", "gb200-nvl72", "dgx-b300", "gb300-nvl72",
                         "ascend-910b"}
    assert rows["dgx-b300"]["peak_bf16_tflops"] == pytest.approx(2250)
    assert [lv["bandwidth_gbps"] for lv in rows["gb300-nvl72"]["levels"]] == pytest.approx([900, 100])
    assert rows["dgx-h100"]["peak_bf16_tflops"] == pytest.approx(989)
    assert [lv["bandwidth_gbps"] for lv in rows["dgx-h100"]["levels"]] == pytest.approx([450, 50])


@pytest.mark.parametrize("argv, cluster, n", [
    (["evaluate", "llama3-70b", "--cluster", "dgx-b300", "--devices", "64", "--tp", "2", "--pp", "4"], "dgx-b300", 64),
    (["plan", "qwen3-235b-a22b", "--cluster", "gb300-nvl72", "--devices", "256"], "gb300-nvl72", 256),
])
def test_blackwell_ultra_presets_evaluate_and_plan(capsys, argv, cluster, n):
    """The Blackwell Ultra presets run end to end: 64 B300 (8 nodes), 256 GB300 (4 racks of 64 GPUs); their
    efficiency table is borrowed, so the band is uncalibrated and says so."""
    out = run_json(capsys, argv)
    assert out["cluster"] == cluster and out["devices"] == n and out["step_time_s"] > 0
    assert out["capacity_gib"] == pytest.approx(270 if cluster == "dgx-b300" else 288) and not out["band_calibrated"]
    assert "transferred to" in out["efficiency_source"]


def test_graph_json(capsys):
    out = run_json(capsys, ["graph", "llama2-7b"])
    assert {"params_total", "params_active", "layers", "ops", "flops_per_step"} <= set(out)
    assert out["params_total"] == out["params_active"] == 6_738_415_616
    assert out["layers"] == 32 and out["ops"] > 32 * 10
    # 6 N tokens + attention: seq 4096, one sequence
    tokens = out["seq"] * out["global_batch"]
    assert out["flops_per_step"] > 6 * out["params_total"] * tokens


def test_graph_table_and_options(capsys, tmp_path):
    assert main(["graph", "mixtral-8x7b", "--seq", "512"]) == 0
    assert "parameters (active per token)" in capsys.readouterr().out
    out = run_json(capsys, ["graph", "llama2-7b", "--set", "layers=2", "--micro-batch", "2", "--global-batch", "8",
                            "--seq", "128"])
    assert (out["layers"], out["micro_batch"], out["global_batch"], out["seq"]) == (2, 2, 8, 128)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 256}))
    out = run_json(capsys, ["graph", str(path)])
    assert (out["layers"], out["hidden"], out["heads"], out["ffn"]) == (2, 64, 4, 256)


def test_evaluate_json(capsys):
    out = run_json(capsys, EVALUATE)
    for key in ("step_time_s", "tokens_per_s", "model_tflops_per_device", "mfu", "memory_gib_per_device"):
        assert isinstance(out[key], float) and out[key] > 0, key
    assert isinstance(out["fits"], bool)
    assert set(out["breakdown"]) >= BREAKDOWN_KEYS
    assert set(out["config"]) >= CONFIG_KEYS
    cfg = out["config"]
    assert (cfg["tp"], cfg["pp"], cfg["dp"], cfg["cp"], cfg["ep"], cfg["zero"], cfg["recompute"]) == (
        8, 1, 2, 1, 1, 0, "none")
    assert cfg["sp"] is True  # the default with tp > 1
    assert (cfg["micro_batch"], cfg["global_batch"]) == (1, 64)
    assert out["tokens_per_s"] == pytest.approx(64 * 4096 / out["step_time_s"])
    assert 0 < out["mfu"] < 1


def test_evaluate_options(capsys):
    argv = ["evaluate", "tiny-mixtral", "--cluster", "dgx-a100-80g", "--nodes", "1", "--tp", "2", "--pp", "2",
            "--ep", "2", "--no-sp", "--zero", "1", "--recompute", "full", "--global-batch", "16", "--seq", "64"]
    out = run_json(capsys, argv)  # --dp defaults to devices / (tp*pp*cp); --micro-batch auto
    cfg = out["config"]
    assert (cfg["dp"], cfg["ep"], cfg["sp"], cfg["zero"], cfg["recompute"], cfg["pp"]) == (2, 2, False, 1, "full", 2)
    assert 16 % (cfg["micro_batch"] * cfg["dp"]) == 0
    assert main(argv) == 0
    assert "step time breakdown" in capsys.readouterr().out


@pytest.mark.parametrize("argv, match", [
    (["evaluate", "llama9-7b", "--cluster", "dgx-h100", "--devices", "8", "--tp", "8"],
     r"unknown model 'llama9-7b'.*Did you mean llama2-7b"),
    (["evaluate", "llama2-7b", "--cluster", "dgx-h900", "--devices", "8", "--tp", "8"],
     r"unknown cluster 'dgx-h900'.*Did you mean .*dgx-h100"),
    (["evaluate", "llama2-7b", "--cluster", "dgx-h100", "--devices", "24", "--tp", "3", "--dp", "8",
      "--global-batch", "64"], r"tp=3 must divide heads=32"),
    (["evaluate", "llama2-7b", "--cluster", "dgx-h100", "--devices", "16", "--tp", "8", "--dp", "4"],
     r"tp\*pp\*dp\*cp = 8\*1\*4\*1 = 32 but the cluster has 16 devices"),
    (["evaluate", "llama2-7b", "--cluster", "dgx-h100", "--devices", "16", "--tp", "8", "--dp", "2",
      "--global-batch", "7"], r"global batch 7 is not divisible by micro_batch\*dp = 1\*2"),
    (["evaluate", "llama2-7b", "--cluster", "dgx-h100", "--devices", "12", "--tp", "4"],
     r"12 devices is not a whole number of nvlink groups of 8"),
    (["evaluate", "{bad_json}", "--cluster", "dgx-h100", "--devices", "8", "--tp", "8"],
     r"config\.json: not valid JSON"),
    (["graph", "{missing_key}"], r"missing key\(s\) num_attention_heads"),
    (["graph", "llama2-7b", "--set", "layerz=4"], r"unknown model field 'layerz'.*Did you mean layers"),
    (["evaluate", "llama2-7b", "--cluster", "dgx-h100", "--devices", "8", "--tp", "8", "--set", "hidden=big"],
     r"--set hidden=big: expected a int value"),
], ids=["unknown-model", "unknown-cluster", "tp-not-dividing-heads", "devices-product", "global-batch",
        "partial-node", "malformed-config-json", "config-json-missing-key", "set-unknown-key", "set-bad-type"])
def test_user_errors_are_one_line(capsys, tmp_path, argv, match):
    bad = tmp_path / "bad" / "config.json"
    bad.parent.mkdir()
    bad.write_text('{"num_hidden_layers": 2, "hidden_size": 64,,}')
    missing = tmp_path / "missing" / "config.json"
    missing.parent.mkdir()
    missing.write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
                                   "vocab_size": 256}))
    argv = [a.format(bad_json=bad, missing_key=missing) for a in argv]
    assert main(argv + ["--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert re.search(match, lines[0]), lines[0]


def test_console_script_graph_405b():
    """The installed entry point runs end to end on the largest dense preset (126 layers, seq 8192)."""
    script = Path(sys.executable).with_name("symtensor")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "symtensor.cli"]
    proc = subprocess.run(cmd + ["graph", "llama3-405b"], capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "llama3-405b" in proc.stdout and "405.85" in proc.stdout


def test_run_refuses_a_plan_for_another_world_size(tmp_path, capsys):
    """``run --plan`` checks the plan against --devices before any process starts."""
    from symtensor.hardware import load_cluster
    from symtensor.models import PRESETS
    from symtensor.plan import save_plan
    from symtensor.search import search

    plan = search(PRESETS["tiny-llama"], load_cluster("dgx-h100", devices=8), 16, 16, space="megatron")
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    code = main(["run", "tiny-llama", "--devices", "4", "--plan", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "is for 8 devices, not --devices 4" in err
