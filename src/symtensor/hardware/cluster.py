"""Clusters: a device type and a hierarchy of link levels; presets and cluster files.

Units inside are SI (seconds, bytes, bytes/s, FLOP/s); cluster files use GB/s, TFLOP/s, GiB and
microseconds and are converted once, here. Bandwidths are per device and per direction.

A cluster of N devices is a hierarchy of levels, innermost first (NVLink inside a node, then
InfiniBand between nodes). Its *mesh* factors N into prime-sized axes, each on one level,
outermost (slowest) level first: 24 H100s = ib:3 x nvlink:2 x nvlink:2 x nvlink:2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from symtensor import validate
from symtensor.errors import PlanError, did_you_mean
from symtensor.hardware.efficiency import END_TO_END_RANGES, KINDS, Efficiency, EndToEnd
from symtensor.hardware.mesh import Axis, Mesh


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One accelerator.

    Attributes:
        name: e.g. ``A100-SXM4-80GB``.
        peak_flops: dense peak FLOP/s per dtype (``bf16``, ``fp16``, ``fp32``, ``fp8``).
        hbm_bandwidth: bytes/s of device memory.
        memory: bytes of device memory.
        source: where the numbers come from.
        host_bandwidth: bytes/s per device each way between device and host memory (the link rate: an upper
            bound; ``HOST_LINKS``), what CPU activation offloading copies over; 0: not stated.
    """

    name: str
    peak_flops: dict
    hbm_bandwidth: float
    memory: float
    source: str = field(default="", compare=False)
    host_bandwidth: float = 0.0

    def flops(self, dtype: str) -> float:
        if dtype not in self.peak_flops:
            raise PlanError(f"device {self.name} has no peak FLOP/s for {dtype}; it has {sorted(self.peak_flops)}")
        return self.peak_flops[dtype]


@dataclass(frozen=True, slots=True, kw_only=True)
class Level:
    """One level of the interconnect.

    Attributes:
        name: e.g. ``nvlink``, ``ib``.
        fanout: how many units of the level below it groups (8 GPUs per node); ``0`` = unbounded
            (the outermost level).
        bandwidth: bytes/s per device per direction across this level.
        latency: seconds per collective step across this level (the alpha of alpha-beta).
        link_efficiency: measured fractions of ``bandwidth`` per collective kind (``all_reduce``,
            ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``send_recv``) on this level, as
            (kind, fraction) pairs; a kind not listed uses the device's efficiency table.
        source: where the numbers come from.
        partial: devices a job uses of each group when its count is no whole number of full groups
            but one of ``partial`` (0: none; a rack-scale NVLink domain, whose switches connect any
            subset all-to-all: ``NVL72_PARTIAL``).
    """

    name: str
    fanout: int
    bandwidth: float
    latency: float
    link_efficiency: tuple[tuple[str, float], ...] = ()
    source: str = field(default="", compare=False)
    partial: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """A device type, its link hierarchy (innermost first) and how many devices are used.

    ``efficiency``: (field, value) pairs of ``symtensor.cost.Efficiency`` that this cluster's file
    sets (measured by ``symtensor profile``, or fitted to the user's runs by ``symtensor calibrate
    --runs``), over the device's calibrated table; ``efficiency_source`` says where they come from
    (date, device, software versions). ``band``: the (lowest, highest) residual, predicted /
    measured - 1, of the runs this file was calibrated on (``calibrate --runs``), which every
    prediction on it takes as its error band; None: the shipped calibration's."""

    name: str
    device: Device
    levels: tuple[Level, ...]
    n_devices: int
    efficiency: tuple[tuple[str, float], ...] = ()
    efficiency_source: str = field(default="", compare=False)
    band: tuple[float, float] | None = None
    # (constant, value) pairs of ``symtensor.hardware.efficiency.EndToEnd`` that this cluster's file
    # sets (its ``end_to_end:`` section, e.g. fitted by ``symtensor calibrate --runs``)
    end_to_end: tuple[tuple[str, float], ...] = ()

    def __post_init__(self):
        if not isinstance(self.n_devices, int) or self.n_devices <= 0:
            raise PlanError(f"cluster {self.name}: the device count must be a positive integer, got {self.n_devices!r}")
        validate.integer(self.n_devices, f"cluster {self.name}: the device count", hi=validate.MAX_DEVICES)
        if not self.levels:
            raise PlanError(f"cluster {self.name}: needs at least one level")
        for lvl in self.levels[:-1]:
            if lvl.fanout <= 0:
                raise PlanError(f"cluster {self.name}: level {lvl.name} needs a positive fanout (only the outermost "
                                "level may be unbounded)")
        _ = self.level_counts  # validates divisibility

    @property
    def level_counts(self) -> tuple[int, ...]:
        """Devices used per level, innermost first: 24 on 8-GPU nodes -> (8, 3)."""
        counts, rest = [], self.n_devices
        for i, lvl in enumerate(self.levels):
            last = i == len(self.levels) - 1
            if last or lvl.fanout == 0:
                counts.append(rest)
                rest = 1
                break
            if lvl.partial and rest > lvl.fanout and rest % lvl.fanout and rest % lvl.partial == 0:
                counts.append(lvl.partial)  # ``partial`` of each group (Level.partial)
                rest //= lvl.partial
                continue
            if rest <= lvl.fanout:
                if lvl.fanout % rest and not (lvl.partial and lvl.partial % rest == 0):
                    also = f" or of {lvl.partial}" if lvl.partial else ""
                    raise PlanError(f"cluster {self.name}: {rest} devices do not split a {lvl.name} group of "
                                    f"{lvl.fanout}; use a divisor of {lvl.fanout}{also} or a multiple of it")
                counts.append(rest)
                rest = 1
                break
            if rest % lvl.fanout:
                raise PlanError(
                    f"cluster {self.name}: {self.n_devices} devices is not a whole number of {lvl.name} groups of "
                    f"{lvl.fanout}; use a multiple of {lvl.fanout}"
                    f"{f' or of {lvl.partial} ({lvl.partial} of each group)' if lvl.partial else ''} "
                    f"(e.g. {self.n_devices // lvl.fanout * lvl.fanout or lvl.fanout}"
                    f" or {(self.n_devices // lvl.fanout + 1) * lvl.fanout}) or a custom cluster file")
            counts.append(lvl.fanout)
            rest //= lvl.fanout
        counts += [1] * (len(self.levels) - len(counts))
        return tuple(counts)

    @property
    def nodes(self) -> int:
        counts = self.level_counts
        n = 1
        for c in counts[1:]:
            n *= c
        return n

    def mesh(self) -> Mesh:
        """Prime-sized axes, outermost level first; within a level larger primes first."""
        axes = []
        for level in reversed(range(len(self.levels))):
            for j, p in enumerate(prime_factors(self.level_counts[level])):
                axes.append(Axis(f"{self.levels[level].name}{j}", p, level))
        return Mesh(axes)


