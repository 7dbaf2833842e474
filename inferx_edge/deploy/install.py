"""``deploy``: verified, atomic install of an artifact on a device, with a rollback history.

Layout on the device (a local directory or an OpenSSH host)::

    DIR/releases/<model>-<target>-<sha12>.ixa   the releases kept, by content
    DIR/current  -> releases/...                what runs
    DIR/previous -> releases/...                what ``deploy --rollback`` makes current
    DIR/history.json                            releases newest first (current first), at most ``keep``

The artifact is verified fully on this machine before anything is sent (checksums; the signature when
a trust store exists), uploaded as ``releases/.<name>.part``, its sha256 computed *on the device* and
compared, verified again *on the device* (``python -m inferx_edge inspect``, with the device's trust
store), and only then renamed into place and ``current`` switched by renaming a new symlink over it.
An interrupted upload, a mismatch or a refused artifact leaves ``current`` and the history untouched;
a release whose self-test fails is switched back and removed, so it never pushes a good one out.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath

from inferx_edge.deploy.result import DeployResult
from inferx_edge.deploy.transports import DeployError, LocalTransport, SSHTransport, check_login_part
from inferx_edge.errors import ArtifactError, InferxError, UsageError
from inferx_edge.package.bundle import sha256_file, verify_artifact
from inferx_edge.package.native import BUILD_RECORD, BUILD_RECORD_SIGNATURE, check_library_record

SCHEMES = ("ssh://user@host[:port]/dir", "rpc://tracker-host:port/key", "a local directory")
#: releases kept for rollback (current included)
DEFAULT_KEEP = 3
_SSH = re.compile(r"ssh://(?:(?P<user>[^@/]*)@)?(?P<host>\[[^\]/]*\]|[^:/]*)(?::(?P<port>[^/]*))?(?P<path>/.*)?")


def parse_destination(dest: str, ssh_options: list[str] | None = None):
    """``ssh://``, ``rpc://`` or a path. Returns a transport, or ``("rpc", host, port, key)``."""
    if "://" not in dest:
        return LocalTransport(str(Path(dest).resolve()))
    scheme = dest.split("://", 1)[0]
    if scheme == "ssh":
        m = _SSH.fullmatch(dest)
        if not m or not m.group("host") or not m.group("path") or m.group("path") == "/":
            raise UsageError(f"bad ssh destination '{dest}': expected ssh://user@host[:port]/absolute/dir")
        port = m.group("port")
        if port is not None and not port.isdigit():
            raise UsageError(f"bad ssh destination '{dest}': port '{port}' is not a number")
        check_login_part(m.group("user"), "user", dest)
        check_login_part(m.group("host"), "host", dest)
        # the path is taken literally (no URL decoding, '#' and '?' included) and quoted remotely
        return SSHTransport(
            m.group("user"), m.group("host"), int(port) if port else None, m.group("path"), list(ssh_options or [])
        )
    if scheme == "rpc":
        from urllib.parse import urlparse

        url = urlparse(dest)
        key = url.path.strip("/")
        if not url.hostname or not url.port or not key:
            raise UsageError(f"bad rpc destination '{dest}': expected rpc://tracker-host:port/device-key")
        return ("rpc", url.hostname, url.port, key)
    raise UsageError(f"unsupported destination scheme '{scheme}://'; valid: {', '.join(SCHEMES)}")


