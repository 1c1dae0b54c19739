"""The output boundary: what reaches the terminal is text, and files are replaced atomically.

    printable(s)    control characters (ESC, newlines, bidi overrides, ...) escaped: ``\\x1b``
    shown(s)        printable, and rich markup in it escaped: a name ``[red]x`` prints as written
    target(p)       checks where a file will be written, before the work that produces it
    write_atomic    writes a temporary file beside the target, then renames it over the target

A symbolic link is never written through unless ``--force`` (``target`` then resolves it).

    >>> printable("a\\x1b[2Jb")
    'a\\\\x1b[2Jb'
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from symtensor.errors import PlanError


def printable(text) -> str:
    """``text`` with every non-printable character replaced by its Python escape."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def shown(text) -> str:
    """``text`` for a rich console: printable, and any markup in it printed literally."""
    from rich.markup import escape

    return escape(printable(text))


def target(path, flag: str, force: bool = False) -> Path:
    """Where ``flag`` (``--out``, ``--html``) will write: a file in an existing, writable directory.

    A symbolic link is refused, or with ``force`` resolved to the file it points to.
    """
    if not str(path).strip():
        raise PlanError(f"{flag}: the path is empty; give a file name")
    p = Path(path)
    if p.is_symlink():
        if not force:
            raise PlanError(f"{flag} {printable(p)} is a symbolic link; give another path, or add --force to write "
                            f"to the file it points to")
        p = Path(os.path.realpath(p))
    if p.is_dir():
        raise PlanError(f"{flag} {printable(p)} is a directory; give a file name inside it")
    if p.exists() and not stat.S_ISREG(p.stat().st_mode):
        raise PlanError(f"{flag} {printable(p)} is not a regular file; give a file path")
    parent = p.parent
    if not parent.is_dir():
        raise PlanError(f"{flag} {printable(p)}: the directory {printable(parent)} does not exist; create it first")
    try:  # the directory must take the temporary file write_atomic renames
        with tempfile.NamedTemporaryFile(dir=parent, prefix=f".{p.name}.", suffix=".check"):
            pass
    except OSError as exc:
        raise PlanError(f"{flag} {printable(p)}: cannot write in {printable(parent)} ({exc.strerror}); "
                        "give a path in a writable directory") from None
    return p


def write_atomic(path, text: str, what: str = "file") -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same directory and a rename, so
    that a reader never sees half a file; a symbolic link at ``path`` is refused."""
    p = Path(path)
    if p.is_symlink():
        raise PlanError(f"{what} {printable(p)} is a symbolic link; write elsewhere, or use --force")
    if p.is_dir():
        raise PlanError(f"{what} {printable(p)} is a directory; give a file name inside it")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, p)
        tmp = None
    except OSError as exc:
        raise PlanError(f"{what} {printable(p)}: cannot write it ({exc.strerror})") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return p
