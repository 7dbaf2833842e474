"""CUDA device code compiled ahead of time on the build host, by a toolkit that matches the device.

TVM 0.27 leaves CUDA *source* in the library when the build host cannot load ``libcuda.so.1`` (its
CUDA codegen lives in ``libtvm_runtime_cuda.so``, which links libcuda): the device would then need a
compiler at load time. Two fixes here:

1. :func:`ensure_cuda_codegen` loads TVM's CUDA runtime library on GPU-less hosts by first loading a
   stub ``libcuda.so.1`` (built once with the host's C compiler; every entry point returns
   CUDA_ERROR_NO_DEVICE). Only the build uses it; nothing on the device changes.
2. :func:`device_compiler` replaces TVM's compile callback with NVRTC from the CUDA major version the
   device runs (JetPack 6 ships CUDA 12.x: a CUDA 13 cubin will not load there), producing a cubin for
   the exact architecture, or PTX that the driver JIT-compiles for its own (newer) architecture.
"""

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
from inferx_edge.targets import TargetSpec

#: Device code formats: a cubin for exactly the target arch, or PTX the driver JIT-compiles.
CUDA_CODE_FORMATS = ("cubin", "ptx")

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


def _build_stub(tvm_cuda_lib: Path) -> Path:
    out = _STUB_DIR / "libcuda.so.1"
    if out.exists():
        return out
    try:
        nm = subprocess.run(
            ["nm", "-D", "--undefined-only", str(tvm_cuda_lib)], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"cannot list the CUDA driver symbols TVM needs (nm: {exc}); install binutils") from exc
    symbols = sorted({line.split()[-1].split("@")[0] for line in nm.splitlines() if re.search(r"\bcu[A-Z]\w*", line)})
    source = "/* libcuda stub for building on GPU-less hosts: every call reports no device. */\n"
    source += "".join(f"int {s}(void) {{ return 100; /* CUDA_ERROR_NO_DEVICE */ }}\n" for s in symbols)
    _STUB_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=_STUB_DIR) as tmp:
        src = Path(tmp) / "stub.c"
        src.write_text(source)
        cc = os.environ.get("CC", "cc")
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


def find_nvrtc(major: int | None) -> Nvrtc:
    """Find NVRTC of CUDA ``major`` (None: the newest found): PyPI wheels first, then a CUDA install."""
    candidates: list[tuple[Path, list[Path]]] = []
    for sp in _site_dirs():
        nv = sp / "nvidia"
        for lib in glob.glob(str(nv / "cuda_nvrtc" / "lib" / "libnvrtc.so.*")) + glob.glob(
            str(nv / "cu*" / "lib" / "libnvrtc.so.*")
        ):
            root = Path(lib).parent.parent
            # cuda_nvcc holds crt/mma.h, which the tensor-core (wmma) kernels include through mma.h
            incs = [nv / "cuda_runtime" / "include", nv / "cuda_cccl" / "include", nv / "cuda_nvcc" / "include"]
            incs.append(root / "include")
            candidates.append((Path(lib), [p for p in incs if p.is_dir()]))
    for cuda in [
        os.environ.get("CUDA_HOME", ""),
        "/usr/local/cuda",
        *sorted(glob.glob("/usr/local/cuda-*"), reverse=True),
    ]:
        if cuda and Path(cuda).is_dir():
            for lib in glob.glob(f"{cuda}/lib*/libnvrtc.so.*") + glob.glob(f"{cuda}/targets/*/lib/libnvrtc.so.*"):
                incs = [
                    Path(cuda) / "include",
                    *map(Path, glob.glob(f"{cuda}/targets/*/include")),
                    *map(Path, glob.glob(f"{cuda}/targets/*/include/cccl")),
                ]
                candidates.append((Path(lib), [p for p in incs if p.is_dir()]))
    found = []
    for lib, incs in candidates:
        if not re.fullmatch(r"libnvrtc\.so\.\d+(\.\d+)*", lib.name) or "builtins" in lib.name:
            continue
        try:
            handle = ctypes.CDLL(str(lib))
        except OSError:
            continue
        mj, mn = ctypes.c_int(), ctypes.c_int()
        handle.nvrtcVersion(ctypes.byref(mj), ctypes.byref(mn))
        if major is None or mj.value == major:
            found.append(Nvrtc(lib, (mj.value, mn.value), tuple(incs)))
    if not found:
        want = f"CUDA {major}" if major else "any CUDA"
        raise BuildError(
            f"no NVRTC for {want} found to compile device code; install it with "
            f"pip install 'nvidia-cuda-nvrtc-cu{major or 12}' 'nvidia-cuda-runtime-cu{major or 12}' "
            f"'nvidia-cuda-cccl-cu{major or 12}' 'nvidia-cuda-nvcc-cu{major or 12}' (or the 'cuda{major or 12}' extra "
            f"of inferx_edge)"
        )
    return max(found, key=lambda n: n.version)


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


