"""The torchrun entry point: train K steps of a parallel layout and record what happened.

Launch (``symtensor.runtime.launch.run_spec`` does this for you)::

    OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node 4 -m symtensor.runtime.worker \\
        --spec spec.json --model tiny-llama --steps 2 --optimizer sgd --out result.json

On GPUs (NCCL, one GPU per process, bf16 autocast; timed, no reference), add ``--device cuda``.
``symtensor run`` starts the same module itself (``symtensor.runtime.group``: one process group,
a rendezvous on 127.0.0.1, heartbeats) with the environment torchrun would set.

Several runs on one launch (one process group; torch is imported and the group formed once)::

    ... -m symtensor.runtime.worker --jobs jobs.json

``jobs.json``: a list of ``{"model", "spec", "steps", "optimizer", "seed", "out"}``, run in order;
rank 0 writes each run's ``out`` when it is done (``symtensor.runtime.launch.run_specs``).

And the single-process reference of the same run, without torchrun::

    python -m symtensor.runtime.worker --reference --spec spec.json --model tiny-llama --steps 2 --out ref.json

Every rank builds the same weights from ``--seed``, applies the spec, and trains on one fixed
synthetic global batch, cut over the data-parallel ranks. Rank 0 writes ``--out`` (JSON: losses,
collective bytes per step and rank, parameter checksums) and the gathered final parameters next to
it (``.pt``). ``train_reference`` is the single-process run the parallel one must reproduce.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from symtensor.errors import PlanError
from symtensor.models import load_model_config
from symtensor.runtime.group import ENV_DIR, ENV_FD, LOOPBACK, Heartbeat
from symtensor.runtime.spec import OPTIMIZERS, RunSpec, check_fits
from symtensor.runtime.torch_models import build_torch_model, loss_fn

SGD_LR, ADAMW_LR = 0.5, 0.01


def make_optimizer(params, name: str) -> torch.optim.Optimizer:
    """Plain SGD (lr 0.5) or AdamW (lr 0.01, weight decay 0.1); no clipping, so no collectives."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=SGD_LR)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=ADAMW_LR, weight_decay=0.1)
    raise PlanError(f"unknown optimizer {name!r}; use one of {', '.join(OPTIMIZERS)}")


