"""CUDA toolkits on the build host that can compile device code: NVRTC (PyPI wheels or a CUDA install)
and nvcc, found by the CUDA major version the device runs, and the compile calls for each."""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import re
import site
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from inferx_edge.errors import BuildError


@dataclass(frozen=True)
class Nvrtc:
    """One NVRTC installation: the library, its version and the headers that go with it."""

    library: Path
    version: tuple[int, int]
    include_dirs: tuple[Path, ...]

    @property
    def version_str(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


def _site_dirs() -> list[Path]:
    dirs = [Path(p) for p in sys.path if p.endswith("-packages")]
    with contextlib.suppress(AttributeError):
        dirs += [Path(p) for p in site.getsitepackages()]
    return list(dict.fromkeys(d for d in dirs if d.is_dir()))


#: what every generated kernel module includes: a toolkit that cannot compile this compiles nothing
#: (torch's pip NVRTC ships without the CCCL headers that cuda_fp16.h of CUDA 13 needs)
PROBE_SOURCE = """#include <cuda_fp16.h>
#include <mma.h>
extern "C" __global__ void inferx_probe(half* x) { x[threadIdx.x] = __float2half(1.0f); }
"""
_PROBE_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferx_edge" / "nvrtc_probe.json"


def nvrtc_candidates(
    site_dirs: list[Path] | None = None, cuda_dirs: list[str] | None = None
) -> list[tuple[Path, list[Path]]]:
    """(library, include dirs) of every NVRTC found: PyPI wheels under ``site_dirs`` first, then CUDA
    installs (``$CUDA_HOME``, ``/usr/local/cuda*``)."""
    candidates: list[tuple[Path, list[Path]]] = []
    for sp in _site_dirs() if site_dirs is None else site_dirs:
        nv = Path(sp) / "nvidia"
        for lib in sorted(
            glob.glob(str(nv / "cuda_nvrtc" / "lib" / "libnvrtc.so.*"))
            + glob.glob(str(nv / "cu*" / "lib" / "libnvrtc.so.*"))
        ):
            root = Path(lib).parent.parent
            # cuda_nvcc holds crt/mma.h, which the tensor-core (wmma) kernels include through mma.h
            incs = [nv / "cuda_runtime" / "include", nv / "cuda_cccl" / "include", nv / "cuda_nvcc" / "include"]
            incs.append(root / "include")
            candidates.append((Path(lib), [p for p in incs if p.is_dir()]))
    if cuda_dirs is None:
        cuda_dirs = [
            os.environ.get("CUDA_HOME", ""),
            "/usr/local/cuda",
            *sorted(glob.glob("/usr/local/cuda-*"), reverse=True),
        ]
    for cuda in cuda_dirs:
        if cuda and Path(cuda).is_dir():
            for lib in glob.glob(f"{cuda}/lib*/libnvrtc.so.*") + glob.glob(f"{cuda}/targets/*/lib/libnvrtc.so.*"):
                incs = [
                    Path(cuda) / "include",
                    *map(Path, glob.glob(f"{cuda}/targets/*/include")),
                    *map(Path, glob.glob(f"{cuda}/targets/*/include/cccl")),
                ]
                candidates.append((Path(lib), [p for p in incs if p.is_dir()]))
    return [(lib, incs) for lib, incs in candidates if re.fullmatch(r"libnvrtc\.so\.\d+(\.\d+)*", lib.name)]


def _probe(nvrtc: Nvrtc) -> str | None:
    """None when ``nvrtc`` compiles :data:`PROBE_SOURCE`, else why not; cached by library, headers and
    their modification times."""
    import json

    key = json.dumps([str(nvrtc.library), [str(d) for d in nvrtc.include_dirs],
                      [os.path.getmtime(p) for p in (nvrtc.library, *nvrtc.include_dirs)]])  # fmt: skip
    try:
        cache = json.loads(_PROBE_CACHE.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        return cache[key]
    try:
        nvrtc_compile(nvrtc, PROBE_SOURCE, "sm_80", "ptx")
        result = None
    except BuildError as exc:
        lines = [line.strip() for line in str(exc).splitlines()[1:] if line.strip()]
        errors = [line for line in lines if "error" in line.lower()]
        result = ((errors or lines or ["compilation failed"])[0])[:300]
    cache[key] = result
    with contextlib.suppress(OSError):
        _PROBE_CACHE.parent.mkdir(parents=True, exist_ok=True)
        _PROBE_CACHE.write_text(json.dumps(cache))
    return result


@dataclass(frozen=True)
class Discovery:
    """What :func:`discover_nvrtc` found: the usable toolkits, newest first, and the rejected ones."""

    usable: tuple[Nvrtc, ...]
    rejected: tuple[tuple[str, str], ...]  # (library, why)

    def describe(self) -> str:
        lines = [f"  usable: NVRTC {n.version_str} at {n.library}" for n in self.usable]
        lines += [f"  rejected: {lib}: {why}" for lib, why in self.rejected]
        return "\n".join(lines) or "  none found"


def discover_nvrtc(major: int | None, site_dirs=None, cuda_dirs=None) -> Discovery:
    """Every NVRTC of CUDA ``major`` (None: any), each checked to load and to compile a probe kernel."""
    usable, rejected, seen = [], [], set()
    for lib, incs in nvrtc_candidates(site_dirs, cuda_dirs):
        real = os.path.realpath(lib)
        if "builtins" in lib.name or real in seen:  # /usr/local/cuda -> cuda-13.0, .so.13 -> .so.13.0.88
            continue
        seen.add(real)
        try:
            handle = ctypes.CDLL(str(lib))
            mj, mn = ctypes.c_int(), ctypes.c_int()
            handle.nvrtcVersion(ctypes.byref(mj), ctypes.byref(mn))
        except (OSError, AttributeError) as exc:
            rejected.append((str(lib), f"does not load as NVRTC ({exc})"))
            continue
        if major is not None and mj.value != major:
            continue  # another CUDA major: not a candidate for this device, not an error
        nvrtc = Nvrtc(lib, (mj.value, mn.value), tuple(incs))
        why = _probe(nvrtc)
        if why is None:
            usable.append(nvrtc)
        else:
            rejected.append((str(lib), f"NVRTC {nvrtc.version_str} cannot compile a kernel with its headers: {why}"))
    usable.sort(key=lambda n: n.version, reverse=True)
    return Discovery(tuple(dict.fromkeys(usable)), tuple(rejected))


def find_nvrtc(major: int | None, site_dirs=None, cuda_dirs=None) -> Nvrtc:
    """The NVRTC to compile device code with: of CUDA ``major`` (None: the newest), one that compiles
    (:func:`discover_nvrtc`); else a :class:`BuildError` listing what was found and why each was rejected."""
    found = discover_nvrtc(major, site_dirs, cuda_dirs)
    if found.usable:
        return found.usable[0]
    want = f"CUDA {major}" if major else "any CUDA"
    raise BuildError(
        f"no usable NVRTC for {want} to compile device code:\n{found.describe()}\ninstall a complete one with "
        f"pip install 'nvidia-cuda-nvrtc-cu{major or 12}' 'nvidia-cuda-runtime-cu{major or 12}' "
        f"'nvidia-cuda-cccl-cu{major or 12}' 'nvidia-cuda-nvcc-cu{major or 12}' (or the 'cuda{major or 12}' extra "
        f"of inferx_edge), or set INFERX_CUDA_COMPILER=nvcc to use nvcc"
    )


def nvrtc_compile(nvrtc: Nvrtc, code: str, arch: str, fmt: str) -> bytes:
    """Compile CUDA C++ ``code`` for ``arch`` (``sm_87``) to a cubin, or PTX for ``compute_87``."""
    lib = ctypes.CDLL(str(nvrtc.library))
    number = arch.removeprefix("sm_")
    gpu_arch = f"sm_{number}" if fmt == "cubin" else f"compute_{number}"
    code = "\n".join(line for line in code.splitlines() if line.strip() != "#include <cuda.h>")
    prog = ctypes.c_void_p()
    _check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), b"inferx_kernels.cu", 0, None, None), prog)
    try:
        opts = [
            f"--gpu-architecture={gpu_arch}",
            "-default-device",
            "--use_fast_math",
            "-D__NV_SILENCE_DEPRECATION_BEGIN=",
            "-D__NV_SILENCE_DEPRECATION_END=",
            "-D__NV_SILENCE_HOST_DEPRECATION_BEGIN=",
            "-D__NV_SILENCE_HOST_DEPRECATION_END=",
            "-U__CUDA_NO_HALF_OPERATORS__",
            "-U__CUDA_NO_HALF_CONVERSIONS__",
            "-U__CUDA_NO_BFLOAT16_OPERATORS__",
            "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
            *(f"-I{d}" for d in nvrtc.include_dirs),
        ]
        if nvrtc.version >= (12, 0):
            opts.append("--device-int128")
        argv = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
        rc = lib.nvrtcCompileProgram(prog, len(opts), argv)
        if rc != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            text = log.value.decode(errors="replace").strip()
            raise BuildError(
                f"NVRTC {nvrtc.version_str} failed to compile device code for {gpu_arch}:\n{compiler_errors(text)}"
            )
        get_size, get = (
            (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN) if fmt == "cubin" else (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX)
        )
        size = ctypes.c_size_t()
        _check(lib, get_size(prog, ctypes.byref(size)), prog)
        buf = ctypes.create_string_buffer(size.value)
        _check(lib, get(prog, buf), prog)
        data = buf.raw[: size.value]
        return data.rstrip(b"\0") if fmt == "ptx" else data
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _check(lib, rc: int, prog) -> None:
    if rc != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise BuildError(f"NVRTC error {rc}: {lib.nvrtcGetErrorString(rc).decode()}")


