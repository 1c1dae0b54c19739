"""Kernel tables (cost/kernels.py): every table names its source, lookups are fractions in (0, 1], the
envelope lookups are monotone and return their own points, and unknown names are one-line errors."""

import math

import pytest

from symtensor.cost import kernels as K
from symtensor.errors import PlanError

DEVICES = ("A100-SXM4-80GB", "H100-SXM5-80GB", "H200", "B200", "B300", "Ascend-910B")
SHAPES = [(m, n, k) for m in (64, 512, 4096, 32768) for n in (128, 1376, 4096, 28672) for k in (256, 4096, 16384)]


def test_every_table_has_a_source():
    tables = K.all_tables()
    assert {t[0] for t in tables} == set(DEVICES)
    for device, kind, key, _table, source in tables:
        assert len(source) > 40, (device, kind, key)
        assert any(word in source for word in ("arXiv", "SimuMax", "DeepGEMM", "gpu-benches", "FlashAttention",
                                               "XLA", "hopper_measure.py")), source
    # copied rows carry their licence
    for source in (K.SIMUMAX, K.DEEPGEMM, K.MAMF, K.MSMF, K.GPU_BENCHES, K.FA3_PAPER, K.XLA_SM90):
        assert any(lic in source for lic in ("Apache-2.0", "MIT", "CC BY", "GPL-3.0")), source


def test_transfers_say_why():
    """A device reading another's numbers says so: H200 reads H100's kernels, Ascend A100's; H100's BF16 GEMMs
    are its own rows (XLA's sm_90 table), their charged rate capped by the A100 Transformer Engine shapes at the
    ratio of the measured ceilings, and its grouped GEMMs are that transfer."""
    assert "GH100" in K.H200.transfers["gemm, grouped, attention"]
    assert "A100" in K.ASCEND_910B.transfers["all"]
    assert "gemm bf16" not in K.H100.transfers and K.H100.gemm["bf16"][0] is K.H100_BF16
    assert "ceilings" in K.H100.transfers["gemm bf16 (charged)"] and "ceilings" in K.H100.transfers["grouped bf16"]
    assert K.H100.stack["bf16"] == K.H200.stack["bf16"] == (K.A100_PCIE_BF16, K.H100_SCALE)
    assert K.H200.attention == K.H100.attention and K.H200.hbm != K.H100.hbm


def test_blackwell_ultra_reads_b200s_tables_and_says_so():
    """B300 and GB300 (no kernel table of their own) read B200's, a stated transfer, by an unambiguous name: a
    GB300's device name holds "B300", never "B200"."""
    for name in ("B300", "B300-SXM-270GB", "GB300-B300-288GB", "NVIDIA GB300"):
        assert K.device_kernels(name) is K.B300
    assert K.device_kernels("GB200-B200-186GB") is K.B200
    assert K.B300.gemm == K.B200.gemm and K.B300.attention == K.B200.attention and K.B300.hbm == K.B200.hbm
    assert K.B300.peak_tflops == K.B200.peak_tflops == {"bf16": 2250.0, "fp16": 2250.0}
    assert "B200" in K.B300.transfers["gemm, grouped, attention"] and "hbm" in K.B300.transfers
    assert K.gemm_efficiency("B300", 4096, 4096, 4096) == K.gemm_efficiency("B200", 4096, 4096, 4096)


@pytest.mark.parametrize("device", DEVICES)
def test_lookups_are_fractions(device):
    dev = K.device_kernels(device)
    for dtype in dev.gemm:
        for m, n, k in SHAPES:
            assert 0 < K.gemm_efficiency(device, m, n, k, dtype) <= 1
    for dtype in dev.grouped:
        for c in (1, 64, 616, 8192, 1e6):
            assert 0 < K.grouped_gemm_efficiency(device, c, dtype) <= 1
    for kernel, direction, causal, _ in dev.attention:
        for seq in (64, 512, 4096, 131072):
            for hd in (32, 64, 128, 256):
                assert 0 < K.attention_efficiency(device, kernel, seq, hd, causal, direction == "bwd") <= 1
    for pattern in K.HBM_PATTERNS:
        assert 0 < K.hbm_fraction(device, pattern) <= 1


