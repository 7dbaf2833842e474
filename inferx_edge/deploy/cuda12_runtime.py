"""Build TVM's CUDA runtime library (``libtvm_runtime_cuda.so``) against CUDA 12, for x86-64 or aarch64
(Jetson Orin, JetPack 6), next to the apache-tvm wheel's ``libtvm_runtime.so`` / ``libtvm_ffi.so``.

The apache-tvm 0.27 wheels link ``libcudart.so.13``; JetPack 6 is CUDA 12. Only this one library is
rebuilt, from the three sources TVM's ``cmake/modules/CUDA.cmake`` compiles into it (the Apache-2.0
copy in ``tvm_cuda_runtime_src/`` beside this module), with the wheel's own headers first.
``python -m inferx_edge cuda-runtime --arch aarch64`` runs it; ``deploy`` runs it by itself when a
Jetson needs the library and none was built.

Inputs, all from PyPI (a cross build downloads the other architecture's wheels into a cache):
apache-tvm and apache-tvm-ffi (the installed versions; their headers and the libraries to link
against), ``nvidia-cuda-runtime-cu12`` (CUDA 12 headers, ``libcudart.so.12``), ``nvidia-cuda-nvcc-cu12``
(``crt/`` headers). The driver library is a link-time stub: the device's real ``libcuda.so.1`` is used
at run time. On a Jetson itself, ``cuda_home=/usr/local/cuda`` takes JetPack's CUDA 12 instead.

Writes ``<out>/<arch>/libtvm_runtime_cuda.so`` and ``build.json`` (sha256 of the library and of every
input, compiler, CUDA version, NEEDED entries); fails unless the library NEEDs ``libcudart.so.12``, no
``libcudart.so.13``, and is of the requested machine. With a signing key it also writes
``build.json.sig``: a device with a trust store loads the library only when that signature is by a
trusted key and the sha256 matches (:mod:`inferx_edge.package.native`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from inferx_edge.compiler.cuda.stub import compile_stub, driver_symbols
from inferx_edge.errors import BuildError, UsageError, check_choice
from inferx_edge.package.bundle import sha256_file
from inferx_edge.package.native import BUILD_RECORD, BUILD_RECORD_SIGNATURE

#: the vendored TVM sources (unmodified; LICENSE, NOTICE and provenance in its README)
TVM_SOURCES = Path(__file__).resolve().parent / "tvm_cuda_runtime_src"
SOURCES = (
    "src/backend/cuda/runtime/cuda_device_api.cc",
    "src/backend/cuda/runtime/cuda_module.cc",
    "src/runtime/vm/cuda/cuda_graph_builtin.cc",
)
ARCHES = {
    "x86_64": {"cxx": "g++", "platform": "manylinux_2_28_x86_64", "machine": "X86-64", "apt": "g++"},
    "aarch64": {
        "cxx": "aarch64-linux-gnu-g++",
        "platform": "manylinux_2_28_aarch64",
        "machine": "AArch64",
        "apt": "g++-aarch64-linux-gnu",
    },
}
#: the CUDA 12 packages the library is built against (JetPack 6.1/6.2 ship CUDA 12.6)
CUDA12 = {"nvidia-cuda-runtime-cu12": "12.6.77", "nvidia-cuda-nvcc-cu12": "12.6.85"}


def default_out() -> Path:
    """Where builds go by default: the directory the runtime searches last on this machine
    (``~/.local/share/inferx_edge/cuda12-runtime``), so an x86-64 build is found without copying."""
    from inferx_edge.runtime._tvm import cuda_runtime_dirs

    return cuda_runtime_dirs()[-1]


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferx_edge" / "wheels"


def installed_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError as exc:
        raise BuildError(f"{dist} is not installed (pip install inferx_edge brings it)") from exc


def fetch_wheel(name: str, version: str, platform: str, cache: Path) -> Path:
    """The wheel of ``name==version`` for ``platform`` (any Python ABI), downloaded once into ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    stem = name.replace("-", "_")
    arch = platform.split("_", 3)[-1]

    def found() -> list[Path]:
        return sorted(p for p in cache.glob(f"{stem}-{version}-*.whl") if arch in p.name)

    tried = []
    for tag in (platform, f"manylinux2014_{arch}"):  # the NVIDIA wheels carry the older tag
        if found():
            break
        for py in ("312", "311", "310"):
            cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
            cmd += ["--platform", tag, "--python-version", py, "-d", str(cache), f"{name}=={version}"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode == 0:
                break
            tried.append(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"pip exited {r.returncode}")
    if not found():
        raise BuildError(
            f"cannot download {name}=={version} for {platform} into {cache} "
            f"({tried[-1] if tried else 'pip download failed'}); with no network, put the wheel there"
        )
    return found()[0]


def _unpack(wheel: Path, dest: Path) -> Path:
    out = dest / wheel.stem
    if not out.exists():
        with zipfile.ZipFile(wheel) as z:
            z.extractall(out)
    return out


def _layout(arch: str, cache: Path, work: Path, cuda_home: Path | None) -> dict[str, Path]:
    """Include and library directories: the installed wheels for this host's arch, else downloaded ones."""
    plat = ARCHES[arch]["platform"]
    native = arch == os.uname().machine
    dirs: dict[str, Path] = {}
    if native:
        import tvm
        import tvm_ffi

        dirs["tvm"] = Path(tvm.__file__).parent
        dirs["ffi"] = Path(tvm_ffi.__file__).parent
    else:
        tvm_wheel = fetch_wheel("apache-tvm", installed_version("apache-tvm"), plat, cache)
        ffi_wheel = fetch_wheel("apache-tvm-ffi", installed_version("apache-tvm-ffi"), plat, cache)
        dirs["tvm"] = _unpack(tvm_wheel, work) / "tvm"
        dirs["ffi"] = _unpack(ffi_wheel, work) / "tvm_ffi"
    if cuda_home is not None:
        dirs["cuda_include"] = dirs["crt_include"] = cuda_home / "include"
        dirs["cudart_lib"] = cuda_home / "lib64"
        return dirs
    try:
        if not native:
            raise ImportError
        import nvidia.cuda_nvcc
        import nvidia.cuda_runtime

        rt = Path(list(nvidia.cuda_runtime.__path__)[0])
        nvcc = Path(list(nvidia.cuda_nvcc.__path__)[0])
    except ImportError:
        rt = _unpack(fetch_wheel("nvidia-cuda-runtime-cu12", CUDA12["nvidia-cuda-runtime-cu12"], plat, cache), work)
        rt = rt / "nvidia" / "cuda_runtime"
        nvcc = _unpack(fetch_wheel("nvidia-cuda-nvcc-cu12", CUDA12["nvidia-cuda-nvcc-cu12"], plat, cache), work)
        nvcc = nvcc / "nvidia" / "cuda_nvcc"
    dirs["cuda_include"] = rt / "include"
    dirs["crt_include"] = nvcc / "include"
    dirs["cudart_lib"] = rt / "lib"
    return dirs


def patch_for_cuda_before_12_8(source: str) -> str:
    """JetPack 6 is CUDA 12.2-12.6: CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION (12.8) does not exist
    there. Guard that launch attribute; a kernel asking for it fails with a clear error (sm_87 has no
    thread-block clusters, so no Orin kernel does). Remove when JetPack ships CUDA >= 12.8."""
    marker = "attr.id = CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION;"
    if marker not in source:
        return source
    start = source.index("    // 1b) Preferred cluster")
    end = source.index("    // 2) Programmatic stream serialization")
    block = source[start:end]
    guarded = (
        "#if CUDA_VERSION >= 12080\n" + block + "#else\n"
        "    if (wl.preferred_cluster_dim(0) != 1 || wl.preferred_cluster_dim(1) != 1 ||\n"
        "        wl.preferred_cluster_dim(2) != 1) {\n"
        '      TVM_FFI_THROW(InternalError) << "preferred cluster dimensions need CUDA >= 12.8; this runtime "\n'
        '                                      "was built with CUDA " << CUDA_VERSION;\n'
        "    }\n#endif\n"
    )
    return source[:start] + guarded + source[end:]


def readelf(lib: Path) -> tuple[str, list[str]]:
    text = subprocess.run(["readelf", "-h", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    machine = re.search(r"Machine:\s+(.+)", text).group(1).strip()
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", text)
    return machine, needed


def build(
    arch: str,
    out: Path | None = None,
    *,
    cuda_home: Path | None = None,
    sign: Path | None = None,
    tvm_src: Path = TVM_SOURCES,
    cache: Path | None = None,
    jobs: int | None = None,
    log=print,
) -> dict:
    """Build ``<out>/<arch>/libtvm_runtime_cuda.so`` (the module docstring); returns its build record.
    ``sign``: an Ed25519 private key (``keygen``) to sign the record with."""
    check_choice("architecture", arch, ARCHES)
    out = Path(out) if out is not None else default_out()
    if sign is not None and not Path(sign).is_file():
        raise UsageError(f"--sign {sign}: no such key file (python -m inferx_edge keygen makes one)")
    missing = [s for s in SOURCES if not (tvm_src / s).exists()]
    if missing:
        raise UsageError(f"{tvm_src} lacks the TVM sources {missing}")
    spec = ARCHES[arch]
    cxx = os.environ.get("CXX_" + arch.upper(), spec["cxx"])
    if shutil.which(cxx) is None:
        raise BuildError(
            f"{cxx} not found: the {arch} C++ compiler builds TVM's CUDA runtime (apt install {spec['apt']})"
        )
    for tool in ("readelf", "nm"):
        if shutil.which(tool) is None:
            raise BuildError(f"{tool} not found (apt install binutils)")
    nm = "aarch64-linux-gnu-nm" if arch == "aarch64" and shutil.which("aarch64-linux-gnu-nm") else "nm"
    dest = out / arch
    dest.mkdir(parents=True, exist_ok=True)
    log(f"building TVM's CUDA runtime against CUDA 12 for {arch} ({cxx}) into {dest}")
    with tempfile.TemporaryDirectory(prefix="cuda12-runtime-") as tmp:
        work = Path(tmp)
        d = _layout(arch, cache or default_cache(), work, cuda_home)
        cuda_h = d["cuda_include"] / "cuda.h"
        if not cuda_h.is_file():
            raise BuildError(f"{cuda_h} not found: not a CUDA toolkit")
        cuda_version = int(re.search(r"#define CUDA_VERSION (\d+)", cuda_h.read_text(errors="replace")).group(1))
        if cuda_version // 1000 != 12:
            raise BuildError(f"{cuda_h} is CUDA {cuda_version}; this builds against CUDA 12")
        includes = [
            d["tvm"] / "include",
            d["tvm"] / "src",
            d["ffi"] / "include",
            tvm_src / "include",
            tvm_src / "src",
            d["cuda_include"],
            d["crt_include"],
            d["tvm"] / "3rdparty" / "dlpack" / "include",
        ]
        # hidden by default, as the wheel builds it: only TVM_DLL entry points are exported
        flags = ["-std=c++17", "-O2", "-fPIC", "-fvisibility=hidden", "-DNDEBUG", "-DTVM_RUNTIME_EXPORTS"]
        flags += ["-DTVM_FFI_EXPORTS", *[f"-I{p}" for p in includes]]
        # reproducible: the temporary build paths (in __FILE__ of error messages) do not reach the binary
        flags += [f"-ffile-prefix-map={p}=tvm" for p in (work, tvm_src, d["tvm"], d["ffi"], d["cuda_include"])]
        flags += ["-frandom-seed=inferx"]
        # the sources include headers by relative path: build in a tree of the vendored src/ with the
        # wheel's src/ laid over it (the wheel's headers are the ones its libraries were built with)
        tree = work / "tree"
        shutil.copytree(tvm_src / "src", tree / "src")
        shutil.copytree(d["tvm"] / "src", tree / "src", dirs_exist_ok=True)
        objects, procs, inputs = [], [], {}
        for rel in SOURCES:
            src = tvm_src / rel
            inputs[rel] = sha256_file(src)
            text = src.read_text()
            local = tree / rel
            local.write_text(patch_for_cuda_before_12_8(text) if cuda_version < 12080 else text)
            obj = work / (Path(rel).stem + ".o")
            objects.append(obj)
            cmd = [cxx, *flags, "-c", str(local), "-o", str(obj)]
            procs.append(subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True))
            if len(procs) >= (jobs or os.cpu_count() or 2):
                _wait(procs.pop(0))
        for p in procs:
            _wait(p)
        # link-time only: the device's real libcuda.so.1 is what loads
        stub = compile_stub(driver_symbols(objects, nm), work / "libcuda.so", cxx.replace("g++", "gcc"))
        tmp_lib = work / "libtvm_runtime_cuda.so"
        link = [cxx, "-shared", "-Wl,-soname,libtvm_runtime_cuda.so", "-Wl,-rpath,$ORIGIN", "-Wl,--no-undefined"]
        link += ["-o", str(tmp_lib), *map(str, objects), str(d["tvm"] / "lib" / "libtvm_runtime.so")]
        link += [str(d["ffi"] / "lib" / "libtvm_ffi.so"), str(d["cudart_lib"] / "libcudart.so.12"), str(stub)]
        r = subprocess.run([*link, "-lpthread"], capture_output=True, text=True)
        if r.returncode:
            raise BuildError(f"linking TVM's CUDA runtime failed:\n{r.stderr[-4000:]}")
        compiler = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
        inputs["libtvm_runtime.so"] = sha256_file(d["tvm"] / "lib" / "libtvm_runtime.so")
        inputs["libtvm_ffi.so"] = sha256_file(d["ffi"] / "lib" / "libtvm_ffi.so")
        inputs["cuda.h"] = sha256_file(cuda_h)
        machine, needed = readelf(tmp_lib)
        problems = []
        if spec["machine"] not in machine:
            problems.append(f"machine is {machine}, not {spec['machine']}")
        if "libcudart.so.12" not in needed:
            problems.append(f"does not NEED libcudart.so.12 ({needed})")
        if any(n.startswith("libcudart.so.13") for n in needed):
            problems.append("NEEDs libcudart.so.13")
        if problems:
            raise BuildError("the CUDA 12 runtime built wrong: " + "; ".join(problems))
        lib = dest / "libtvm_runtime_cuda.so"
        shutil.move(str(tmp_lib), lib)
    record = {
        "library": f"{arch}/libtvm_runtime_cuda.so",
        "sha256": sha256_file(lib),
        "arch": arch,
        "machine": machine,
        "needed": needed,
        "cuda_version": cuda_version,
        "tvm": installed_version("apache-tvm"),
        "tvm_ffi": installed_version("apache-tvm-ffi"),
        "compiler": compiler,
        "patched_for_cuda_before_12_8": cuda_version < 12080,
        "inputs_sha256": inputs,
        "cuda_source": str(cuda_home) if cuda_home else "PyPI " + ", ".join(f"{k}=={v}" for k, v in CUDA12.items()),
    }
    (dest / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    sig = dest / BUILD_RECORD_SIGNATURE
    if sign is not None:
        from inferx_edge.package.signing import sign_manifest

        sig.write_bytes(sign_manifest((dest / BUILD_RECORD).read_bytes(), Path(sign), BUILD_RECORD))
    elif sig.exists():
        sig.unlink()  # a signature of an earlier build would not match this record
    log(
        f"wrote {lib} (sha256 {record['sha256'][:16]}..., {machine}, CUDA {cuda_version}, "
        f"NEEDED {', '.join(n for n in needed if 'cud' in n)}{', signed' if sign else ''})"
    )
    return record


def _wait(p: subprocess.Popen) -> None:
    _, err = p.communicate()
    if p.returncode:
        raise BuildError(f"compiling TVM's CUDA runtime failed:\n{err[-4000:]}")
