"""File operations on the install directory, locally or over OpenSSH, behind one small interface.

Only what an atomic install needs: every step is either a rename or a symlink swap, so an interrupted
deploy leaves at most an ignored ``*.part`` file behind. Every failure is a :class:`DeployError` (exit
7) naming the step and the reason (a full disk, a destination that is a file, a ``current`` that is a
directory). Child processes (ssh, the local self-test) are killed when the deploy is interrupted
(Ctrl-C, SIGTERM) and, on Linux, when the deploying process dies (``PR_SET_PDEATHSIG``), so none is
left behind.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path, PurePosixPath

from inferx_edge.errors import DeployError  # noqa: F401  (re-exported)

TIMEOUT_S = 600


def _os_error(what: str, path, exc: OSError) -> DeployError:
    reason = "the disk is full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    return DeployError(f"{what} {path}: {reason}")


class LocalTransport:
    """The install directory is on this machine."""

    def __init__(self, root: str) -> None:
        self.root = PurePosixPath(root)
        self.describe = f"local directory {root}"

    def mkdir(self, path: PurePosixPath) -> None:
        root = Path(self.root)
        if root.exists() and not root.is_dir():
            raise DeployError(f"deploy destination {root} is a file, not a directory; nothing was installed")
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _os_error("cannot create", path, exc) from exc

    def put(self, local: Path, remote: PurePosixPath) -> None:
        try:
            shutil.copyfile(local, remote)
        except OSError as exc:
            raise _os_error("upload to", remote, exc) from exc

    def sha256(self, path: PurePosixPath) -> str:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()

    def verify(self, path: PurePosixPath, python: str, trust) -> None:
        from inferx_edge.errors import ArtifactError
        from inferx_edge.package.bundle import verify_artifact

        try:
            verify_artifact(path, trust=trust)
        except ArtifactError as exc:
            raise DeployError(f"the uploaded artifact failed verification on the device: {exc}") from exc

    def rename(self, src: PurePosixPath, dst: PurePosixPath) -> None:
        try:
            os.replace(src, dst)
        except OSError as exc:
            raise _os_error("cannot rename to", dst, exc) from exc

    def readlink(self, path: PurePosixPath) -> str | None:
        try:
            return os.readlink(path)
        except OSError:
            return None

    def set_link(self, link: PurePosixPath, target: str) -> None:
        if os.path.isdir(link) and not os.path.islink(link):
            raise DeployError(f"{link} is a directory, not a link; refusing to replace it (move it away first)")
        tmp = f"{link}.tmp"
        try:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            os.symlink(target, tmp)
            os.replace(tmp, link)  # rename(2) over the old link: atomic
        except OSError as exc:
            raise _os_error("cannot switch", link, exc) from exc

    def read_text(self, path: PurePosixPath) -> str | None:
        try:
            return Path(path).read_text()
        except (OSError, UnicodeDecodeError):
            return None

    def write_text(self, path: PurePosixPath, text: str) -> None:
        tmp = Path(f"{path}.tmp")
        try:
            tmp.write_text(text)
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise _os_error("cannot write", path, exc) from exc

    def remove(self, path: PurePosixPath) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _os_error("cannot remove", path, exc) from exc

    def selftest(self, artifact: PurePosixPath, python: str, repeat: int) -> str:
        cmd = [python, "-m", "inferx_edge", "run", str(artifact), "--repeat", str(repeat)]
        return _checked(cmd, "self-test")

    def cuda_status(self, python: str) -> dict | None:
        """:mod:`inferx_edge.runtime.cuda_status` as the device's Python reports it (None if it cannot)."""
        return _status(lambda: _checked([python, "-m", "inferx_edge.runtime.cuda_status"], "CUDA status"))


def check_login_part(value: str | None, what: str, dest: str) -> None:
    """ssh reads a host or user starting with '-' as an option: refuse it."""
    if value is not None and (value.startswith("-") or not value or any(c.isspace() for c in value)):
        from inferx_edge.errors import UsageError

        raise UsageError(f"bad ssh destination '{dest}': the {what} '{value}' would be read as an option or is empty")


