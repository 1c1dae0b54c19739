"""``symtensor profile``: check the request, run the worker under torchrun here, return the file.

Everything a user can get wrong is checked before any process starts (a ``PlanError``, one line):
the backend, the device count (NCCL: at most this machine's GPUs; gloo: at most
``MAX_PROCESSES_PER_CORE`` processes per CPU core, since beyond that every process mostly waits),
the ranks per node, the preset, and the output path (YAML, writable, not an existing file unless
``force``). The workers run through ``symtensor.runtime.launch`` (rendezvous on 127.0.0.1, a
session of their own); a timeout or Ctrl-C stops all of them and writes nothing.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from symtensor.errors import PlanError
from symtensor.hardware.cluster import preset_for
from symtensor.profile.document import check_writable, curves, links_preset, read
from symtensor.profile.grid import STEP_MARK

BACKENDS = ("nccl", "gloo")
MAX_PROCESSES_PER_CORE = 4
TIMEOUT_S = {True: 300, False: 1200}  # --quick / default: the bounds (1 and 5 minutes) with room


def cuda_devices() -> int:
    """GPUs torch sees on this machine (0 without a CUDA build)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_request(out: str, devices: int | None, backend: str | None, force: bool, like: str | None,
                  ranks_per_node: int | None) -> tuple[int, str]:
    """The (devices, backend) to run, or a PlanError naming what to change."""
    if backend is not None and backend not in BACKENDS:
        raise PlanError(f"unknown backend {backend!r}: use nccl (GPUs) or gloo (CPU processes)")
    gpus = cuda_devices() if backend != "gloo" else 0
    backend = backend or ("nccl" if gpus else "gloo")
    if backend == "nccl" and not gpus:
        raise PlanError("--backend nccl needs CUDA GPUs and torch sees none here; use --backend gloo")
    limit = gpus if backend == "nccl" else MAX_PROCESSES_PER_CORE * (os.cpu_count() or 1)
    devices = devices if devices is not None else (gpus if backend == "nccl" else 2)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise PlanError(f"--devices {devices!r}: give a number of devices, 1 or more (one measures no links)")
    if devices > limit:
        what = (f"this machine has {gpus} GPU(s)" if backend == "nccl" else
                f"gloo runs at most {MAX_PROCESSES_PER_CORE} processes per CPU core, {limit} on this machine")
        raise PlanError(f"--devices {devices}: {what}; on several nodes start symtensor.profile.worker under "
                        "torchrun on each (see its docstring)")
    if ranks_per_node is not None and (ranks_per_node < 1 or devices % ranks_per_node):
        raise PlanError(f"--ranks-per-node {ranks_per_node} must divide --devices {devices}")
    preset_for("", like)  # an unknown preset fails here
    if devices == 1:  # one device measures no links: the file keeps a preset's (its GPU's, or --like)
        import torch

        links_preset(torch.cuda.get_device_name(0) if backend == "nccl" else "", like, devices)
    check_writable(out, force)
    return devices, backend


def worker_command(out: str, devices: int, backend: str, quick: bool, force: bool, like: str | None,
                   ranks_per_node: int | None) -> list[str]:
    from symtensor.runtime.launch import local_torchrun

    cmd = local_torchrun(devices) + ["-m", "symtensor.profile.worker", "--backend", backend, "--out", str(out)]
    cmd += ["--quick"] * quick + ["--force"] * force
    cmd += (["--like", like] if like else []) + (["--ranks-per-node", str(ranks_per_node)] if ranks_per_node else [])
    return cmd


def profile(out: str, devices: int | None = None, backend: str | None = None, quick: bool = False,
            force: bool = False, like: str | None = None, ranks_per_node: int | None = None, on_step=None,
            timeout_s: float | None = None) -> dict:
    """Measure this machine and write the cluster file ``out``.

    Args:
        out: the YAML file to write.
        devices: processes (default: every GPU with NCCL, 2 with gloo).
        backend: ``nccl`` or ``gloo`` (default: nccl where torch sees GPUs).
        quick: a few points per curve.
        force: overwrite ``out``.
        like: a preset whose published peaks the file keeps (default: matched by device name).
        ranks_per_node: group ranks into nodes of this many (default: all on one node).
        on_step: called with (done, total, what) as points complete.
        timeout_s: stop the workers after this long (default: 300 s quick, 1,200 s full).

    Returns:
        ``out``, ``wall_s``, the written ``cluster`` document and ``curves`` (each fit's summary).
    """
    from symtensor.runtime.launch import GLOO_TEARDOWN_ABORT, run_process_group, worker_env

    devices, backend = check_request(out, devices, backend, force, like, ranks_per_node)
    cmd = worker_command(out, devices, backend, quick, force, like, ranks_per_node)

    def on_line(line: str) -> None:
        if on_step is not None and STEP_MARK in line:
            done, total, what = line.split(STEP_MARK, 1)[1].split(maxsplit=2)
            on_step(int(done), int(total), what.strip())

    start = time.time()
    try:
        code, output = run_process_group(cmd, worker_env(), timeout_s or TIMEOUT_S[quick], on_line)
    except subprocess.TimeoutExpired:
        raise PlanError(f"the profile did not finish in {timeout_s or TIMEOUT_S[quick]} s; its processes were "
                        f"stopped and {out} was not written") from None
    except KeyboardInterrupt:
        raise PlanError(f"interrupted: the profile's processes were stopped and {out} was not written") from None
    written = Path(out).exists() and Path(out).stat().st_mtime >= start - 1
    if not written or (code != 0 and GLOO_TEARDOWN_ABORT not in output):
        raise PlanError(failure_line(code, output))
    return {"out": str(out), "wall_s": time.time() - start, "devices": devices, "backend": backend,
            "cluster": read(out), "curves": [c.summary() for c in curves(out)]}


def failure_line(code: int, output: str) -> str:
    """One line: the workers' last error line, and the log that keeps all their output."""
    import tempfile

    from symtensor.output import printable

    fd, log = tempfile.mkstemp(prefix="symtensor-profile-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(output)
    lines = output.strip().splitlines() or ["no output"]
    # the workers' own lines come before torchrun's report of their exit
    own = next((i for i, x in enumerate(lines) if "torch/distributed/elastic" in x), len(lines))
    errors = [x for x in lines[:own] if "rror" in x]
    last = printable(errors[-1] if errors else lines[-1])[:300]
    return f"the profile's workers failed (torchrun exited with {code}): {last}; their output: {log}"
