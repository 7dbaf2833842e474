"""The CUDA compile callback a build runs under: device code compiled ahead of time on the build host,
by a toolkit that matches the device (JetPack 6 ships CUDA 12.x: a CUDA 13 cubin will not load there),
with the source patches applied first."""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

from inferx_edge.compiler.cuda.source_patches import (
    drop_own_lane_shuffles,
    fix_gathered_half8_packs,
    fix_int8_vector_constants,
    interleave_pipelined_copies,
)
from inferx_edge.compiler.cuda.stub import ensure_cuda_codegen
from inferx_edge.compiler.cuda.toolkit import find_nvcc, find_nvrtc, nvcc_compile, nvrtc_compile
from inferx_edge.compiler.cuda.wgmma import parse_tile
from inferx_edge.errors import BuildError, check_choice
from inferx_edge.targets import TargetSpec

#: Device code formats: a cubin for exactly the target arch, or PTX the driver JIT-compiles.
CUDA_CODE_FORMATS = ("cubin", "ptx")
#: ``compiler`` choices: "" (NVRTC of the device's CUDA major, else nvcc), or one of them only
CUDA_COMPILERS = ("", "nvrtc", "nvcc")


@dataclass(frozen=True, kw_only=True)
class CudaOptions:
    """How CUDA device code is compiled. :meth:`from_env` reads the environment switches.

    Attributes
    ----------
    compiler : ``"nvrtc"`` or ``"nvcc"`` to use only that one; ``""`` (default) NVRTC of the device's
        CUDA major version, else nvcc (env ``INFERX_CUDA_COMPILER``).
    interleave_copies : apply :func:`~inferx_edge.compiler.cuda.source_patches.interleave_pipelined_copies`
        (env ``INFERX_CUDA_INTERLEAVE=0`` turns it off, for A/B measurements of the rewrite).
    dump_dir : keep every generated CUDA source here (env ``INFERX_DUMP_CUDA``).
    fused_attention : fp16/int8/mixed variants run attention as one fused tensor-core kernel
        (:mod:`~inferx_edge.compiler.passes.fused_attention`; default on, env
        ``INFERX_FUSED_ATTENTION=0`` turns it off: softmax between two matmul kernels, for A/B
        measurements). Checked against float64 on an H100 and faster there on every zoo transformer
        (``benchmarks/results/gpu_attention_h100.json``, ``zoo_h100_fused_attention.json``).
    wgmma : int8 dense layers of sm_90a builds run on the wgmma GEMM with their epilogue
        (:mod:`~inferx_edge.compiler.cuda.rules.wgmma_matmul`; default on, env ``INFERX_WGMMA=0``
        turns it off: the mma.sync tile schedule, for A/B measurements). ViT-B/16 int8 at batch 64
        on an H100: 5.55 ms per call with it, 6.71 ms without (kernel profiles of session 75,
        docs/zoo.md "wgmma by default").
    wgmma_tile : the tile those kernels run with, in :func:`~inferx_edge.compiler.cuda.wgmma.parse_tile`'s
        spelling (env ``INFERX_WGMMA_TILE``); ``""`` keeps the rule's ``TILE``.
    """

    compiler: str = ""
    interleave_copies: bool = True
    dump_dir: Path | None = None
    fused_attention: bool = True
    wgmma: bool = True
    wgmma_tile: str = ""

    def __post_init__(self) -> None:
        check_choice("CUDA compiler (INFERX_CUDA_COMPILER)", self.compiler, CUDA_COMPILERS)
        if self.wgmma_tile:
            try:
                parse_tile(self.wgmma_tile)
            except ValueError as e:
                raise BuildError(f"INFERX_WGMMA_TILE: {e}") from None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> CudaOptions:
        env = os.environ if env is None else env
        dump = env.get("INFERX_DUMP_CUDA")
        return cls(
            compiler=env.get("INFERX_CUDA_COMPILER", "").lower(),
            interleave_copies=env.get("INFERX_CUDA_INTERLEAVE", "1") != "0",
            dump_dir=Path(dump) if dump else None,
            fused_attention=env.get("INFERX_FUSED_ATTENTION", "1") != "0",
            wgmma=env.get("INFERX_WGMMA", "1") != "0",
            wgmma_tile=env.get("INFERX_WGMMA_TILE", ""),
        )


def _toolkit(spec: TargetSpec, forced: str):
    major = int(spec.device_cuda.split(".")[0]) if spec.device_cuda else None
    try:
        if forced == "nvcc":
            raise BuildError("nvcc requested by INFERX_CUDA_COMPILER")
        tool = find_nvrtc(major)
        return tool, nvrtc_compile, f"NVRTC {tool.version_str}"
    except BuildError:
        tool = find_nvcc(major) if forced != "nvrtc" else None
        if tool is None:
            raise
        return tool, nvcc_compile, f"nvcc {tool.version_str}"


#: numbers the sources ``INFERX_DUMP_CUDA`` keeps, across every compilation of a process
_DUMPS = itertools.count(1)


@contextlib.contextmanager
def device_compiler(spec: TargetSpec, fmt: str, options: CudaOptions | None = None):
    """Within the block, TVM compiles CUDA kernels with the toolkit matching ``spec``; yields its record."""
    import tvm_ffi

    check_choice("CUDA code format", fmt, CUDA_CODE_FORMATS)
    options = options or CudaOptions.from_env()
    ensure_cuda_codegen()
    tool, compile_fn, name = _toolkit(spec, options.compiler)
    arch = spec.cuda_arch
    if fmt == "ptx" and arch.endswith("a"):
        raise BuildError(f"{spec.name} is {arch}: arch-specific features have no portable PTX; use cubin")
    calls, interleaved = [], []

    def compile_cuda(code, *_):
        calls.append(1)
        generated = str(code)
        code = drop_own_lane_shuffles(generated)
        if options.interleave_copies:
            code, n = interleave_pipelined_copies(code)
            interleaved.append(n)
        code = fix_gathered_half8_packs(fix_int8_vector_constants(code))
        if options.dump_dir:  # as TVM wrote it and, where the repairs changed it, as compiled (the
            # line numbers of a compiler error); numbered per process, so per-kernel retries keep theirs
            options.dump_dir.mkdir(parents=True, exist_ok=True)
            stem = options.dump_dir / f"kernels_{os.getpid()}_{next(_DUMPS)}"
            stem.with_suffix(".cu").write_text(generated)
            if code != generated:
                stem.with_suffix(".compiled.cu").write_text(code)
        return bytearray(compile_fn(tool, code, arch, fmt))

    previous = tvm_ffi.get_global_func("tvm_callback_cuda_compile", allow_missing=True)
    tvm_ffi.register_global_func("tvm_callback_cuda_compile", compile_cuda, override=True)
    record = {
        "toolkit": name,
        "compiler": str(getattr(tool, "library", getattr(tool, "path", ""))),
        "code": fmt,
        "arch": arch if fmt == "cubin" else arch.replace("sm_", "compute_"),
        "kernels_modules": calls,
    }
    try:
        yield record
    finally:
        if previous is not None:
            tvm_ffi.register_global_func("tvm_callback_cuda_compile", previous, override=True)
        record["kernels_modules"] = len(calls)
        record["pipeline_rewrite"] = options.interleave_copies
        record["interleaved_pipeline_loops"] = sum(interleaved)
