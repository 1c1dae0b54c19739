"""Megatron's MoE parallel folding under ``symtensor run`` (issue 13): a Qwen3-style MoE (Q/K
norms, every layer MoE) on 4 gloo ranks with EP = 4 folded over TP = 2 x DP = 2 (expert TP 1),
judged against one process and against the bytes the cost model predicts for the same layouts
(its launch shared with the other runs of 4 processes: ``conftest.Launches``)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from symtensor.cli import main  # noqa: E402
from symtensor.models import load_model_config  # noqa: E402

pytestmark = pytest.mark.dist


ARGV = ["run", "tiny-qwen3-moe", "--devices", "4", "--tp", "2", "--ep", "4", "--steps", "2", "--json"]


@pytest.mark.launch_cli(ARGV)
def test_ep4_folded_over_tp2_x_dp2(capsys, launches):
    """Each rank routes its own sequence shard (sequence parallel) to the experts of all four
    ranks: one all-to-all of E x T x h slots per dispatch and per combine, forward and backward,
    exactly as predicted, and every other collective kind too (the vocabulary-parallel embedding's
    gradient is synchronised as its parameter is placed: vocab / tp rows, not the whole table)."""
    with launches.serving():
        code = main(ARGV)
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    c = out["config"]
    assert (c["tp"], c["dp"], c["ep"], c["etp"], c["sp"]) == (2, 2, 4, 1, True)
    assert out["spec"]["ep_axes"] == ["loopback0", "loopback1"]  # the plan's axes: dp's, then tp's
    assert out["numerics_ok"], (out["loss_max_abs_diff"], out["param_max_abs_diff"])
    rows = {r["kind"]: r for r in out["bytes"]}
    cfg = load_model_config("tiny-qwen3-moe")
    tokens = 8 // 2 * 16 // 2  # global batch 8 over dp 2, sequence 16 over tp 2 (sequence parallel)
    assert rows["all_to_all"]["measured_bytes"] == rows["all_to_all"]["predicted_bytes"] \
        == 4 * cfg.layers * cfg.experts * tokens * cfg.hidden * 4
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "send_recv"):
        assert rows[kind]["ok"], rows[kind]
    assert out["bytes_ok"]
