"""No op is costed faster than its device's measured kernel tables allow (issue 22, "must show"), the
step floor stays a lower bound, and a cluster file's measured fractions still win over the tables.

For every GEMM, batched matmul, grouped expert GEMM, fused attention and memory-bound op the evaluator
charges (several models, data-parallel and tensor-parallel layouts, every engine, on A100, H100, H200,
B200 and Ascend 910B), the charged forward and backward seconds of the op's local piece are at least what
its table allows: FLOPs over (peak x the table's bound: ``kernels.gemm_efficiency``, the envelope of the
measured GEMMs at that size; ``grouped_gemm_efficiency``; ``attention_efficiency`` of the engine's kernel at
the op's keys, head dim and causality) and bytes over (HBM bandwidth x the best measured STREAM fraction).
Sources of the tables: cost/kernels.py (SimuMax's measured Transformer Engine kernels, the FlashAttention-2
and -3 papers, DeepGEMM, gpu-benches, ml-engineering's MAMF table).
"""

import functools

import pytest

from symtensor.cost import Evaluator, efficiency_for, kernels as K
from symtensor.cost.opcost import gemm_shape, local_sizes, op_floor, op_time, table_attention_kernel
from symtensor.graph import DTYPE_BYTES, kind_of
from symtensor.hardware import load_cluster
from symtensor.models import PRESETS, build_graph
from symtensor.search.megatron import megatron_layouts

CASES = [("llama2-7b", "dgx-a100-80g", {"tp": 1}), ("llama3-8b", "dgx-h100", {"tp": 8}),
         ("llama2-70b", "dgx-h100", {"tp": 4}), ("mixtral-8x7b", "dgx-a100-80g", {"tp": 2, "ep": 4}),
         ("gpt3-1.3b", "dgx-b200", {"tp": 1}), ("qwen2-7b", "dgx-h200", {"tp": 2}),
         ("llama2-7b", "ascend-910b", {"tp": 8})]
FRAMEWORKS = ("megatron", "fsdp2")


@functools.cache
def _charged(model, cluster_name, cuts, framework):
    cfg = PRESETS[model]
    cluster = load_cluster(cluster_name, devices=64)
    par = dict(cuts)
    tp, ep = par.get("tp", 1), par.get("ep", 1)
    dp = 64 // tp
    graph = build_graph(cfg, micro_batch=2 * dp, seq=min(4096, cfg.max_context), skeleton=True)
    ev = Evaluator(graph, cluster, framework=framework)
    layouts = megatron_layouts(graph, ev.mesh, dict(tp=tp, pp=1, dp=dp, cp=1, ep=ep, etp=1, sp=tp > 1))
    out = []
    for op in graph.ops:
        lay = layouts.get(op.name)
        if lay is None:
            continue
        t = ev.op_time(op, lay)
        out.append((op, local_sizes(op, lay, ev.mesh), t, ev.grad_operands[op.name]))
    return ev, out


def _bound_rates(ev, op, sizes, grad_operands):
    """(forward, backward) fraction of peak the tables allow this piece at most."""
    dev, dtype = ev.eff.kernels, K.table_dtype(ev.eff.kernels, ev.dtype)
    if op.kind == "attention":
        kernel, share = table_attention_kernel(ev.eff, op.attr("kernel"))
        keys = min(sizes["t"], op.attr("window") or sizes["t"])
        causal = bool(op.attr("causal", True))
        return tuple(share * K.attention_efficiency(dev, kernel, keys, sizes["d"], causal, bwd)
                     for bwd in (False, True))
    m, n, k, groups = gemm_shape(op, sizes)
    if groups > 1 and op.kind == "linear":
        e = K.grouped_gemm_efficiency(dev, m, dtype if dtype in K.device_kernels(dev).grouped else "bf16")
    else:
        e = K.gemm_efficiency(dev, m, n, k, dtype)
    return e, e


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("model,cluster,cuts", CASES, ids=[f"{m}-{c}-{p}" for m, c, p in CASES])
def test_no_op_is_costed_faster_than_its_table(model, cluster, cuts, framework):
    ev, charged = _charged(model, cluster, tuple(sorted(cuts.items())), framework)
    assert ev.eff.tables == ("gemm", "attention", "hbm") and ev.eff.kernels
    device = ev.cluster.device
    peak = device.flops(ev.dtype)
    best_hbm = max(K.hbm_fraction(ev.eff.kernels, p) for p in K.HBM_PATTERNS)
    seen = set()
    for op, sizes, t, grads in charged:
        kind = kind_of(op.kind)
        flops = kind.fwd_flops(sizes, dict(op.attrs))
        nbytes = sum(DTYPE_BYTES[ev.tensors[x].dtype] * _prod(sizes, dims)
                     for x, dims in zip(op.inputs + op.outputs, op.in_dims + op.out_dims))
        # memory: no op moves its bytes faster than the best measured streaming kernel
        assert t.fwd_s >= nbytes / (device.hbm_bandwidth * best_hbm) * (1 - 1e-9), op.name
        if kind.memory_bound or op.kind == "reshape":
            seen.add("memory")
            continue
        fwd_e, bwd_e = _bound_rates(ev, op, sizes, grads)
        bwd_flops = flops * (kind.bwd_fixed if kind.bwd_ratio is None else kind.bwd_ratio * grads)
        assert t.fwd_s >= flops / (peak * fwd_e) * (1 - 1e-9), (op.name, t.fwd_s, flops / (peak * fwd_e))
        if bwd_flops:
            assert t.bwd_s >= bwd_flops / (peak * bwd_e) * (1 - 1e-9), (op.name, t.bwd_s)
        seen.add(op.kind)
    assert {"linear", "attention", "memory"} <= seen