def _release_name(m, sha: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{m.model['name']}-{m.target['name']}")
    return f"{stem}-{sha[:12]}.ixa"


def _history(transport) -> list[str]:
    """Releases newest first; from ``history.json``, or (installs made before it existed) the links."""
    text = transport.read_text(transport.root / "history.json")
    if text:
        try:
            items = json.loads(text)
            if isinstance(items, list) and all(isinstance(i, str) for i in items):
                return list(dict.fromkeys(items))
        except ValueError:
            pass  # a torn or foreign file: rebuilt from the links below
    links = [transport.readlink(transport.root / n) for n in ("current", "previous")]
    return list(dict.fromkeys(x for x in links if x))


def _save_history(transport, history: list[str]) -> None:
    transport.write_text(transport.root / "history.json", json.dumps(history, indent=1) + "\n")
    if len(history) > 1:
        transport.set_link(transport.root / "previous", history[1])


def deploy(
    artifact: Path,
    dest: str,
    *,
    selftest: bool = True,
    python: str = "python3",
    repeat: int = 20,
    ssh_options: list[str] | None = None,
    trust=None,
    keep: int = DEFAULT_KEEP,
    cuda_runtime: Path | None = None,
    sign: Path | None = None,
    log=print,
) -> DeployResult:
    """Install ``artifact`` at ``dest`` (see the module docstring). For a Jetson artifact, TVM's CUDA
    runtime built against CUDA 12 goes with it where the device needs it (:func:`prepare_cuda_runtime`:
    ``cuda_runtime`` is where it was built, by default built on the way and signed with ``sign``)."""
    if keep < 2:
        raise UsageError(f"--keep must be at least 2 (current and one to roll back to), got {keep}")
    transport = parse_destination(dest, ssh_options)
    log(f"[1/5] verifying {Path(artifact).name} on this machine")
    manifest, provenance = verify_artifact(artifact, trust=trust)  # nothing is sent unless this passes
    log(f"      {provenance.line()}")
    if isinstance(transport, tuple):
        from inferx_edge.deploy.rpc import deploy_rpc

        return deploy_rpc(artifact, *transport[1:], repeat=repeat, log=log, trust=trust)

    runtime, notes = None, []
    if manifest.target.get("device") == "cuda" and manifest.target.get("min_jetpack"):  # a Jetson
        runtime, notes = prepare_cuda_runtime(
            transport, manifest.target, cuda_runtime, log, python=python, trust=trust, sign=sign
        )
    sha = sha256_file(artifact)
    name = _release_name(manifest, sha)
    releases = transport.root / "releases"
    final = releases / name
    part = releases / f".{name}.part"
    target = f"releases/{name}"
    log(f"[2/5] uploading to {transport.describe}")
    transport.mkdir(releases)
    history = _history(transport)
    fresh = target not in history
    try:
        transport.put(artifact, part)
        log("[3/5] verifying on the device (sha256, manifest, signature)")
        remote_sha = transport.sha256(part)
        if remote_sha != sha:
            raise DeployError(
                f"checksum mismatch after upload: local {sha[:16]}..., device {remote_sha[:16] or '?'}...; "
                f"nothing was installed"
            )
        transport.verify(part, python, trust)
        transport.rename(part, final)
    except BaseException:
        transport.remove(part)
        raise
    if runtime is not None:
        notes += install_cuda_runtime(transport, runtime, manifest.target["host_triple"].split("-")[0], log, trust)
    log("[4/5] switching current")
    current = transport.root / "current"
    old = transport.readlink(current)
    transport.set_link(current, target)
    if selftest:
        log("[5/5] self-test on the device")
        try:
            result_selftest = transport.selftest(current, python, repeat)
        except BaseException as exc:  # never leave a release that fails its self-test as current
            if old and old != target:
                transport.set_link(current, old)
            elif not old:
                transport.remove(current)
            if fresh:
                transport.remove(final)
            if isinstance(exc, DeployError):
                where = f"; current restored to {old}" if old and old != target else ""
                raise DeployError(f"{exc}{where}") from exc
            raise
    else:
        result_selftest = None
    new_history = [target, *[h for h in history if h != target]]
    kept, dropped = new_history[:keep], new_history[keep:]
    _save_history(transport, kept)
    for release in dropped:
        transport.remove(transport.root / release)
    previous = kept[1] if len(kept) > 1 else None
    result = DeployResult(transport.describe, target, previous, sha, result_selftest)
    result.notes += notes
    if dropped:
        result.notes.append(f"removed {len(dropped)} release(s) beyond the last {keep}: {', '.join(dropped)}")
    return result


def prepare_cuda_runtime(
    transport,
    target: dict,
    runtime_dir: Path | None,
    log,
    python: str = "python3",
    trust=None,
    sign: Path | None = None,
) -> tuple[Path | None, list[str]]:
    """Before anything is uploaded: does the device need the CUDA 12 build of TVM's CUDA runtime, and is
    it here? Returns (its library, checked; None when the device's own TVM already runs on its driver,
    as ``python -m inferx_edge.runtime.cuda_status`` there says) and notes for the deploy result.

    ``runtime_dir``: the ``--out`` of ``python -m inferx_edge cuda-runtime``; by default its default
    output, where a missing library is built now (:mod:`inferx_edge.deploy.cuda12_runtime`; ``sign``
    signs its record). Checked here: the sha256 in its ``build.json``; with a trust store,
    ``build.json.sig`` by a trusted key (the device's runtime applies the same rule before loading it)."""
    from inferx_edge.deploy import cuda12_runtime
    from inferx_edge.package.signing import TrustStore

    arch = target["host_triple"].split("-")[0]
    explicit = runtime_dir is not None
    runtime_dir = Path(runtime_dir) if explicit else cuda12_runtime.default_out()
    lib = runtime_dir / arch / "libtvm_runtime_cuda.so"
    status = transport.cuda_status(python)
    if status and status.get("works") and status.get("arch") == arch:
        log(
            f"      the device's TVM CUDA runtime (libcudart.so.{status['installed_cudart']}) runs on its driver "
            f"(CUDA {'.'.join(map(str, status['driver_cuda']))}): no CUDA 12 runtime installed"
        )
        return None, []
    notes = []
    if not lib.is_file() or not (lib.parent / BUILD_RECORD).is_file():
        if explicit:
            raise UsageError(f"--cuda-runtime {runtime_dir}: no {arch}/libtvm_runtime_cuda.so with its build.json")
        if sign is None and trust is not False and TrustStore.load(trust) is not None:
            raise DeployError(
                f"the device needs TVM's CUDA runtime built against CUDA 12, and the trust store here requires "
                f"signed native code: deploy with --sign KEY (or build it first: python -m inferx_edge "
                f"cuda-runtime --arch {arch} --sign KEY); nothing was installed"
            )
        log(f"      the device needs TVM's CUDA runtime built against CUDA 12 for {arch}: building it (once)")
        try:
            cuda12_runtime.build(arch, runtime_dir, sign=sign, log=lambda m: log(f"      {m}"))
        except InferxError as exc:
            raise DeployError(f"building the CUDA 12 runtime for {arch} failed, nothing was installed: {exc}") from exc
        notes.append(f"built the CUDA 12 runtime for {arch} in {runtime_dir}")
    try:
        check_library_record(lib, trust, require_record=True)
    except ArtifactError as exc:
        raise DeployError(f"CUDA 12 runtime not deployed, nothing was installed: {exc}") from exc
    return lib, notes


def install_cuda_runtime(transport, lib: Path, arch: str, log, trust=None) -> list[str]:
    """Install ``lib`` (from :func:`prepare_cuda_runtime`) as ``ROOT/cuda12-runtime/<arch>/``, where the
    device's runtime looks for it next to the release: uploaded as ``.part``, its sha256 computed on the
    device and compared with the record, then renamed into place; the record and its signature go
    beside it; an identical copy already there is left alone."""
    record_path, sig_path = lib.parent / BUILD_RECORD, lib.parent / BUILD_RECORD_SIGNATURE
    checked = check_library_record(lib, trust, require_record=True)
    want = checked["sha256"]
    record = json.loads(record_path.read_text())
    dest_dir = transport.root / "cuda12-runtime" / arch
    final, part = dest_dir / "libtvm_runtime_cuda.so", dest_dir / ".libtvm_runtime_cuda.so.part"
    transport.mkdir(dest_dir)
    try:
        there = transport.sha256(final)
    except (OSError, DeployError):  # not installed yet
        there = ""
    signed = sig_path.read_text() if sig_path.is_file() else None
    if there == want and transport.read_text(dest_dir / BUILD_RECORD_SIGNATURE) == signed:
        log(f"      CUDA 12 runtime for {arch} already on the device ({want[:12]})")
        return []
    signer = f", signed by {checked['signer']}" if checked.get("signer") else (", signed" if signed else ", unsigned")
    log(f"      installing the CUDA 12 runtime for {arch} ({want[:12]}, CUDA {record.get('cuda_version')}{signer})")
    try:
        transport.put(lib, part)
        got = transport.sha256(part)
        if got != want:
            raise DeployError(f"CUDA runtime checksum mismatch after upload: {want[:16]}... vs {got[:16] or '?'}...")
        transport.rename(part, final)
    except BaseException:
        transport.remove(part)
        raise
    transport.write_text(dest_dir / BUILD_RECORD, record_path.read_text())
    if signed is not None:
        transport.write_text(dest_dir / BUILD_RECORD_SIGNATURE, signed)
    else:
        transport.remove(dest_dir / BUILD_RECORD_SIGNATURE)  # a stale signature would not match this record
    return [f"installed the CUDA 12 runtime for {arch} as {final}"]


def rollback(
    dest: str,
    *,
    selftest: bool = True,
    python: str = "python3",
    repeat: int = 20,
    ssh_options: list[str] | None = None,
    log=print,
) -> DeployResult:
    """Make the previous release current again (and the rolled-back one the new previous)."""
    transport = parse_destination(dest, ssh_options)
    if isinstance(transport, tuple):
        raise UsageError("rollback applies to installs (ssh:// or a directory); an rpc:// deploy installs nothing")
    history = _history(transport)
    if len(history) < 2:
        raise DeployError(f"nothing to roll back to at {transport.describe}: no previous release")
    old, prev = history[0], history[1]
    transport.set_link(transport.root / "current", prev)
    _save_history(transport, [prev, old, *history[2:]])
    log(f"rolled back {transport.describe}: current -> {prev} (was {old})")
    result = DeployResult(transport.describe, prev, old, None)
    if selftest:
        result.selftest = transport.selftest(PurePosixPath(transport.root / "current"), python, repeat)
    return result


__all__ = ["DEFAULT_KEEP", "deploy", "parse_destination", "rollback"]