class SSHTransport:
    """The install directory is on an OpenSSH host (``ssh`` from PATH, your ssh config applies).

    Every remote command quotes its paths; the upload streams the file through ``ssh ... 'cat > PATH'``
    (scp's SFTP mode would take a shell-quoted path literally), so paths with spaces or ``#`` work."""

    def __init__(self, user: str | None, host: str, port: int | None, root: str, options: list[str]) -> None:
        self.root = PurePosixPath(root)
        self.login = f"{user}@{host}" if user else host
        self.port = port
        self.options = ["-o", "BatchMode=yes", *options]
        self.describe = f"ssh {self.login}{':' + str(port) if port else ''}:{root}"

    def _argv(self, command: str) -> list[str]:
        return ["ssh", *self.options, *(["-p", str(self.port)] if self.port else []), "--", self.login, command]

    def _ssh(self, command: str, what: str, stdin=None) -> str:
        return _checked(self._argv(command), what, stdin=stdin)

    def mkdir(self, path: PurePosixPath) -> None:
        root, p = shlex.quote(str(self.root)), shlex.quote(str(path))
        self._ssh(
            f"if [ -e {root} ] && [ ! -d {root} ]; then echo 'the destination is a file, not a directory' >&2; "
            f"exit 1; fi; mkdir -p {p}",
            "prepare destination",
        )

    def put(self, local: Path, remote: PurePosixPath) -> None:
        with open(local, "rb") as f:
            self._ssh(f"cat > {shlex.quote(str(remote))}", "upload", stdin=f)

    def sha256(self, path: PurePosixPath) -> str:
        out = self._ssh(f"sha256sum {shlex.quote(str(path))}", "checksum")
        return out.split()[0] if out.strip() else ""

    def verify(self, path: PurePosixPath, python: str, trust) -> None:
        # the device's own trust store decides ($INFERX_TRUST_DIR or ~/.config/inferx_edge/trusted there)
        self._ssh(
            f"{shlex.quote(python)} -m inferx_edge inspect {shlex.quote(str(path))}", "verification on the device"
        )

    def rename(self, src: PurePosixPath, dst: PurePosixPath) -> None:
        self._ssh(f"mv -f {shlex.quote(str(src))} {shlex.quote(str(dst))}", "rename")

    def readlink(self, path: PurePosixPath) -> str | None:
        out = self._ssh(f"readlink {shlex.quote(str(path))} || true", "readlink").strip()
        return out or None

    def set_link(self, link: PurePosixPath, target: str) -> None:
        q, tmp = shlex.quote(str(link)), shlex.quote(f"{link}.tmp")
        # mv -T renames the new link over the old one (rename(2)): readers never see no link
        self._ssh(
            f"if [ -d {q} ] && [ ! -L {q} ]; then echo '{link} is a directory, not a link' >&2; exit 1; fi; "
            f"ln -sfn {shlex.quote(target)} {tmp} && mv -Tf {tmp} {q}",
            "switch link",
        )

    def read_text(self, path: PurePosixPath) -> str | None:
        out = self._ssh(f"cat {shlex.quote(str(path))} 2>/dev/null || true", "read")
        return out or None

    def write_text(self, path: PurePosixPath, text: str) -> None:
        import io

        tmp = shlex.quote(f"{path}.tmp")
        self._ssh(f"cat > {tmp} && mv -f {tmp} {shlex.quote(str(path))}", "write", stdin=io.BytesIO(text.encode()))

    def remove(self, path: PurePosixPath) -> None:
        self._ssh(f"rm -f {shlex.quote(str(path))}", "remove")

    def selftest(self, artifact: PurePosixPath, python: str, repeat: int) -> str:
        return self._ssh(
            f"{shlex.quote(python)} -m inferx_edge run {shlex.quote(str(artifact))} --repeat {int(repeat)}", "self-test"
        )

    def cuda_status(self, python: str) -> dict | None:
        """:mod:`inferx_edge.runtime.cuda_status` as the device's Python reports it (None if it cannot)."""
        return _status(lambda: self._ssh(f"{shlex.quote(python)} -m inferx_edge.runtime.cuda_status", "CUDA status"))


def _status(call) -> dict | None:
    try:
        lines = call().strip().splitlines()
        doc = json.loads(lines[-1]) if lines else None
    except (DeployError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _checked(cmd: list[str], what: str, stdin=None) -> str:
    """Run ``cmd``; on any interruption it is killed (and on Linux it dies with this process)."""
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent if os.name == "posix" else None,
        )
    except FileNotFoundError as exc:
        raise DeployError(f"{what}: '{cmd[0]}' not found (install OpenSSH client)") from exc
    try:
        data = stdin.read() if stdin is not None else None
        out, err = proc.communicate(data, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        _kill(proc)
        raise DeployError(f"{what} timed out after {TIMEOUT_S} s") from exc
    except BaseException:  # Ctrl-C, SIGTERM turned into an exception: leave no child running
        _kill(proc)
        raise
    out, err = out.decode(errors="replace"), err.decode(errors="replace")
    if proc.returncode != 0:
        detail = (err or out).strip().splitlines()
        raise DeployError(f"{what} failed (exit {proc.returncode}): {detail[-1] if detail else 'no output'}")
    return out


def _kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
