"""The processes of one ``symtensor run``: started together, watched by heartbeat, stopped together.

Launcher side (``WorkerGroup``):

    rendezvous   the launcher binds 127.0.0.1 (port ``--master-port``, or one the system picks) and
                 hands the listening socket to rank 0, whose TCPStore serves on it; gloo's own
                 sockets use the loopback interface. Nothing listens beyond this machine.
    one group    every worker is in one process group, led by rank 0; each asks the kernel to kill
                 it when the launcher dies (a parent-death signal), so a SIGKILLed launcher leaves
                 nothing behind.
    heartbeat    each worker's heartbeat thread writes ``beat<rank>`` every second: the time, and
                 where its main thread is (``step 3: forward``) since when. A rank whose heartbeat
                 is older than ``stall_s`` (stopped, frozen) or that stays in one place longer than
                 ``timeout_s`` (hung in a collective or a loop; places named ``startup: ...`` get at
                 least STARTUP_S) stops the run, named with where it was. The launcher beats too
                 (``launcher.beat``); a worker whose launcher stopped beating (SIGSTOP, a frozen
                 terminal) exits.
    stopping     on an error, a stall, Ctrl-C or SIGTERM: SIGTERM to the group, SIGKILL after 2 s,
                 then every worker is reaped.

Worker side (``Heartbeat``): ``Heartbeat.from_env()`` in the worker, ``beat.at("step 1: forward")``
as it goes. Without the launcher's environment (a plain torchrun launch) it does nothing.

Unlike torchrun, which starts every worker in a session of its own, this keeps the run's processes
in one group that one signal reaches; the worker still runs under torchrun as well (see
``symtensor.runtime.worker``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from symtensor.errors import PlanError
from symtensor.output import printable

LOOPBACK = "127.0.0.1"
BEAT_S = 1.0  # a worker's heartbeat period
POLL_S = 0.2  # the launcher's
STALL_S = 10.0  # a heartbeat older than this (or than half of timeout_s) is a stalled rank
STARTUP_S = 120.0  # the first heartbeat may take this long (importing torch on a loaded machine)
GRACE_S = 5.0  # after one rank fails, the others' time to exit on their own
ENV_DIR, ENV_STALL, ENV_FD, ENV_LAUNCHER = ("SYMTENSOR_RUN_DIR", "SYMTENSOR_STALL_S", "SYMTENSOR_STORE_FD",
                                            "SYMTENSOR_LAUNCHER_PID")


def listen(port: int | None) -> socket.socket:
    """A socket listening on 127.0.0.1:``port`` (None: a free port); a taken port is a PlanError."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine; a listener is not
    try:
        sock.bind((LOOPBACK, port or 0))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        why = ("is in use by another process" if exc.errno == errno.EADDRINUSE
               else f"cannot be bound ({exc.strerror})")
        raise PlanError(f"--master-port {port}: {LOOPBACK}:{port} {why}; choose another port, or omit "
                        "--master-port to let the system pick a free one") from None
    return sock


def _parent_death_signal(parent: int):
    """A preexec_fn: the child gets SIGKILL when ``parent`` dies (Linux), or exits if it already has."""
    libc = None
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)

    def preexec():
        if libc is not None:
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _read_beat(path: Path):
    """(beat time, since, where) from a heartbeat file, or None before the first beat."""
    try:
        beat, since, where = path.read_text().split(" ", 2)
        return float(beat), float(since), where.strip()
    except (OSError, ValueError):
        return None