def prime_factors(n: int) -> list[int]:
    """Prime factors of n, largest first: 24 -> [3, 2, 2, 2]."""
    out, p = [], 2
    while p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    if n > 1:
        out.append(n)
    return sorted(out, reverse=True)


GB = 1e9
TFLOPS = 1e12
GIB = 2**30
US = 1e-6
# Usable fraction of device memory for the predicted device peak (``cost.memory``: allocated + fragmentation +
# CUDA context + NCCL buffers, what nvidia-smi shows). It was 0.9 (spec open point 9) when it stood for the
# context and fragmentation, which are now modelled; what is left is a margin for their spread around the
# averages the model uses: fragmentation measured at 15% on average but up to 33% (GMLake, ASPLOS 2024), NCCL
# channel counts that vary with topology and version (NVIDIA/nccl#986), kernel modules loaded into the context.
MEMORY_HEADROOM = 0.95

# Link latencies: per collective step, the order of NCCL's own model (src/graph/tuning.cc: a few
# microseconds of base latency for NVLink rings, more across the network). Not fitted.
_NVLINK_LAT, _NET_LAT = 3 * US, 8 * US

# Device <-> host links (``Device.host_bandwidth``, per GPU each way), the link rates: upper bounds, no measured
# fraction is applied (none cited here). PCIe per direction: Gen4 x16 16 GT/s x 16 lanes x 128b/130b = 31.5 GB/s,
# Gen5 x16 twice that, 63 GB/s (PCI-SIG PCIe 4.0/5.0 base specifications; Transformer Engine's CPU offloading guide,
# NVIDIA/TransformerEngine@d0067d0da6cb docs/features/other_optimizations/cpu_offloading/cpu_offloading.rst: "PCIe
# Gen5 x16 systems offer 128 GB/s bidirectional"). DGX A100's GPUs hang off PCIe Gen4 switches; HGX/DGX H100, H200,
# B200 and B300 reach their x86 hosts over PCIe Gen5 x16. Grace-Blackwell (GB200, GB300): each GPU has its own
# NVLink-C2C link to the Grace CPU, "900 GB/s bidirectional per link" (the same guide and its figure "900 GB/s per
# NVLink-C2C link"): 450 GB/s each way. Ascend 910B: PCIe 4.0 x16 to the host (Huawei's Atlas 800T A2 specs name the
# NPU's host interface PCIe 4.0), as Gen4 above.
HOST_LINKS = {"pcie4": 31.5 * GB, "pcie5": 63 * GB, "nvlink-c2c": 450 * GB}

