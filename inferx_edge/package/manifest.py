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


def _digest(body: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the manifest without its own checksum field."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(canonical).hexdigest()
