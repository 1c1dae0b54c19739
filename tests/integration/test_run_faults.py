"""`symtensor run` under faults: whatever happens to the launcher or a worker, no process of the run
survives and no port stays open (issue "Hardening": a hung worker left orphaned after a 300 s wait
and a traceback; Ctrl-C left a worker running; the rendezvous listened on every interface).

Each case starts ``symtensor run tiny-llama --devices 2`` for many steps in a subprocess, waits
until both workers train, does one thing to it, then checks that the workers are gone and the
rendezvous port is free. Linux only (it reads /proc).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [pytest.mark.dist, pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs /proc")]

TIMEOUT_S = 8  # --timeout: a worker without a heartbeat for 4 s is stalled


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of a live process, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[2])


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = _stat(int(entry.name))
            if st and st[1] == pid and st[0] not in ("Z", "X"):
                out.append(int(entry.name))
    return sorted(out)


def _in_group(pgid: int) -> list[int]:
    return [int(e.name) for e in Path("/proc").iterdir()
            if e.name.isdigit() and (st := _stat(int(e.name))) and st[2] == pgid and st[0] not in ("Z", "X")]


def _listeners(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) listening on ``port``."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:
                out.append(addr)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _run_dir(pid: int) -> Path | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"SYMTENSOR_RUN_DIR="):
            return Path(item.split(b"=", 1)[1].decode())
    return None


def _training(run_dir: Path) -> bool:
    beats = [run_dir / f"beat{r}" for r in range(2)]
    return all(b.exists() and " step " in f" {b.read_text()}" for b in beats)


def _as_on_a_terminal():
    """The launcher as a terminal's foreground process starts: Ctrl-C (SIGINT) at its default action. A test run
    started in the background of a non-interactive shell (``.ci/run &``) inherits SIGINT ignored, which Python then
    keeps ignored, and the Ctrl-C test would wait on a launcher that never sees it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def started_run():
    """A launcher with two workers in their training loop; yields (launcher, workers, port)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "symtensor.cli", "run", "tiny-llama", "--devices", "2", "--steps", "100000",
           "--timeout", str(TIMEOUT_S), "--master-port", str(port)]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_as_on_a_terminal)
    run_dir = None
    try:
        workers = _wait(lambda: len(_children(launcher.pid)) == 2 and _children(launcher.pid), 120, "two workers")
        run_dir = _wait(lambda: _run_dir(workers[0]), 10, "the run directory")
        _wait(lambda: _training(run_dir), 120, "both workers training")
        yield launcher, workers, port
    finally:
        for pid in [launcher.pid] + _children(launcher.pid):
            if _alive(pid):
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        if run_dir is not None:  # kept for its logs when the run failed
            shutil.rmtree(run_dir, ignore_errors=True)


def _assert_nothing_left(workers: list[int], port: int, within: float = 20):
    pgid = workers[0]
    _wait(lambda: not any(_alive(w) for w in workers) and not _in_group(pgid), within, "the workers to exit")
    _wait(lambda: not _listeners(port), within, f"port {port} to close")


def test_rendezvous_listens_on_loopback_only_and_workers_share_one_group(started_run):
    launcher, workers, port = started_run
    assert set(_listeners(port)) == {"0100007F"}  # 127.0.0.1, no other interface
    assert len({_stat(w)[2] for w in workers}) == 1 and _stat(workers[0])[2] == workers[0]
    assert _stat(launcher.pid)[2] != workers[0]  # Ctrl-C on the terminal reaches the launcher, which stops them
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 130 and err.strip() == "error: interrupted", err
    _assert_nothing_left(workers, port)


def test_sigkill_to_the_launcher_kills_the_workers(started_run):
    launcher, workers, port = started_run
    launcher.kill()
    launcher.wait(timeout=10)
    _assert_nothing_left(workers, port)


def test_sigstop_to_the_launcher_makes_the_workers_exit(started_run):
    launcher, workers, port = started_run
    launcher.send_signal(signal.SIGSTOP)
    try:
        _assert_nothing_left(workers, port, within=TIMEOUT_S + 20)
    finally:
        launcher.send_signal(signal.SIGCONT)


def test_a_stopped_worker_is_reported_and_the_run_stopped(started_run):
    launcher, workers, port = started_run
    os.kill(workers[1], signal.SIGSTOP)
    _, err = launcher.communicate(timeout=TIMEOUT_S + 30)
    lines = err.strip().splitlines()
    assert launcher.returncode == 2 and len(lines) == 1, err
    assert lines[0].startswith("error: rank 1 stalled: no heartbeat") and "step" in lines[0], err
    _assert_nothing_left(workers, port)


def test_a_killed_worker_is_reported_and_the_run_stopped(started_run):
    launcher, workers, port = started_run
    os.kill(workers[0], signal.SIGKILL)
    _, err = launcher.communicate(timeout=60)
    lines = err.strip().splitlines()
    assert launcher.returncode == 2 and len(lines) == 1, err
    assert "rank 0 of 2 was killed by SIGKILL" in lines[0], err
    _assert_nothing_left(workers, port)


def test_a_taken_master_port_is_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "symtensor.cli", "run", "tiny-llama", "--devices", "2",
                               "--master-port", str(port)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"--master-port {port}: 127.0.0.1:{port} is in use" in proc.stderr
