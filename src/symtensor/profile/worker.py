"""The torchrun entry point of ``symtensor profile``: time the grid, rank 0 writes the cluster file.

``symtensor profile`` launches it on this machine for you. On several nodes, start it on each::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m symtensor.profile.worker --backend nccl --out my-cluster.yaml

and on one machine by hand::

    OMP_NUM_THREADS=1 torchrun --nnodes 1 --nproc-per-node 4 -m symtensor.profile.worker \\
        --backend gloo --quick --out cpu.yaml

Every rank times the compute grid on its own device at the same time (the concurrent load of
training: clocks, power caps, shared CPU cores); rank 0 keeps the median over ranks. Collectives
run within each node (all nodes at once) and across nodes (ranks of equal local index at once);
nodes are the launcher's (``LOCAL_WORLD_SIZE``), or groups of ``--ranks-per-node`` ranks. A
collective point's time is the slowest rank's. Rank 0 prints ``symtensor-profile-step i n what``
lines for the progress bar and writes the file (``symtensor.profile.document``).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import signal
import sys
import time
from datetime import UTC, datetime

import torch
import torch.distributed as dist
import torch.nn.functional as F

from symtensor.errors import PlanError
from symtensor.profile.document import build, check_writable, write
from symtensor.profile.fit import median
from symtensor.profile.grid import KINDS, STEP_MARK, Grid, aligned_twin, grid_for

MAX_REPS = 200  # repetitions of one point at most (a tiny kernel within its budget)
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _die_with_parent() -> None:
    """Linux: this process gets SIGKILL when torchrun (its parent) dies, so that no worker outlives
    an interrupted or killed profile."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Bench:
    """The device, dtype and clock of this rank's measurements."""

    def __init__(self, device: torch.device, dtype: torch.dtype, budget_s: float):
        self.device, self.dtype, self.budget_s = device, dtype, budget_s

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def seconds(self, fn, reps: int | None = None) -> float:
        """Mean seconds of ``fn`` after one warm-up call, repeated within the budget (or ``reps``)."""
        fn()
        self.sync()
        if reps is None:
            start = time.perf_counter()
            fn()
            self.sync()
            first = time.perf_counter() - start
            reps = int(min(MAX_REPS, max(1, self.budget_s / max(first, 1e-9))))
        start = time.perf_counter()
        for _ in range(reps):
            fn()
        self.sync()
        return (time.perf_counter() - start) / reps

    def randn(self, *shape, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, dtype=self.dtype, requires_grad=grad)


def measure_gemm(b: Bench, grid: Grid, step) -> list[dict]:
    rows = []
    for m, n, k in grid.gemm:
        x, w = b.randn(m, k), b.randn(k, n)
        rows.append({"m": m, "n": n, "k": k, "seconds": b.seconds(lambda: x @ w)})
        step(f"gemm {m}x{n}x{k}")
    return rows


def measure_unaligned(b: Bench, grid: Grid, step) -> list[dict]:
    """Each unaligned GEMM of the grid and its aligned twin (``grid.aligned_twin``)."""
    rows = []
    for m, n, k in grid.unaligned:
        x, w = b.randn(m, k), b.randn(k, n)
        xa, wa = b.randn(m, aligned_twin(k)), b.randn(aligned_twin(k), aligned_twin(n))
        rows.append({"m": m, "n": n, "k": k, "seconds": b.seconds(lambda: x @ w),
                     "aligned_seconds": b.seconds(lambda: xa @ wa)})
        step(f"gemm {m}x{n}x{k} unaligned")
    return rows


def measure_bmm(b: Bench, grid: Grid, step) -> list[dict]:
    rows = []
    for batch, m, n, k in grid.bmm:
        x, y = b.randn(batch, m, k), b.randn(batch, k, n)
        rows.append({"batch": batch, "m": m, "n": n, "k": k, "seconds": b.seconds(lambda: torch.bmm(x, y))})
        step(f"bmm {batch}x{m}x{n}x{k}")
    return rows


