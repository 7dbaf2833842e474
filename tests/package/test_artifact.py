"""The artifact file: round trip, and every corrupt, tampered or unsafe form refused."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from pathlib import Path

import pytest

from inferx_edge.errors import ArtifactError, ChecksumError, UsageError
from inferx_edge.package import SCHEMA_VERSION, open_artifact, read_manifest, write_artifact
from tests.helpers import cli


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _repack(path: Path, out: Path, members: dict[str, bytes], extra: list[tarfile.TarInfo] = ()) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return out


def test_round_trip_manifest(default_artifact):
    m = read_manifest(default_artifact)
    assert m.schema_version == SCHEMA_VERSION
    assert m.model["name"] == "fmnist_cnn" and len(m.model["sha256"]) == 64
    assert m.target["name"] in ("x86-cpu", "arm64-cpu") and m.target["device"] == "cpu"
    assert m.tvm_version.startswith("0.27")
    v = m.variant()
    assert v.name == "fp32-b1" and v.batch == 1 and v.precision == "fp32"
    assert [s.describe() for s in v.inputs] == ["image: float32[1x1x28x28]"]
    assert [s.describe() for s in v.outputs] == ["logits: float32[1x10]"]
    assert set(m.files) == {v.library, v.weights}
    with open_artifact(default_artifact) as art:
        for name, meta in m.files.items():
            assert art.member(name).stat().st_size == meta["size"]
        root = art.root
    assert not root.exists()  # temporary extraction removed


def test_tampered_member_is_refused(default_artifact, tmp_path):
    members = _members(default_artifact)
    lib = next(n for n in members if n.endswith(".so"))
    data = bytearray(members[lib])
    data[len(data) // 2] ^= 0xFF
    members[lib] = bytes(data)
    bad = _repack(default_artifact, tmp_path / "tampered.ixa", members)
    with pytest.raises(ChecksumError, match=f"checksum mismatch for '{lib}'"):
        open_artifact(bad)
    r = cli("run", bad)
    assert r.returncode == 5 and "checksum mismatch" in r.stderr


def test_tampered_manifest_is_refused(default_artifact, tmp_path):
    members = _members(default_artifact)
    body = json.loads(members["manifest.json"])
    body["variants"][0]["inputs"][0]["shape"] = [8, 1, 28, 28]
    members["manifest.json"] = json.dumps(body).encode()
    with pytest.raises(ArtifactError, match="manifest checksum mismatch"):
        open_artifact(_repack(default_artifact, tmp_path / "m.ixa", members))


def test_extra_and_missing_members_are_refused(default_artifact, tmp_path):
    members = _members(default_artifact)
    with pytest.raises(ChecksumError, match=r"unlisted member 'lib/evil.so'"):
        open_artifact(_repack(default_artifact, tmp_path / "e.ixa", members | {"lib/evil.so": b"\x7fELF"}))
    weights = next(n for n in members if n.endswith(".npz"))
    del members[weights]
    with pytest.raises(ChecksumError, match="missing members"):
        open_artifact(_repack(default_artifact, tmp_path / "m.ixa", members))


@pytest.mark.parametrize("name", ["../escape.so", "/etc/evil", "lib/../../x", "..\\win"])
def test_unsafe_member_paths_are_refused(default_artifact, tmp_path, name):
    bad = _repack(default_artifact, tmp_path / "unsafe.ixa", _members(default_artifact) | {name: b"boom"})
    with pytest.raises(ArtifactError, match="unsafe member path"):
        open_artifact(bad, dest=tmp_path / "out")
    assert not (tmp_path / "escape.so").exists()
    with pytest.raises(ArtifactError, match="unsafe member path"):
        read_manifest(bad)


def test_links_are_refused(default_artifact, tmp_path):
    link = tarfile.TarInfo("lib/link.so")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    bad = _repack(default_artifact, tmp_path / "link.ixa", _members(default_artifact), extra=[link])
    with pytest.raises(ArtifactError, match="not a regular file"):
        open_artifact(bad)


def test_not_an_artifact(tmp_path):
    junk = tmp_path / "junk.ixa"
    junk.write_bytes(b"definitely not a tar" * 100)
    with pytest.raises(ArtifactError, match="not an inferx_edge artifact"):
        open_artifact(junk)
    with pytest.raises(UsageError, match="artifact not found"):
        open_artifact(tmp_path / "missing.ixa")


def test_truncated_artifact(default_artifact, tmp_path):
    cut = tmp_path / "cut.ixa"
    cut.write_bytes(default_artifact.read_bytes()[: default_artifact.stat().st_size // 2])
    with pytest.raises(ArtifactError):
        open_artifact(cut)


def test_future_schema_version_is_refused(default_artifact, tmp_path):
    m = read_manifest(default_artifact)
    future = dataclasses.replace(m, schema_version=SCHEMA_VERSION + 1)
    with open_artifact(default_artifact) as art:
        out = write_artifact(tmp_path / "future.ixa", future, {n: art.member(n) for n in m.files})
    assert out.schema_version == SCHEMA_VERSION + 1
    with pytest.raises(ArtifactError, match=f"schema version {SCHEMA_VERSION + 1} is not supported"):
        open_artifact(tmp_path / "future.ixa")


def test_failed_write_leaves_previous_artifact_intact(default_artifact, tmp_path):
    out = tmp_path / "keep.ixa"
    out.write_bytes(default_artifact.read_bytes())
    before = out.read_bytes()
    m = read_manifest(default_artifact)
    with pytest.raises(FileNotFoundError):
        write_artifact(out, m, {"lib/x.so": tmp_path / "does-not-exist.so"})
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["keep.ixa"]


def test_inspect_cli(default_artifact):
    r = cli("inspect", default_artifact)
    assert r.returncode == 0, r.stderr
    assert "verified" in r.stdout and "image: float32[1x1x28x28]" in r.stdout
    r = cli("inspect", default_artifact, "--json")
    assert json.loads(r.stdout)["default_variant"] == "fp32-b1"
