"""A stub ``libcuda.so.1`` so TVM's CUDA codegen loads on a build host without a GPU.

TVM 0.27 leaves CUDA *source* in the library when the build host cannot load ``libcuda.so.1`` (its
CUDA codegen lives in ``libtvm_runtime_cuda.so``, which links libcuda): the device would then need a
compiler at load time. :func:`ensure_cuda_codegen` loads TVM's CUDA runtime library on GPU-less hosts
by first loading a stub (built once with the host's C compiler; every entry point returns
CUDA_ERROR_NO_DEVICE). Only the build uses it; nothing on the device changes."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import tempfile
from pathlib import Path

from inferx_edge.errors import BuildError

_STUB_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferx_edge" / "libcuda-stub"


def ensure_cuda_codegen() -> None:
    """Make TVM's CUDA codegen produce device binaries, loading a stub libcuda on GPU-less hosts."""
    from tvm.base import _LOADED_LIBS

    from inferx_edge.runtime._tvm import load_tvm_cuda_library, tvm_lib_dir

    if "tvm_runtime_cuda" in _LOADED_LIBS:
        return
    try:
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        ctypes.CDLL(str(_build_stub(tvm_lib_dir() / "libtvm_runtime_cuda.so")), mode=ctypes.RTLD_GLOBAL)
    try:
        load_tvm_cuda_library()
    except (OSError, RuntimeError) as exc:
        raise BuildError(
            f"cannot load TVM's CUDA runtime library for code generation ({exc}); it needs the CUDA runtime "
            f"(libcudart) of the TVM wheel's CUDA version on the build host"
        ) from exc


def driver_symbols(binaries, nm: str = "nm") -> list[str]:
    """The CUDA driver entry points (``cu*``) that shared libraries or object files leave undefined."""
    names = set()
    for b in binaries:
        dynamic = [] if Path(b).suffix == ".o" else ["-D"]
        try:
            out = subprocess.run(
                [nm, *dynamic, "--undefined-only", str(b)], capture_output=True, text=True, check=True
            ).stdout
        except (OSError, subprocess.CalledProcessError) as exc:
            raise BuildError(f"cannot list the CUDA driver symbols of {b} ({nm}: {exc}); install binutils") from exc
        names |= {line.split()[-1].split("@")[0] for line in out.splitlines() if re.search(r"\bcu[A-Z]\w*", line)}
    return sorted(names)


def compile_stub(symbols: list[str], out: Path, cc: str | None = None) -> Path:
    """Write ``out``, a ``libcuda.so.1`` defining ``symbols``, each returning CUDA_ERROR_NO_DEVICE;
    ``cc`` (default ``$CC`` or ``cc``; a cross compiler for another architecture) builds it."""
    cc = cc or os.environ.get("CC", "cc")
    source = "/* libcuda stub for building on GPU-less hosts: every call reports no device. */\n"
    source += "".join(f"int {s}(void) {{ return 100; /* CUDA_ERROR_NO_DEVICE */ }}\n" for s in symbols)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        src = Path(tmp) / "stub.c"
        src.write_text(source)
        try:
            subprocess.run(
                [cc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(Path(tmp) / "lib.so"), str(src)],
                check=True,
                capture_output=True,
                text=True,
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            raise BuildError(f"cannot build the libcuda stub with '{cc}': {getattr(exc, 'stderr', exc)}") from exc
        os.replace(Path(tmp) / "lib.so", out)
    return out


def _build_stub(tvm_cuda_lib: Path) -> Path:
    out = _STUB_DIR / "libcuda.so.1"
    if out.exists():
        return out
    return compile_stub(driver_symbols([tvm_cuda_lib]), out)
