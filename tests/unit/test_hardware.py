"""Clusters: presets, level counts and mesh axes, device counts refused, YAML/JSON cluster files.

Units inside are SI (bytes, bytes/s, seconds, FLOP/s); cluster files use GB/s, TFLOP/s, GiB and us.
A mesh factors the devices into prime-sized axes, outermost (slowest) level first.
"""

import json

import pytest

from symtensor.errors import PlanError
from symtensor.hardware import PRESETS, Cluster, cluster_from_dict, cluster_names, load_cluster, prime_factors

GIB = 2**30

# -- presets ---------------------------------------------------------------------------------------

# name -> (device memory GiB, dense bf16 TFLOP/s, HBM GB/s, intra-node GB/s each way, inter-node GB/s)
DATASHEET = {
    "dgx-a100-80g": (80, 312, 2039, 300, 25),
    "dgx-h100": (80, 989, 3350, 450, 50),
    "dgx-h200": (141, 989, 4800, 450, 50),
    "dgx-b200": (180, 2250, 8000, 900, 50),
    "dgx-b300": (270, 2250, 8000, 900, 100),
    "ascend-910b": (64, 313, 1600, 50, 10),
}
NODE = {"gb200-nvl72": 72, "gb300-nvl72": 72}  # GPUs per NVLink domain where it is not 8


def test_preset_names():
    assert cluster_names() == sorted([*DATASHEET, *NODE])


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_preset_constants(name):
    mem, tflops, hbm, intra, inter = DATASHEET[name]
    c = load_cluster(name, nodes=2)
    assert c.n_devices == 16 and c.nodes == 2 and c.level_counts == (8, 2)
    assert c.device.memory == mem * GIB
    assert c.device.flops("bf16") == pytest.approx(tflops * 1e12)
    assert c.device.hbm_bandwidth == pytest.approx(hbm * 1e9)
    assert [lv.fanout for lv in c.levels] == [8, 0]
    assert [lv.bandwidth for lv in c.levels] == pytest.approx([intra * 1e9, inter * 1e9])
    assert all(0 < lv.latency < 1e-4 for lv in c.levels)  # microseconds, in seconds
    assert c.levels[0].latency < c.levels[1].latency


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_constant_has_a_source(name):
    device, levels = PRESETS[name]
    assert device.source.strip()
    assert all(lv.source.strip() for lv in levels)


def test_missing_dtype_names_the_available_ones():
    with pytest.raises(PlanError, match=r"no peak FLOP/s for fp8; it has \['bf16', 'fp16', 'fp32', 'tf32'\]"):
        load_cluster("dgx-a100-80g", devices=8).device.flops("fp8")


# -- level counts and mesh axes ----------------------------------------------------------------------

@pytest.mark.parametrize("devices, counts, axes", [
    (8, (8, 1), ["nvlink0:2", "nvlink1:2", "nvlink2:2"]),
    (24, (8, 3), ["ib0:3", "nvlink0:2", "nvlink1:2", "nvlink2:2"]),
    (96, (8, 12), ["ib0:3", "ib1:2", "ib2:2", "nvlink0:2", "nvlink1:2", "nvlink2:2"]),
    (1536, (8, 192), ["ib0:3"] + [f"ib{j}:2" for j in range(1, 7)] + ["nvlink0:2", "nvlink1:2", "nvlink2:2"]),
    (2520, (8, 315), ["ib0:7", "ib1:5", "ib2:3", "ib3:3", "nvlink0:2", "nvlink1:2", "nvlink2:2"]),
    (4, (4, 1), ["nvlink0:2", "nvlink1:2"]),  # part of one node
])
def test_dgx_h100_mesh(devices, counts, axes):
    c = load_cluster("dgx-h100", devices=devices)
    assert c.level_counts == counts
    assert c.nodes == counts[1]
    mesh = c.mesh()
    assert [f"{a.name}:{a.size}" for a in mesh] == axes
    assert [a.level for a in mesh] == sorted((a.level for a in mesh), reverse=True)  # outermost first
    total = 1
    for a in mesh:
        total *= a.size
    assert total == devices


def test_gb200_nvl72_is_one_nvlink_domain_of_72():
    """A rack of 72 GB200 GPUs is one NVLink domain (9 and 8 inside it as 3 x 3 x 2 x 2 x 2 axes):
    tensor and expert parallelism up to 72 ranks stay on NVLink; racks join over InfiniBand."""
    c = load_cluster("gb200-nvl72", nodes=2)
    assert c.n_devices == 144 and c.level_counts == (72, 2)
    assert [f"{a.name}:{a.size}" for a in c.mesh()] == ["ib0:2", "nvlink0:3", "nvlink1:3", "nvlink2:2",
                                                         "nvlink3:2", "nvlink4:2"]
    assert c.device.flops("bf16") == pytest.approx(2500e12) and c.device.flops("fp8") == pytest.approx(5000e12)
    assert c.device.memory == 186 * GIB and c.levels[0].bandwidth == pytest.approx(900e9)
    assert load_cluster("gb200-nvl72", devices=36).level_counts == (36, 1)  # half a rack