def measure_attention(b: Bench, grid: Grid, step) -> list[dict]:
    rows = []
    for batch, heads, seq, head_dim, causal in grid.attention:
        q, k, v = (b.randn(batch, heads, seq, head_dim, grad=True) for _ in range(3))

        def fwd():
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        out = fwd()
        grad = torch.randn_like(out)
        bwd_s = b.seconds(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
        with torch.no_grad():
            fwd_s = b.seconds(fwd)
        rows.append({"batch": batch, "heads": heads, "seq": seq, "head_dim": head_dim, "causal": causal,
                     "fwd_seconds": fwd_s, "bwd_seconds": bwd_s})
        step(f"attention s{seq} d{head_dim}{' causal' if causal else ''}")
    return rows


def _memory_kernel(b: Bench, kernel: str, n: int, width: int):
    """(the kernel, bytes it moves as the cost model counts them: inputs + outputs)."""
    x = b.randn(n // width, width)
    size = x.element_size() * x.numel()
    if kernel == "copy":
        out = torch.empty_like(x)
        return (lambda: out.copy_(x)), 2 * size
    if kernel == "rmsnorm":
        weight = b.randn(width)
        return (lambda: F.rms_norm(x, (width,), weight)), 2 * size
    if kernel == "swiglu":
        up = b.randn(n // width, width)
        return (lambda: F.silu(x) * up), 3 * size
    assert kernel == "softmax", kernel
    return (lambda: torch.softmax(x, dim=-1)), 2 * size


def measure_memory(b: Bench, grid: Grid, step) -> list[dict]:
    rows = []
    with torch.no_grad():
        for kernel, n in grid.memory:
            fn, nbytes = _memory_kernel(b, kernel, n, grid.norm_width)
            rows.append({"kernel": kernel, "elements": n, "bytes": nbytes, "seconds": b.seconds(fn)})
            step(f"memory {kernel} {n}")
    return rows


def node_groups(world: int, rank: int, per_node: int):
    """This rank's group within its node and across nodes (None where that level has one member).
    Every rank creates every group, in the same order, as ``new_group`` requires."""
    nodes = world // per_node
    intra = inter = None
    for node in range(nodes):
        ranks = list(range(node * per_node, (node + 1) * per_node))
        group = dist.new_group(ranks) if per_node > 1 else None
        if rank in ranks:
            intra = group
    for local in range(per_node):
        ranks = list(range(local, world, per_node))
        group = dist.new_group(ranks) if nodes > 1 else None
        if rank in ranks:
            inter = group
    return [(0, per_node, intra), (1, nodes, inter)]


def _collective(kind: str, nbytes: int, group, size: int, b: Bench):
    """The call of one collective of ``nbytes`` (cost.collectives' message sizes) and the size
    actually moved (rounded to whole fp32 elements per member)."""
    n = max(1, nbytes // (4 * size)) * size
    full = torch.ones(n, device=b.device, dtype=torch.float32)
    part = torch.ones(n // size, device=b.device, dtype=torch.float32)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if kind == "all_reduce":
        return (lambda: dist.all_reduce(full, group=group)), 4 * n
    if kind == "all_gather":  # the size is the gathered result
        return (lambda: gather(full, part, group=group)), 4 * n
    if kind == "reduce_scatter":  # the size is the input
        return (lambda: scatter(part, full, group=group)), 4 * n
    out = torch.empty_like(full)
    return (lambda: dist.all_to_all_single(out, full, group=group)), 4 * n


def _slowest(value: float, b: Bench) -> float:
    t = torch.tensor([value], device=b.device, dtype=torch.float64 if b.device.type == "cpu" else torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def measure_collectives(b: Bench, grid: Grid, per_node: int, step) -> list[dict]:
    """Per level with more than one member: bytes and seconds per kind, all groups at once."""
    levels = []
    for level, size, group in node_groups(dist.get_world_size(), dist.get_rank(), per_node):
        if size < 2:
            continue
        curves = {"level": level, "group": size}
        for kind in KINDS:
            rows = []
            for nbytes in grid.message_bytes:
                fn, moved = _collective(kind, nbytes, group, size, b)
                first = _slowest(b.seconds(fn, reps=1), b)  # every rank repeats as often as the slowest
                reps = int(min(MAX_REPS, max(1, grid.point_budget_s / max(first, 1e-9))))
                dist.barrier()
                rows.append({"bytes": moved, "seconds": _slowest(b.seconds(fn, reps=reps), b)})
                step(f"{kind} level {level} {moved} B")
            curves[kind] = rows
        levels.append(curves)
    return levels


def environment(backend: str, device: torch.device, dtype: str) -> dict:
    """Provenance: date, device name, software versions."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        version = torch.cuda.nccl.version() if backend == "nccl" else None  # a tuple (older torch: an int)
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else version and str(version)
    else:
        name = _cpu_name()
        nccl = None
    return {"date": datetime.now(UTC).isoformat(timespec="seconds"), "device": name,
            "torch": str(torch.__version__), "cuda": torch.version.cuda, "nccl": nccl, "backend": backend,
            "dtype": dtype, "world_size": dist.get_world_size()}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "CPU " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU " + (platform.processor() or platform.machine())


def device_memory(device: torch.device, per_node: int) -> float:
    """Bytes of memory per device: the GPU's, or this machine's RAM shared by its ranks."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) / per_node


def measure(backend: str, quick: bool, per_node: int, dtype: str) -> dict | None:
    """Time the grid on this rank; the measurements on rank 0, else None."""
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    grid = grid_for(device.type, quick)
    b = Bench(device, _DTYPES[dtype], grid.point_budget_s)
    levels = (per_node > 1) + (dist.get_world_size() // per_node > 1)
    total, done = grid.steps(levels), [0]

    def step(what: str) -> None:
        done[0] += 1
        if rank == 0:
            print(f"{STEP_MARK} {done[0]} {total} {what}", flush=True)

    torch.manual_seed(rank)
    compute = {"gemm": measure_gemm(b, grid, step), "bmm": measure_bmm(b, grid, step),
               "attention": measure_attention(b, grid, step), "memory": measure_memory(b, grid, step),
               "unaligned": measure_unaligned(b, grid, step)}
    dist.barrier()
    collectives = measure_collectives(b, grid, per_node, step)
    every = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(compute, every, dst=0)
    if rank != 0:
        return None
    tables = {name: _median_rows([ranks[name] for ranks in every]) for name in compute}
    return {"meta": environment(backend, device, dtype) | {"ranks_per_node": per_node},
            "memory_bytes": device_memory(device, per_node), "tables": tables | {"collectives": collectives}}


def _median_rows(per_rank: list[list[dict]]) -> list[dict]:
    """Row by row, the median over ranks of every ``seconds`` field."""
    out = []
    for rows in zip(*per_rank):
        row = dict(rows[0])
        for key in row:
            if key.endswith("seconds"):
                row[key] = median(r[key] for r in rows)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", required=True, choices=("nccl", "gloo"))
    p.add_argument("--out", required=True, help="the cluster file to write (rank 0)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.add_argument("--like", help="a preset whose published peaks the file keeps (default: matched by device name)")
    p.add_argument("--ranks-per-node", type=int, help="default: the launcher's LOCAL_WORLD_SIZE")
    p.add_argument("--dtype", choices=tuple(_DTYPES), help="default: bf16 on GPUs, fp32 on CPUs")
    args = p.parse_args(argv)
    _die_with_parent()
    if args.backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(args.backend)
    try:
        per_node = args.ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        if dist.get_world_size() % per_node:
            raise PlanError(f"--ranks-per-node {per_node} does not divide the {dist.get_world_size()} ranks")
        if dist.get_rank() == 0:  # before minutes of measuring (symtensor profile checked it already)
            check_writable(args.out, args.force)
        dtype = args.dtype or ("bf16" if args.backend == "nccl" else "fp32")
        result = measure(args.backend, args.quick, per_node, dtype)
        if result is not None:
            doc, _ = build(result, like=args.like)
            write(doc, args.out, force=args.force)
        dist.barrier()  # tear the groups down together, after rank 0 has written
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