A100_80G = Device(
    name="A100-SXM4-80GB", peak_flops={"bf16": 312 * TFLOPS, "fp16": 312 * TFLOPS, "fp32": 19.5 * TFLOPS,
                                       "tf32": 156 * TFLOPS},
    hbm_bandwidth=2039 * GB, memory=80 * GIB,
    source="NVIDIA A100 datasheet (dense BF16/FP16 312 TFLOP/s, HBM2e 2,039 GB/s, 80 GB)",
    host_bandwidth=HOST_LINKS["pcie4"])
H100_SXM = Device(
    name="H100-SXM5-80GB", peak_flops={"bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS, "fp8": 1979 * TFLOPS,
                                       "fp32": 67 * TFLOPS},
    hbm_bandwidth=3350 * GB, memory=80 * GIB,
    source="NVIDIA H100 datasheet (dense BF16 989 TFLOP/s, FP8 1,979, HBM3 3.35 TB/s, 80 GB)",
    host_bandwidth=HOST_LINKS["pcie5"])
# Device memory counts the datasheet's GB as GiB, as the A100 and H100 presets do (an 80 GB H100 shows
# 79.6 GiB in nvidia-smi); MEMORY_HEADROOM's margin covers the difference.
# H200: the H100's GH100 die (same SMs, clocks and Tensor Cores: the same dense peaks) with 141 GB of
# HBM3e at 4.8 TB/s.
H200_SXM = Device(
    name="H200-SXM-141GB", peak_flops={"bf16": 989 * TFLOPS, "fp16": 989 * TFLOPS, "fp8": 1979 * TFLOPS,
                                       "fp32": 67 * TFLOPS},
    hbm_bandwidth=4800 * GB, memory=141 * GIB,
    source="NVIDIA H200 Tensor Core GPU datasheet (SXM: dense BF16 989 TFLOP/s, FP8 1,979 = half the "
           "with-sparsity figures; 141 GB HBM3e at 4.8 TB/s; the H100's GH100 die)",
    host_bandwidth=HOST_LINKS["pcie5"])
# B200 in an HGX/DGX B200 board (1,000 W): the Blackwell datasheet's dense (non-sparse) Tensor Core
# peaks; DGX B200 holds 1,440 GB of HBM3e at 64 TB/s over 8 GPUs: 180 GB and 8 TB/s each.
B200_HGX = Device(
    name="B200-SXM-180GB", peak_flops={"bf16": 2250 * TFLOPS, "fp16": 2250 * TFLOPS, "fp8": 4500 * TFLOPS,
                                       "fp4": 9000 * TFLOPS, "fp32": 80 * TFLOPS},
    hbm_bandwidth=8000 * GB, memory=180 * GIB,
    source="NVIDIA Blackwell datasheet, HGX B200 at 1,000 W: dense BF16 2,250 TFLOP/s, FP8 4,500, FP4 9,000 "
           "(sparse figures are twice these); DGX B200: 1,440 GB HBM3e, 64 TB/s for 8 GPUs",
    host_bandwidth=HOST_LINKS["pcie5"])
# B200 in a GB200 superchip (1,200 W): higher clocks than HGX; GB200 NVL72 holds up to 13.4 TB of
# HBM3e at 576 TB/s over 72 GPUs: 186 GB and 8 TB/s each.
GB200 = Device(
    name="GB200-B200-186GB", peak_flops={"bf16": 2500 * TFLOPS, "fp16": 2500 * TFLOPS, "fp8": 5000 * TFLOPS,
                                         "fp4": 10000 * TFLOPS, "fp32": 90 * TFLOPS},
    hbm_bandwidth=8000 * GB, memory=186 * GIB,
    source="NVIDIA Blackwell datasheet, GB200 at 1,200 W: dense BF16 2,500 TFLOP/s, FP8 5,000, FP4 10,000; "
           "GB200 NVL72 spec: up to 13.4 TB HBM3e and 576 TB/s for 72 GPUs (186 GB, 8 TB/s each)",
    host_bandwidth=HOST_LINKS["nvlink-c2c"])
