"""Two independent halves of the search at once: a forked child computes one while this process
computes the other (the planner's machines have at least two cores; the search is CPU-bound
Python, so threads would not help).

Forking is used only where it is safe and cheap: on Linux, unless ``SYMTENSOR_SERIAL=1``, and
only for work that does not call into torch (the planner does not fork when it plans a captured
model, whose graphs torch.export builds on demand: a forked torch may hold locks of its worker
threads). Elsewhere the work runs in this process, with the same result: the halves share
nothing but their inputs. A forked child does not fork again: it runs beside its parent, which
already keeps the other core busy (``search.guarantee`` searches the level below in a child while
this level's grid runs), so its own halves run one after the other.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import sys
import traceback

_CHILD = False  # whether this process is a Background's forked child


def can_fork() -> bool:
    return (not _CHILD and sys.platform.startswith("linux") and hasattr(os, "fork")
            and os.environ.get("SYMTENSOR_SERIAL", "") not in ("1", "true", "yes"))


class Background:
    """``fn()`` running in a forked child; ``result()`` waits for it and returns its value (or
    raises what it raised); later calls return the same value. Serial fallback: ``fn`` runs on the
    first ``result()``, also when the child died without a result. Use it as a context manager, so
    that a child is not left behind when this process fails first."""

    _NONE = object()  # no value yet

    def __init__(self, fn, fork: bool = True):
        self.fn, self.pid, self.fd = fn, None, None
        self._value = Background._NONE
        if not (fork and can_fork()):
            return
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: compute, send, leave without running the parent's cleanup
            global _CHILD
            _CHILD, code = True, 0
            try:
                os.close(r)
                try:
                    payload = pickle.dumps((True, fn()), protocol=pickle.HIGHEST_PROTOCOL)
                except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
                    try:
                        payload = pickle.dumps((False, e))
                    except Exception:  # an exception that does not pickle: send its text
                        payload = pickle.dumps((False, RuntimeError(traceback.format_exc())))
                with os.fdopen(w, "wb") as f:
                    f.write(payload)
            except BaseException:  # noqa: BLE001
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        self.pid, self.fd = pid, r

    def __enter__(self) -> Background:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """If this process failed before collecting the child, stop and reap it."""
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass
            os.close(self.fd)
            self.pid = None

    @property
    def forked(self) -> bool:
        """Whether ``fn`` runs in a forked child (until its result is received)."""
        return self.pid is not None

    def ready(self) -> bool:
        """Whether ``result()`` would not wait for the child: it has sent its result (or there is
        no child, and ``result()`` computes it here, or has)."""
        return self.pid is None or bool(select.select([self.fd], [], [], 0)[0])

    def result(self):
        if self._value is Background._NONE:
            self._value = self._receive()
        return self._value

    def _receive(self):
        if self.pid is None:
            return self.fn()
        with os.fdopen(self.fd, "rb") as f:
            payload = f.read()
        os.waitpid(self.pid, 0)
        self.pid = None
        if not payload:  # the child died without a word (killed, out of memory): do it here
            return self.fn()
        ok, value = pickle.loads(payload)
        if not ok:
            raise value
        return value
