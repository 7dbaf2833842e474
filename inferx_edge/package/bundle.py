"""Write and open artifact files: one tar holding ``manifest.json`` plus members it checksums.

Opening never trusts the archive: member names are validated (no absolute paths, no ``..``, regular
files only), every member is hashed while it is extracted, and anything unlisted or mismatched fails.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from inferx_edge.errors import ArtifactError, ChecksumError, UsageError
from inferx_edge.package.atomic import atomic_write
from inferx_edge.package.manifest import MANIFEST_NAME, Manifest

_CHUNK = 1 << 20


def _check_member_name(name: str) -> str:
    path = PurePosixPath(name)
    if not name or path.is_absolute() or name.startswith(("/", "\\")) or ".." in path.parts or "\\" in name:
        raise ArtifactError(f"unsafe member path '{name}' in artifact (absolute or containing '..'); refusing it")
    return str(path)


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def write_artifact(out_path: str | os.PathLike, manifest: Manifest, members: dict[str, Path]) -> Manifest:
    """Write ``manifest`` and ``members`` (archive name -> local file) to ``out_path`` atomically.

    The manifest's ``files`` table is filled in here from the members' contents. The archive is written
    to a temporary file beside ``out_path`` and renamed into place, so a failure leaves no partial file
    and an existing artifact at that path stays intact until the new one is complete.
    """
    files = {}
    for name, local in sorted(members.items()):
        _check_member_name(name)
        if name == MANIFEST_NAME:
            raise ValueError(f"'{MANIFEST_NAME}' is reserved for the manifest")
        files[name] = {"sha256": sha256_file(local), "size": os.path.getsize(local)}
    manifest = dataclasses.replace(manifest, files=files)
    text = manifest.to_json().encode()

    with atomic_write(out_path) as raw, tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(MANIFEST_NAME)
        info.size, info.mode = len(text), 0o644
        tar.addfile(info, io.BytesIO(text))
        for name, local in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = os.path.getsize(local), 0o644
            with open(local, "rb") as f:
                tar.addfile(info, f)
    return manifest


def _open_tar(path: Path) -> tarfile.TarFile:
    if not path.is_file():
        raise UsageError(f"artifact not found: {path}")
    try:
        return tarfile.open(path, mode="r:*")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArtifactError(f"{path} is not an inferx_edge artifact (not a readable tar archive: {exc})") from exc


def _read_manifest_member(tar: tarfile.TarFile, path: Path) -> Manifest:
    try:
        member = tar.getmember(MANIFEST_NAME)
    except KeyError:
        raise ArtifactError(f"{path} has no {MANIFEST_NAME}: not an inferx_edge artifact") from None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArtifactError(f"{path} is truncated or corrupt ({exc})") from exc
    if not member.isfile():
        raise ArtifactError(f"{MANIFEST_NAME} in {path} is not a regular file")
    return Manifest.from_json(tar.extractfile(member).read())


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Read and validate only the manifest (member names checked, contents not hashed)."""
    path = Path(path)
    with _open_tar(path) as tar:
        try:
            for member in tar.getmembers():
                _check_member_name(member.name)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ArtifactError(f"{path} is truncated or corrupt ({exc})") from exc
        return _read_manifest_member(tar, path)


@dataclasses.dataclass
class ExtractedArtifact:
    """A verified artifact unpacked into ``root``; removes the directory on :meth:`close` if it owns it."""

    path: Path
    manifest: Manifest
    root: Path
    _owned: bool = True

    def member(self, name: str) -> Path:
        return self.root / name

    def close(self) -> None:
        if self._owned and self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ExtractedArtifact:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_artifact(path: str | os.PathLike, dest: str | os.PathLike | None = None) -> ExtractedArtifact:
    """Verify and unpack an artifact. Raises :class:`ArtifactError` (or :class:`ChecksumError`) on any fault.

    ``dest`` is the directory to unpack into (created; kept); default a fresh temporary directory that
    :meth:`ExtractedArtifact.close` removes.
    """
    path = Path(path)
    root = Path(dest) if dest is not None else Path(tempfile.mkdtemp(prefix="inferx_edge-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        with _open_tar(path) as tar:
            try:
                members = tar.getmembers()
            except (tarfile.TarError, OSError, EOFError) as exc:
                raise ArtifactError(f"{path} is truncated or corrupt ({exc})") from exc
            for m in members:
                _check_member_name(m.name)
                if not m.isfile():
                    raise ArtifactError(f"member '{m.name}' of {path} is not a regular file (links are refused)")
            manifest = _read_manifest_member(tar, path)
            names = [m.name for m in members if m.name != MANIFEST_NAME]
            if len(set(names)) != len(names):
                raise ArtifactError(f"{path} holds duplicate members")
            unlisted = sorted(set(names) - set(manifest.files))
            missing = sorted(set(manifest.files) - set(names))
            if unlisted or missing:
                raise ChecksumError(
                    f"{path} does not match its manifest: unlisted members {unlisted}, missing members {missing}"
                )
            for m in members:
                if m.name == MANIFEST_NAME:
                    continue
                _extract_verified(tar, m, root / m.name, manifest.files[m.name]["sha256"], path)
        return ExtractedArtifact(path=path, manifest=manifest, root=root, _owned=dest is None)
    except BaseException:
        if dest is None:
            shutil.rmtree(root, ignore_errors=True)
        raise


def _extract_verified(tar: tarfile.TarFile, member: tarfile.TarInfo, out: Path, expected: str, path: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    try:
        src = tar.extractfile(member)
        with open(out, "wb") as dst:
            while chunk := src.read(_CHUNK):
                h.update(chunk)
                dst.write(chunk)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArtifactError(f"{path} is truncated or corrupt while reading '{member.name}' ({exc})") from exc
    if h.hexdigest() != expected:
        raise ChecksumError(
            f"checksum mismatch for '{member.name}' in {path}: manifest says {expected[:16]}..., "
            f"contents hash to {h.hexdigest()[:16]}...; the artifact was modified or corrupted"
        )