# Blackwell Ultra (B300) in an HGX/DGX B300 board: the Blackwell tensor cores at B200's dense BF16/FP8 rates
# (HGX B300 spec per 8 GPUs: FP16/BF16 36 PFLOP/s and FP8 72 with sparsity, FP4 105 without, FP32 600 TFLOP/s), more
# dense FP4, 288 GB of HBM3e (12-high stacks) at 8 TB/s. NVIDIA's own MLPerf systems name the part B300-SXM-288GB
# (DGX B300, MLPerf Inference v5.1) and later B300-SXM-270GB: what the driver exposes is below the datasheet's
# 288 GB, by more than MEMORY_HEADROOM's 5%, so the preset takes the 270 (its source string says so).
B300_HGX = Device(
    name="B300-SXM-270GB", peak_flops={"bf16": 2250 * TFLOPS, "fp16": 2250 * TFLOPS, "fp8": 4500 * TFLOPS,
                                       "fp4": 105000 / 8 * TFLOPS, "fp32": 75 * TFLOPS},
    hbm_bandwidth=8000 * GB, memory=270 * GIB,
    source="NVIDIA HGX B300 spec (nvidia.com/data-center/hgx), per 8 GPUs: FP16/BF16 36 PFLOP/s and FP8 72 with "
           "sparsity = dense 2,250 and 4,500 TFLOP/s per GPU, FP4 105 PFLOP/s without sparsity = 13,125, FP32 600 "
           "TFLOP/s = 75; 8 TB/s per Blackwell Ultra GPU (NVIDIA Technical Blog, 'Inside NVIDIA Blackwell Ultra', "
           "2025). Memory: the datasheets' 288 GB HBM3e (DGX B300: 2.3 TB for 8), of which NVIDIA's later MLPerf "
           "Training systems name 270 GB usable per HGX B300 GPU (B300-SXM-270GB): the lower is taken, since fits "
           "judges the reserved peak against it (288 would overstate it by 6.7%, beyond the 5% headroom)",
    host_bandwidth=HOST_LINKS["pcie5"])
# Blackwell Ultra in a GB300 superchip (1,400 W): GB200's dense BF16/FP8 rates; GB300 NVL72 spec for 72 GPUs:
# FP16/BF16 360 PFLOP/s and FP8 720 with sparsity, FP4 1,080 without, FP32 6 PFLOP/s, HBM3e at 576 TB/s.
GB300 = Device(
    name="GB300-B300-288GB", peak_flops={"bf16": 2500 * TFLOPS, "fp16": 2500 * TFLOPS, "fp8": 5000 * TFLOPS,
                                         "fp4": 15000 * TFLOPS, "fp32": 6000 / 72 * TFLOPS},
    hbm_bandwidth=8000 * GB, memory=288 * GIB,
    source="NVIDIA GB300 NVL72 spec (nvidia.com/data-center/gb300-nvl72), per 72 GPUs: FP16/BF16 360 PFLOP/s and "
           "FP8 720 with sparsity = dense 2,500 and 5,000 TFLOP/s per GPU, FP4 1,080 PFLOP/s without sparsity = "
           "15,000 (the Blackwell Ultra blog's 15 PFLOP/s dense NVFP4), FP32 6 PFLOP/s = 83.3, 576 TB/s HBM3e = "
           "8 TB/s; 288 GB HBM3e per Blackwell Ultra GPU (NVIDIA Technical Blog, 'Inside NVIDIA Blackwell Ultra'; "
           "NVIDIA's MLPerf systems GB300-NVL72_GB300-288GB)",
    host_bandwidth=HOST_LINKS["nvlink-c2c"])
ASCEND_910B = Device(
    name="Ascend-910B", peak_flops={"bf16": 313 * TFLOPS, "fp16": 313 * TFLOPS, "fp32": 75 * TFLOPS},
    hbm_bandwidth=1600 * GB, memory=64 * GIB,
    source="Huawei Atlas 800T A2 (Ascend 910B) public specs: ~313 TFLOP/s FP16, 64 GB HBM2e at ~1.6 TB/s",
    host_bandwidth=HOST_LINKS["pcie4"])


# A job on GB200 NVL72 racks whose GPU count is no multiple of 72 uses 64 GPUs of each rack: "To avoid this
# partitioning complexity, you can just use 64 GPUs out of the 72 GPUs" (Megatron-Bridge docs/performance-guide.md,
# "Parallel mapping strategies with NVL72", NVIDIA-NeMo/Megatron-Bridge@067f987df03b), as NVIDIA's own GB200
# performance recipes of 64 and 256 GPUs run. GB300 NVL72 is the same rack (72 GPUs, 9 NVLink switch trays) and
# NVIDIA's DGX-GB300 performance rows run 8, 64, 128 and 256 GPUs (benchmarks/results/bridge_perf_runs.md).
NVL72_PARTIAL = 64