@pytest.mark.parametrize("preset", ["gb200-nvl72", "gb300-nvl72"])
@pytest.mark.parametrize("devices,counts", [(32, (32, 1)), (16, (16, 1)), (64, (64, 1)), (128, (64, 2)),
                                            (256, (64, 4)), (1024, (64, 16)),
                                            (144, (72, 2)), (72, (72, 1)), (8, (8, 1))])
def test_gb200_jobs_of_64_gpus_per_rack(preset, devices, counts):
    """A GB200 job whose GPU count is no multiple of 72 but one of 64 uses 64 GPUs of each rack (Megatron-Bridge's
    performance guide; NVIDIA's 64- and 256-GPU GB200 recipes): 256 GPUs are 4 racks of 64, not refused; a job of a
    divisor of 64 (32 GPUs: NVIDIA's Llama-3-70B fine-tuning rows) sits in one rack. GB300 NVL72 is the same rack
    (NVIDIA's DGX-GB300 rows run 8, 64, 128 and 256 GPUs)."""
    assert load_cluster(preset, devices=devices).level_counts == counts


@pytest.mark.parametrize("preset", ["gb200-nvl72", "gb300-nvl72"])
def test_a_job_neither_of_whole_racks_nor_of_64_per_rack_is_refused_with_both_fixes(preset):
    with pytest.raises(PlanError, match=r"100 devices is not a whole number of nvlink groups of 72; use a multiple of "
                                        r"72 or of 64 \(64 of each group\)"):
        load_cluster(preset, devices=100)


def test_gb300_nvl72_is_one_nvlink_domain_of_72_blackwell_ultra_gpus():
    """GB300 NVL72 (GB300 NVL72 spec, per 72 GPUs: 360 PFLOP/s FP16/BF16 and 720 FP8 with sparsity, 1,080 FP4
    without, 576 TB/s HBM3e, 130 TB/s NVLink; one ConnectX-8 800 Gb/s per GPU): per GPU, dense 2,500 BF16, 5,000
    FP8, 15,000 FP4 TFLOP/s, 288 GB at 8 TB/s, 900 GB/s NVLink and 100 GB/s network each way."""
    c = load_cluster("gb300-nvl72", nodes=2)
    assert c.n_devices == 144 and c.level_counts == (72, 2) and c.levels[0].partial == 64
    assert [f"{a.name}:{a.size}" for a in c.mesh()] == ["ib0:2", "nvlink0:3", "nvlink1:3", "nvlink2:2",
                                                         "nvlink3:2", "nvlink4:2"]
    d = c.device
    assert [d.flops(t) / 1e12 for t in ("bf16", "fp16", "fp8", "fp4")] == pytest.approx([2500, 2500, 5000, 15000])
    assert d.flops("fp32") == pytest.approx(6e15 / 72)
    assert d.memory == 288 * GIB and d.hbm_bandwidth == pytest.approx(576e12 / 72)
    assert [lv.bandwidth for lv in c.levels] == pytest.approx([130e12 / 72 / 2, 800e9 / 8], rel=1e-2)
    assert [lv.bandwidth for lv in c.levels] == pytest.approx([900e9, 100e9])


def test_dgx_b300_constants_match_the_hgx_b300_spec():
    """HGX B300 spec per 8 GPUs: 36 PFLOP/s FP16/BF16 and 72 FP8 with sparsity (half dense), 105 FP4 without,
    600 TFLOP/s FP32, 14.4 TB/s NVLink; DGX B300: 8 ConnectX-8 at 800 Gb/s; 270 GB usable (NVIDIA's MLPerf
    B300-SXM-270GB) of the datasheet's 288."""
    c = load_cluster("dgx-b300", nodes=8)
    assert c.n_devices == 64 and c.level_counts == (8, 8)
    d = c.device
    assert [d.flops(t) * 8 * 2 / 1e15 for t in ("bf16", "fp16", "fp8")] == pytest.approx([36, 36, 72])
    assert d.flops("fp4") * 8 == pytest.approx(105e15) and d.flops("fp32") * 8 == pytest.approx(600e12)
    assert d.memory == 270 * GIB and d.hbm_bandwidth == pytest.approx(8e12)
    assert c.levels[0].bandwidth * 2 * 8 == pytest.approx(14.4e12) and c.levels[1].bandwidth == pytest.approx(800e9 / 8)


