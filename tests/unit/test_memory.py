"""Memory as the allocator sees it (``cost.memory``): each term's formula counted by hand on tiny models, the
published memory rows of data/calibration.csv (a copy of ../shared/data/calibration.csv) within 5% on the
component each row measures, the reserved peak never below the allocated one, and ``fits`` judging the reserved
peak.

Notation for the hand counts: tiny-llama (2 layers, hidden 64, vocab 256, untied), N its parameters, one
sequence of 64 tokens per device and micro-batch.
"""

import dataclasses
import math

import pytest
from hypothesis import given, settings, strategies as st

from symtensor import api, calibration
from symtensor.cost import memory
from symtensor.cost.engine import ENGINES
from symtensor.hardware import GIB, MEMORY_HEADROOM, load_cluster
from symtensor.search.megatron import megatron_plan

SEQ, VOCAB = 64, 256


def _plan(devices=8, **kw):
    kw = {"micro_batch": 1, "global_batch": 2 * devices, "seq": SEQ, **kw}
    return api.evaluate("tiny-llama", "dgx-h100", devices=devices, **kw)


def _params(plan) -> int:
    """N: every parameter tensor once."""
    return sum(t.numel for t in plan.graph.tensors.values() if t.param)


def _layer_params(plan) -> int:
    """The parameters of one transformer layer (an FSDP unit)."""
    names = {t for op in plan.graph.ops if op.layer == 0 for t in op.inputs if plan.graph.tensors[t].param}
    return sum(plan.graph.tensors[t].numel for t in names)


# -- each term by hand ---------------------------------------------------------------------------------------


def test_nccl_per_communicator():
    """544 MB for a pair, 688 MB for a larger group (NVIDIA/nccl#964); one rank needs none."""
    assert memory.nccl_bytes([2, 8, 1]) == 544e6 + 688e6
    assert memory.nccl_bytes([]) == 0.0


def test_communicators_megatron_tp_dp():
    """Megatron tp=2 dp=4 on 8 H100s: the tensor-parallel pair, the data-parallel group of 4 and the world."""
    plan = _plan(tp=2)
    assert plan.report.memory["nccl"] == 544e6 + 688e6 + 688e6
    pp = _plan(tp=2, pp=2)  # tp, dp and pp pairs and the world; tiny-llama ties no embedding
    assert pp.report.memory["nccl"] == 3 * 544e6 + 688e6


def test_communicators_data_parallel_is_the_world():
    """Data parallel over every device: one communicator (its group is the world's)."""
    assert _plan(framework="fsdp2", zero=3).report.memory["nccl"] == 688e6


def test_workspace_per_generation():
    """cuBLAS's workspace: 32 MiB on Hopper, 2 x 4096 KiB + 8 x 16 KiB on Ampere."""
    assert memory.workspace_bytes(load_cluster("dgx-h100", devices=8).device) == 32 * 2**20
    assert memory.workspace_bytes(load_cluster("dgx-a100-80g", devices=8).device) == 8 * 2**20 + 128 * 2**10


def test_engine_buffers_by_engine():
    """DeepSpeed ZeRO 1: two IPG buckets of min(5e8 elements x 2 B, the 2N B of gradients) = 4N (ZeRO 3: one,
    2N); PyTorch DDP
    (FSDP2's ZeRO 0): a copy of the fp32 gradients, 4N; FSDP2 ZeRO 3: one layer's gradients in fp32; Megatron:
    none (buckets are views of its gradient buffer)."""
    ds = _plan(framework="deepspeed", zero=1)
    n = _params(ds)
    assert ds.report.memory["engine_buffers"] == 4 * n
    assert _plan(framework="deepspeed", zero=3).report.memory["engine_buffers"] == 2 * n  # one bucket
    assert _plan(framework="fsdp2", zero=0).report.memory["engine_buffers"] == 4 * n
    fsdp = _plan(framework="fsdp2", zero=3)
    assert fsdp.report.memory["engine_buffers"] == 4 * _layer_params(fsdp)
    assert _plan(zero=1).report.memory["engine_buffers"] == 0.0