def _prod(sizes, dims):
    n = 1.0
    for d in dims:
        n *= sizes[d]
    return n


@pytest.mark.parametrize("model,cluster,cuts", CASES[:4], ids=[f"{m}-{c}" for m, c, _ in CASES[:4]])
def test_op_floor_bounds_every_piece(model, cluster, cuts):
    """``op_floor`` (the search's pruning bound) is at most the charged time of any layout's pieces
    summed over the devices that share the op."""
    ev, charged = _charged(model, cluster, tuple(sorted(cuts.items())), "megatron")
    n = ev.cluster.n_devices
    for op, sizes, t, grads in charged:
        fwd, bwd = op_floor(op, ev.cluster.device, ev.eff, ev.tensors, grads, ev.dtype)
        whole = op.dim_sizes
        share = _prod(sizes, sizes) / _prod(whole, whole)  # this piece's share of the op's iteration space
        pieces = min(n, round(1 / share))  # devices holding distinct pieces (the others replicate)
        assert fwd <= t.fwd_s * pieces * (1 + 1e-9), op.name
        assert bwd <= t.bwd_s * pieces * (1 + 1e-9) or not t.bwd_s, op.name


def test_each_device_gemm_ceiling_is_its_own_measurement():
    """A device's GEMM ceiling is its own cited measurement, and no GEMM lookup exceeds it: A100 SXM its MAMF
    burst (267.9 of 312 TFLOP/s; no sustained figure is published for it), H100 and H200 the sustained MSMF
    of the GH100 die (H200, 698.6 of 989, below H100's 792.1 burst MAMF: a training step is a sustained load).
    A transferred shape table maps the measured device's ceiling to the target's (``kernels.A100_SXM_SCALE``;
    ``kernels.H100_SCALE`` for H100's grouped GEMMs), H100's own burst rows take the sustained/burst ratio."""
    assert K.A100.ceiling["bf16"][0] == K.MAMF_A100_SXM
    assert K.H100.ceiling["bf16"][0] == K.H200.ceiling["bf16"][0] == K.MSMF_H200 < K.MAMF_H100_SXM
    assert abs(K.H100_SCALE * K.MAMF_A100_PCIE - K.MSMF_H200) < 1e-12
    assert abs(K.A100_SXM_SCALE * K.MAMF_A100_PCIE - K.MAMF_A100_SXM) < 1e-12
    assert K.H100.gemm["bf16"] == K.H200.gemm["bf16"] == (K.H100_BF16, K.GH100_SUSTAINED)
    shapes = ([row[:3] for row in K.A100_PCIE_BF16.rows] + [row[:3] for row in K.H100_BF16.rows]
              + [(65536, 65536, 65536), (8192, 53248, 16384), (131072, 4096, 4096)])
    for dev in (K.A100, K.H100, K.H200):
        cap = dev.ceiling["bf16"][0]
        assert max(K.gemm_envelope(dev.name)[1]) <= cap
        for m, n, k in shapes:
            assert K.gemm_efficiency(dev.name, m, n, k) <= cap
            for layout in K.GEMM_LAYOUTS:
                assert K.gemm_shape_efficiency(dev.name, m, n, k, "bf16", layout) <= cap + 1e-12


