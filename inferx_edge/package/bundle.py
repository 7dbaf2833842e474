"""Write and open artifact files: one tar holding ``manifest.json``, optionally ``signature.json``, and
the members the manifest checksums.

Opening never trusts the archive. It is read as a stream, in order: the manifest first (bounded in
size, validated), then the signature, checked against the trust store *before any other member is
read*; then each member, refused unless it is a regular file with a safe name, listed in the manifest
exactly once, of the declared size, within the unpacked-size budget, and of the declared sha256. A
member is written under its final name only after its hash matched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import shutil
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from inferx_edge.errors import ArtifactError, ChecksumError, UsageError
from inferx_edge.package.atomic import atomic_write
from inferx_edge.package.manifest import MANIFEST_NAME, Manifest
from inferx_edge.package.scratch import make_scratch
from inferx_edge.package.signing import MAX_SIGNATURE_BYTES, SIGNATURE_NAME, Signature, TrustStore, sign_manifest

_CHUNK = 1 << 20
#: members up to this size are hashed in memory and written only once they match
_IN_MEMORY = 32 << 20
_TAR_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error)


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(float(value))
    except ValueError:
        raise UsageError(f"{name} must be a number of bytes, got '{value}'") from None


@dataclasses.dataclass(frozen=True)
class ReadLimits:
    """Bounds on what opening an artifact may unpack (each settable by environment variable).

    Attributes
    ----------
    max_manifest_bytes : ``manifest.json`` larger than this is refused (``INFERX_MAX_MANIFEST_BYTES``).
    max_unpacked_bytes : absolute cap on all members together (``INFERX_MAX_UNPACKED_BYTES``).
    max_expansion : all members together may be at most this many times the artifact file's size
        (``INFERX_MAX_EXPANSION``): libraries and weights compress a few times, a zip bomb thousands.
    """

    max_manifest_bytes: int = 16 << 20
    max_unpacked_bytes: int = 64 << 30
    max_expansion: float = 100.0

    @classmethod
    def from_env(cls) -> ReadLimits:
        d = cls()
        return cls(
            _env_int("INFERX_MAX_MANIFEST_BYTES", d.max_manifest_bytes),
            _env_int("INFERX_MAX_UNPACKED_BYTES", d.max_unpacked_bytes),
            float(os.environ.get("INFERX_MAX_EXPANSION") or d.max_expansion),
        )

    def budget(self, file_size: int) -> int:
        """Bytes all members of an artifact file of ``file_size`` bytes may unpack to."""
        return int(min(self.max_unpacked_bytes, self.max_expansion * max(file_size, 1 << 20)))


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


def write_artifact(
    out_path: str | os.PathLike, manifest: Manifest, members: dict[str, Path], sign_key: Path | None = None
) -> Manifest:
    """Write ``manifest`` and ``members`` (archive name -> local file) to ``out_path`` atomically,
    signed with the Ed25519 key at ``sign_key`` when given.

    The manifest's ``files`` table is filled in here from the members' contents. The archive is written
    to a temporary file beside ``out_path`` and renamed into place, so a failure leaves no partial file
    and an existing artifact at that path stays intact until the new one is complete.
    """
    files = {}
    for name, local in sorted(members.items()):
        _check_member_name(name)
        if name in (MANIFEST_NAME, SIGNATURE_NAME):
            raise ValueError(f"'{name}' is reserved")
        files[name] = {"sha256": sha256_file(local), "size": os.path.getsize(local)}
    manifest = dataclasses.replace(manifest, files=files)
    text = manifest.to_json().encode()
    signature = sign_manifest(text, sign_key) if sign_key is not None else None

    # gzip level 1: quantized weights barely compress at any level, and level 9 took minutes on a
    # 1 GB LLM artifact (SmolLM2 in five precisions) for a few per cent
    with (
        atomic_write(out_path) as raw,
        tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT, compresslevel=1) as tar,
    ):
        for name, data in ((MANIFEST_NAME, text), (SIGNATURE_NAME, signature)):
            if data is not None:
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        for name, local in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = os.path.getsize(local), 0o644
            with open(local, "rb") as f:
                tar.addfile(info, f)
    return manifest


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Who signed an artifact, and whether this machine checked it.

    ``signer``: the fingerprint of the key that signed it (None: unsigned). ``verified``: the signature
    was checked against ``trust_store`` (None: no trust store here, nothing required)."""

    signer: str | None
    verified: bool
    trust_store: str | None

    def line(self) -> str:
        if self.verified:
            return f"signed by {self.signer} (verified against {self.trust_store})"
        if self.signer:
            return f"signed by {self.signer} (not verified: no trust store on this machine)"
        return "unsigned (no trust store on this machine: not required)"