def test_deepspeed_bucket_is_capped_by_its_size():
    """Past 5e8 elements the IPG buckets stop growing: 2 x 5e8 x 2 B."""
    big = megatron_plan(api.load_model_config("llama2-7b").replace(layers=4), load_cluster("dgx-a100-80g", devices=8),
                        dp=8, zero=1, global_batch=8, micro_batch=1, seq=256, framework="deepspeed")
    grads = sum(t.numel for t in big.graph.tensors.values() if t.param and t.trainable) * 2
    assert grads > 1e9 and big.report.memory["engine_buffers"] == 2 * 1e9


def test_loss_transient_is_the_local_logits():
    """seq x micro_batch x vocab / tp x the engine's bytes: Megatron 2 (the bf16 cast of the in-place fp32
    gradient), torchtitan's cross entropy on fp32 logits 8 (nll_loss's fp32 gradient and log_softmax's, beside
    the saved fp32 log-probabilities)."""
    assert _plan(tp=2).report.memory["loss_transient"] == SEQ * 1 * VOCAB / 2 * 2
    assert _plan(framework="fsdp2", zero=3).report.memory["loss_transient"] == SEQ * 1 * VOCAB * 8


def test_optimizer_step_transient():
    """DeepSpeed ZeRO 1's fp32 gradient partition at the step: 4 B x N / dp; the others allocate none."""
    ds = _plan(framework="deepspeed", zero=1)
    assert ds.report.memory["optimizer_transient"] == pytest.approx(4 * _params(ds) / 8)
    assert _plan(zero=1).report.memory["optimizer_transient"] == 0.0


def test_backward_transient_is_two_of_the_largest_saved_tensor():
    """Without recomputation: an op's output gradient and input gradient, each as large as the largest
    saved tensor of a layer; under full recomputation the recomputed layer's activations as well."""
    mem = _plan(tp=2).report.memory
    full = _plan(tp=2, recompute="full").report.memory
    assert mem["backward_transient"] > 0 and mem["recompute_transient"] == 0
    assert full["backward_transient"] == pytest.approx(full["recompute_transient"] + mem["backward_transient"])


def test_fragmentation_and_the_reserved_sum():
    """Fragmentation: 0.15 / 0.85 of what is allocated and freed every micro-batch (GMLake's mean), none under
    expandable segments (FSDP2 as torchtitan runs it); the device's peak is the allocated peak + fragmentation
    + context + NCCL, and the terms ``peak_terms`` lists add up to it."""
    rep = _plan(tp=2).report
    mem = rep.memory
    persistent = mem["static"] + mem["engine_buffers"] + mem["workspace"]
    churn = mem["activations"] + max(mem["loss_transient"], mem["backward_transient"])
    assert mem["allocated"] == pytest.approx(persistent + churn)
    assert mem["fragmentation"] == pytest.approx(0.15 / 0.85 * churn)
    assert mem["cuda_context"] == 400e6
    assert rep.memory_reserved == pytest.approx(mem["allocated"] + mem["fragmentation"] + 400e6 + mem["nccl"])
    assert sum(memory.peak_terms(mem).values()) == pytest.approx(rep.memory_reserved)
    # FSDP2 under expandable segments: no rounding modelled, only what its side streams keep reserved beyond the
    # compute stream's peak: the all-gather copy-in stream's two units (two micro-batches here: the gradients,
    # on the reduce-scatter stream, are live at the peak), at most the two largest
    fsdp = _plan(framework="fsdp2", zero=3).report.memory
    assert 0.0 < fsdp["fragmentation"] <= fsdp["gathered_params"]
    assert ENGINES["fsdp2"].expandable_segments and not ENGINES["megatron"].expandable_segments


def test_every_term_has_a_formula_and_a_source():
    rep = _plan(tp=2).report
    for term in memory.peak_terms(rep.memory):
        assert term in memory.TERMS or term == "transient"
    assert all(formula and source for formula, source in memory.TERMS.values())


# -- the published memory rows -------------------------------------------------------------------------------

