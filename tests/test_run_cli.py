"""`symtensor run`: a plan executed under torchrun (gloo, CPU) matches one process, and the bytes
each collective moved equal the cost model's prediction (per kind, per device, per step)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from symtensor.cli import main  # noqa: E402

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("args", [
    ["tiny-llama", "--devices", "4", "--tp", "1"],  # plain data parallelism
    ["tiny-mixtral", "--devices", "4", "--tp", "1"],
    ["tiny-llama", "--devices", "2", "--zero", "3", "--optimizer", "adamw"],
    ["tiny-llama", "--devices", "2", "--tp", "2"],
    ["tiny-llama", "--devices", "4", "--tp", "2", "--zero", "3"],
    ["tiny-mixtral", "--devices", "4", "--ep", "4"],
    ["tiny-llama", "--devices", "4", "--pp", "2"],
    ["tiny-llama", "--devices", "2", "--pp", "2"],
    ["tiny-llama", "--devices", "4", "--tp", "2", "--attention-only-tp"],
], ids=["llama-4", "mixtral-4", "llama-fsdp-2", "llama-tp-sp-2", "llama-fsdp-x-tp-4", "mixtral-ep-4",
        "llama-pp2-x-dp2-4", "llama-pp2-2", "llama-heterogeneous-4"])
def test_run_matches_one_process_and_predicted_bytes(args, capsys):
    code = main(["run", *args, "--steps", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["numerics_ok"] and out["bytes_ok"]
    assert sum(r["measured_bytes"] for r in out["bytes"]) > 0


def test_run_refuses_a_plan_for_another_world_size(tmp_path, capsys):
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
