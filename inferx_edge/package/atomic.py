"""Write a file so that readers see the old contents or the new, never a half-written file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def _sweep_parts(path: Path) -> None:
    """Remove ``.part`` files of ``path`` left by a writer that was killed outright (its pid is gone)."""
    from inferx_edge.package.scratch import _alive

    prefix = f".{path.name}."
    with contextlib.suppress(OSError):
        for p in path.parent.iterdir():
            rest = p.name[len(prefix) :] if p.name.startswith(prefix) and p.name.endswith(".part") else ""
            pid = rest.split(".", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                p.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb"):
    """Yield a file opened on a temporary name beside ``path``; rename it over ``path`` on success,
    delete it on any error (Ctrl-C included). The file gets the usual permissions (0666 & ~umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_parts(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