@pytest.mark.parametrize("preset", ["dgx-b300", "gb300-nvl72"])
def test_blackwell_ultra_presets_have_microscaling_and_read_b200s_kernels(preset):
    """Blackwell Ultra lists an FP4 peak (MXFP8 is its default FP8 recipe) and reads B200's kernel tables, the
    end-to-end fractions as B200's (uncalibrated)."""
    from symtensor.cost import kernels as K
    from symtensor.cost.efficiency import device_table
    from symtensor.cost.precision import default_recipe

    device = load_cluster(preset, devices=8).device
    assert default_recipe(device) == "mxfp8"
    assert K.device_kernels(device) is K.B300 and device_table(device.name) == device_table("B200-SXM-180GB")


def test_the_partial_rack_survives_the_cluster_file_and_the_plan_file(tmp_path):
    from symtensor.hardware.cluster import cluster_dict, cluster_from_dict

    c = load_cluster("gb200-nvl72", devices=256)
    again = cluster_from_dict(cluster_dict(c), 256)
    assert again.levels[0].partial == 64 and again.level_counts == (64, 4)
    bad = cluster_dict(c)
    bad["levels"][0]["partial"] = 72
    with pytest.raises(PlanError, match="partial"):
        cluster_from_dict(bad, 256)


def test_nodes_and_devices_agree():
    assert load_cluster("dgx-h100", nodes=3) == load_cluster("dgx-h100", devices=24)
    assert load_cluster("dgx-h100", devices=1).mesh() == ()


def test_prime_factors():
    assert prime_factors(24) == [3, 2, 2, 2]
    assert prime_factors(2520) == [7, 5, 3, 3, 2, 2, 2]
    assert prime_factors(97) == [97]
    assert prime_factors(1) == []


@pytest.mark.parametrize("devices, match", [
    (12, (r"12 devices is not a whole number of nvlink groups of 8; use a multiple of 8 \(e\.g\. 8 or 16\)"
          r".*custom cluster file")),
    (20, r"use a multiple of 8 \(e\.g\. 16 or 24\)"),
    (3, r"3 devices do not split a nvlink group of 8; use a divisor of 8 or a multiple of it"),
    (0, r"--devices must be a positive integer, got 0"),
])
def test_bad_device_counts(devices, match):
    with pytest.raises(PlanError, match=match):
        load_cluster("dgx-h100", devices=devices)


def test_bad_cluster_requests():
    with pytest.raises(PlanError, match=r"give exactly one of --devices N or --nodes N"):
        load_cluster("dgx-h100")
    with pytest.raises(PlanError, match=r"give exactly one of --devices N or --nodes N"):
        load_cluster("dgx-h100", devices=8, nodes=1)
    with pytest.raises(PlanError, match=r"--nodes must be a positive integer, got -1"):
        load_cluster("dgx-h100", nodes=-1)
    with pytest.raises(PlanError, match=r"unknown cluster 'dgx-h300'.*Did you mean dgx-h200, dgx-h100"):
        load_cluster("dgx-h300", devices=8)
    with pytest.raises(PlanError, match=r"needs at least one level"):
        Cluster(name="x", device=PRESETS["dgx-h100"][0], levels=(), n_devices=8)


# -- cluster files --------------------------------------------------------------------------------------

MINI = {"name": "mini", "device": {"name": "X1", "peak_tflops": {"bf16": 100, "fp32": 25}, "hbm_gbps": 1000,
                                   "memory_gib": 16},
        "levels": [{"name": "fast", "fanout": 4, "bandwidth_gbps": 100, "latency_us": 2},
                   {"name": "slow", "bandwidth_gbps": 12.5, "latency_us": 5}]}
MINI_YAML = """\
name: mini
device:
  name: X1
  peak_tflops: {bf16: 100, fp32: 25}   # TFLOP/s
  hbm_gbps: 1000                        # GB/s
  memory_gib: 16
levels:                                 # innermost first
  - {name: fast, fanout: 4, bandwidth_gbps: 100, latency_us: 2}
  - {name: slow, bandwidth_gbps: 12.5, latency_us: 5}
"""

FILE_BUG = ("cluster_from_dict refuses every cluster file: its first _require(data, ('device', 'levels')) "
            "checks that 'levels' is a non-negative number or a mapping, so the required list of levels "
            "fails with 'levels must be a non-negative number'")


def _check_mini(c):
    assert c.name == "mini" and c.n_devices == 16 and c.level_counts == (4, 4)
    assert c.device.peak_flops == {"bf16": 100e12, "fp32": 25e12}  # TFLOP/s -> FLOP/s
    assert c.device.hbm_bandwidth == 1000e9                          # GB/s -> bytes/s
    assert c.device.memory == 16 * GIB                               # GiB -> bytes
    assert [lv.bandwidth for lv in c.levels] == [100e9, 12.5e9]      # GB/s -> bytes/s
    assert c.levels[0].latency == pytest.approx(2e-6)                # us -> s
    assert c.levels[1].latency == pytest.approx(5e-6)
    assert [lv.fanout for lv in c.levels] == [4, 0]                  # the outermost level is unbounded
    assert all(lv.source for lv in c.levels) and c.device.source
    assert [f"{a.name}:{a.size}" for a in c.mesh()] == ["slow0:2", "slow1:2", "fast0:2", "fast1:2"]