@pytest.mark.parametrize("device", DEVICES)
def test_gemm_monotone_in_every_dimension(device):
    """At fixed other dims a larger GEMM is never allowed less (the envelope over FLOPs)."""
    for dtype in K.device_kernels(device).gemm:
        for m, n, k in SHAPES:
            e = K.gemm_efficiency(device, m, n, k, dtype)
            for bigger in ((2 * m, n, k), (m, 2 * n, k), (m, n, 2 * k)):
                assert K.gemm_efficiency(device, *bigger, dtype) >= e - 1e-12, (device, dtype, (m, n, k), bigger)


@pytest.mark.parametrize("device", DEVICES)
def test_grouped_monotone_in_tokens(device):
    for dtype in K.device_kernels(device).grouped:
        effs = [K.grouped_gemm_efficiency(device, c, dtype) for c in (16, 128, 256, 616, 1000, 4096, 1e5)]
        assert effs == sorted(effs)


def test_gemm_hits_its_envelope_points():
    for device in DEVICES:
        for dtype in K.device_kernels(device).gemm:
            for flops, eff in zip(*K.gemm_envelope(device, dtype)):
                m = n = k = (flops / 2) ** (1 / 3)
                assert math.isclose(K.gemm_efficiency(device, m, n, k, dtype), eff, rel_tol=1e-9)


def test_envelope_points_are_measured_rows():
    """Every envelope point of the A100 table is a real row; the measured row of a shape is returned."""
    xs, ys = K._gemm_envelope(K.A100_PCIE_BF16)
    rows = {(2 * m * n * k, eff) for m, n, k, _, eff in K.A100_PCIE_BF16.rows}
    assert set(zip(xs, ys)) <= rows
    assert K.gemm_measured("B200", 4096, 512, 4096) == 0.5318  # SimuMax b200 row m=4096 k=4096 n=512 (NN)
    assert K.gemm_measured("A100", 3, 5, 7) is None
    # FP8 on H100: DeepGEMM's 4096 x 7168 x 16384 at 1,520 TFLOP/s of 1,979, a burst, at the sustained clock
    assert math.isclose(K.gemm_measured("H100", 4096, 7168, 16384, "fp8"), 1520 / 1979 * K.GH100_SUSTAINED)


def test_attention_hits_published_points_and_interpolates_in_log_seq():
    # FA3 paper, H100 forward causal hd 128: 579 TFLOP/s at 4k, 602 at 8k
    assert math.isclose(K.attention_efficiency("H100", "fa3", 4096, 128, True), 579 / 989)
    mid = K.attention_efficiency("H100", "fa3", math.sqrt(4096 * 8192), 128, True)
    assert math.isclose(mid, (579 + 602) / 2 / 989)
    # clamped at the table's edges
    assert K.attention_efficiency("H100", "fa3", 100, 128, True) == 292 / 989
    assert K.attention_efficiency("H100", "fa3", 10**6, 128, True) == 616 / 989
    # head dim between 64 and 128: between the two curves
    lo, hi = (K.attention_efficiency("H100", "fa2", 2048, d, False) for d in (64, 128))
    assert lo <= K.attention_efficiency("H100", "fa2", 2048, 96, False) <= hi
    # no causal backward curve was published: the non-causal one bounds it
    assert K.attention_efficiency("H100", "fa3", 4096, 128, True, backward=True) == 542 / 989
    # SimuMax's causal rows count non-causal FLOPs: the executed fraction is half the reported one
    assert math.isclose(K.attention_efficiency("A100", "te", 4096, 128, True), 1.187 * 0.5)


def test_fused_attention_rises_with_sequence():
    """FlashAttention curves do not fall with longer sequences (more key blocks per query block)."""
    for (kernel, direction, causal, hd), curve in K.H100_ATTENTION.items():
        if kernel in ("fa2", "fa3"):
            assert list(curve.ys) == sorted(curve.ys), (kernel, direction, causal, hd)


def test_hbm_fractions_are_the_measured_ones():
    assert math.isclose(K.hbm_fraction("A100-SXM4-80GB", "scale"), 1732 / 2039)
    assert math.isclose(K.hbm_fraction("H200", "triad"), 3534 / 4800)