class WorkerGroup:
    """``nproc`` workers running ``cmd`` in one process group, rendezvous on 127.0.0.1.

    Args:
        cmd: the worker command line (the same for every rank; ranks come from the environment).
        nproc: processes.
        run_dir: the directory for heartbeats and logs (``rank<r>.log``).
        timeout_s: how long a rank may stay in one place of its work.
        master_port: the rendezvous port, or None for a free one.
        env: the workers' base environment.

    Example:
        >>> with WorkerGroup(cmd, 2, run_dir, 300) as group:   # doctest: +SKIP
        ...     codes = group.wait()
    """

    def __init__(self, cmd: list[str], nproc: int, run_dir: Path, timeout_s: float, master_port: int | None = None,
                 env: dict | None = None):
        self.cmd, self.nproc, self.run_dir = cmd, nproc, Path(run_dir)
        self.timeout_s, self.master_port = timeout_s, master_port
        self.stall_s = min(STALL_S, timeout_s / 2)
        self.env = dict(os.environ if env is None else env)
        self.procs: list[subprocess.Popen] = []
        self.culprit: int | None = None  # the rank that failed first (a signal it got before any exit)
        self._old_term = None

    # -- starting -------------------------------------------------------------------------------
    def __enter__(self) -> WorkerGroup:
        sock = listen(self.master_port)
        if threading.current_thread() is threading.main_thread():
            self._old_term = signal.signal(signal.SIGTERM, _interrupt)
        try:
            self._start(sock)
        except BaseException:
            self.stop()
            raise
        finally:
            sock.close()  # rank 0 holds its own copy
        return self

    def _start(self, sock: socket.socket) -> None:
        port = sock.getsockname()[1]
        base = dict(self.env, MASTER_ADDR=LOOPBACK, MASTER_PORT=str(port), WORLD_SIZE=str(self.nproc),
                    LOCAL_WORLD_SIZE=str(self.nproc), GROUP_RANK="0", **{ENV_DIR: str(self.run_dir),
                    ENV_STALL: str(self.stall_s), ENV_LAUNCHER: str(os.getpid())})
        if Path("/sys/class/net/lo").exists():
            base["GLOO_SOCKET_IFNAME"] = "lo"  # gloo's pair sockets on loopback, not the host's address
        self.beat()
        preexec = _parent_death_signal(os.getpid())
        for rank in range(self.nproc):
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            fds = ()
            if rank == 0:
                env[ENV_FD] = str(sock.fileno())
                fds = (sock.fileno(),)
            with open(self.log(rank), "wb") as log:
                self.procs.append(subprocess.Popen(
                    self.cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=fds, preexec_fn=preexec, process_group=0 if rank == 0 else self.procs[0].pid))
        self.started = time.time()

    def log(self, rank: int) -> Path:
        return self.run_dir / f"rank{rank}.log"

    def beat(self) -> None:
        """The launcher's heartbeat, which the workers watch."""
        (self.run_dir / "launcher.beat").touch()

    # -- watching -------------------------------------------------------------------------------
    def wait(self) -> list[int]:
        """Wait for every worker; their exit statuses. A stalled or hung rank stops the run (PlanError)."""
        failed_at = None
        while True:
            codes = [p.poll() for p in self.procs]
            if all(c is not None for c in codes):
                return codes
            if failed_at is None and any(c not in (None, 0) for c in codes):
                failed_at = time.time()
                failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
                self.culprit = next((r for r in failed if codes[r] < 0), failed[0])
            if failed_at is not None and time.time() - failed_at > GRACE_S:
                self.stop()
                return [p.returncode for p in self.procs]
            if failed_at is None:
                self._check_beats(codes)
            self.beat()
            time.sleep(POLL_S)

    def _check_beats(self, codes: list[int | None]) -> None:
        """A stopped rank first (its peers then wait in a collective and look hung), then a hung one."""
        now, startup = time.time(), max(self.timeout_s, STARTUP_S)
        beats = {rank: _read_beat(self.run_dir / f"beat{rank}") for rank, code in enumerate(codes) if code is None}
        for rank, beat in beats.items():
            if beat is None and now - self.started > startup:
                self._fail(rank, f"did not start within {startup:.0f} s (no heartbeat)")
        # the rank that went silent first: a peer blocked in a collective with it may go silent too, later
        stalled = sorted((beat[0], rank) for rank, beat in beats.items() if beat is not None
                         and now - beat[0] > self.stall_s)
        if stalled:
            last, rank = stalled[0]
            self._fail(rank, f"stalled: no heartbeat for {now - last:.0f} s, last at {beats[rank][2]}")
        for rank, beat in beats.items():
            limit = startup if beat and beat[2].startswith("startup") else self.timeout_s
            if beat is not None and now - beat[1] > limit:
                self._fail(rank, f"made no progress for {now - beat[1]:.0f} s (--timeout {self.timeout_s:g}) at "
                                 f"{beat[2]}")

    def _fail(self, rank: int, what: str):
        self.stop()
        raise PlanError(f"rank {rank} {printable(what)}; stopped the run's {self.nproc} processes; "
                        f"its log: {self.log(rank)}")

    # -- stopping -------------------------------------------------------------------------------
    def stop(self) -> None:
        """SIGTERM to the group, SIGKILL 2 s later, and reap every worker."""
        if self.procs:
            for sig, wait_s in ((signal.SIGCONT, 0), (signal.SIGTERM, 2.0), (signal.SIGKILL, 10.0)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.procs[0].pid, sig)
                deadline = time.time() + wait_s
                while any(p.poll() is None for p in self.procs) and time.time() < deadline:
                    time.sleep(0.05)
            for p in self.procs:  # a worker that left the group (it should not) is killed alone
                if p.poll() is None:
                    p.kill()
                    p.wait()

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._old_term is not None:
            signal.signal(signal.SIGTERM, self._old_term)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


class Heartbeat:
    """A worker's heartbeat (see the module docstring); inert outside a ``WorkerGroup``."""

    def __init__(self, path: Path | None, stall_s: float = STALL_S, launcher: int | None = None):
        self.path, self.stall_s, self.launcher = path, stall_s, launcher
        self.where, self.since = "starting", time.time()

    @classmethod
    def from_env(cls, env=os.environ) -> Heartbeat:
        if ENV_DIR not in env:
            return cls(None)
        return cls(Path(env[ENV_DIR]) / f"beat{env.get('RANK', '0')}", float(env.get(ENV_STALL, STALL_S)),
                   int(env[ENV_LAUNCHER]))

    def at(self, where: str) -> None:
        """Where this rank's main thread is now (shown when it stalls)."""
        self.where, self.since = where, time.time()

    def start(self) -> Heartbeat:
        if self.path is not None:
            self._write()
            threading.Thread(target=self._loop, name="symtensor-heartbeat", daemon=True).start()
        return self

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{time.time():.3f} {self.since:.3f} {self.where}")
        os.replace(tmp, self.path)  # the launcher never reads half a beat

    def _loop(self) -> None:
        launcher_beat = self.path.parent / "launcher.beat"
        while True:
            time.sleep(BEAT_S)
            try:
                self._write()
                quiet = time.time() - launcher_beat.stat().st_mtime
            except OSError:  # the run directory is gone: the launcher has finished with us
                os._exit(3)
            if os.getppid() != self.launcher or quiet > self.stall_s:
                print(f"symtensor worker: the launcher stopped responding ({quiet:.0f} s); exiting", file=sys.stderr,
                      flush=True)
                os._exit(3)