# XLA's measured BF16 dots on H100 SXM (sm_90), read off the source, not off cost/kernels_data.py: (b, m, n, k,
# TFLOP/s rounded to 0.01). tensorflow/tensorflow @372d578b, third_party/xla/xla/service/gpu/model/
# matmul_interpolator_data.h (kDefaultMatmulPTable, Apache-2.0, written by XLA's matmul_perf_table_gen on the
# device): short timed runs, i.e. at the boost clock; times the MSMF/MAMF ratio of the same die (H200: 698.6 /
# 823.9) they are the sustained rates of those shapes. The batched rows are read at M = b m.
XLA_H100 = ((1, 4096, 4096, 4096, 783.33), (1, 2048, 2048, 2048, 631.98), (1, 4096, 4096, 2048, 738.74),
            (1, 4096, 2048, 4096, 758.43), (1, 2048, 4096, 4096, 753.64), (1, 4096, 2048, 2048, 716.07),
            (1, 2048, 4096, 2048, 715.35), (1, 2048, 2048, 4096, 737.97), (1, 4096, 1024, 1024, 488.06),
            (1, 256, 256, 256, 6.45), (1, 1024, 4096, 256, 209.72), (4, 4096, 2048, 4096, 808.70),
            (2, 4096, 4096, 4096, 807.67), (4, 4096, 4096, 4096, 793.13), (2, 256, 4096, 4096, 587.71),
            (2, 2048, 2048, 2048, 717.74), (2, 1024, 2048, 4096, 739.00), (4, 1024, 1024, 1024, 489.85),
            (1, 512, 4096, 4096, 644.12))
GH100_SUSTAINED = K.GH100_SUSTAINED


@pytest.mark.parametrize("b,m,n,k,tflops", XLA_H100)
def test_h100_gemms_are_the_measured_h100_rows(b, m, n, k, tflops):
    """H100's BF16 table is XLA's sm_90 rows at the sustained clock: a measured shape is returned as measured
    (the best row folded to its M = b m), and no lookup at it is above the measurement (forward, input- and
    weight-gradient layouts: the table records none) nor above the device's ceiling."""
    best = max(t for bb, mm, nn, kk, t in XLA_H100 if (bb * mm, nn, kk) == (b * m, n, k))
    measured = best / 989 * GH100_SUSTAINED
    assert K.gemm_measured("H100", b * m, n, k) == pytest.approx(measured, abs=0.006 / 989)
    assert tflops / 989 * GH100_SUSTAINED <= K.gemm_measured("H100", b * m, n, k) + 0.006 / 989
    for layout in K.GEMM_LAYOUTS:
        e = K.gemm_shape_efficiency("H100-SXM5-80GB", b * m, n, k, "bf16", layout)
        assert e <= measured + 0.006 / 989 and e <= K.MSMF_H200
    # the envelope at the row's FLOPs allows at least the row (it is their upper envelope), capped at the ceiling
    assert K.gemm_efficiency("H100", b * m, n, k) >= measured - 0.006 / 989
    assert K.gemm_efficiency("H100", b * m, n, k) <= K.MSMF_H200


def test_h100_table_is_every_copied_row():
    """Every one of XLA's 375 sm_90 BF16 rows (kernels_data) is in H100's table at M = b m, none faster than the
    best of its folded shape; the envelope's points are measured rows; above the largest FLOPs the envelope
    stays at its top row (0.693), under the MSMF ceiling (0.706)."""
    from symtensor.cost.kernels_data import XLA_H100_GEMM

    assert len(XLA_H100_GEMM) == 375 == len({r[:4] for r in XLA_H100_GEMM})
    table = {(m, n, k): eff for m, n, k, _, eff in K.H100_BF16.rows}
    for b, m, n, k, flops_per_s in XLA_H100_GEMM:
        assert flops_per_s / 989e12 <= table[(b * m, n, k)]
    xs, ys = K._gemm_envelope(K.H100_BF16)
    assert set(zip(xs, ys)) <= {(2 * m * n * k, eff) for (m, n, k), eff in table.items()}
    top = max(ys) * GH100_SUSTAINED
    assert top == pytest.approx(808.70 / 989 * GH100_SUSTAINED, abs=1e-5) and top < K.MSMF_H200
    assert K.gemm_efficiency("H100", 65536, 65536, 65536) == pytest.approx(top)


