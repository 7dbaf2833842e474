"""Artifacts crafted to hurt: manifest paths outside the artifact, size lies, decompression bombs,
oversized manifests, duplicate members, manifests missing fields; and fuzzing of the reader."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferx_edge.errors import ArtifactError, InferxError
from inferx_edge.package import open_artifact, read_manifest
from inferx_edge.package.bundle import verify_artifact
from inferx_edge.package.manifest import Manifest
from tests.helpers import cli


def _members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def _pack(out: Path, members: list[tuple[str, bytes | tarfile.TarInfo]], big: dict[str, int] | None = None) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, size in (big or {}).items():  # zeros, streamed: a decompression bomb
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, _Zeros(size))
    return out


class _Zeros(io.RawIOBase):
    def __init__(self, n):
        self.left = n

    def read(self, k=-1):
        k = self.left if k < 0 else min(k, self.left)
        self.left -= k
        return b"\0" * k


def _resign(body: dict) -> bytes:
    body.pop("manifest_sha256", None)
    body["manifest_sha256"] = hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    return (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()


def _with_manifest(members, edit) -> list[tuple[str, bytes]]:
    body = json.loads(dict(members)["manifest.json"])
    edit(body)
    return [(n, _resign(body) if n == "manifest.json" else d) for n, d in members]


@pytest.mark.parametrize("path", ["../../x.so", "/usr/lib/x.so", "lib/not-listed.so"])
def test_a_manifest_path_outside_the_artifact_is_refused(default_artifact, tmp_path, path):
    members = _with_manifest(_members(default_artifact), lambda b: b["variants"][0].update(library=path))
    bad = _pack(tmp_path / "bad.ixa", members)
    with pytest.raises(ArtifactError, match="points outside the artifact|not a member listed"):
        verify_artifact(bad, trust=False)
    r = cli("run", bad)
    assert r.returncode == 5 and "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda b: b.pop("target"), "lacks the fields \\['target'\\]"),
        (lambda b: b["target"].pop("host_triple"), "'target' must hold"),
        (lambda b: b.update(variants=[]), "non-empty list"),
        (lambda b: b.update(default_variant="nope"), "default_variant 'nope'"),
        (lambda b: b["target"].update(device="tpu"), "device 'tpu' is unknown"),
        (lambda b: b["files"][next(iter(b["files"]))].update(size=-1), "must be \\{sha256"),
        (lambda b: b["variants"].append(dict(b["variants"][0])), "variant name twice"),
    ],
)
def test_a_manifest_missing_or_contradicting_fields_gets_exit_5_naming_it(default_artifact, tmp_path, edit, message):
    bad = _pack(tmp_path / "bad.ixa", _with_manifest(_members(default_artifact), edit))
    with pytest.raises(ArtifactError, match=message):
        read_manifest(bad)
    r = cli("inspect", bad)
    assert r.returncode == 5 and "Traceback" not in r.stderr


def test_a_member_longer_than_declared_is_refused(default_artifact, tmp_path):
    members = _members(default_artifact)
    lib = next(n for n, _ in members if n.endswith(".so"))
    longer = [(n, d + b"\0" * 10 if n == lib else d) for n, d in members]
    with pytest.raises(ArtifactError, match="bytes; the manifest says"):
        open_artifact(_pack(tmp_path / "long.ixa", longer), dest=tmp_path / "out")
    assert not any((tmp_path / "out").rglob("*"))


def test_a_decompression_bomb_is_refused_without_unpacking_it(default_artifact, tmp_path, monkeypatch):
    members = _members(default_artifact)
    size = 200 << 20  # 200 MiB of zeros: a ~200 KiB file
    bomb = _with_manifest(
        members, lambda b: b["files"].update({"weights/bomb.npz": {"sha256": "0" * 64, "size": size}})
    )
    path = _pack(tmp_path / "bomb.ixa", bomb, big={"weights/bomb.npz": size})
    assert path.stat().st_size < 2 << 20
    with pytest.raises(ArtifactError, match="unpacks to more than"):
        open_artifact(path, dest=tmp_path / "out")
    assert not (tmp_path / "out" / "weights" / "bomb.npz").exists()
    monkeypatch.setenv("INFERX_MAX_UNPACKED_BYTES", "1000")  # the absolute cap, configurable
    with pytest.raises(ArtifactError, match="unpacks to more than 1000 bytes"):
        verify_artifact(default_artifact, trust=False)


def test_an_oversized_manifest_is_refused(default_artifact, tmp_path, monkeypatch):
    members = _with_manifest(_members(default_artifact), lambda b: b["build"].update(padding="x" * 100_000))
    bad = _pack(tmp_path / "fat.ixa", members)
    verify_artifact(bad, trust=False)
    monkeypatch.setenv("INFERX_MAX_MANIFEST_BYTES", "65536")
    with pytest.raises(ArtifactError, match="over the limit of 65536"):
        verify_artifact(bad, trust=False)


def test_duplicate_members_are_refused(default_artifact, tmp_path):
    members = _members(default_artifact)
    lib = next((n, d) for n, d in members if n.endswith(".so"))
    with pytest.raises(ArtifactError, match="twice"):
        verify_artifact(_pack(tmp_path / "dup.ixa", [*members, lib]), trust=False)


def test_a_wrong_checksum_leaves_no_member_behind(default_artifact, tmp_path):
    members = _members(default_artifact)
    lib = next(n for n, _ in members if n.endswith(".so"))
    flipped = [(n, (bytes([d[0] ^ 1]) + d[1:]) if n == lib else d) for n, d in members]
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        open_artifact(_pack(tmp_path / "flip.ixa", flipped), dest=tmp_path / "out")
    assert not (tmp_path / "out" / lib).exists() and not list((tmp_path / "out").rglob("*.part"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(min_value=0, max_value=4000), flips=st.lists(st.integers(min_value=0), max_size=4))
def test_fuzzed_artifact_bytes_give_only_inferx_errors(default_artifact, tmp_path_factory, cut, flips):
    data = bytearray(default_artifact.read_bytes())
    for f in flips:
        data[f % len(data)] ^= 0x5A
    if cut:
        data = data[: max(1, len(data) - cut)]
    path = tmp_path_factory.mktemp("fuzz") / "f.ixa"
    path.write_bytes(bytes(data))
    try:
        verify_artifact(path, trust=False)
    except InferxError:
        pass


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    body=st.dictionaries(
        st.sampled_from(
            [
                "format",
                "schema_version",
                "files",
                "target",
                "variants",
                "model",
                "default_variant",
                "inferx_edge_version",
                "tvm_version",
                "created",
                "x",
            ]
        ),
        _json,
    )
)
def test_fuzzed_manifests_give_only_artifact_errors(body):
    body = {"format": "inferx_edge.artifact", "schema_version": 1, **body}
    text = _resign(dict(body))
    try:
        Manifest.from_json(text)
    except ArtifactError:
        pass