# NCCL's ring collectives over a GPUDirect-RDMA InfiniBand NIC reach 0.92-0.96 of its line rate, by NCCL's own
# team: "For NDR @ 400Gbps you should see 46-48GB/s per NIC" (NVIDIA/nccl-tests#290, 2025-03-03) and, for one
# HDR 200 Gb/s NIC, "you should get ... 24GB/s inter-node" (NVIDIA/nccl#412, 2023-04-24), busbw of nccl-tests at
# large sizes; 0.94 is the NDR statement's middle (HDR's 0.96 is inside its range). The device table's link
# fractions (0.79-0.82: nccl-tests over NVLink, about 230 of 300 GB/s on DGX A100) are NVLink's, and stay on the
# NVLink level and for the kinds not stated here (all-to-all, send/recv). ConnectX-8 (800 Gb/s) borrows it: no
# statement for it was found.
IB_RING_EFFICIENCY = 0.94
IB_LINK_EFFICIENCY = tuple((kind, IB_RING_EFFICIENCY) for kind in ("all_gather", "all_reduce", "reduce_scatter"))


def _levels(intra_name, intra_bw, inter_name, inter_bw, intra_src, inter_src, fanout=8, partial=0):
    ib = inter_name == "ib"
    if ib:
        inter_src += (f"; all-reduce, all-gather and reduce-scatter at {IB_RING_EFFICIENCY} of it (NCCL's team: "
                      "46-48 GB/s per NDR NIC, NVIDIA/nccl-tests#290)")
    return (Level(name=intra_name, fanout=fanout, bandwidth=intra_bw, latency=_NVLINK_LAT, source=intra_src,
                  partial=partial),
            Level(name=inter_name, fanout=0, bandwidth=inter_bw, latency=_NET_LAT, source=inter_src,
                  link_efficiency=IB_LINK_EFFICIENCY if ib else ()))


PRESETS = {
    "dgx-a100-80g": (A100_80G, _levels(
        "nvlink", 300 * GB, "ib", 25 * GB,
        "NVLink 3 through NVSwitch: 600 GB/s bidirectional per GPU = 300 GB/s each way (A100 datasheet)",
        "8x HDR InfiniBand 200 Gb/s per node, one NIC per GPU = 25 GB/s each way (DGX A100 user guide)")),
    "dgx-h100": (H100_SXM, _levels(
        "nvlink", 450 * GB, "ib", 50 * GB,
        "NVLink 4 through NVSwitch: 900 GB/s bidirectional per GPU = 450 GB/s each way (H100 datasheet)",
        "8x NDR InfiniBand 400 Gb/s per node, one NIC per GPU = 50 GB/s each way (DGX H100 user guide)")),
    "dgx-h200": (H200_SXM, _levels(
        "nvlink", 450 * GB, "ib", 50 * GB,
        "NVLink 4 through NVSwitch: 900 GB/s bidirectional per GPU = 450 GB/s each way (H200 datasheet)",
        "8x NDR InfiniBand 400 Gb/s per node (ConnectX-7), one NIC per GPU = 50 GB/s each way (DGX H200)")),
    "dgx-b200": (B200_HGX, _levels(
        "nvlink", 900 * GB, "ib", 50 * GB,
        "NVLink 5 through two NVSwitch chips: 1.8 TB/s bidirectional per GPU (14.4 TB/s for 8) = 900 GB/s "
        "each way (DGX B200 datasheet)",
        "8x ConnectX-7 400 Gb/s InfiniBand per node, one NIC per GPU = 50 GB/s each way (DGX B200 user guide)")),
    # one NVLink domain of 72 GPUs (a rack: 18 compute trays of 2 GB200 superchips, 4 GPUs each, and
    # 9 NVLink switch trays); racks joined by InfiniBand, one 400 Gb/s NIC per GPU
    "gb200-nvl72": (GB200, _levels(
        "nvlink", 900 * GB, "ib", 50 * GB,
        "NVLink 5 switch system across the rack: 130 TB/s for 72 GPUs = 1.8 TB/s bidirectional per GPU = "
        "900 GB/s each way (GB200 NVL72 spec)",
        "ConnectX-7 400 Gb/s InfiniBand, one NIC per GPU = 50 GB/s each way (DGX GB200 reference "
        "architecture)", fanout=72, partial=NVL72_PARTIAL)),
    "dgx-b300": (B300_HGX, _levels(
        "nvlink", 900 * GB, "ib", 100 * GB,
        "NVLink 5 through NVSwitch: 1.8 TB/s GPU-to-GPU per GPU (14.4 TB/s for 8) = 900 GB/s each way "
        "(HGX B300 spec)",
        "8x ConnectX-8 SuperNIC 800 Gb/s InfiniBand XDR or Spectrum-X Ethernet per node, one per GPU = 100 GB/s "
        "each way (DGX B300 datasheet; HGX B300 spec: 1.6 TB/s networking for 8 GPUs, both ways)")),
    # one NVLink domain of 72 GPUs, as GB200 NVL72 (18 compute trays of 4 Blackwell Ultra GPUs and 2 Grace CPUs,
    # 9 NVLink switch trays); racks joined by the scale-out network, one ConnectX-8 SuperNIC per GPU
    "gb300-nvl72": (GB300, _levels(
        "nvlink", 900 * GB, "ib", 100 * GB,
        "NVLink 5 switch system across the rack: 130 TB/s for 72 GPUs = 1.8 TB/s bidirectional per GPU = "
        "900 GB/s each way (GB300 NVL72 spec; NVIDIA Enterprise RA NVL72 AI Factory: 9 NVSwitch trays, 130 TB/s)",
        "ConnectX-8 SuperNIC 800 Gb/s (Quantum-X800 InfiniBand or Spectrum-X Ethernet), one per GPU (4 per 4-GPU "
        "compute tray: NVIDIA Enterprise RA NVL72 AI Factory) = 100 GB/s each way (GB300 NVL72 spec)",
        fanout=72, partial=NVL72_PARTIAL)),
    "ascend-910b": (ASCEND_910B, _levels(
        "hccs", 50 * GB, "roce", 10 * GB,
        "HCCS inside an 8-NPU Atlas 800T A2 node, ~50 GB/s per NPU (PARADISE hardware.py A2 preset)",
        "200 Gb/s RoCE per NPU, ~10 GB/s achievable (PARADISE hardware.py A2 preset)")),
}