def test_wave_quantisation():
    """One full wave of 256 x 128 tiles on 108 SMs is lossless; one tile more costs a nearly empty wave
    unless a smaller tile fills the SMs; overhanging tiles lose their idle part."""
    assert K.wave(12 * 256, 9 * 128, 108) == 1.0
    assert K.wave(100, 100, 108) < 0.1
    assert K.wave(4096, 4096, None) == 1.0
    assert K.gemm_wave("A100", 4096, 3584) < K.gemm_wave("A100", 4096, 4096)


@pytest.mark.parametrize("call, match", [
    (lambda: K.gemm_efficiency("V100", 1, 1, 1), "no kernel tables for device 'V100'"),
    (lambda: K.gemm_efficiency("A100", 64, 64, 64, "fp8"), "no GEMM table for fp8 on A100"),
    (lambda: K.attention_efficiency("A100", "fa3", 4096, 128), "no fwd attention table for kernel 'fa3'"),
    (lambda: K.attention_efficiency("B200", "te", 4096, 128, causal=False), "no non-causal fwd"),
    (lambda: K.grouped_gemm_efficiency("B200", 128, "fp8"), "no grouped-GEMM table for fp8 on B200"),
    (lambda: K.hbm_fraction("H100", "gather"), "HBM pattern 'gather'"),
    (lambda: K.gemm_efficiency("H100", 0, 1, 1), "must be positive"),
])
def test_unknown_names_are_one_line_errors(call, match):
    with pytest.raises(PlanError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


def test_the_alignment_rows_are_the_measured_ones():
    """``GH100_ALIGNMENT`` holds the H200 alignment microbenchmark's rows as measured (benchmarks/results/hopper_h200/
    round2.json, rounded to 0.1 TFLOP/s), each unaligned weight paired with the aligned one of its kind (the vocabulary
    rows with 50,304, the 5,140-wide ones with 5,120) in the same layout."""
    import json
    from pathlib import Path

    raw = json.loads((Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "hopper_h200" /
                      "round2.json").read_text())["alignment"]
    tf = {(r["out"], r["inp"], r["layout"]): r["tflops"] for r in raw}
    rows = K.GH100_ALIGNMENT.rows
    assert len(rows) == len([k for k in tf if k[0] % 8 or k[1] % 8]) == 15
    for out, inp, layout, t, aout, ainp, at in rows:
        assert t == pytest.approx(tf[out, inp, layout], abs=0.05) and at == pytest.approx(tf[aout, ainp, layout],
                                                                                        abs=0.05)
        assert (out % 8 or inp % 8) and not (aout % 8 or ainp % 8) and abs(out - aout) <= 80 and abs(inp - ainp) <= 20


def test_alignment_factor_by_class():
    """An aligned weight (both dims multiples of 8), a device without an alignment table, or FP8 (its own
    alignment rule, cost.precision): 1. On the GH100: an odd width at its class's measured mean per layout, a width
    of 2 or 4 times an odd number at theirs, the lower dimension's class deciding; every factor in (0, 1)."""
    assert [K.aligned_elements(w) for w in (50257, 50258, 50260, 5140, 20560, 4096, 2570)] == [1, 2, 4, 4, 8, 8, 2]
    for device in ("H100-SXM5-80GB", "H200"):
        assert K.alignment_factor(device, 4096, 14336, "bf16", "TN") == 1.0
        odd = [K.alignment_factor(device, 50257, 2048, "bf16", lay) for lay in K.GEMM_LAYOUTS]
        assert odd == pytest.approx([99.0 / 648.1, 142.5 / 695.5, 148.5 / 705.8], rel=1e-6)
        four = K.alignment_factor(device, 20560, 5140, "bf16", "TN")
        assert four == pytest.approx((279.0 / 648.1 + 214.1 / 690.4 + 236.2 / 699.4) / 3, rel=1e-6)
        assert K.alignment_factor(device, 5140, 20560, "bf16", "TN") == four  # (the lower dimension's class)
        assert all(0 < f < 1 for f in K.alignment_means(device, "bf16").values())
        assert K.alignment_factor(device, 50257, 2048, "fp8", "TN") == 1.0
    for device in ("A100-SXM4-80GB", "B200", "Ascend-910B"):
        assert K.alignment_factor(device, 50257, 2048, "bf16", "TN") == 1.0

