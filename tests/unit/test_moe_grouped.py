"""Grouped expert GEMMs per direction (``cost.kernels.grouped_direction_efficiency``): forward, input gradient
and weight gradient each at the curve of their own measured rows (SimuMax's A100 PCIe and B200 group_matmul),
never above the envelope nor the device's ceiling; the weight gradient (a reduction over the tokens) is the
slowest at few tokens per expert, and the evaluator charges each direction its own."""

from __future__ import annotations

import pytest

from symtensor.cost import Evaluator, kernels as K
from symtensor.cost.opcost import gemm_shape, grouped_tile_factor, local_sizes, op_rates
from symtensor.errors import PlanError
from symtensor.hardware import load_cluster
from symtensor.models import PRESETS, build_graph
from symtensor.search.megatron import megatron_layouts

TOKENS = (16, 128, 154, 256, 512, 616, 1000, 1232, 2460, 4096, 1e5)


@pytest.mark.parametrize("device", sorted(K.DEVICES))
def test_every_direction_stays_under_the_envelope_and_the_ceiling(device):
    dev = K.device_kernels(device)
    for dtype in dev.grouped:
        ceiling = K.grouped_ceiling(device, dtype)
        for c in TOKENS:
            env = K.grouped_gemm_efficiency(device, c, dtype)
            for d in K.GROUPED_DIRECTIONS:
                e = K.grouped_direction_efficiency(device, c, dtype, d)
                assert 0 < e <= env <= ceiling <= 1, (device, dtype, c, d)
                assert K.grouped_direction(device, c, dtype, d) == e


def test_the_weight_gradient_is_the_slowest_at_few_tokens_per_expert():
    """A100 PCIe's rows at 616 tokens per expert: 0.52 against 0.63 (forward) and 0.68 (input gradient), at the
    A100 SXM's scale; B200 at 512: 0.29 against 0.37-0.43; H100 takes A100 PCIe's directions at its scale."""
    a100 = {d: K.grouped_direction_efficiency("A100", 616, "bf16", d) / K.A100_SXM_SCALE
            for d in K.GROUPED_DIRECTIONS}
    assert a100["fwd"] == pytest.approx(0.6313) and a100["bwd_grad_act"] == pytest.approx(0.6791)
    assert a100["bwd_grad_w"] == pytest.approx(0.5198)
    b200 = {d: K.grouped_direction_efficiency("B200", 512, "bf16", d) for d in K.GROUPED_DIRECTIONS}
    assert b200["bwd_grad_w"] < 0.8 * min(b200["fwd"], b200["bwd_grad_act"])
    h100 = {d: K.grouped_direction_efficiency("H100", 512, "bf16", d) for d in K.GROUPED_DIRECTIONS}
    assert h100["bwd_grad_w"] / h100["fwd"] == pytest.approx(a100["bwd_grad_w"] / a100["fwd"])
    # a table without directions (DeepGEMM's FP8 forward rows) charges its envelope
    assert K.grouped_direction_efficiency("H100", 512, "fp8", "bwd_grad_w") == K.grouped_gemm_efficiency(
        "H100", 512, "fp8")
    with pytest.raises(PlanError, match="grouped GEMM direction 'dgrad'"):
        K.grouped_direction_efficiency("H100", 512, "bf16", "dgrad")


def test_the_evaluator_charges_each_direction_its_own():
    cfg = PRESETS["mixtral-8x7b"]
    cluster = load_cluster("dgx-h100", devices=16)
    graph = build_graph(cfg, micro_batch=8, seq=4096, skeleton=True)
    ev = Evaluator(graph, cluster)
    layouts = megatron_layouts(graph, ev.mesh, dict(tp=2, pp=1, dp=8, cp=1, ep=2, etp=1, sp=True))
    seen = 0
    for op in graph.ops:
        lay = layouts.get(op.name)
        sizes = local_sizes(op, lay, ev.mesh) if lay is not None else None
        if sizes is None or op.kind != "linear" or gemm_shape(op, sizes)[3] <= 1:
            continue
        m = gemm_shape(op, sizes)[0]
        tile, grads = grouped_tile_factor(op, sizes), ev.grad_operands[op.name]
        fwd, bwd = op_rates(op, sizes, ev.eff, grads, ev.dtype, 1.0, False)
        f, a, w = (K.grouped_direction(ev.eff.kernels, m, "bf16", d) * tile for d in K.GROUPED_DIRECTIONS)
        assert fwd == pytest.approx(f) and bwd == pytest.approx(2 / (1 / a + 1 / w) if grads >= 2 else min(a, w))
        assert bwd < K.grouped_efficiency(ev.eff.kernels, m, "bf16") * tile  # the envelope charged before
        seen += 1
    assert seen
