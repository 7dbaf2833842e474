"""Signed artifacts: keygen, build --sign, trust stores, and forgeries refused before anything is loaded."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from inferx_edge.errors import ArtifactError, UsageError
from inferx_edge.package import open_artifact
from inferx_edge.package.bundle import verify_artifact
from inferx_edge.package.signing import PUBLIC_KEY_NAME, generate_keypair
from tests.helpers import build_quietly, cli


def _members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def _pack(out: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out


def _rechecksum(members: list[tuple[str, bytes]], replace: dict[str, bytes]) -> list[tuple[str, bytes]]:
    """The forger's move: swap member contents and recompute every checksum the manifest holds
    (member sha256 and size, then manifest_sha256); the signature member is kept as it was."""
    members = [(n, replace.get(n, d)) for n, d in members]
    body = json.loads(dict(members)["manifest.json"])
    for name, data in members:
        if name in body["files"]:
            body["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    body.pop("manifest_sha256")
    body["manifest_sha256"] = hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    text = (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()
    return [(n, text if n == "manifest.json" else d) for n, d in members]


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    a = generate_keypair(d / "a")
    b = generate_keypair(d / "b")
    return {"a": a, "b": b}


@pytest.fixture(scope="module")
def signed(tmp_path_factory, keys):
    out = tmp_path_factory.mktemp("signed") / "signed.ixa"
    return build_quietly(out, input_shapes={"image": (2, 1, 28, 28)}, sign_key=keys["a"][0])


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path):
    r = cli("keygen", "--out", tmp_path / "k")
    assert r.returncode == 0, r.stderr
    key = tmp_path / "k" / "inferx_signing.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and (tmp_path / "k" / PUBLIC_KEY_NAME).exists()
    assert "fingerprint ed25519:" in r.stdout
    again = cli("keygen", "--out", tmp_path / "k")
    assert again.returncode == 2 and "refusing to overwrite" in again.stderr


def test_signed_artifact_is_verified_against_the_trust_store(signed, keys):
    _, public, fp = keys["a"]
    manifest, prov = verify_artifact(signed, trust=public)
    assert prov.verified and prov.signer == fp
    r = cli("inspect", signed, "--trust", public)
    assert r.returncode == 0 and f"signed by {fp} (verified" in r.stdout
    r = cli("inspect", signed)  # no trust store here (conftest points INFERX_TRUST_DIR nowhere)
    assert r.returncode == 0 and "not verified: no trust store" in r.stdout


def test_trust_store_refuses_unsigned_and_foreign_signed_artifacts(default_artifact, signed, keys, tmp_path):
    trust_b = keys["b"][1]
    with pytest.raises(ArtifactError, match="is not signed, and the trust store"):
        verify_artifact(default_artifact, trust=trust_b)
    with pytest.raises(ArtifactError, match=f"signed by {keys['a'][2]}, which is not in the trust store"):
        verify_artifact(signed, trust=trust_b)
    # a trust directory in the environment applies to every command and the Engine
    store = tmp_path / "trusted"
    store.mkdir()
    (store / PUBLIC_KEY_NAME).write_bytes(trust_b.read_bytes())
    env = dict(os.environ, INFERX_TRUST_DIR=str(store))
    for args in (("run", default_artifact), ("inspect", signed), ("run", signed)):
        r = cli(*args, env=env)
        assert r.returncode == 5 and "trust store" in r.stderr, (args, r.stderr)
    r = cli("deploy", signed, "--to", tmp_path / "dev", "--no-selftest", env=env)
    assert r.returncode == 5 and not (tmp_path / "dev").exists()


def test_an_empty_trust_directory_refuses_everything_and_says_so(tmp_path, default_artifact):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="holds no \\*.pub key"):
        verify_artifact(default_artifact, trust=tmp_path / "empty")
    with pytest.raises(UsageError, match="trust store not found"):
        verify_artifact(default_artifact, trust=tmp_path / "missing")


def test_rechecksummed_forgery_with_changed_weights_is_refused(signed, keys, tmp_path):
    members = _members(signed)
    weights = next(n for n, _ in members if n.endswith(".npz"))
    data = bytearray(dict(members)[weights])
    data[-100] ^= 0xFF
    forged = _pack(tmp_path / "forged.ixa", _rechecksum(members, {weights: bytes(data)}))
    verify_artifact(forged, trust=False)  # every checksum is consistent: without a key it passes
    with pytest.raises(ArtifactError, match="signature does not match the manifest"):
        open_artifact(forged, dest=tmp_path / "out", trust=keys["a"][1])
    assert list((tmp_path / "out").iterdir()) == []  # refused before any member was written
    stripped = _pack(
        tmp_path / "stripped.ixa",
        [(n, d) for n, d in _rechecksum(members, {weights: bytes(data)}) if n != "signature.json"],
    )
    with pytest.raises(ArtifactError, match="is not signed"):
        open_artifact(stripped, trust=keys["a"][1])


def test_forged_library_with_an_elf_constructor_never_runs(signed, keys, tmp_path):
    """A library that does its damage at dlopen: refused before extraction, so it is never loaded."""
    marker = tmp_path / "pwned"
    src = tmp_path / "evil.c"
    src.write_text(
        f'#include <stdio.h>\n__attribute__((constructor)) static void evil(void) {{ FILE* f = fopen("{marker}", "w"); '
        f"if (f) fclose(f); }}\nint __tvm_ffi_main__ = 0;\n"
    )
    lib = tmp_path / "evil.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    members = _members(signed)
    library = next(n for n, _ in members if n.endswith(".so"))
    forged = _pack(tmp_path / "evil.ixa", _rechecksum(members, {library: lib.read_bytes()}))
    r = cli("run", forged, "--trust", keys["a"][1])
    assert r.returncode == 5 and "signature does not match" in r.stderr
    assert not marker.exists()
    from inferx_edge.runtime import Engine

    with pytest.raises(ArtifactError, match="signature does not match"):
        Engine(forged, trust=keys["a"][1])
    assert not marker.exists()


def test_build_with_a_missing_key_fails_before_compiling(tmp_path):
    r = cli("build", "--sign", tmp_path / "nokey.pem", "-o", tmp_path / "a.ixa")
    assert r.returncode == 2 and "signing key not found" in r.stderr and not (tmp_path / "a.ixa").exists()
