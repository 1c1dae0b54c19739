"""`symtensor run`: every declared run (``runs.RUNS``) executed under torchrun (gloo, CPU) matches
one process, and the bytes each collective moved equal the cost model's prediction (per kind, per
device, per step)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from runs import RUNS  # noqa: E402

from symtensor.cli import main  # noqa: E402

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_run_matches_one_process_and_predicted_bytes(run, capsys):
    code = main(["run", run.model, "--devices", str(run.ranks), *run.plan, "--steps", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["numerics_ok"] and out["bytes_ok"]
    assert sum(r["measured_bytes"] for r in out["bytes"]) > 0