MEMORY_ROWS = [r for r in calibration.load_rows(("A100",)) if "memory" in r.metric]
# the component of the prediction each row measures (calibration._korthikanti, calibration._zero)
COMPONENT = {"weights+grads+optimizer memory per GPU (GiB)": "the transformer layers' state (layer_state)",
             "activation memory per GPU (GiB)": "the layers' activations in flight (activations_layers)",
             "activation memory, % of no-recompute tensor-parallel baseline": "activations_layers over the "
             "baseline's", "model-state memory per GPU (GB)": "params + grads + optimizer"}


def test_the_published_memory_rows_are_all_there():
    """12 Korthikanti et al. 2022 component rows, 8 of their percentages, 4 ZeRO model-state rows."""
    assert len(MEMORY_ROWS) == 24
    for r in MEMORY_ROWS:
        key = "model-state memory per GPU (GB)" if r.metric.startswith("model-state") else r.metric
        assert key in COMPONENT


@pytest.mark.parametrize("index", range(len(MEMORY_ROWS)))
def test_published_memory_row_within_5_percent(index):
    """Every memory row of data/calibration.csv within 5% of the component it measures (relative, also for
    the percentages)."""
    result = calibration.predict([MEMORY_ROWS[index]])[0]
    assert math.isfinite(result.predicted)
    assert abs(result.predicted / result.row.measured - 1) <= 0.05, (result.row.metric, result.predicted)


# -- invariants ----------------------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None, database=None)
@given(framework=st.sampled_from(["megatron", "fsdp2", "deepspeed"]), zero=st.integers(0, 3),
       tp=st.sampled_from([1, 2]), pp=st.sampled_from([1, 2]), recompute=st.sampled_from(["none", "full"]))
def test_reserved_is_never_below_allocated(framework, zero, tp, pp, recompute):
    pp = 1 if framework == "deepspeed" else pp  # (the deepspeed engine runs no pipeline: cost.engine._PIPE)
    rep = _plan(framework=framework, zero=zero if 8 // (tp * pp) > 1 else 0, tp=tp, pp=pp, recompute=recompute).report
    mem = rep.memory
    assert rep.memory_reserved >= mem["allocator_reserved"] >= rep.memory_peak >= mem["static"] > 0
    assert rep.memory_reserved >= mem["fixed"] + mem["scaled"] - 1e-6 * rep.memory_reserved
    assert rep.fits == (rep.memory_reserved <= MEMORY_HEADROOM * rep.capacity)


def test_fits_follows_the_reserved_peak():
    """A device whose usable memory holds the allocated peak but not the reserved one: does not fit."""
    plan = _plan(tp=2)
    rep = plan.report
    between = (rep.memory_peak + rep.memory_reserved) / 2 / MEMORY_HEADROOM
    cl = load_cluster("dgx-h100", devices=8)
    small = dataclasses.replace(cl, device=dataclasses.replace(cl.device, memory=between))
    again = megatron_plan(plan.model, small, **plan.parallelism.as_dict()).report
    assert again.memory_peak <= MEMORY_HEADROOM * again.capacity < again.memory_reserved
    assert not again.fits
    roomy = dataclasses.replace(cl, device=dataclasses.replace(cl.device, memory=rep.memory_reserved / MEMORY_HEADROOM))
    assert megatron_plan(plan.model, roomy, **plan.parallelism.as_dict()).report.fits


def test_json_states_both_peaks_and_the_terms():
    """``evaluate --json`` and ``plan --json``: memory_gib_per_device is the allocated peak (the contract),
    memory_reserved_gib_per_device the device's, memory_terms_gib its terms."""
    from symtensor.plan.document import evaluation_json

    out = evaluation_json(_plan(tp=2))
    assert out["memory_gib_per_device"] * GIB == pytest.approx(_plan(tp=2).report.memory_peak)
    assert sum(out["memory_terms_gib"].values()) == pytest.approx(out["memory_reserved_gib_per_device"])
    assert out["memory_reserved_gib_per_device"] > out["memory_gib_per_device"]
