"""Run a RunSpec on worker processes and compare it with the single-process reference.

``run_spec`` checks the spec against the model and the process count first (a ``PlanError``
before any process starts), starts ``python -m symtensor.runtime.worker`` on every rank as a
``symtensor.runtime.group.WorkerGroup`` (one process group, rendezvous on 127.0.0.1, heartbeats,
all stopped on an error, a stall or Ctrl-C) with ``OMP_NUM_THREADS=1``, runs the same training in
this process without parallelism, and returns both, their differences, and the bytes every rank's
collectives moved (definitions in ``symtensor.runtime.commcount``). ``run_specs`` does the same for
several specs on one launch. ``local_torchrun`` and ``run_process_group`` launch other commands
under torchrun.
"""

from __future__ import annotations

import json
import os
import shutil
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
from symtensor.output import printable
from symtensor.runtime.group import WorkerGroup
from symtensor.runtime.spec import OPTIMIZERS, RunSpec, check_fits


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
    ask for a parent-death signal, as ``symtensor.profile.worker`` does). SIGTERM to this process
    counts as Ctrl-C, and torchrun gets SIGTERM if this process dies (Linux)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=_terminated_with(os.getpid()))
    lines: list[str] = []

    def read():
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    main = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _interrupted) if main else None
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
        if main:
            signal.signal(signal.SIGTERM, old_term)
        reader.join(timeout=10)
    return proc.returncode, "".join(lines)


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _terminated_with(parent: int):
    """A preexec_fn: the child gets SIGTERM when ``parent`` dies (Linux), or exits if it already has."""
    prctl = None
    if sys.platform.startswith("linux"):
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec():
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def worker_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    src = str(Path(__file__).resolve().parents[2])  # the directory holding the symtensor package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def _failure(codes: list[int], group: WorkerGroup) -> str:
    """One line: the first rank that failed, how, and its last line of output."""
    rank = group.culprit if group.culprit is not None else next((r for r, c in enumerate(codes) if c), 0)
    code = codes[rank]
    how = (f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}" if code
           else "exited without writing its result")
    lines = [line.strip() for line in group.log(rank).read_text(errors="replace").splitlines() if line.strip()]
    last = printable(lines[-1])[:300] if lines else "no output"
    return f"rank {rank} of {len(codes)} {how}: {last}; its log: {group.log(rank)}"


def launch_jobs(jobs: list[dict], nproc: int, timeout_s: float = 300, master_port: int | None = None,
                device: str = "cpu") -> list[dict]:
    """Run the worker on ``nproc`` processes for several runs on one launch: the workers import torch and
    form their process group once, then run the jobs (``model``, ``spec``, ``steps``, ``optimizer``,
    ``seed``) in order; rank 0's result of each, in order (with ``state`` loaded on CPU). A failure in
    any run stops them all.

    Args:
        timeout_s: how long a rank may stay in one place (``symtensor.runtime.group``).
        master_port: the rendezvous port on 127.0.0.1 (None: a free one).
        device: ``cpu`` (gloo) or ``cuda`` (NCCL, one GPU per process).

    Raises:
        PlanError: a rank failed, stalled or hung (every process is stopped first); the message
            names the rank, its last line and its log, which is kept.
    """
    run_dir = Path(tempfile.mkdtemp(prefix="symtensor-run-"))
    outs = [run_dir / f"result{i}.json" for i in range(len(jobs))]
    jobs_file = run_dir / "jobs.json"
    jobs_file.write_text(json.dumps([dict(job, spec=job["spec"].to_dict(), out=str(out))
                                     for job, out in zip(jobs, outs)]))
    cmd = [sys.executable, "-m", "symtensor.runtime.worker", "--jobs", str(jobs_file), "--device", device]
    try:
        for _attempt in range(2):
            with WorkerGroup(cmd, nproc, run_dir, timeout_s, master_port, env=worker_env()) as group:
                codes = group.wait()
            aborted = any(GLOO_TEARDOWN_ABORT in group.log(r).read_text(errors="replace") for r in range(nproc))
            # gloo sometimes aborts a worker ("terminate called without an active exception")
            # while processes shut down; rank 0 has then written the complete results, or a
            # second launch succeeds. Any other failure is reported at once.
            done = all(_written(out) for out in outs)
            if (done and (aborted or all(c == 0 for c in codes))) or not aborted:
                break
        if not (done and (aborted or all(c == 0 for c in codes))):
            raise PlanError(_failure(codes, group))
        import torch  # after the workers: they import it meanwhile, on the other cores

        results = [json.loads(out.read_text()) for out in outs]
        for result in results:
            if "state_file" in result:
                result["state"] = torch.load(result.pop("state_file"))
    except BaseException as exc:  # keep the logs a failure message names, nothing else
        if isinstance(exc, KeyboardInterrupt) or not any(run_dir.glob("rank*.log")):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    shutil.rmtree(run_dir, ignore_errors=True)
    return results


def _written(out: Path) -> bool:
    """Rank 0 wrote this result (and, on CPU, the parameters it names)."""
    state_file = json.loads(out.read_text()).get("state_file") if out.exists() else None
    return out.exists() and (state_file is None or Path(state_file).exists())


def _max_abs_diff(a: dict, b: dict) -> float:
    if set(a) != set(b):
        raise AssertionError(f"parameter names differ: {sorted(set(a) ^ set(b))}")
    return max((a[k] - b[k]).abs().max().item() for k in a)


