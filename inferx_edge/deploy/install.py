"""``deploy``: atomic install of an artifact on a device, previous kept for rollback, self-test after.

Layout on the device (a local directory or an OpenSSH host)::

    DIR/releases/<model>-<target>-<sha12>.ixa   each artifact installed, by content
    DIR/current  -> releases/...                what runs
    DIR/previous -> releases/...                what ran before; ``deploy --rollback`` swaps them back

The artifact is uploaded as ``releases/.<name>.part``, its sha256 is computed *on the device* and
compared with the local file, and only then renamed into place and ``current`` switched by renaming a
new symlink over it. An interrupted upload or a checksum mismatch leaves ``current`` untouched.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

from inferx_edge.deploy.result import DeployResult
from inferx_edge.deploy.transports import DeployError, LocalTransport, SSHTransport
from inferx_edge.errors import UsageError
from inferx_edge.package import read_manifest
from inferx_edge.package.bundle import sha256_file

SCHEMES = ("ssh://user@host[:port]/dir", "rpc://tracker-host:port/key", "a local directory")


def parse_destination(dest: str, ssh_options: list[str] | None = None):
    """``ssh://``, ``rpc://`` or a path. Returns a transport, or ``("rpc", host, port, key)``."""
    if "://" not in dest:
        return LocalTransport(str(Path(dest).resolve()))
    url = urlparse(dest)
    if url.scheme == "ssh":
        if not url.hostname or not url.path or url.path == "/":
            raise UsageError(f"bad ssh destination '{dest}': expected ssh://user@host[:port]/absolute/dir")
        return SSHTransport(url.username, url.hostname, url.port, url.path, list(ssh_options or []))
    if url.scheme == "rpc":
        key = url.path.strip("/")
        if not url.hostname or not url.port or not key:
            raise UsageError(f"bad rpc destination '{dest}': expected rpc://tracker-host:port/device-key")
        return ("rpc", url.hostname, url.port, key)
    raise UsageError(f"unsupported destination scheme '{url.scheme}://'; valid: {', '.join(SCHEMES)}")


def _release_name(m, sha: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{m.model['name']}-{m.target['name']}")
    return f"{stem}-{sha[:12]}.ixa"


def deploy(
    artifact: Path,
    dest: str,
    *,
    selftest: bool = True,
    python: str = "python3",
    repeat: int = 20,
    ssh_options: list[str] | None = None,
    log=print,
) -> DeployResult:
    manifest = read_manifest(artifact)  # a missing or unsafe artifact fails here, before anything is sent
    transport = parse_destination(dest, ssh_options)
    if isinstance(transport, tuple):
        from inferx_edge.deploy.rpc import deploy_rpc

        return deploy_rpc(artifact, *transport[1:], repeat=repeat, log=log)

    sha = sha256_file(artifact)
    name = _release_name(manifest, sha)
    releases = transport.root / "releases"
    final = releases / name
    part = releases / f".{name}.part"
    log(f"[1/4] uploading {artifact.name} to {transport.describe}")
    transport.mkdir(releases)
    try:
        transport.put(artifact, part)
        log("[2/4] verifying sha256 on the device")
        remote_sha = transport.sha256(part)
        if remote_sha != sha:
            raise DeployError(
                f"checksum mismatch after upload: local {sha[:16]}..., device {remote_sha[:16] or '?'}...; "
                f"nothing was installed"
            )
        transport.rename(part, final)
    except BaseException:
        transport.remove(part)
        raise
    log("[3/4] switching current")
    current, previous_link = transport.root / "current", transport.root / "previous"
    old = transport.readlink(current)
    target = f"releases/{name}"
    if old and old != target:
        transport.set_link(previous_link, old)
    transport.set_link(current, target)
    result = DeployResult(transport.describe, target, old if old != target else transport.readlink(previous_link), sha)
    if selftest:
        log("[4/4] self-test on the device")
        try:
            result.selftest = transport.selftest(current, python, repeat)
        except DeployError as exc:
            if old and old != target:  # never leave a release that fails its self-test as current
                transport.set_link(current, old)
                raise DeployError(f"{exc}; current restored to {old}") from exc
            raise
    return result


def rollback(
    dest: str,
    *,
    selftest: bool = True,
    python: str = "python3",
    repeat: int = 20,
    ssh_options: list[str] | None = None,
    log=print,
) -> DeployResult:
    """Make ``previous`` current again (and the rolled-back release the new ``previous``)."""
    transport = parse_destination(dest, ssh_options)
    if isinstance(transport, tuple):
        raise UsageError("rollback applies to installs (ssh:// or a directory); an rpc:// deploy installs nothing")
    current, previous_link = transport.root / "current", transport.root / "previous"
    old, prev = transport.readlink(current), transport.readlink(previous_link)
    if not prev:
        raise DeployError(f"nothing to roll back to at {transport.describe}: no previous release")
    transport.set_link(current, prev)
    if old:
        transport.set_link(previous_link, old)
    log(f"rolled back {transport.describe}: current -> {prev} (was {old})")
    result = DeployResult(transport.describe, prev, old, None)
    if selftest:
        result.selftest = transport.selftest(PurePosixPath(current), python, repeat)
    return result
