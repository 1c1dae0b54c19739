"""Run a RunSpec under torchrun and compare it with the single-process reference.

``run_spec`` checks the spec against the model and the process count first (a ``PlanError``
before any process starts), launches ``python -m torch.distributed.run`` (``local_torchrun``: its
rendezvous binds 127.0.0.1 port 0, so the OS picks a free port) with ``OMP_NUM_THREADS=1``, runs the same
training in this process without parallelism, and returns both, their differences, and the bytes
every rank's collectives moved (definitions in ``symtensor.runtime.commcount``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from symtensor.errors import PlanError
from symtensor.models import load_model_config
from symtensor.runtime.spec import OPTIMIZERS, RunSpec, check_fits


def torchrun_command(model: str, spec_file: Path, steps: int, optimizer: str, nproc: int, out: Path,
                     seed: int = 0) -> list[str]:
    """The torchrun command line that runs ``symtensor.runtime.worker`` on ``nproc`` processes."""
    return local_torchrun(nproc) + ["-m", "symtensor.runtime.worker", "--spec", str(spec_file), "--model", str(model),
            "--steps", str(steps), "--optimizer", optimizer, "--seed", str(seed), "--out", str(out)]


def local_torchrun(nproc: int) -> list[str]:
    """torchrun for ``nproc`` processes on this machine; its rendezvous binds 127.0.0.1 port 0 (the OS
    picks a free port; nothing listens beyond this machine)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-id", uuid.uuid4().hex]


def run_process_group(cmd: list[str], env: dict[str, str], timeout_s: float, on_line=None) -> tuple[int, str]:
    """Run ``cmd`` (a torchrun command) in a session of its own and return (exit status, output).

    Each output line goes to ``on_line`` as it comes. On a timeout, an error or Ctrl-C the launcher
    gets SIGTERM (torchrun then stops its workers), then SIGKILL if it has not exited within 10 s,
    and the exception propagates: no process is left behind (workers that must not outlive torchrun
    ask for a parent-death signal, as ``symtensor.profile.worker`` does)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []

    def read():
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout_s)
    except BaseException:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(timeout=10)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        raise
    finally:
        reader.join(timeout=10)
    return proc.returncode, "".join(lines)


def _worker_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    src = str(Path(__file__).resolve().parents[2])  # the directory holding the symtensor package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def _failure_tail(output: str, lines: int = 60) -> str:
    """The workers' own last lines (``[rankN]:`` prefixed) rather than torchrun's summary."""
    rank_lines = [line for line in output.splitlines() if line.startswith("[rank")]
    return "\n".join((rank_lines or output.splitlines())[-lines:])


def launch(model: str, spec: RunSpec, steps: int, optimizer: str, nproc: int, seed: int = 0,
           timeout_s: float = 300) -> dict:
    """Run the worker under torchrun and return rank 0's result (with ``state`` loaded).

    Raises:
        RuntimeError: the workers failed; the message ends with their output.
    """
    import torch

    with tempfile.TemporaryDirectory(prefix="symtensor-run-") as tmp:
        spec_file, out = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_file.write_text(json.dumps(spec.to_dict()))
        cmd = torchrun_command(model, spec_file, steps, optimizer, nproc, out, seed)
        for attempt in range(2):
            proc = subprocess.run(cmd, env=_worker_env(), capture_output=True, text=True, timeout=timeout_s,
                                  check=False)
            output = proc.stdout + proc.stderr
            if proc.returncode == 0 and out.exists():
                break
            # gloo sometimes aborts a worker ("terminate called without an active exception")
            # while processes shut down; rank 0 has then written the complete result, or a
            # second launch succeeds. Any other failure is reported at once.
            if GLOO_TEARDOWN_ABORT not in output:
                break
            if out.exists() and Path(json.loads(out.read_text())["state_file"]).exists():
                break
        if not out.exists():
            raise RuntimeError(f"torchrun exited with {proc.returncode}: {' '.join(cmd)}\n" + _failure_tail(output))
        if proc.returncode != 0 and GLOO_TEARDOWN_ABORT not in output:
            raise RuntimeError(f"torchrun exited with {proc.returncode}: {' '.join(cmd)}\n" + _failure_tail(output))
        result = json.loads(out.read_text())
        result["state"] = torch.load(result.pop("state_file"))
    return result


def _max_abs_diff(a: dict, b: dict) -> float:
    if set(a) != set(b):
        raise AssertionError(f"parameter names differ: {sorted(set(a) ^ set(b))}")
    return max((a[k] - b[k]).abs().max().item() for k in a)


def run_spec(model: str, spec: RunSpec | dict, steps: int = 2, optimizer: str = "sgd", nproc: int | None = None,
             seed: int = 0, timeout_s: float = 300) -> dict:
    """Run ``spec`` on ``nproc`` processes and against one process; compare losses and parameters.

    Args:
        model: a model preset (``tiny-llama``, ``tiny-mixtral``) or config.json path.
        spec: a RunSpec or its dict.
        steps: training steps.
        optimizer: ``sgd`` or ``adamw``.
        nproc: processes (default: the mesh product); must equal the mesh product.
        seed: weight and data seed.
        timeout_s: wall-clock limit for torchrun.

    Returns:
        ``losses`` and ``reference_losses`` (per step), ``loss_max_abs_diff``,
        ``param_max_abs_diff``, ``comm_bytes`` (``[step][rank] -> {kind: bytes}``), ``comm`` (the
        full per-step, per-rank records with calls and bytes per mesh axis), ``wall_s``.

    Example:
        >>> spec = RunSpec(mesh={"dp": 2}, dp_axes=("dp",))      # doctest: +SKIP
        >>> r = run_spec("tiny-llama", spec, steps=2, nproc=2)   # doctest: +SKIP
        >>> r["loss_max_abs_diff"] < 1e-5                          # doctest: +SKIP
        True
    """
    spec = spec if isinstance(spec, RunSpec) else RunSpec.from_dict(spec)
    nproc = spec.world_size if nproc is None else nproc
    if optimizer not in OPTIMIZERS:
        raise PlanError(f"optimizer {optimizer!r}; use one of {', '.join(OPTIMIZERS)}")
    cfg = load_model_config(model)
    check_fits(spec, cfg, nproc)  # before torch is imported or any process starts
    from symtensor.runtime.worker import train_reference

    start = time.perf_counter()
    result = launch(model, spec, steps, optimizer, nproc, seed, timeout_s)
    reference = train_reference(cfg, spec, steps, optimizer, seed)
    return {"losses": result["losses"], "reference_losses": reference["losses"],
            "loss_max_abs_diff": max(abs(a - b) for a, b in zip(result["losses"], reference["losses"])),
            "param_max_abs_diff": _max_abs_diff(result["state"], reference["state"]),
            "comm_bytes": [[rank["bytes"] for rank in step] for step in result["comm"]],
            "comm": result["comm"], "wall_s": time.perf_counter() - start}