def run_spec(model: str, spec: RunSpec | dict, steps: int = 2, optimizer: str = "sgd", nproc: int | None = None,
             seed: int = 0, timeout_s: float = 300, master_port: int | None = None, device: str = "cpu") -> dict:
    """Run ``spec`` on ``nproc`` processes and against one process; compare losses and parameters.

    Args:
        model: a model preset (``tiny-llama``, ``tiny-mixtral``) or config.json path.
        spec: a RunSpec or its dict.
        steps: training steps.
        optimizer: ``sgd`` or ``adamw``.
        nproc: processes (default: the mesh product); must equal the mesh product.
        seed: weight and data seed.
        timeout_s: how long a rank may stay in one place before the run is stopped.
        master_port: the rendezvous port on 127.0.0.1 (None: a free one).
        device: ``cpu`` (gloo), or ``cuda`` (NCCL): there the run is timed and its peak memory
            kept, and there is no single-process reference (its ``reference_losses`` and
            differences are None).

    Returns:
        ``losses`` and ``reference_losses`` (per step), ``loss_max_abs_diff``,
        ``param_max_abs_diff``, ``comm_bytes`` (``[step][rank] -> {kind: bytes}``), ``comm`` (the
        full per-step, per-rank records with calls and bytes per mesh axis), ``step_times_s``,
        ``peak_memory_bytes`` (per rank, cuda only), ``wall_s`` (the launch and the reference).

    Example:
        >>> spec = RunSpec(mesh={"dp": 2}, dp_axes=("dp",))      # doctest: +SKIP
        >>> r = run_spec("tiny-llama", spec, steps=2, nproc=2)   # doctest: +SKIP
        >>> r["loss_max_abs_diff"] < 1e-5                          # doctest: +SKIP
        True
    """
    run = {"model": model, "spec": spec, "steps": steps, "optimizer": optimizer, "seed": seed}
    return run_specs([run], nproc, timeout_s, master_port, device)[0]


def run_specs(runs: list[dict], nproc: int | None = None, timeout_s: float = 300, master_port: int | None = None,
              device: str = "cpu") -> list[dict]:
    """``run_spec`` for several runs on one launch: the processes start, import torch and form their
    group once, then train the runs in order (a few seconds of CPU per process saved per run; the
    test suite's way of running many). Each result is judged on its own, as ``run_spec``'s; the
    single-process reference is computed once per distinct (model, batch, sequence, steps,
    optimizer, seed). A failure in any run stops them all (``PlanError``, as ``launch_jobs``).

    Args:
        runs: dicts of ``run_spec``'s ``model``, ``spec`` and optionally ``steps`` (2),
            ``optimizer`` (``sgd``) and ``seed`` (0).
        nproc: processes (default: the mesh product, which every spec must share).
        timeout_s, master_port, device: as for ``run_spec``.

    Returns:
        ``run_spec``'s result for each run, in order; ``wall_s`` with several runs is the run's
        own time on the workers and its reference's (the start of the processes is shared).
    """
    jobs = []
    for run in runs:
        spec = run["spec"] if isinstance(run["spec"], RunSpec) else RunSpec.from_dict(run["spec"])
        job = {"model": run["model"], "spec": spec, "steps": run.get("steps", 2),
               "optimizer": run.get("optimizer", "sgd"), "seed": run.get("seed", 0)}
        if job["optimizer"] not in OPTIMIZERS:
            raise PlanError(f"optimizer {job['optimizer']!r}; use one of {', '.join(OPTIMIZERS)}")
        job["cfg"] = load_model_config(job["model"])
        jobs.append(job)
    nproc = jobs[0]["spec"].world_size if nproc is None else nproc
    for job in jobs:
        check_fits(job["spec"], job["cfg"], nproc)  # before torch is imported or any process starts
    start = time.perf_counter()
    results = launch_jobs([{k: v for k, v in job.items() if k != "cfg"} for job in jobs], nproc, timeout_s,
                          master_port, device)
    references: dict[tuple, tuple[dict, float]] = {}
    outs = []
    for job, result in zip(jobs, results):
        out = {"losses": result["losses"], "reference_losses": None, "loss_max_abs_diff": None,
               "param_max_abs_diff": None, "comm_bytes": [[rank["bytes"] for rank in step] for step in result["comm"]],
               "comm": result["comm"], "step_times_s": result["step_times_s"],
               "peak_memory_bytes": result["peak_memory_bytes"]}
        reference_s = 0.0
        if device == "cpu":
            from symtensor.runtime.worker import train_reference

            spec = job["spec"]
            key = (repr(job["cfg"]), spec.global_batch, spec.seq, job["steps"], job["optimizer"], job["seed"])
            if key not in references:
                t0 = time.perf_counter()
                references[key] = (train_reference(job["cfg"], spec, job["steps"], job["optimizer"], job["seed"]),
                                   time.perf_counter() - t0)
                reference_s = references[key][1]
            reference = references[key][0]
            out |= {"reference_losses": reference["losses"],
                    "loss_max_abs_diff": max(abs(a - b) for a, b in zip(result["losses"], reference["losses"])),
                    "param_max_abs_diff": _max_abs_diff(result["state"], reference["state"])}
        outs.append(out | {"wall_s": result["wall_s"] + reference_s})
    if len(outs) == 1:
        outs[0]["wall_s"] = time.perf_counter() - start
    return outs