_CHAR = r"\(\(?signed char\)\s*(-?\d+)\)?"
_PACKED_CHARS = re.compile(r"make_int([24])\(\s*(" + _CHAR + r"(?:\s*,\s*" + _CHAR + r")*)\s*\)")


def fix_int8_vector_constants(code: str) -> str:
    """Repair TVM 0.27's CUDA codegen for constant int8 vectors of 8 and 16 lanes: it prints
    ``make_int4((signed char)0, ... 16 values)`` (e.g. the zero a padded convolution's 16-byte activation
    load takes outside the image), which does not compile. Each group of 4 chars becomes the int holding
    those bytes (little-endian), so the vector keeps its bits."""

    def packed(m: re.Match) -> str:
        n = int(m.group(1))
        values = [int(v) for v in re.findall(_CHAR, m.group(2))]
        if len(values) != 4 * n:
            return m.group(0)
        words = []
        for i in range(0, len(values), 4):
            word = sum((v & 0xFF) << (8 * k) for k, v in enumerate(values[i : i + 4]))
            words.append(str(word - (1 << 32) if word >= 1 << 31 else word))
        return f"make_int{n}({', '.join(words)})"

    return _PACKED_CHARS.sub(packed, code)


_OWN_LANE_SHUFFLE = "__shfl_sync(__activemask(), "
_OWN_LANE_TAIL = re.compile(r"\s*\(\(int\)threadIdx\.x\), 32\)")


def drop_own_lane_shuffles(code: str) -> str:
    """Replace ``__shfl_sync(__activemask(), v, ((int)threadIdx.x), 32)`` by ``v``. TVM 0.27 lowers
    every read of a "warp" buffer (the tensor-core accumulators) to a shuffle from the lane the index
    names; the accumulator store reads each thread's own values (lane ``threadIdx.x``, width 32,
    which TVM emits only where threadIdx.x spans whole warps, so the source lane is the thread's own)
    and so paid 128 shuffles per thread for a 64x64 warp tile. Without them nvcc also merges the
    stores into 8-byte ones. On the H200's 4096^3 int8 GEMM a prototype giving the same PTX (TVM's
    mma_store builtin, which fails to lower for some convolutions) went from 679 to 687 TOPS in one
    run; the best tile measured 685 with this repair (gpu_int8_matmul_h200_tiles5.json)."""
    out, pos = [], 0
    while (start := code.find(_OWN_LANE_SHUFFLE, pos)) >= 0:
        i, depth = start + len(_OWN_LANE_SHUFFLE), 0
        while i < len(code) and (depth or code[i] != ","):  # the value: up to its top-level comma
            depth += code[i] in "([{"
            depth -= code[i] in ")]}"
            if depth < 0:
                break
            i += 1
        tail = _OWN_LANE_TAIL.match(code, i + 1) if i < len(code) and code[i] == "," else None
        if tail is None:
            out.append(code[pos : start + len(_OWN_LANE_SHUFFLE)])
            pos = start + len(_OWN_LANE_SHUFFLE)
            continue
        out.append(code[pos:start] + "(" + code[start + len(_OWN_LANE_SHUFFLE) : i].strip() + ")")
        pos = tail.end()
    return "".join(out) + code[pos:]


def _skip_literal(code: str, i: int) -> int:
    """The index after the string or char literal starting at ``code[i]``."""
    quote, i = code[i], i + 1
    while i < len(code) and code[i] != quote:
        i += 2 if code[i] == "\\" else 1
    return i + 1