def cluster_names() -> list[str]:
    return sorted(PRESETS)


# a device name containing the key is that preset's device (torch.cuda.get_device_name); the first
# key found wins, so a key inside another comes after it ("NVIDIA GB200" holds "B200")
# The first key a device's name contains wins: GB300 before B300, GB200 before B200 (and no Blackwell Ultra name
# holds "B200"); a Grace Hopper (GH200: 96 or 144 GB, its own clocks and NVLink-C2C) has no preset and must not pass
# for an H200 (None).
PRESET_DEVICES = (("GB300", "gb300-nvl72"), ("B300", "dgx-b300"), ("GB200", "gb200-nvl72"), ("B200", "dgx-b200"),
                  ("GH200", None), ("H200", "dgx-h200"), ("H100", "dgx-h100"), ("A100", "dgx-a100-80g"),
                  ("910B", "ascend-910b"))


def preset_for(device_name: str, like: str | None) -> str | None:
    """The preset of a device: ``like`` (a preset name), else the one whose device ``device_name``
    names (``symtensor profile`` keeps its published peaks; ``run --device cuda`` predicts on it)."""
    if like is not None:
        if like not in PRESETS:
            raise PlanError(f"--like {like!r} is not a cluster preset." + did_you_mean(like, PRESETS))
        return like
    return next((preset for key, preset in PRESET_DEVICES if key in device_name), None)


def _from_file(path: Path, n_devices: int) -> Cluster:
    return cluster_from_dict(validate.read_mapping(path, "cluster file"), n_devices, str(path))


def _mapping(data, where: str, required: tuple, optional: tuple = ()) -> dict:
    """Check a mapping strictly: every required key present, no unknown key."""
    return validate.keys(data, where, required, optional)


def _number(data: dict, key: str, where: str, positive: bool = True, unit: str = "") -> float:
    """A finite number, at most the bound of ``unit`` (default ``key``) in validate.HARDWARE_MAX."""
    return validate.number(data[key], f"{where}: {key}", validate.HARDWARE_MAX.get(unit or key, 1e30), positive)