def test_a_small_h100_gemm_is_charged_its_measured_row_not_the_a100_transfer():
    """GPT-3 350M's attention projections at 2 x 2,048 tokens are 4,096 x 1,024 x 1,024 GEMMs. H100 ran that shape
    at 488.06 TFLOP/s flat and 489.85 as 4 x 1,024^3 (XLA's sm_90 rows, bursts; the best of the shape is kept):
    0.420 of the peak at the sustained clock. The A100 PCIe transfer it replaces allowed 0.513 there (its
    smallest rows are 2.4e10 FLOPs; below them it clamped), 22% faster than H100 was measured to run it. The
    evaluator charges the forward GEMM at the measured row."""
    measured = 489845722627737 / 989e12 * GH100_SUSTAINED
    assert K.gemm_shape_efficiency("H100-SXM5-80GB", 4096, 1024, 1024, "bf16", "TN") == pytest.approx(measured)
    xs, ys = K._gemm_envelope(K.A100_PCIE_BF16)
    transfer = K.interp_log(xs, ys, 2 * 4096 * 1024 * 1024 * 312 / 989) * K.H100_SCALE
    assert transfer > 1.2 * measured
    graph = build_graph(PRESETS["gpt3-350m"], micro_batch=16, seq=2048, skeleton=True)  # 2 per device
    ev = Evaluator(graph, load_cluster("dgx-h100", devices=8))
    op = next(o for o in graph.ops if o.name.endswith("q_proj"))
    lay = megatron_layouts(graph, ev.mesh, dict(tp=1, pp=1, dp=8, cp=1, ep=1, etp=1, sp=False))[op.name]
    sizes = local_sizes(op, lay, ev.mesh)
    assert gemm_shape(op, sizes)[:3] == (4096, 1024, 1024)
    flops = kind_of("linear").fwd_flops(sizes, {})
    assert ev.op_time(op, lay).fwd_s == pytest.approx(flops / (989e12 * measured), rel=1e-9)


def test_a_measured_cluster_file_overrides_the_tables():
    """A cluster file's measured GEMM fraction (symtensor profile) takes GEMMs out of the tables: its
    number is charged, the other classes stay tabled."""
    from dataclasses import replace

    cluster = replace(load_cluster("dgx-h100", devices=8), efficiency=(("gemm", 0.5), ("bmm", 0.5)),
                      efficiency_source="test")
    eff = efficiency_for(cluster)
    assert eff.tables == ("attention", "hbm") and eff.gemm == 0.5
    graph = build_graph(PRESETS["llama3-8b"], micro_batch=8, seq=2048, skeleton=True)
    ev = Evaluator(graph, cluster)
    op = next(o for o in graph.ops if o.kind == "linear")
    lay = megatron_layouts(graph, ev.mesh, dict(tp=1, pp=1, dp=8, cp=1, ep=1, etp=1, sp=False))[op.name]
    t = op_time(op, lay, ev.mesh, cluster.device, eff, ev.tensors, ev.grad_operands[op.name], ev.dtype)
    tabled = op_time(op, lay, ev.mesh, cluster.device, efficiency_for(load_cluster("dgx-h100", devices=8)),
                     ev.tensors, ev.grad_operands[op.name], ev.dtype)
    flops = kind_of("linear").fwd_flops(local_sizes(op, lay, ev.mesh), {})
    assert t.fwd_s >= flops / (cluster.device.flops("bf16") * 0.5)
    assert t.fwd_s > 1.3 * tabled.fwd_s  # the tables allow ~0.75 of peak at this shape


def test_end_to_end_constants_from_a_cluster_file(tmp_path):
    """A cluster file's end_to_end: section sets the constants (inside their ranges; outside: a one-line
    error) and they change the step."""
    import yaml

    from symtensor import api
    from symtensor.cost.efficiency import END_TO_END
    from symtensor.errors import PlanError
    from symtensor.hardware.efficiency import END_TO_END_RANGES

    doc = {"name": "e2e", "device": {"name": "H100-SXM5-80GB", "peak_tflops": {"bf16": 989}, "hbm_gbps": 3350,
                                     "memory_gib": 80},
           "levels": [{"name": "nvlink", "fanout": 8, "bandwidth_gbps": 450, "latency_us": 3},
                      {"name": "ib", "bandwidth_gbps": 400, "latency_us": 8}],
           "end_to_end": {"step_s": 0.5, "microbatch_s": 0.01}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(doc))
    eff = efficiency_for(load_cluster(str(path), devices=8))
    assert eff.end_to_end.step_s == 0.5 and eff.end_to_end.microbatch_s == 0.01
    base = api.evaluate("llama3-8b", str(path), 8, tp=1, zero=1, micro_batch=1, global_batch=16)
    doc["end_to_end"] = {}
    path.write_text(yaml.safe_dump(doc))
    none = api.evaluate("llama3-8b", str(path), 8, tp=1, zero=1, micro_batch=1, global_batch=16)
    assert base.report.step_time_s > none.report.step_time_s
    shipped = 2 * END_TO_END.microbatch_s  # the empty section keeps the shipped constants
    assert base.report.breakdown["overhead"] == pytest.approx(0.5 + 2 * 0.01 + none.report.breakdown["overhead"]
                                                              - shipped)
    doc["end_to_end"] = {"microbatch_s": 10 * END_TO_END_RANGES["microbatch_s"][1]}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(PlanError, match="outside its physical range"):
        load_cluster(str(path), devices=8)
