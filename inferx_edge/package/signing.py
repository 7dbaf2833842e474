"""Ed25519 signatures of artifacts, and the trust store that decides which signers a device accepts.

A signature covers the exact bytes of ``manifest.json``; the manifest pins every other member's sha256
and size, so a valid signature covers the whole artifact. It travels as the ``signature.json`` member
(right after the manifest), so a reader checks it before any other member is extracted.

Keys are PEM files: ``inferx_signing.key`` (PKCS#8, mode 0600) and ``inferx_signing.pub``
(SubjectPublicKeyInfo). A key's fingerprint is ``ed25519:`` + the first 32 hex digits of the sha256 of
its raw 32-byte public key. The trust store is a directory of ``*.pub`` files (or one file):
``--trust`` / ``Engine(trust=...)``, else ``$INFERX_TRUST_DIR``, else ``~/.config/inferx_edge/trusted/``
when that exists. With a trust store, unsigned artifacts and artifacts signed by any other key are
refused.

The ``cryptography`` package is imported only when a signature is made or checked.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from inferx_edge.errors import ArtifactError, UsageError

SIGNATURE_NAME = "signature.json"
SIGNATURE_FORMAT = "inferx_edge.signature"
PRIVATE_KEY_NAME = "inferx_signing.key"
PUBLIC_KEY_NAME = "inferx_signing.pub"
#: a signature document is a few hundred bytes; anything much larger is not one
MAX_SIGNATURE_BYTES = 64 * 1024


def default_trust_dir() -> Path:
    """``$INFERX_TRUST_DIR``, else ``$XDG_CONFIG_HOME/inferx_edge/trusted`` (``~/.config/...``)."""
    env = os.environ.get("INFERX_TRUST_DIR")
    if env:
        return Path(env)
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "inferx_edge" / "trusted"


def _crypto():
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:  # a base dependency; only a broken install gets here
        raise UsageError("artifact signatures need the 'cryptography' package (pip install cryptography)") from exc
    return serialization, ed25519


def fingerprint(public_raw: bytes) -> str:
    return "ed25519:" + hashlib.sha256(public_raw).hexdigest()[:32]


def _raw(public_key) -> bytes:
    serialization, _ = _crypto()
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def generate_keypair(out_dir: Path) -> tuple[Path, Path, str]:
    """Write a new key pair into ``out_dir`` (private key 0600, created exclusively: an existing key is
    never overwritten). Returns (private key path, public key path, fingerprint)."""
    serialization, ed25519 = _crypto()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    private, public = out_dir / PRIVATE_KEY_NAME, out_dir / PUBLIC_KEY_NAME
    for p in (private, public):
        if p.exists():
            raise UsageError(f"{p} exists; refusing to overwrite a key (choose another --out directory)")
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub = key.public_key()
    public.write_bytes(pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public, fingerprint(_raw(pub))


def load_private_key(path: Path):
    serialization, ed25519 = _crypto()
    path = Path(path)
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        raise UsageError(f"signing key not found: {path}") from None
    except (ValueError, TypeError, OSError) as exc:
        raise UsageError(f"{path} is not an unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise UsageError(f"{path} is not an Ed25519 key (python -m inferx_edge keygen makes one)")
    return key


def sign_manifest(manifest_bytes: bytes, key_path: Path, signed_member: str = "manifest.json") -> bytes:
    """The ``signature.json`` member for ``manifest_bytes``, signed with the key at ``key_path``
    (``signed_member`` names what was signed: the same document signs other records, e.g. the
    ``build.json`` of a CUDA runtime library)."""
    key = load_private_key(key_path)
    raw = _raw(key.public_key())
    doc = {
        "format": SIGNATURE_FORMAT,
        "version": 1,
        "algorithm": "ed25519",
        "signed_member": signed_member,
        "key_fingerprint": fingerprint(raw),
        "public_key": base64.b64encode(raw).decode(),
        "signature": base64.b64encode(key.sign(manifest_bytes)).decode(),
    }
    return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


@dataclass(frozen=True)
class Signature:
    """A parsed ``signature.json``."""

    fingerprint: str
    public_raw: bytes
    signature: bytes

    @classmethod
    def parse(cls, data: bytes, where: str) -> Signature:
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != SIGNATURE_FORMAT or doc.get("algorithm") != "ed25519":
                raise ValueError(f"not an {SIGNATURE_FORMAT} document with algorithm ed25519")
            public_raw = base64.b64decode(doc["public_key"], validate=True)
            sig = base64.b64decode(doc["signature"], validate=True)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"{where}: malformed {SIGNATURE_NAME} ({exc})") from exc
        if len(public_raw) != 32 or len(sig) != 64:
            raise ArtifactError(f"{where}: malformed {SIGNATURE_NAME} (wrong key or signature length)")
        return cls(fingerprint(public_raw), public_raw, sig)


class TrustStore:
    """The public keys whose signatures this machine accepts, by fingerprint."""

    def __init__(self, keys: dict[str, bytes], source: str) -> None:
        self.keys = keys  # fingerprint -> raw public key
        self.source = source

    @classmethod
    def load(cls, trust: str | os.PathLike | None = None) -> TrustStore | None:
        """``trust`` (a ``.pub`` file or a directory of them); else the default store when it exists;
        None when there is no store (then artifacts are not required to be signed)."""
        if trust is None:
            path = default_trust_dir()
            if not path.exists():
                return None
        else:
            path = Path(trust)
            if not path.exists():
                raise UsageError(f"trust store not found: {path} (a .pub file or a directory of them)")
        files = sorted(path.glob("*.pub")) if path.is_dir() else [path]
        serialization, ed25519 = _crypto()
        keys = {}
        for f in files:
            try:
                key = serialization.load_pem_public_key(f.read_bytes())
            except (ValueError, TypeError, OSError) as exc:
                raise UsageError(f"trusted key {f} is not a PEM public key ({exc})") from exc
            if not isinstance(key, ed25519.Ed25519PublicKey):
                raise UsageError(f"trusted key {f} is not an Ed25519 key")
            raw = _raw(key)
            keys[fingerprint(raw)] = raw
        if not keys:
            raise ArtifactError(
                f"trust store {path} holds no *.pub key: every artifact would be refused; add the signer's "
                f"{PUBLIC_KEY_NAME}, or remove the directory to accept unsigned artifacts"
            )
        return cls(keys, str(path))

    def verify(self, manifest_bytes: bytes, signature: Signature | None, where: str) -> str:
        """The signer's fingerprint when ``signature`` is a valid signature of ``manifest_bytes`` by a
        trusted key; else :class:`ArtifactError`."""
        if signature is None:
            raise ArtifactError(f"{where} is not signed, and the trust store {self.source} requires a signature")
        raw = self.keys.get(signature.fingerprint)
        if raw is None:
            raise ArtifactError(
                f"{where} is signed by {signature.fingerprint}, which is not in the trust store {self.source} "
                f"(trusted: {', '.join(sorted(self.keys))})"
            )
        _, ed25519 = _crypto()
        from cryptography.exceptions import InvalidSignature

        try:
            ed25519.Ed25519PublicKey.from_public_bytes(raw).verify(signature.signature, manifest_bytes)
        except InvalidSignature:
            raise ArtifactError(
                f"{where}: the signature does not match the manifest (the artifact was modified after signing)"
            ) from None
        return signature.fingerprint