def cluster_from_dict(data: dict, n_devices: int, where: str = "cluster") -> Cluster:
    """A cluster from a mapping in user units (GB/s, TFLOP/s, GiB, us); rejects unknown keys.

    Example (YAML):
        name: my-h100
        device: {name: H100, peak_tflops: {bf16: 989}, hbm_gbps: 3350, memory_gib: 80, host_gbps: 63}
                                      # host_gbps (optional): the device-host link, GB/s each way
        levels:                       # innermost first; the last level has no fanout
          - {name: nvlink, fanout: 8, bandwidth_gbps: 450, latency_us: 3}
          - {name: ib, bandwidth_gbps: 50, latency_us: 8}
    """
    _mapping(data, where, ("device", "levels"), ("name", "efficiency", "measured", "band", "end_to_end"))
    dev = _mapping(data["device"], f"{where}: device", ("name", "peak_tflops", "hbm_gbps", "memory_gib"),
                   ("source", "host_gbps"))
    peaks = dev["peak_tflops"]
    if not isinstance(peaks, dict) or not peaks:
        raise PlanError(f"{where}: device.peak_tflops must map dtypes to TFLOP/s, e.g. {{bf16: 989}}")
    flops = {validate.name(k, f"{where}: device.peak_tflops key"): _number(
        peaks, k, f"{where}: device.peak_tflops", unit="peak_tflops") * TFLOPS for k in peaks}
    device = Device(name=validate.name(dev["name"], f"{where}: device.name"), peak_flops=flops,
                    hbm_bandwidth=_number(dev, "hbm_gbps", f"{where}: device") * GB,
                    memory=_number(dev, "memory_gib", f"{where}: device") * GIB,
                    source=str(dev.get("source", f"cluster file {where}")),
                    host_bandwidth=_number(dev, "host_gbps", f"{where}: device", unit="hbm_gbps") * GB
                    if "host_gbps" in dev else 0.0)
    if not isinstance(data["levels"], list) or not data["levels"]:
        raise PlanError(f"{where}: levels must be a non-empty list, innermost first")
    if len(data["levels"]) > validate.MAX_LEVELS:
        raise PlanError(f"{where}: {len(data['levels'])} levels, above the limit of {validate.MAX_LEVELS}")
    levels = []
    for i, lv in enumerate(data["levels"]):
        last = i == len(data["levels"]) - 1
        here = f"{where}: levels[{i}]"
        _mapping(lv, here, ("name", "bandwidth_gbps", "latency_us") + (() if last else ("fanout",)),
                 (("fanout",) if last else ()) + ("link_efficiency", "source", "partial"))
        fanout = lv.get("fanout", 0)
        if not isinstance(fanout, int) or isinstance(fanout, bool) or fanout < 0 or (not last and fanout == 0):
            raise PlanError(f"{here}: fanout must be a positive integer, got {fanout!r}")
        validate.integer(fanout, f"{here}: fanout", lo=0, hi=validate.MAX_DEVICES)
        levels.append(Level(name=validate.name(lv["name"], f"{here}: name", identifier=True), fanout=fanout,
                            bandwidth=_number(lv, "bandwidth_gbps", here) * GB,
                            latency=_number(lv, "latency_us", here, positive=False) * US,
                            link_efficiency=level_link_efficiency(lv, here),
                            source=str(lv.get("source", f"cluster file {where}")),
                            partial=validate.integer(lv.get("partial", 0), f"{here}: partial", lo=0,
                                                     hi=max(fanout - 1, 0))))
    return Cluster(name=validate.name(data.get("name", where), f"{where}: name"), device=device, levels=tuple(levels),
                   n_devices=n_devices, **cluster_calibration(data, where))


def _band(data: dict, where: str) -> tuple[float, float] | None:
    """The ``band:`` section (``symtensor calibrate --runs``): low <= 0 <= high residuals, each
    above -1 (a prediction is never negative)."""
    if "band" not in data:
        return None
    here = f"{where}: band"
    band = _mapping(data["band"], here, ("low", "high"), ("rows", "held_out", "source"))
    for k in ("low", "high"):
        if isinstance(band[k], bool) or not isinstance(band[k], (int, float)) or not math.isfinite(band[k]):
            raise PlanError(f"{here}: {k} must be a finite number (a residual, predicted / measured - 1), got "
                            f"{band[k]!r}")
    lo, hi = float(band["low"]), float(band["high"])
    if not -1 < lo <= hi <= 100:
        raise PlanError(f"{here}: low={lo:g} and high={hi:g} must satisfy -1 < low <= high <= 100 (residuals, "
                        "predicted / measured - 1)")
    return (lo, hi)


def cluster_dict(cluster: Cluster) -> dict:
    """``cluster`` as a cluster file's mapping (the inverse of ``cluster_from_dict``, user units)."""
    dev = cluster.device
    doc = {"name": cluster.name,
           "device": {"name": dev.name, "peak_tflops": {k: v / TFLOPS for k, v in dev.peak_flops.items()},
                      "hbm_gbps": dev.hbm_bandwidth / GB, "memory_gib": dev.memory / GIB, "source": dev.source},
           "levels": []}
    if dev.host_bandwidth:
        doc["device"]["host_gbps"] = dev.host_bandwidth / GB
    for i, lv in enumerate(cluster.levels):
        level = {"name": lv.name, "bandwidth_gbps": lv.bandwidth / GB, "latency_us": lv.latency / US,
                 "source": lv.source}
        if i < len(cluster.levels) - 1 or lv.fanout:
            level["fanout"] = lv.fanout
        if lv.link_efficiency:
            level["link_efficiency"] = dict(lv.link_efficiency)
        if lv.partial:
            level["partial"] = lv.partial
        doc["levels"].append(level)
    return doc | calibrated_sections(cluster)