def synthetic_batch(cfg, spec: RunSpec, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch: token ids [global_batch, seq] and next-token labels, from ``seed``."""
    gen = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, cfg.vocab, (spec.global_batch, spec.seq + 1), generator=gen)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def batch_index(spec: RunSpec, coords: dict[str, int]) -> int:
    """This rank's slice of the batch: its coordinates on the batch axes, row-major in mesh order."""
    index = 0
    for axis in spec.batch_axes:
        index = index * spec.axis_size_of(axis) + coords[axis]
    return index


def local_slice(x: torch.Tensor, spec: RunSpec, coords: dict[str, int]) -> torch.Tensor:
    per = spec.global_batch // spec.batch_cut
    start = batch_index(spec, coords) * per
    return x[start:start + per]


def _mean_loss(loss: torch.Tensor | None, device: torch.device) -> float:
    """The global mean loss from the ranks that own one (each the mean of an equal-sized slice)."""
    pair = torch.tensor([0.0, 0.0], dtype=torch.float64, device=device)
    if loss is not None:
        pair += torch.tensor([loss.item(), 1.0], dtype=torch.float64)
    dist.all_reduce(pair)
    return (pair[0] / pair[1]).item()


def train_parallel(cfg, spec: RunSpec, steps: int, optimizer: str, seed: int = 0, on_phase=None,
                   device: str = "cpu", meshes: dict | None = None) -> dict | None:
    """Train ``steps`` steps of ``spec`` on this torchrun rank; the result on rank 0, else None.

    On ``cuda`` (NCCL) the steps run under bf16 autocast (fp32 weights, as mixed-precision training
    holds them), each step is timed between device synchronisations and the peak memory of every
    rank is kept; the parameters are not gathered (no single-process reference on GPUs).

    Args:
        cfg: the model config.
        spec: the layout; its mesh product must be the world size.
        steps: optimizer steps.
        optimizer: ``sgd`` or ``adamw``.
        seed: weight and data seed.
        on_phase: called with where the rank is (``step 2: optimizer``), for its heartbeat.
        device: ``cpu`` or ``cuda`` (this rank's GPU, ``LOCAL_RANK``).
        meshes: the DeviceMeshes of earlier runs in this process group, by axes: a run on the same
            axes reuses its mesh. torch caches DTensor redistributions by the mesh's value (its
            ranks and axis names), and a cached one issues its collectives on the mesh it was made
            with, whose groups a new mesh's byte count would not know (bytes ``@?``).
    """
    from symtensor.runtime.apply import axis_of_group, build_mesh, parallelize

    on_phase = on_phase or (lambda where: None)
    on_phase("startup: building the model")
    from symtensor.runtime.commcount import CommCounter

    check_fits(spec, cfg, dist.get_world_size())
    here = torch.device(device, torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    meshes = {} if meshes is None else meshes
    if (device, spec.mesh) not in meshes:
        meshes[(device, spec.mesh)] = build_mesh(spec, device)
    mesh = meshes[(device, spec.mesh)]
    coords = {axis: mesh.get_local_rank(axis) for axis, _ in spec.mesh}
    ids, labels = (local_slice(t, spec, coords).to(here) for t in synthetic_batch(cfg, spec, seed))
    run = parallelize(build_torch_model(cfg, seed).to(here), spec, mesh, cfg, local_batch=ids.shape[0])
    opt = make_optimizer(run.model.parameters(), optimizer)
    groups = axis_of_group(mesh, spec)
    losses, comm, step_s = [], [], []
    for step in range(1, steps + 1):
        _synchronize(here)
        start = time.perf_counter()
        with CommCounter(groups) as counter:  # one training step: forward, backward, optimizer
            on_phase(f"step {step}: forward and backward")
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=here.type == "cuda"):
                loss = run.forward_backward(ids, labels)
            on_phase(f"step {step}: gradient synchronisation")
            run.sync_gradients()
            on_phase(f"step {step}: optimizer")
            opt.step()
            opt.zero_grad()
        _synchronize(here)
        step_s.append(time.perf_counter() - start)
        on_phase(f"step {step}: loss")
        losses.append(_mean_loss(loss, here))
        comm.append(counter.summary())
    on_phase("gathering the final parameters")
    state = run.full_state() if here.type == "cpu" else None
    peak = torch.cuda.max_memory_allocated(here) if here.type == "cuda" else None
    every = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object((comm, peak), every, dst=0)
    if dist.get_rank() != 0:
        return None
    out = {"model": cfg.name, "spec": spec.to_dict(), "steps": steps, "optimizer": optimizer, "seed": seed,
           "world_size": dist.get_world_size(), "losses": losses, "device": here.type, "step_times_s": step_s,
           # comm[step][rank] = {"bytes": {kind: n}, "calls": {...}, "bytes_by_axis": {...}}
           "comm": [[every[r][0][s] for r in range(len(every))] for s in range(steps)],
           "peak_memory_bytes": [rank[1] for rank in every] if here.type == "cuda" else None}
    return out | ({"checksums": checksums(state), "state": state} if state is not None else {})


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_reference(cfg, spec: RunSpec, steps: int, optimizer: str, seed: int = 0) -> dict:
    """The same training in one process without any parallelism: the ground truth.

    Args:
        cfg: the model config.
        spec: the layout; only ``global_batch`` and ``seq`` are used.
        steps: optimizer steps.
        optimizer: ``sgd`` or ``adamw``.
        seed: weight and data seed.
    """
    model = build_torch_model(cfg, seed)
    ids, labels = synthetic_batch(cfg, spec, seed)
    opt = make_optimizer(model.parameters(), optimizer)
    losses = []
    for _ in range(steps):
        loss = loss_fn(model(ids), labels)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    state = {k: v.detach().clone() for k, v in model.named_parameters()}
    return {"losses": losses, "state": state, "checksums": checksums(state)}


def checksums(state: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Per parameter: [sum, sum of absolute values], in float64."""
    return {k: [v.double().sum().item(), v.double().abs().sum().item()] for k, v in sorted(state.items())}


def _write(result: dict, out: Path) -> None:
    if "state" in result:  # a CPU run's gathered parameters, for the comparison with one process
        state_path = out.with_suffix(".pt")
        torch.save(result.pop("state"), state_path)
        result["state_file"] = str(state_path)
    out.write_text(json.dumps(result, indent=1))


def _init_process_group(device: str = "cpu") -> None:
    """gloo (``cpu``) or NCCL (``cuda``, this rank's GPU: ``LOCAL_RANK``) over the launcher's
    rendezvous: rank 0 serves the TCPStore on the socket the launcher bound to 127.0.0.1
    (``symtensor.runtime.group``); under torchrun, its environment."""
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    if ENV_DIR not in os.environ:  # torchrun
        dist.init_process_group(backend)
        return
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    fd = int(os.environ[ENV_FD]) if rank == 0 else None
    store = dist.TCPStore(LOOPBACK, int(os.environ["MASTER_PORT"]), world, is_master=rank == 0,
                          master_listen_fd=fd, wait_for_workers=False)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", help="RunSpec JSON file")
    parser.add_argument("--model", help="model preset or config.json")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="result JSON (rank 0 writes it)")
    parser.add_argument("--jobs", help="instead of --spec, --model, ...: a JSON list of runs, each with those keys")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu (gloo) or cuda (NCCL)")
    parser.add_argument("--reference", action="store_true",
                        help="run train_reference in this one process instead (no torchrun)")
    args = parser.parse_args(argv)
    if args.jobs is None and None in (args.spec, args.model, args.out):
        parser.error("give --spec, --model and --out, or --jobs")
    jobs = json.loads(Path(args.jobs).read_text()) if args.jobs else [
        {"model": args.model, "spec": json.loads(Path(args.spec).read_text()), "steps": args.steps,
         "optimizer": args.optimizer, "seed": args.seed, "out": args.out}]
    if args.reference:
        for job in jobs:
            cfg, spec = load_model_config(job["model"]), RunSpec.from_dict(job["spec"])
            result = train_reference(cfg, spec, job["steps"], job["optimizer"], job["seed"])
            _write(result | {"model": cfg.name, "spec": spec.to_dict(), "steps": job["steps"]}, Path(job["out"]))
        return
    beat = Heartbeat.from_env().start()
    beat.at("startup: rendezvous")
    _init_process_group(args.device)
    meshes = {}
    try:
        for i, job in enumerate(jobs):
            tag = f" (run {i + 1} of {len(jobs)})" if len(jobs) > 1 else ""
            start = time.perf_counter()
            result = train_parallel(load_model_config(job["model"]), RunSpec.from_dict(job["spec"]), job["steps"],
                                    job["optimizer"], job["seed"], on_phase=lambda where, tag=tag: beat.at(where + tag),
                                    device=args.device, meshes=meshes)
            if result is not None:
                beat.at("writing the result" + tag)
                _write(result | {"wall_s": time.perf_counter() - start}, Path(job["out"]))
            beat.at("barrier" + tag)
            dist.barrier()  # the next run (or the teardown) together, after rank 0 has written
    finally:
        dist.destroy_process_group()


def _leave() -> None:
    """Exit at once, without the interpreter's teardown: with torch loaded it takes seconds (more
    on a loaded machine), during which the heartbeat thread no longer runs, so the launcher would
    call this rank stalled after all was done. Everything is written and the group destroyed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
    _leave()
