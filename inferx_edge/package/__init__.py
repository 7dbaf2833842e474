"""Artifact format: versioned manifest + libraries + weights in one checksummed tar file.

Runtime-safe: imports only the standard library, so devices read artifacts without the compiler.
"""

from inferx_edge.package.bundle import ExtractedArtifact, open_artifact, read_manifest, write_artifact
from inferx_edge.package.manifest import SCHEMA_VERSION, Manifest, TensorSpec, Variant

__all__ = [
    "SCHEMA_VERSION",
    "ExtractedArtifact",
    "Manifest",
    "TensorSpec",
    "Variant",
    "open_artifact",
    "read_manifest",
    "write_artifact",
]