def test_json_cluster_file(tmp_path):
    path = tmp_path / "mini.json"
    path.write_text(json.dumps(MINI))
    _check_mini(load_cluster(str(path), devices=16))


def test_yaml_cluster_file(tmp_path):
    path = tmp_path / "mini.yaml"
    path.write_text(MINI_YAML)
    _check_mini(load_cluster(str(path), nodes=4))


def test_cluster_from_dict():
    _check_mini(cluster_from_dict(MINI, 16))


def _mini(**changes) -> dict:
    """A copy of MINI with ``changes`` applied: 'device.memory_gib': ..., 'levels.0.fanout': ..., or
    a value of None to delete the key."""
    data = json.loads(json.dumps(MINI))
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = data
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    return data


@pytest.mark.parametrize("data, match", [
    (_mini(device=None), r"missing key\(s\) device"),
    (_mini(levels=None), r"missing key\(s\) levels"),
    (_mini(levels={}), r"levels must be a non-empty list"),
], ids=["missing-device", "missing-levels", "levels-not-a-list"])
def test_cluster_file_refused(data, match):
    with pytest.raises(PlanError, match=match):
        cluster_from_dict(data, 16)


@pytest.mark.parametrize("data, match", [
    (_mini(extra=1), r"unknown key\(s\) \['extra'\]; allowed: device, levels, name"),
    (_mini(levels=[]), r"levels must be a non-empty list"),
    (_mini(**{"device.hbm_gbps": None}), r"device: missing key\(s\) hbm_gbps"),
    (_mini(**{"levels.0.latency_us": None}), r"levels\[0\]: missing key\(s\) latency_us"),
    (_mini(**{"levels.0.fanout": None}), r"levels\[0\]: missing key\(s\) fanout"),
    (_mini(**{"levels.0.bandwidth_gbps": "100"}), r"levels\[0\]: bandwidth_gbps must be a positive number"),
    (_mini(**{"device.peak_tflops": 100}), r"peak_tflops must map dtypes to TFLOP/s"),
], ids=["unknown-top-level-key", "empty-levels", "missing-device-key", "missing-level-key", "missing-inner-fanout",
        "string-bandwidth", "scalar-peak"])
def test_cluster_file_refused_with_the_right_message(data, match):
    with pytest.raises(PlanError, match=match):
        cluster_from_dict(data, 16)


@pytest.mark.parametrize("data, match", [
    (_mini(**{"device.memory_gb": 16}), r"unknown key.*memory_gb"),
    (_mini(**{"levels.1.latency_ms": 1}), r"unknown key.*latency_ms"),
    (_mini(**{"levels.0.bandwidth_gbps": 0}), r"bandwidth_gbps must be a positive number"),
], ids=["unknown-device-key", "unknown-level-key", "zero-bandwidth"])
def test_cluster_file_read_strictly(data, match):
    with pytest.raises(PlanError, match=match):
        cluster_from_dict(data, 16)


def test_unparseable_cluster_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("levels: [unclosed\n")
    with pytest.raises(PlanError, match=r"cluster file .*bad\.yaml: cannot parse"):
        load_cluster(str(path), devices=8)
    path = tmp_path / "bad.json"
    path.write_text("{")
    with pytest.raises(PlanError, match=r"cannot parse"):
        load_cluster(str(path), devices=8)


@pytest.mark.parametrize("device_name, preset", [
    ("NVIDIA A100-SXM4-80GB", "dgx-a100-80g"),
    ("NVIDIA H100 80GB HBM3", "dgx-h100"),
    ("NVIDIA H200", "dgx-h200"),
    ("NVIDIA B200", "dgx-b200"),
    ("NVIDIA GB200", "gb200-nvl72"),  # "B200" is in the name too: GB200 must be matched first
    ("NVIDIA B300 SXM6 AC", "dgx-b300"),
    ("NVIDIA GB300", "gb300-nvl72"),  # "B300" is in the name too: GB300 must be matched first, and never as a B200
    ("NVIDIA GH200 480GB", None),  # "H200" is in the name: a Grace Hopper is not an H200 preset
    ("Ascend910B2", "ascend-910b"),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_a_device_name_finds_its_preset(device_name, preset):
    from symtensor.hardware.cluster import preset_for

    assert preset_for(device_name, None) == preset
    assert preset is None or preset in PRESETS
