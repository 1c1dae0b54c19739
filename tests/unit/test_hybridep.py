"""NVIDIA's HybridEP token dispatcher as a stack fact (``cost.moe``, ``moe_dispatcher="hybridep"``): its time at
the measured point equals the README's algorithm bytes over its algorithm bandwidth (deepseek-ai/DeepEP@94a9f8f6,
branch hybrid-ep, docs/README_Hybrid-EP.md: 4,096 tokens per rank, hidden 7,168, top-8, 8 local experts), which
row applies where, that it beats NCCL's all-to-all across nodes for a DeepSeek-V3-like EP group, the engines that
refuse it, and its Megatron and torchtitan exports and the CLI."""

from __future__ import annotations

import json

import pytest

from symtensor.api import evaluate
from symtensor.cli import main
from symtensor.cost import moe
from symtensor.cost.collectives import collective_time
from symtensor.cost.train import TrainConfig
from symtensor.errors import PlanError
from symtensor.export import export, megatron_args
from symtensor.hardware import load_cluster
from symtensor.models import load_model_config
from symtensor.plan import Stack
from symtensor.plan.io import load_plan
from symtensor.search import megatron_plan

TOKENS, HIDDEN, TOP_K, LOCAL = 4096, 7168, 8, 8  # the README's test setup (per rank)
TOKEN_BYTES = TOKENS * HIDDEN * 2  # one BF16 copy of a rank's tokens
GB = 1e9


def _harmonic(a: float, b: float) -> float:
    return 2 / (1 / a + 1 / b)


def test_internode_time_is_the_measured_rdma_time():
    """H100, 16 ranks in 2 nodes of 8 (128 experts): the README counts per rank its tokens times the nodes they
    go to, its own included (``rdma_send_bytes``), at 57.74 GB/s (dispatch, BF16) and 56.96 GB/s (combine) with
    8 SMs; the module's time is those bytes over the harmonic mean of the two rates, plus one latency per level
    (the NVLink forwarding, at the GB200 8-rank row of the H100's 450 GB/s, is the shorter of the two)."""
    cl = load_cluster("dgx-h100", devices=16)
    counts = [8, 2] + [1] * (len(cl.levels) - 2)
    experts = 16 * LOCAL
    t = moe.hybridep_time(TOKEN_BYTES * TOP_K, counts, cl.levels, experts, TOP_K)
    rdma_bytes = TOKEN_BYTES * moe.distinct(experts, TOP_K, 2)  # its own node included, as the README counts
    measured = rdma_bytes / (_harmonic(57.74, 56.96) * GB)
    assert t == pytest.approx(measured + cl.levels[0].latency + cl.levels[1].latency, rel=1e-12)
    nvl_bytes = TOKEN_BYTES * moe.distinct(experts, TOP_K, 16) * 7 / 8
    assert nvl_bytes / (cl.levels[0].bandwidth * moe.hybridep_fraction(moe.HYBRIDEP_NVL_ROWS, 8, 900)) < measured


def test_nvlink_domain_time_is_the_measured_nvl_time():
    """GB200 NVL72, 36 ranks in one NVLink domain (288 experts): the README counts the tokens a rank receives,
    its own included (``nvl_recv_bytes``), at 469.96 GB/s (dispatch) and 418.27 GB/s (combine), 16 SMs."""
    cl = load_cluster("gb200-nvl72", devices=36)
    counts = [36] + [1] * (len(cl.levels) - 1)
    experts = 36 * LOCAL
    t = moe.hybridep_time(TOKEN_BYTES * TOP_K, counts, cl.levels, experts, TOP_K)
    received = TOKEN_BYTES * moe.distinct(experts, TOP_K, 36)
    assert t == pytest.approx(received / (_harmonic(469.96, 418.27) * GB) + cl.levels[0].latency, rel=1e-12)


@pytest.mark.parametrize("rows, n, link, row", [
    (moe.HYBRIDEP_NVL_ROWS, 8, 900, (8, 550.10, 538.44)),
    (moe.HYBRIDEP_NVL_ROWS, 12, 900, (16, 472.84, 474.48)),  # the fewest measured ranks >= 12
    (moe.HYBRIDEP_NVL_ROWS, 64, 900, (36, 469.96, 418.27)),  # beyond the largest measured: borrowed
    (moe.HYBRIDEP_IB_ROWS, 3, 50, (4, 46.54, 50.68)),
    (moe.HYBRIDEP_IB_ROWS, 16, 50, (8, 41.46, 47.68)),
])
def test_which_row_applies(rows, n, link, row):
    m, dispatch, combine = row
    assert moe.hybridep_fraction(rows, n, link) == pytest.approx(_harmonic(dispatch, combine) * (m - 1) / m / link)


