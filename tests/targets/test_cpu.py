"""x86-64 ISA levels, the CPU features an artifact records, and the refusal on a CPU without them."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile

import pytest

from inferx_edge.errors import TargetMismatchError
from inferx_edge.runtime import compat
from inferx_edge.targets.cpu import X86_LEVELS, isa_level, required_features, same_level_cpus
from tests.helpers import cli


def test_isa_levels_from_cpu_flags():
    assert isa_level(X86_LEVELS["x86-64-v4"] | {"avx512_vnni"}) == "x86-64-v4"
    assert isa_level(X86_LEVELS["x86-64-v3"]) == "x86-64-v3"
    assert isa_level(X86_LEVELS["x86-64-v4"] - {"avx512bw"}) == "x86-64-v3"  # AVX-512F alone is not v4
    assert isa_level(frozenset({"sse2"})) == "x86-64"
    assert isa_level(None) == "x86-64-v2"
    assert required_features({"avx512f", "fast-gather", "prefer-256-bit", "lzcnt", "sse4.2"}) == [
        "abm",
        "avx512f",
        "sse4_2",
    ]
    assert "znver4" in same_level_cpus("rocketlake") and "haswell" not in same_level_cpus("rocketlake")


def test_an_artifact_needing_features_this_cpu_lacks_is_refused(default_artifact, tmp_path, monkeypatch):
    with tarfile.open(default_artifact) as tar:
        members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
    body = json.loads(dict(members)["manifest.json"])
    assert body["target"]["cpu_features"]  # builds record what their code uses
    body["target"]["cpu_features"].append("avx10_2")  # an extension no CPU of today has
    body.pop("manifest_sha256")
    body["manifest_sha256"] = hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    out = tmp_path / "future.ixa"
    with tarfile.open(out, "w:gz") as tar:
        for name, data in members:
            data = (json.dumps(body, indent=2, sort_keys=True) + "\n").encode() if name == "manifest.json" else data
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    r = cli("run", out)
    assert r.returncode == 5 and "this CPU lacks avx10_2" in r.stderr and "illegal instruction" in r.stderr
    monkeypatch.setattr(compat, "cpu_flags", lambda: frozenset())
    from inferx_edge.package import open_artifact

    with open_artifact(default_artifact) as art:
        lib = art.member(art.manifest.variant().library)
        with pytest.raises(TargetMismatchError, match="this CPU lacks"):
            compat.check_host(art.manifest.target, lib)