def _close(code: str, i: int) -> int:
    """The index of the bracket closing the one at ``code[i]`` (string and char literals skipped)."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    while i < len(code):
        c = code[i]
        if c in "\"'":
            i = _skip_literal(code, i)
            continue
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")}]":
            if not stack or stack.pop() != c:
                raise ValueError("unbalanced brackets")
            if not stack:
                return i
        i += 1
    raise ValueError("unbalanced brackets")


def _statements(code: str) -> list[str]:
    """The top-level C statements of a block body: ``for``/``if``/``while`` with their bodies (and
    ``else`` branches), ``{...}`` blocks, and statements ending in ``;``."""
    out, i = [], 0
    while True:
        while i < len(code) and code[i].isspace():
            i += 1
        if i >= len(code):
            return out
        start = i
        m = re.match(r"(for|if|while)\s*\(", code[i:])
        if m or code[i] == "{":
            while True:
                if m:
                    i = _close(code, i + m.end() - 1) + 1
                    while code[i].isspace():
                        i += 1
                    if code[i] != "{":  # a braceless body: one statement
                        i = code.index(";", i) + 1
                    else:
                        i = _close(code, i) + 1
                else:
                    i = _close(code, i) + 1
                e = re.match(r"\s*else\b\s*", code[i:])
                if not (m and m.group(1) == "if" and e):
                    break
                i += e.end()
                m = re.match(r"(if)\s*\(", code[i:])
                if not m and code[i] != "{":
                    raise ValueError("unsupported else branch")
        else:
            while code[i] != ";":
                i = _close(code, i) + 1 if code[i] in "([{" else _skip_literal(code, i) if code[i] in "\"'" else i + 1
            i += 1
        out.append(code[start:i])


_FOR = re.compile(r"for \(int (\w+) = 0; \1 < (\d+); \+\+\1\) \{")
_WAIT = re.compile(r"tvm_builtin_ptx_cp_async_wait_group_async_wait_group_(\d+)\(\);")
_COMMIT = "tvm_builtin_ptx_cp_async_commit_group_async_commit_group();"
_DECL = re.compile(r"(int|unsigned|uint|signed char|char|long|bool|half|float|int[24]|uint[24])\s+\w+\s*(=|;|\[)")
_SYNC = "__syncthreads();"


def _rewrite_pipelined_loop(body: str) -> str | None:
    """:func:`interleave_pipelined_copies` for one loop body, or None when it is not TVM's cp.async
    pipeline loop (see there)."""
    stmts = _statements(body)
    try:
        top = stmts.index(_SYNC)
        commit = stmts.index(_COMMIT)
        wait = next(n for n, s in enumerate(stmts) if _WAIT.fullmatch(s))
    except (ValueError, StopIteration):
        return None
    wait_n = int(_WAIT.fullmatch(stmts[wait]).group(1))
    if not top < commit < wait or stmts[wait + 1 : wait + 2] != [_SYNC] or wait_n < 2:
        return None  # (wait_n < 2: two buffers, see interleave_pipelined_copies)
    head, copies, mid, compute = stmts[:top], stmts[top + 1 : commit], stmts[commit + 1 : wait], stmts[wait + 2 :]
    if not all(_DECL.match(s) for s in head + mid) or not copies:
        return None
    if any(_DECL.match(s) for s in copies) or any(
        _SYNC in s or _COMMIT in s or "wait_group" in s for s in copies + compute
    ):
        return None
    steps_at = next((n for n, s in enumerate(compute) if s.startswith("for ")), None)
    step = _FOR.match(compute[steps_at]) if steps_at is not None else None
    if step is None or int(step.group(2)) < 2:
        return None
    var, steps = step.group(1), int(step.group(2))
    spread, first = [], []
    for s in copies:
        loop = _FOR.match(s)
        inner = _statements(s[loop.end() : _close(s, loop.end() - 1)]) if loop else []
        if loop and inner and all(x.startswith("ptx_cp_async") or _DECL.match(x) for x in inner):
            v, n = loop.group(1), int(loop.group(2))
            per = -(-n // steps)
            end = f"{var} * {per} + {per}" if per * steps == n else f"min({var} * {per} + {per}, {n})"
            spread.append(f"for (int {v} = {var} * {per}; {v} < {end}; ++{v}) {{" + s[loop.end() :])
        else:  # synchronous loads (predicated activations) and single copies: right after the barrier
            first.append(s)
    if not spread:
        return None
    loop_text = compute[steps_at]
    opened = _FOR.match(loop_text).end()
    compute[steps_at] = loop_text[:opened] + "\n" + "\n".join(spread) + loop_text[opened:]
    new = [*head, *mid, f"tvm_builtin_ptx_cp_async_wait_group_async_wait_group_{wait_n - 1}();", _SYNC]
    return "\n".join(new + first + compute + [_COMMIT]) + "\n"


def interleave_pipelined_copies(code: str) -> tuple[str, int]:
    """Rewrite the main loop of TVM's cp.async pipeline (:attr:`~inferx_edge.compiler.cuda_pipeline.
    WmmaConfig.pipeline`) the way CUTLASS's multistage GEMMs run it; returns the source and how many
    loops changed. TVM 0.27 emits, per shared-memory stage k::

        __syncthreads(); <copies of stage k+L>; commit; wait_group(L); __syncthreads(); <math of stage k>

    with every copy issued in one burst ahead of the math and two barriers. Rewritten::

        wait_group(L-1); __syncthreads(); <math of stage k, each 32-deep step issuing its share of
        the cp.async copies of stage k+L>; commit

    Exact by the same argument as CUTLASS's: after the one barrier stage k has landed for every warp,
    and every warp has finished stage k-1's math, whose buffer ((k+L) mod (L+1)) the copies refill.
    Only for L >= 2 (``async3``, ``async4``): the copies of stage k+L now start after stage k has landed
    instead of before, which costs nothing with another stage in flight but exposed the load latency
    with two buffers (L = 1, ``async``: the 8-warp 128x256 tile read 580 TOPS rewritten, 619-621 as TVM
    emits it, in two runs): those loops are left alone.
    Copy loops that are not plain cp.async (the predicated synchronous loads of a padded convolution's
    input) and single copies go right after the barrier instead. A loop that does not have exactly
    this shape (no cp.async pipeline, one 32-deep step per stage, anything unexpected) is left as it is.
    On the H200's 4096^3 int8 GEMM (hand-edited TVM source, 2 alternating rounds, exact): the 8-warp
    128x256 tile with three buffers 591-594 -> 742-747 TOPS (one barrier alone: 638), with fragment
    double buffering 597-605 -> 749-754; the 4-warp 128x128 tile 659-665 -> 670-671 (cuBLASLt 824-868)."""
    out, pos, changed = [], 0, 0
    for m in re.finditer(r"for \(int (\w+) = 0; \1 < \d+; \+\+\1\) \{", code):
        if m.start() < pos or _COMMIT not in code[m.end() : m.end() + 20000]:
            continue
        try:
            end = _close(code, m.end() - 1)
            new = _rewrite_pipelined_loop(code[m.end() : end])
        except (ValueError, IndexError):
            new = None
        if new is None:
            continue
        out.append(code[pos : m.end()] + "\n" + new)
        pos, changed = end, changed + 1
    return "".join(out) + code[pos:], changed


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


@contextlib.contextmanager
def device_compiler(spec: TargetSpec, fmt: str):
    """Within the block, TVM compiles CUDA kernels with the NVRTC matching ``spec``; yields its record."""
    import tvm_ffi

    if fmt not in CUDA_CODE_FORMATS:
        raise BuildError(f"unknown CUDA code format '{fmt}'; valid: {', '.join(CUDA_CODE_FORMATS)}")
    ensure_cuda_codegen()
    major = int(spec.device_cuda.split(".")[0]) if spec.device_cuda else None
    forced = os.environ.get("INFERX_CUDA_COMPILER", "").lower()  # "nvcc" or "nvrtc" to skip the other
    if forced not in ("", "nvcc", "nvrtc"):
        raise BuildError(f"INFERX_CUDA_COMPILER must be nvcc or nvrtc, got '{forced}'")
    try:
        if forced == "nvcc":
            raise BuildError("nvcc requested by INFERX_CUDA_COMPILER")
        tool = find_nvrtc(major)
        compile_fn, name = nvrtc_compile, f"NVRTC {tool.version_str}"
    except BuildError:
        tool = find_nvcc(major) if forced != "nvrtc" else None
        if tool is None:
            raise
        compile_fn, name = nvcc_compile, f"nvcc {tool.version_str}"
    arch = spec.cuda_arch
    if fmt == "ptx" and arch.endswith("a"):
        raise BuildError(f"{spec.name} is {arch}: arch-specific features have no portable PTX; use cubin")
    calls, interleaved = [], []
    dump = os.environ.get("INFERX_DUMP_CUDA")  # a folder: keep each generated CUDA source there
    # "0": keep TVM's cp.async pipeline loops as generated (A/B measurements of the rewrite)
    interleave = os.environ.get("INFERX_CUDA_INTERLEAVE", "1") != "0"

    def compile_cuda(code, *_):
        calls.append(1)
        if dump:
            Path(dump).mkdir(parents=True, exist_ok=True)
            (Path(dump) / f"kernels_{os.getpid()}_{len(calls)}.cu").write_text(str(code))
        code = drop_own_lane_shuffles(str(code))
        if interleave:
            code, n = interleave_pipelined_copies(code)
            interleaved.append(n)
        return bytearray(compile_fn(tool, fix_int8_vector_constants(code), arch, fmt))

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
        record["pipeline_rewrite"] = interleave  # interleave_pipelined_copies (off: INFERX_CUDA_INTERLEAVE=0)
        record["interleaved_pipeline_loops"] = sum(interleaved)
