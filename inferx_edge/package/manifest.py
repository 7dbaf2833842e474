"""The artifact manifest: what was built, for which target, with which signature, and every member's sha256.

Schema history (bump :data:`SCHEMA_VERSION` on any change a reader of the previous version would misread):

1. first version.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from inferx_edge.errors import ArtifactError

SCHEMA_VERSION = 1
FORMAT = "inferx_edge.artifact"
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output. ``shape`` entries are ints; None marks a dimension known only at run time."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str

    def describe(self) -> str:
        dims = "x".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name}: {self.dtype}[{dims}]"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TensorSpec:
        return cls(name=d["name"], shape=tuple(d["shape"]), dtype=d["dtype"])


@dataclass(frozen=True)
class Variant:
    """One compiled form of the model: precision x batch size x schedule set.

    ``library`` is the member holding the compiled VM program and kernels; ``weights`` the ``.npz`` of
    parameters passed after the inputs, in ``params`` order (variants of one precision share it).
    """

    name: str
    precision: str
    batch: int
    library: str
    weights: str | None
    params: tuple[str, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    tuned: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Variant:
        return cls(
            name=d["name"],
            precision=d["precision"],
            batch=int(d["batch"]),
            library=d["library"],
            weights=d.get("weights"),
            params=tuple(d.get("params", ())),
            inputs=tuple(TensorSpec.from_dict(t) for t in d["inputs"]),
            outputs=tuple(TensorSpec.from_dict(t) for t in d["outputs"]),
            tuned=bool(d.get("tuned", False)),
            extra=dict(d.get("extra", {})),
        )


@dataclass(frozen=True)
class Manifest:
    """Top level of ``manifest.json``. ``files`` maps every other member to ``{"sha256", "size"}``."""

    inferx_edge_version: str
    tvm_version: str
    created: str
    model: dict[str, Any]
    target: dict[str, Any]
    variants: tuple[Variant, ...]
    default_variant: str
    files: dict[str, dict[str, Any]]
    build: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    format: str = FORMAT

    def variant(self, name: str | None = None) -> Variant:
        """The named variant, or the default one; an unknown name lists the valid ones."""
        name = name or self.default_variant
        for v in self.variants:
            if v.name == name:
                return v
        raise ArtifactError(f"artifact has no variant '{name}'; valid: {', '.join(v.name for v in self.variants)}")

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return self.variant().inputs

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return self.variant().outputs

    def to_json(self) -> str:
        body = asdict(self)
        body["manifest_sha256"] = _digest(body)
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        try:
            body = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ArtifactError(f"manifest is not valid JSON ({exc})") from exc
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ArtifactError(f"not an inferx_edge artifact manifest (format must be '{FORMAT}')")
        version = body.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ArtifactError(
                f"artifact manifest schema version {version} is not supported by this inferx_edge "
                f"(reads version {SCHEMA_VERSION}); rebuild the artifact or use a matching release"
            )
        recorded = body.pop("manifest_sha256", None)
        if recorded != _digest(body):
            raise ArtifactError("manifest checksum mismatch: manifest.json was modified after the build")
        _validate(body)
        try:
            return cls(
                inferx_edge_version=body["inferx_edge_version"],
                tvm_version=body["tvm_version"],
                created=body["created"],
                model=body["model"],
                target=body["target"],
                variants=tuple(Variant.from_dict(v) for v in body["variants"]),
                default_variant=body["default_variant"],
                files=body["files"],
                build=body.get("build", {}),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"manifest is missing or has a malformed field: {exc}") from exc


_HEX = frozenset("0123456789abcdef")
#: keys of ``target`` the runtime reads before it loads anything
_TARGET_KEYS = ("name", "device", "host_triple")


def _member_path(value: Any, files: dict, what: str) -> None:
    """A path the manifest names must be a safe, listed member: the runtime opens it."""
    if not isinstance(value, str) or not value:
        raise ArtifactError(f"manifest {what} must be a member name, got {value!r}")
    from pathlib import PurePosixPath

    parts = PurePosixPath(value).parts
    if value.startswith(("/", "\\")) or ".." in parts or "\\" in value:
        raise ArtifactError(f"manifest {what} '{value}' points outside the artifact; refusing it")
    if value not in files:
        raise ArtifactError(f"manifest {what} '{value}' is not a member listed in the manifest's files")


def _validate(body: dict[str, Any]) -> None:
    """Refuse a manifest whose fields are missing, malformed, or contradict each other, naming the field."""
    missing = [
        k
        for k in ("inferx_edge_version", "tvm_version", "model", "target", "variants", "default_variant", "files")
        if k not in body
    ]
    if missing:
        raise ArtifactError(f"manifest lacks the fields {missing}")
    files = body["files"]
    if not isinstance(files, dict):
        raise ArtifactError("manifest 'files' must map member names to {sha256, size}")
    for name, entry in files.items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("sha256"), str)
            or len(entry["sha256"]) != 64
            or not set(entry["sha256"]) <= _HEX
            or not isinstance(entry.get("size"), int)
            or isinstance(entry.get("size"), bool)
            or entry["size"] < 0
        ):
            raise ArtifactError(f"manifest entry for member '{name}' must be {{sha256: 64 hex digits, size: bytes}}")
    target = body["target"]
    if not isinstance(target, dict) or any(not isinstance(target.get(k), str) for k in _TARGET_KEYS):
        raise ArtifactError(f"manifest 'target' must hold the strings {list(_TARGET_KEYS)}")
    if target["device"] not in ("cpu", "cuda"):
        raise ArtifactError(f"manifest target device '{target['device']}' is unknown; valid: cpu, cuda")
    if target["device"] == "cuda" and not isinstance(target.get("cuda_arch"), str):
        raise ArtifactError("manifest target is a CUDA device but names no 'cuda_arch'")
    if not isinstance(body["model"], dict) or not isinstance(body["model"].get("name"), str):
        raise ArtifactError("manifest 'model' must be an object with a 'name'")
    variants = body["variants"]
    if not isinstance(variants, list) or not variants or not all(isinstance(v, dict) for v in variants):
        raise ArtifactError("manifest 'variants' must be a non-empty list of objects")
    names = [v.get("name") for v in variants]
    if len(set(names)) != len(names):
        raise ArtifactError(f"manifest lists a variant name twice: {names}")
    if body["default_variant"] not in names:
        raise ArtifactError(f"manifest default_variant '{body['default_variant']}' is not one of the variants {names}")
    for v in variants:
        _member_path(v.get("library"), files, f"variant '{v.get('name')}' library")
        if v.get("weights") is not None:
            _member_path(v["weights"], files, f"variant '{v.get('name')}' weights")


def _digest(body: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the manifest without its own checksum field."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()