def _open_stream(path: Path) -> tarfile.TarFile:
    if not path.exists():
        raise UsageError(f"artifact not found: {path}")
    if not path.is_file():
        raise UsageError(f"artifact path is not a file: {path}")
    try:
        return tarfile.open(path, mode="r|*")
    except _TAR_ERRORS as exc:
        raise ArtifactError(f"{path} is not an inferx_edge artifact (not a readable tar archive: {exc})") from exc


def _read_small(tar: tarfile.TarFile, member: tarfile.TarInfo, limit: int, what: str, path: Path) -> bytes:
    if not member.isfile():
        raise ArtifactError(f"{what} in {path} is not a regular file")
    if member.size > limit:
        raise ArtifactError(f"{what} in {path} is {member.size} bytes, over the limit of {limit}; refusing it")
    data = tar.extractfile(member).read(limit + 1)
    if len(data) != member.size:
        raise ArtifactError(f"{path} is truncated or corrupt inside {what}")
    return data


def _read_first_manifest(tar: tarfile.TarFile, path: Path, limits: ReadLimits):
    """(the member iterator, the manifest's bytes, the manifest): the manifest must come first."""
    members = iter(tar)
    first = next(members, None)
    if first is None or first.name != MANIFEST_NAME:
        raise ArtifactError(f"{path} does not start with {MANIFEST_NAME}: not an inferx_edge artifact")
    text = _read_small(tar, first, limits.max_manifest_bytes, MANIFEST_NAME, path)
    return members, text, Manifest.from_json(text)


def _stream(path: Path, trust, limits: ReadLimits | None, dest: Path | None) -> tuple[Manifest, Provenance]:
    """Read and verify ``path`` member by member, writing members under ``dest`` (None: hash only)."""
    limits = limits or ReadLimits.from_env()
    store = None if trust is False else TrustStore.load(trust)
    budget = limits.budget(path.stat().st_size if path.is_file() else 0)
    with _open_stream(path) as tar:
        try:
            members, text, manifest = _read_first_manifest(tar, path, limits)
            member = next(members, None)
            signature = None
            if member is not None and member.name == SIGNATURE_NAME:
                signature = Signature.parse(
                    _read_small(tar, member, MAX_SIGNATURE_BYTES, SIGNATURE_NAME, path), str(path)
                )
                member = next(members, None)
            signer = store.verify(text, signature, str(path)) if store else None
            provenance = Provenance(
                signer or (signature.fingerprint if signature else None), bool(store), store and store.source
            )
            seen: set[str] = set()
            total = len(text)
            while member is not None:
                name = _check_member_name(member.name)
                if not member.isfile():
                    raise ArtifactError(f"member '{name}' of {path} is not a regular file (links are refused)")
                if name in seen or name in (MANIFEST_NAME, SIGNATURE_NAME):
                    raise ArtifactError(f"{path} holds member '{name}' twice")
                entry = manifest.files.get(name)
                if entry is None:
                    raise ChecksumError(f"{path} does not match its manifest: unlisted member '{name}'")
                if member.size != entry["size"]:
                    raise ChecksumError(
                        f"member '{name}' of {path} is {member.size} bytes; the manifest says {entry['size']}"
                    )
                total += member.size
                if total > budget:
                    raise ArtifactError(
                        f"{path} unpacks to more than {budget} bytes (file size x {limits.max_expansion:g}, at most "
                        f"{limits.max_unpacked_bytes}); refusing it (INFERX_MAX_EXPANSION / INFERX_MAX_UNPACKED_BYTES raise the limits)"
                    )
                _copy_verified(tar, member, entry, None if dest is None else dest / name, path)
                seen.add(name)
                member = next(members, None)
        except _TAR_ERRORS as exc:
            raise ArtifactError(f"{path} is truncated or corrupt ({exc})") from exc
    missing = sorted(set(manifest.files) - seen)
    if missing:
        raise ChecksumError(f"{path} does not match its manifest: missing members {missing}")
    return manifest, provenance


