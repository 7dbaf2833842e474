"""Native libraries that travel beside artifacts (the CUDA 12 build of TVM's CUDA runtime): the build
record that pins their sha256 and the signature that vouches for that record.

``python -m inferx_edge cuda-runtime`` (:mod:`inferx_edge.deploy.cuda12_runtime`) writes ``build.json`` next to the library (``sha256`` of it, and of
every input) and, with ``--sign KEY``, ``build.json.sig`` (the artifact signature document of
:mod:`inferx_edge.package.signing`, over the exact bytes of ``build.json``). The same trust store that
decides which artifacts a device runs decides which native code it loads.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from inferx_edge.errors import ArtifactError

BUILD_RECORD, BUILD_RECORD_SIGNATURE = "build.json", "build.json.sig"


def check_library_record(lib: Path, trust=None, require_record: bool = False) -> dict:
    """Check ``lib`` against the build record beside it; returns what was checked
    (``{"sha256": ..., "signer": ...}``, keys present only when checked).

    - with ``build.json`` beside it, the library's sha256 must match the one recorded;
    - with a trust store (``trust``: a ``.pub`` file or directory; None for the default store when it
      exists; False for none) the record must exist and be signed by a trusted key.
    Raises :class:`ArtifactError` naming what failed."""
    from inferx_edge.package.signing import Signature, TrustStore

    lib = Path(lib)
    record_path, sig_path = lib.parent / BUILD_RECORD, lib.parent / BUILD_RECORD_SIGNATURE
    record_bytes = record_path.read_bytes() if record_path.is_file() else None
    checked: dict = {}
    store = None if trust is False else TrustStore.load(trust)
    if record_bytes is None:
        if store is not None or require_record:
            why = f"the trust store {store.source} requires signed native code" if store else "it is required"
            raise ArtifactError(
                f"{lib} has no {BUILD_RECORD} beside it, and {why} (python -m inferx_edge cuda-runtime [--sign KEY])"
            )
        return checked
    try:
        want = json.loads(record_bytes)["sha256"]
        if not isinstance(want, str):
            raise TypeError("sha256 is not a string")
    except (ValueError, KeyError, TypeError) as exc:
        raise ArtifactError(
            f"{record_path} is not a build record of python -m inferx_edge cuda-runtime ({exc})"
        ) from exc
    if hashlib.sha256(lib.read_bytes()).hexdigest() != want:
        raise ArtifactError(f"{lib} does not match the sha256 in {record_path}: modified or corrupt, rebuild it")
    checked["sha256"] = want
    if store is not None:
        signature = Signature.parse(sig_path.read_bytes(), str(sig_path)) if sig_path.is_file() else None
        checked["signer"] = store.verify(record_bytes, signature, f"native library {lib}")
    return checked
