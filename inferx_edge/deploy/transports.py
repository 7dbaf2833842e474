"""File operations on the install directory, locally or over OpenSSH, behind one small interface.

Only what an atomic install needs: every step is either a rename or a symlink swap, so an interrupted
deploy leaves at most an ignored ``*.part`` file behind.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath

from inferx_edge.errors import DeployError  # noqa: F401  (re-exported)


class LocalTransport:
    """The install directory is on this machine."""

    def __init__(self, root: str) -> None:
        self.root = PurePosixPath(root)
        self.describe = f"local directory {root}"

    def mkdir(self, path: PurePosixPath) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)

    def put(self, local: Path, remote: PurePosixPath) -> None:
        shutil.copyfile(local, remote)

    def sha256(self, path: PurePosixPath) -> str:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        return h.hexdigest()

    def rename(self, src: PurePosixPath, dst: PurePosixPath) -> None:
        os.replace(src, dst)

    def readlink(self, path: PurePosixPath) -> str | None:
        try:
            return os.readlink(path)
        except OSError:
            return None

    def set_link(self, link: PurePosixPath, target: str) -> None:
        tmp = f"{link}.tmp"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        os.symlink(target, tmp)
        os.replace(tmp, link)  # rename(2) over the old link: atomic

    def remove(self, path: PurePosixPath) -> None:
        with __import__("contextlib").suppress(FileNotFoundError):
            os.unlink(path)

    def selftest(self, artifact: PurePosixPath, python: str, repeat: int) -> str:
        cmd = [python, "-m", "inferx_edge", "run", str(artifact), "--repeat", str(repeat)]
        return _checked(cmd, "self-test")


class SSHTransport:
    """The install directory is on an OpenSSH host (``ssh``/``scp`` from PATH, your ssh config applies)."""

    def __init__(self, user: str | None, host: str, port: int | None, root: str, options: list[str]) -> None:
        self.root = PurePosixPath(root)
        self.login = f"{user}@{host}" if user else host
        self.port = port
        self.options = ["-o", "BatchMode=yes", *options]
        self.describe = f"ssh {self.login}{':' + str(port) if port else ''}:{root}"

    def _ssh(self, command: str, what: str) -> str:
        cmd = ["ssh", *self.options, *(["-p", str(self.port)] if self.port else []), self.login, command]
        return _checked(cmd, what)

    def mkdir(self, path: PurePosixPath) -> None:
        self._ssh(f"mkdir -p {shlex.quote(str(path))}", "mkdir")

    def put(self, local: Path, remote: PurePosixPath) -> None:
        cmd = [
            "scp",
            "-q",
            *self.options,
            *(["-P", str(self.port)] if self.port else []),
            str(local),
            f"{self.login}:{shlex.quote(str(remote))}",
        ]
        _checked(cmd, "upload")

    def sha256(self, path: PurePosixPath) -> str:
        out = self._ssh(f"sha256sum {shlex.quote(str(path))}", "checksum")
        return out.split()[0] if out.strip() else ""

    def rename(self, src: PurePosixPath, dst: PurePosixPath) -> None:
        self._ssh(f"mv -f {shlex.quote(str(src))} {shlex.quote(str(dst))}", "rename")

    def readlink(self, path: PurePosixPath) -> str | None:
        out = self._ssh(f"readlink {shlex.quote(str(path))} || true", "readlink").strip()
        return out or None

    def set_link(self, link: PurePosixPath, target: str) -> None:
        tmp = shlex.quote(f"{link}.tmp")
        # mv -T renames the new link over the old one (rename(2)): readers never see no link
        self._ssh(f"ln -sfn {shlex.quote(target)} {tmp} && mv -Tf {tmp} {shlex.quote(str(link))}", "switch link")

    def remove(self, path: PurePosixPath) -> None:
        self._ssh(f"rm -f {shlex.quote(str(path))}", "remove")

    def selftest(self, artifact: PurePosixPath, python: str, repeat: int) -> str:
        return self._ssh(f"{python} -m inferx_edge run {shlex.quote(str(artifact))} --repeat {repeat}", "self-test")


def _checked(cmd: list[str], what: str) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except FileNotFoundError as exc:
        raise DeployError(f"{what}: '{cmd[0]}' not found (install OpenSSH client)") from exc
    except subprocess.TimeoutExpired as exc:
        raise DeployError(f"{what} timed out after 600 s") from exc
    if r.returncode != 0:
        detail = (r.stderr or r.stdout).strip().splitlines()
        raise DeployError(f"{what} failed (exit {r.returncode}): {detail[-1] if detail else 'no output'}")
    return r.stdout
