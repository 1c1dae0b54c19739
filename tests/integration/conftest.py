"""Torchrun launches shared between tests (issue 24: ``make test`` in 6 minutes on 2 cores).

Starting a run's processes costs more than its two training steps: each rank imports torch and
forms its process group (about 2.5 s of CPU per rank; a tiny model's steps take under one). So the
runs the selected tests declare are executed together, one launch per world size
(``symtensor.runtime.launch.run_specs``: the workers run them in sequence, each recorded on its
own, and each single-process reference is computed once), when the first of those tests needs
one; every test then judges its own run as before. A test declares its run with a marker:

    ``@pytest.mark.launch(model, spec, optimizer="sgd")``: ``run_spec``'s arguments; the test's
        ``launched`` fixture gives ``.spec``, ``.optimizer`` and ``.result`` (``run_spec``'s).
    ``@pytest.mark.launch_cli(argv)``: a ``symtensor run`` command line; the test runs it inside
        ``launches.serving()``, where the command's ``run_spec`` call returns the shared result
        (found once by running the command up to that call, so the command plans the run exactly
        as it does when judged). Everything else the command does runs unchanged.

A test selected alone (``-k llama-4``) launches only its own run. A call that no marker declared
runs on its own launch, and so does every run of a launch that failed: each test still fails (or
passes) on its own, and a warning names the shared launch's error.

Under pytest-xdist (``-n 2``, the Makefile's) the modules that start processes (``TORCHRUN``) run
on one worker, one test at a time, so that their runs launch together there while the other
worker runs the CPU-bound tests (the fuzz cases, the searches) one by one. xdist's own
``--dist loadgroup`` does not group under pytest 9.2 (pytest-xdist issue 1386: it writes the
group into a node id field that pytest no longer reads), hence ``pytest_xdist_make_scheduler``.
"""

from __future__ import annotations

import json
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

from symtensor.runtime.launch import run_spec as launch_alone  # (torch is imported when a run starts)

# the modules whose tests start torchrun or worker processes (the ``dist`` marker)
TORCHRUN = ("test_run.py", "test_runtime_dist.py", "test_run_moe_folding.py", "test_run_faults.py",
            "test_profile_runs.py")


def pytest_configure(config):
    config.addinivalue_line("markers", "launch(model, spec, optimizer='sgd'): a run_spec run, launched with others")
    config.addinivalue_line("markers", "launch_cli(argv): a `symtensor run` command, its run launched with others")


def pytest_collection_modifyitems(config, items):
    """A test that starts processes outside ``TORCHRUN`` would share its worker's cores unseen."""
    for item in items:
        if any(item.get_closest_marker(m) for m in ("dist", "launch", "launch_cli")) and item.path.name not in TORCHRUN:
            raise pytest.UsageError(f"{item.nodeid} starts processes: add {item.path.name} to conftest.TORCHRUN")


@pytest.hookimpl(optionalhook=True)  # (a pytest-xdist hook)
def pytest_xdist_make_scheduler(config, log):
    """``--dist load`` (``-n N`` alone), except that the ``TORCHRUN`` modules are one unit of work:
    one worker runs them in order, the others the remaining tests, as each becomes free."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TorchrunApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "torchrun" if nodeid.split("::")[0].rsplit("/", 1)[-1] in TORCHRUN else nodeid

    return TorchrunApart(config, log)


def _key(model, spec, steps=2, optimizer="sgd", nproc=None, seed=0, timeout_s=300, master_port=None,
         device="cpu") -> tuple:
    """A run_spec call's arguments (the defaults are run_spec's), comparable."""
    from symtensor.runtime import RunSpec

    spec = spec if isinstance(spec, RunSpec) else RunSpec.from_dict(spec)
    nproc = spec.world_size if nproc is None else nproc
    return (str(model), json.dumps(spec.to_dict(), sort_keys=True), steps, optimizer, nproc, seed, timeout_s,
            master_port, device)


class _Found(BaseException):
    """Stops a ``symtensor run`` command at its run_spec call (not an Exception: nothing catches it)."""


def _cli_run(argv: list[str]) -> dict | None:
    """The run_spec call the command ``argv`` makes, as keyword arguments (None: it makes none)."""
    from symtensor.cli import main
    from symtensor.runtime import launch

    found = {}

    def record(model, spec, **kwargs):
        found.update(kwargs, model=model, spec=spec)
        raise _Found

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "run_spec", record)
        try:
            main(argv)
        except _Found:
            return found
    return None


class Launches:
    """The shared runs of the selected tests: launched together on first use, then looked up."""

    def __init__(self, items):
        self.calls: dict[tuple, dict] = {}  # key -> run_spec's keyword arguments
        for item in items:
            for mark in item.iter_markers("launch"):
                call = _marked(mark)
                self.calls.setdefault(_key(**call), call)
            for mark in item.iter_markers("launch_cli"):
                call = _cli_run(list(mark.args[0]))
                if call is not None:
                    self.calls.setdefault(_key(**call), call)
        self.results: dict[tuple, dict] | None = None

    def _launch_all(self) -> None:
        """One launch per (world size, timeout, port, device); a failed one leaves its runs to run alone."""
        from symtensor.errors import PlanError
        from symtensor.runtime.launch import run_specs

        self.results, batches = {}, {}
        for key, call in self.calls.items():
            batches.setdefault(key[4:], []).append((key, call))
        for (nproc, _seed, timeout_s, master_port, device), batch in batches.items():
            runs = [{k: call[k] for k in ("model", "spec", "steps", "optimizer", "seed") if k in call}
                    for _, call in batch]
            try:
                results = run_specs(runs, nproc, timeout_s, master_port, device)
            except PlanError as exc:
                warnings.warn(f"the shared launch of {len(runs)} runs on {nproc} processes failed ({exc}); "
                              "each runs on its own", stacklevel=1)
                continue
            self.results |= {key: result for (key, _), result in zip(batch, results)}

    def run_spec(self, model, spec, **kwargs) -> dict:
        """``run_spec``'s result: the shared launch's when it ran this call, else a launch of its own."""
        if self.results is None:
            self._launch_all()
        result = self.results.get(_key(model, spec, **kwargs))
        return dict(result) if result is not None else launch_alone(model, spec, **kwargs)

    @contextmanager
    def serving(self):
        """``symtensor.runtime.launch.run_spec`` answered from the shared launches (``symtensor run``)."""
        from symtensor.runtime import launch

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(launch, "run_spec", self.run_spec)
            yield self


def _marked(mark) -> dict:
    model, spec = mark.args
    return {"model": model, "spec": spec, "steps": 2, "optimizer": mark.kwargs.get("optimizer", "sgd")}


@pytest.fixture(scope="session")
def launches(request) -> Launches:
    """The shared runs of the selected tests."""
    return Launches(request.session.items)


@dataclass
class Launched:
    spec: object
    optimizer: str
    result: dict


@pytest.fixture
def launched(request, launches) -> Launched:
    """This test's ``launch`` run and its result."""
    call = _marked(request.node.get_closest_marker("launch"))
    return Launched(call["spec"], call["optimizer"], launches.run_spec(**call))