def _copy_verified(tar: tarfile.TarFile, member: tarfile.TarInfo, entry: dict, out: Path | None, path: Path) -> None:
    src = tar.extractfile(member)
    h, size, held = hashlib.sha256(), 0, []
    part = None if out is None or member.size <= _IN_MEMORY else out.with_name(out.name + ".part")
    dst = None
    try:
        if part is not None:
            part.parent.mkdir(parents=True, exist_ok=True)
            dst = open(part, "wb")
        while chunk := src.read(min(_CHUNK, entry["size"] - size + 1)):
            size += len(chunk)
            if size > entry["size"]:
                raise ChecksumError(
                    f"member '{member.name}' of {path} is longer than the {entry['size']} bytes declared"
                )
            h.update(chunk)
            if dst is not None:
                dst.write(chunk)
            elif out is not None:
                held.append(chunk)
        if dst is not None:
            dst.close()
        if size != entry["size"]:
            raise ArtifactError(f"{path} is truncated or corrupt while reading '{member.name}'")
        if h.hexdigest() != entry["sha256"]:
            raise ChecksumError(
                f"checksum mismatch for '{member.name}' in {path}: manifest says {entry['sha256'][:16]}..., "
                f"contents hash to {h.hexdigest()[:16]}...; the artifact was modified or corrupted"
            )
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            if part is not None:
                os.replace(part, out)
            else:
                out.write_bytes(b"".join(held))
    finally:
        if dst is not None and not dst.closed:
            dst.close()
        if part is not None and part.exists():
            part.unlink()


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Read and validate the manifest; check every member's header (safe name, regular file, listed,
    within the size budget) without reading or hashing member contents."""
    path = Path(path)
    limits = ReadLimits.from_env()
    budget = limits.budget(path.stat().st_size if path.is_file() else 0)
    with _open_stream(path) as tar:
        try:
            members, _, manifest = _read_first_manifest(tar, path, limits)
            total = 0
            for member in members:
                name = _check_member_name(member.name)
                if not member.isfile():
                    raise ArtifactError(f"member '{name}' of {path} is not a regular file (links are refused)")
                total += member.size
                if total > budget:
                    raise ArtifactError(f"{path} unpacks to more than {budget} bytes; refusing it")
            return manifest
        except _TAR_ERRORS as exc:
            raise ArtifactError(f"{path} is truncated or corrupt ({exc})") from exc


def verify_artifact(
    path: str | os.PathLike, trust=None, limits: ReadLimits | None = None
) -> tuple[Manifest, Provenance]:
    """Verify everything :func:`open_artifact` verifies, without writing anything. ``trust``: a trust
    store path, None for the default store (when one exists), False for none."""
    return _stream(Path(path), trust, limits, None)


@dataclasses.dataclass
class ExtractedArtifact:
    """A verified artifact unpacked into ``root``; removes the directory on :meth:`close` if it owns it."""

    path: Path
    manifest: Manifest
    root: Path
    _owned: bool = True
    provenance: Provenance | None = None

    def member(self, name: str) -> Path:
        return self.root / name

    def close(self) -> None:
        if self._owned and self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ExtractedArtifact:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_artifact(
    path: str | os.PathLike, dest: str | os.PathLike | None = None, trust=None, limits: ReadLimits | None = None
) -> ExtractedArtifact:
    """Verify and unpack an artifact. Raises :class:`ArtifactError` (or :class:`ChecksumError`) on any fault.

    ``dest`` is the directory to unpack into (created; kept); default a fresh temporary directory that
    :meth:`ExtractedArtifact.close` removes. ``trust``: a trust store (``.pub`` file or directory), None
    for the default store when one exists, False for none (see :mod:`inferx_edge.package.signing`).
    """
    path = Path(path)
    root = Path(dest) if dest is not None else make_scratch("artifact")
    root.mkdir(parents=True, exist_ok=True)
    try:
        manifest, provenance = _stream(path, trust, limits, root)
        return ExtractedArtifact(path=path, manifest=manifest, root=root, _owned=dest is None, provenance=provenance)
    except BaseException:
        if dest is None:
            shutil.rmtree(root, ignore_errors=True)
        raise


def _same_build(a: Manifest, b: Manifest) -> bool:
    return (
        a.model.get("sha256") == b.model.get("sha256")
        and a.target.get("name") == b.target.get("name")
        and [v.name for v in a.variants] == [v.name for v in b.variants]
    )


def keep_other_build(output: Path, manifest: Manifest, log) -> None:
    """An artifact already at ``output`` that holds another build is renamed to the next free
    ``<stem>.<n><suffix>`` (a rebuild of the same model, target and variants is simply replaced)."""
    if not output.exists():
        return
    from inferx_edge.errors import InferxError

    try:
        if _same_build(read_manifest(output), manifest):
            return
    except InferxError:
        pass  # not a readable artifact: keep it too
    n = 1
    while (backup := output.with_name(f"{output.stem}.{n}{output.suffix}")).exists():
        n += 1
    output.rename(backup)
    log(f"      {output} held another build: kept as {backup} (--force replaces it)")
