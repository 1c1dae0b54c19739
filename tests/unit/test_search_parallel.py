"""The search's two halves in a forked child and in this process give the plan the serial search
gives; the child's errors reach the caller."""

from __future__ import annotations

import pytest

from symtensor.errors import PlanError
from symtensor.hardware import load_cluster
from symtensor.models import load_model_config
from symtensor.search import parallel, search

pytestmark = pytest.mark.skipif(not parallel.can_fork(), reason="no fork here: the search runs serially")


@pytest.mark.parametrize("name, layers, devices, gb, seq", [
    ("llama3-8b", None, 64, 64, 2048),  # seeds || partition; polishing changes it: the child's rollbacks
    ("llama2-7b", None, 64, 1024, 4096),  # the same; polishing changes nothing: this process's rollbacks
    # over FULL_MESH devices: the seed scan split by TP degree (1, 4 | 2, 8 here), then the child
    # refines the best seed while this process partitions (two layers: the same split, half the time)
    ("mixtral-8x7b", 2, 256, 512, 4096)])
def test_parallel_search_equals_serial(monkeypatch, name, layers, devices, gb, seq):
    cfg, cl = load_model_config(name), load_cluster("dgx-h100", devices=devices)
    cfg = cfg.replace(layers=layers) if layers else cfg
    forked = search(cfg, cl, gb, seq)
    monkeypatch.setenv("SYMTENSOR_SERIAL", "1")
    assert not parallel.can_fork()
    serial = search(cfg, cl, gb, seq)
    assert forked.report.step_time_s == serial.report.step_time_s
    assert forked.train == serial.train and forked.layouts == serial.layouts
    assert forked.evaluations == serial.evaluations


def test_background_returns_and_raises():
    assert parallel.Background(lambda: {"x": [1, 2]}).result() == {"x": [1, 2]}

    def fails():
        raise PlanError("pp=3 does not divide the 8 devices")

    with pytest.raises(PlanError, match="does not divide"):
        parallel.Background(fails).result()


def test_child_is_reaped_when_this_process_fails_first():
    import os
    import time

    with (pytest.raises(ValueError, match="the partition failed"),
          parallel.Background(lambda: time.sleep(30) or 1) as job):
        pid = job.pid
        raise ValueError("the partition failed")
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # already reaped


def test_a_child_that_dies_is_replaced_by_this_process():
    import os

    parent = os.getpid()

    def dies_in_the_child():
        if os.getpid() != parent:
            os._exit(9)  # like the out-of-memory killer: no result, no exception
        return "computed here"

    assert parallel.Background(dies_in_the_child).result() == "computed here"