def test_beats_nccl_alltoall_across_nodes_for_deepseek_v3():
    """DeepSeek-V3's experts (256, top-8) over EP 64 = 8 H100 nodes: NCCL's all-to-all moves the 8 copies of
    each token, HybridEP each token once per node holding one of its experts (about 5.3 of 8 nodes) over
    InfiniBand at 0.78 of the NIC: less time than the all-to-all even at the full link rate; and so in a
    Qwen3-235B step over EP 32 across 4 nodes."""
    cl = load_cluster("dgx-h100", devices=64)
    counts = [8, 8] + [1] * (len(cl.levels) - 2)
    nbytes = TOKEN_BYTES * TOP_K
    hybrid = moe.hybridep_time(nbytes, counts, cl.levels, 256, TOP_K)
    assert hybrid < 0.9 * collective_time("all_to_all", nbytes, counts, cl.levels)
    run = dict(tp=2, ep=32, pp=8, vpp=4, pp_layout="even", seq=4096, global_batch=2048, micro_batch=1,
               recompute="selective", zero=1)
    a2a = evaluate("qwen3-235b-a22b", "dgx-h100", 256, **run).report
    hyb = evaluate("qwen3-235b-a22b", "dgx-h100", 256, stack=Stack(moe_dispatcher="hybridep"), **run).report
    assert hyb.breakdown["ep_comm"] < a2a.breakdown["ep_comm"] and hyb.step_time_s < a2a.step_time_s


def test_refusals():
    """An unknown dispatcher names the three; DeepSpeed's engines have no DeepEP or HybridEP (one line each,
    from the stack, the cost model's TrainConfig and the configuration rule); torchtitan (fsdp2) runs it."""
    with pytest.raises(PlanError, match="moe_dispatcher='hybrid'; use one of alltoall, deepep, hybridep"):
        Stack(moe_dispatcher="hybrid")
    message = "moe_dispatcher='hybridep': framework deepspeed dispatches with alltoall only"
    with pytest.raises(PlanError, match=message):
        TrainConfig(global_batch=8, framework="deepspeed", stack=Stack(moe_dispatcher="hybridep"))
    with pytest.raises(PlanError, match=message):
        evaluate("tiny-qwen3-moe", "dgx-h100", 8, ep=4, global_batch=8, seq=64, framework="deepspeed",
                 stack=Stack(moe_dispatcher="hybridep"))
    fsdp2 = TrainConfig(global_batch=8, framework="fsdp2", stack=Stack(moe_dispatcher="hybridep"))
    assert fsdp2.stack.moe_dispatcher == "hybridep"


def test_exports():
    """Megatron: the flex dispatcher with the hybridep backend (not --moe-enable-deepep); torchtitan: the job
    config plus a note that the dispatcher is the model config's comm_backend."""
    cfg, cl = load_model_config("tiny-qwen3-moe"), load_cluster("dgx-h100", devices=8)
    plan = megatron_plan(cfg, cl, global_batch=8, seq=64, dp=8, ep=4, moe_dispatcher="hybridep")
    args = megatron_args(plan)
    assert "--moe-token-dispatcher-type flex" in args and "--moe-flex-dispatcher-backend hybridep" in args
    assert "--moe-enable-deepep" not in args and "--moe-token-dispatcher-type alltoall" not in args
    fsdp = megatron_plan(cfg, cl, global_batch=8, seq=64, dp=8, ep=4, zero=3, framework="fsdp2",
                         moe_dispatcher="hybridep")
    assert 'comm_backend="hybridep"' in export(fsdp, "torchtitan")["_dispatcher_note"]


def test_cli_round_trip(capsys, tmp_path):
    """--moe-dispatcher hybridep: evaluate reports it, plan --out keeps it, export writes Megatron's flags."""
    argv = ["evaluate", "tiny-qwen3-moe", "--cluster", "dgx-h100", "--devices", "16", "--tp", "1", "--pp", "1",
            "--dp", "16", "--ep", "8", "--seq", "256", "--global-batch", "64", "--moe-dispatcher", "hybridep"]
    assert main(argv + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"]["moe_dispatcher"] == "hybridep"
    path = tmp_path / "plan.json"
    assert main(["plan", "tiny-qwen3-moe", "--cluster", "dgx-h100", "--devices", "16", "--seq", "256",
                 "--global-batch", "64", "--space", "megatron", "--no-baselines", "--moe-dispatcher", "hybridep",
                 "--out", str(path)]) == 0
    capsys.readouterr()
    assert load_plan(path).train.stack.moe_dispatcher == "hybridep"
    assert main(["export", str(path), "--to", "megatron"]) == 0
    assert "--moe-flex-dispatcher-backend hybridep" in capsys.readouterr().out