def calibrated_sections(cluster: Cluster) -> dict:
    """What a cluster file states beyond its device and levels, as its sections (``efficiency:`` with its source,
    ``end_to_end:``, ``band:``): only those it has. ``cluster_calibration`` reads them back; a plan file carries
    them (``plan.io``), so a plan made on a profiled or calibrated cluster is re-costed on the same constants."""
    doc = {}
    if cluster.efficiency:
        doc["efficiency"] = {**dict(cluster.efficiency), "source": cluster.efficiency_source}
    if cluster.end_to_end:
        doc["end_to_end"] = dict(cluster.end_to_end)
    if cluster.band is not None:
        doc["band"] = {"low": cluster.band[0], "high": cluster.band[1]}
    return doc


def cluster_calibration(data: dict, where: str) -> dict:
    """``Cluster``'s keyword arguments from the sections ``calibrated_sections`` writes (each checked)."""
    return {"band": _band(data, where), **_efficiency(data, where), **_end_to_end(data, where)}


# The raw tables and provenance that ``symtensor profile`` writes under ``measured:`` (their rows are
# checked by symtensor.profile.document, which fits and shows them).
MEASURED_KEYS = ("date", "device", "torch", "cuda", "nccl", "backend", "dtype", "world_size", "ranks_per_node",
                 "note", "peaks", "gemm", "bmm", "attention", "memory", "unaligned", "collectives")


def level_link_efficiency(lv: dict, here: str) -> tuple[tuple[str, float], ...]:
    """A level's measured ``link_efficiency: {kind: fraction}`` as sorted (kind, fraction) pairs."""
    if "link_efficiency" not in lv:
        return ()
    fractions = _mapping(lv["link_efficiency"], f"{here}: link_efficiency", (), KINDS)
    return tuple(sorted((k, _number(fractions, k, f"{here}: link_efficiency")) for k in fractions))


def _efficiency(data: dict, where: str) -> dict:
    """The ``efficiency:`` section (fields of ``symtensor.cost.Efficiency``, e.g. measured by
    ``symtensor profile``) as the Cluster's ``efficiency`` and ``efficiency_source``; ``measured:``
    may hold only its known keys."""
    if "measured" in data:
        _mapping(data["measured"], f"{where}: measured", (), MEASURED_KEYS)
    if "efficiency" not in data:
        return {}
    names = tuple(f.name for f in fields(Efficiency) if f.name not in NOT_FRACTIONS)
    here = f"{where}: efficiency"
    eff = _mapping(data["efficiency"], here, (), names + ("source",))
    # fractions must be positive; a knee or a half-bandwidth message size of 0 means no size curve
    values = tuple((k, _number(eff, k, here, positive=not k.endswith(("_knee", "_bytes")))) for k in names if k in eff)
    return {"efficiency": values, "efficiency_source": str(eff.get("source", f"cluster file {where}"))}


# Efficiency fields a cluster file's efficiency: section may not set (provenance, the kernel tables'
# choice, the end-to-end constants, which have their own end_to_end: section, and what the engine decides:
# its eager kernels and whether it pads the vocabulary)
NOT_FRACTIONS = ("source", "kernels", "tables", "attention_kernel", "end_to_end", "eager_elementwise", "pads_vocab")


def _end_to_end(data: dict, where: str) -> dict:
    """The ``end_to_end:`` section: constants of ``EndToEnd`` (each inside its physical range)."""
    if "end_to_end" not in data:
        return {}
    here = f"{where}: end_to_end"
    raw = _mapping(data["end_to_end"], here, (), tuple(END_TO_END_RANGES))
    values = {k: _number(raw, k, here, positive=False) for k in raw}
    EndToEnd().replace(**values)  # a one-line error for a value outside its range
    return {"end_to_end": tuple(sorted(values.items()))}


def load_cluster(spec: str, devices: int | None = None, nodes: int | None = None) -> Cluster:
    """A preset name or a YAML/JSON cluster file, sized by ``devices`` or ``nodes``."""
    if (devices is None) == (nodes is None):
        raise PlanError("give exactly one of --devices N or --nodes N")
    extra = {}
    if spec in PRESETS:
        device, levels = PRESETS[spec]
        name = spec
    else:
        path = Path(spec)
        if not path.exists():
            raise PlanError(f"unknown cluster {spec!r}: give a preset or a YAML/JSON file."
                            + did_you_mean(spec, PRESETS))
        proto = _from_file(path, 1)
        device, levels, name = proto.device, proto.levels, proto.name
        extra = dict(efficiency=proto.efficiency, efficiency_source=proto.efficiency_source, band=proto.band,
                     end_to_end=proto.end_to_end)
    if nodes is not None:
        if not isinstance(nodes, int) or nodes <= 0:
            raise PlanError(f"--nodes must be a positive integer, got {nodes!r}")
        devices = nodes * (levels[0].fanout or 1)
    if not isinstance(devices, int) or devices <= 0:
        raise PlanError(f"--devices must be a positive integer, got {devices!r}")
    return Cluster(name=name, device=device, levels=levels, n_devices=devices, **extra)