@dataclass(frozen=True)
class Nvcc:
    """An nvcc installation, used when no NVRTC of the right CUDA version is found."""

    path: str
    version: tuple[int, int]

    @property
    def version_str(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"


def find_nvcc(major: int | None) -> Nvcc | None:
    import shutil

    for exe in dict.fromkeys(
        filter(None, [shutil.which("nvcc"), os.environ.get("CUDA_HOME", "") + "/bin/nvcc", "/usr/local/cuda/bin/nvcc"])
    ):
        try:
            out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        m = re.search(r"release (\d+)\.(\d+)", out)
        if m and (major is None or int(m.group(1)) == major):
            return Nvcc(exe, (int(m.group(1)), int(m.group(2))))
    return None


def nvcc_compile(nvcc: Nvcc, code: str, arch: str, fmt: str) -> bytes:
    number = arch.removeprefix("sm_")
    with tempfile.TemporaryDirectory(prefix="inferx_nvcc_") as tmp:
        src, out = Path(tmp) / "kernels.cu", Path(tmp) / f"kernels.{fmt}"
        src.write_text(code)
        flag = "--cubin" if fmt == "cubin" else "--ptx"
        gpu = f"sm_{number}" if fmt == "cubin" else f"compute_{number}"
        cmd = [nvcc.path, flag, f"-arch={gpu}", "-O3", "--use_fast_math", "-o", str(out), str(src)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(
                f"nvcc {nvcc.version_str} failed to compile device code for {gpu}:\n{compiler_errors(r.stderr)}"
            )
        return out.read_bytes()


def compiler_errors(log: str, limit: int = 4000) -> str:
    """The error messages of a CUDA compiler log (each with the two lines that follow it: the source
    line and its caret), without the warnings that bury them; the log's tail when none is marked."""
    lines = log.splitlines()
    picked: list[str] = []
    for i, line in enumerate(lines):
        if re.search(r"\berror\b", line):
            picked += lines[i : i + 3]
    text = "\n".join(picked) if picked else log
    return text[:limit] if picked else text[-limit:]
