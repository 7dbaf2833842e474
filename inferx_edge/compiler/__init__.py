"""Compilation: Relax pipeline, ahead-of-time build per target, export of the shared library, packaging."""

from inferx_edge.compiler.build import BuildOptions, build_artifact, compile_variant, resolve_tvm_target

__all__ = ["BuildOptions", "build_artifact", "compile_variant", "resolve_tvm_target"]
