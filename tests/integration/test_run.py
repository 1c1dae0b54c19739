"""`symtensor run`: every declared run (``runs.RUNS``) executed under torchrun (gloo, CPU) matches
one process, and the bytes each collective moved equal the cost model's prediction (per kind, per
device, per step). The runs share their launches (``conftest.Launches``); each command is judged
on its own."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from runs import RUNS  # noqa: E402

from symtensor.cli import main  # noqa: E402

pytestmark = pytest.mark.dist


def argv(run) -> list[str]:
    return ["run", run.model, "--devices", str(run.ranks), *run.plan, "--steps", "2", "--json"]


@pytest.mark.parametrize("run", [pytest.param(r, id=r.name, marks=pytest.mark.launch_cli(argv(r))) for r in RUNS])
def test_run_matches_one_process_and_predicted_bytes(run, capsys, launches):
    with launches.serving():
        code = main(argv(run))
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["numerics_ok"] and out["bytes_ok"]
    assert sum(r["measured_bytes"] for r in out["bytes"]) > 0
