"""Scratch directories that never outlive their process for long.

Each is named ``inferx_edge-<kind>-<pid>-<random>`` in the temporary directory. It is removed when its
``with`` block ends (an exception or Ctrl-C / SIGTERM included); one left by a process that was killed
outright (SIGKILL, power loss) is removed by the next :func:`scratch_dir` of the same kind, once its
process is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path

_NAME = re.compile(r"inferx_edge-(?P<kind>[a-z]+)-(?P<pid>\d+)-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep(kind: str, base: str | os.PathLike | None = None) -> list[Path]:
    """Remove ``kind`` scratch directories (and ``.part`` files) whose process is gone; returns them."""
    base = Path(base or tempfile.gettempdir())
    removed = []
    with contextlib.suppress(OSError):
        for p in base.iterdir():
            m = _NAME.match(p.name)
            if m and m.group("kind") == kind and int(m.group("pid")) != os.getpid() and not _alive(int(m.group("pid"))):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def make_scratch(kind: str, base: str | os.PathLike | None = None) -> Path:
    """A new scratch directory of ``kind`` (stale ones swept first); the caller removes it."""
    sweep(kind, base)
    return Path(tempfile.mkdtemp(prefix=f"inferx_edge-{kind}-{os.getpid()}-", dir=base))


@contextlib.contextmanager
def scratch_dir(kind: str, base: str | os.PathLike | None = None):
    """A scratch directory for the ``with`` block (see the module docstring)."""
    path = make_scratch(kind, base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
