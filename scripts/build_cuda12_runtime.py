#!/usr/bin/env python3
"""Build TVM's CUDA runtime library (``libtvm_runtime_cuda.so``) against CUDA 12, for x86-64 or aarch64
(Jetson Orin, JetPack 6), next to the apache-tvm wheel's ``libtvm_runtime.so`` / ``libtvm_ffi.so``.

The apache-tvm 0.27 wheels link ``libcudart.so.13``; JetPack 6 is CUDA 12. Only this one library is
rebuilt, from the three sources TVM's ``cmake/modules/CUDA.cmake`` compiles into it (the Apache-2.0
copy in ``scripts/tvm_cuda_runtime_src/``, or ``--tvm-src``), with the wheel's own headers first:

    python scripts/build_cuda12_runtime.py --arch x86_64 --out build/cuda12-runtime
    python scripts/build_cuda12_runtime.py --arch aarch64 --out build/cuda12-runtime   # cross, for Jetson

Inputs, all from PyPI (``--arch aarch64`` downloads the aarch64 wheels into ``--cache``): apache-tvm
and apache-tvm-ffi (the versions pinned in pyproject.toml; their headers and the libraries to link
against), ``nvidia-cuda-runtime-cu12`` (CUDA 12 headers, ``libcudart.so.12``), ``nvidia-cuda-nvcc-cu12``
(``crt/`` headers). The driver library is a link-time stub: the device's real ``libcuda.so.1`` is used
at run time. On a Jetson itself, ``--cuda-home /usr/local/cuda`` takes JetPack's CUDA 12 instead of the
PyPI headers (docs/deploy.md).

Writes ``<out>/<arch>/libtvm_runtime_cuda.so`` and ``build.json`` (sha256 of the library and of every
input, compiler, CUDA version, NEEDED entries); fails unless the library NEEDs ``libcudart.so.12``, no
``libcudart.so.13``, and is of the requested machine. ``--sign KEY`` (the Ed25519 key artifacts are
signed with, ``python -m inferx_edge keygen``) also writes ``build.json.sig``: a device with a trust
store loads the library only when that signature is by a trusted key and the sha256 matches.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from inferx_edge.compiler.cuda.stub import compile_stub, driver_symbols
from inferx_edge.package.bundle import sha256_file

REPO = Path(__file__).resolve().parent.parent
SOURCES = (
    "src/backend/cuda/runtime/cuda_device_api.cc",
    "src/backend/cuda/runtime/cuda_module.cc",
    "src/runtime/vm/cuda/cuda_graph_builtin.cc",
)
ARCHES = {
    "x86_64": {"cxx": "g++", "platform": "manylinux_2_28_x86_64", "machine": "X86-64"},
    "aarch64": {"cxx": "aarch64-linux-gnu-g++", "platform": "manylinux_2_28_aarch64", "machine": "AArch64"},
}
CUDA12 = {"nvidia-cuda-runtime-cu12": "12.6.77", "nvidia-cuda-nvcc-cu12": "12.6.85"}


def pinned(name: str) -> str:
    text = (REPO / "pyproject.toml").read_text()
    m = re.search(rf'"{re.escape(name)}==([^"]+)"', text)
    if not m:
        raise SystemExit(f"pyproject.toml pins no version of {name}")
    return m.group(1)


def fetch_wheel(name: str, version: str, platform: str, cache: Path) -> Path:
    """The wheel of ``name==version`` for ``platform`` (any Python ABI), downloaded once into ``cache``."""
    cache.mkdir(parents=True, exist_ok=True)
    stem = name.replace("-", "_")
    found = [p for p in cache.glob(f"{stem}-{version}-*.whl") if platform.split("_", 3)[-1] in p.name]
    arch = platform.split("_", 3)[-1]
    tags = [platform, f"manylinux2014_{arch}"]  # the NVIDIA wheels carry the older tag
    if not found:
        for tag in tags:
            for py in ("312", "311", "310"):
                cmd = [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "-q",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--platform",
                    tag,
                    "--python-version",
                    py,
                    "-d",
                    str(cache),
                    f"{name}=={version}",
                ]
                if subprocess.run(cmd, capture_output=True, text=True).returncode == 0:
                    break
            else:
                continue
            break
        found = [p for p in cache.glob(f"{stem}-{version}-*.whl") if platform.split("_", 3)[-1] in p.name]
    if not found:
        raise SystemExit(f"cannot download {name}=={version} for {platform} (pip download failed)")
    return sorted(found)[0]


def unpack(wheel: Path, dest: Path) -> Path:
    out = dest / wheel.stem
    if not out.exists():
        with zipfile.ZipFile(wheel) as z:
            z.extractall(out)
    return out


def layout(arch: str, cache: Path, work: Path, cuda_home: Path | None) -> dict[str, Path]:
    """Include and library directories: the installed wheels for this host's arch, else downloaded ones."""
    plat = ARCHES[arch]["platform"]
    host = os.uname().machine
    dirs: dict[str, Path] = {}
    if arch == host:
        import tvm
        import tvm_ffi

        dirs["tvm"] = Path(tvm.__file__).parent
        dirs["ffi"] = Path(tvm_ffi.__file__).parent
    else:
        dirs["tvm"] = unpack(fetch_wheel("apache-tvm", pinned("apache-tvm"), plat, cache), work) / "tvm"
        dirs["ffi"] = unpack(fetch_wheel("apache-tvm-ffi", pinned("apache-tvm-ffi"), plat, cache), work) / "tvm_ffi"
    if cuda_home is not None:
        dirs["cuda_include"] = cuda_home / "include"
        dirs["crt_include"] = cuda_home / "include"
        dirs["cudart_lib"] = cuda_home / "lib64"
        return dirs
    try:
        if arch != host:
            raise ImportError
        import nvidia.cuda_nvcc
        import nvidia.cuda_runtime

        rt = Path(list(nvidia.cuda_runtime.__path__)[0])
        nvcc = Path(list(nvidia.cuda_nvcc.__path__)[0])
    except ImportError:
        rt = unpack(fetch_wheel("nvidia-cuda-runtime-cu12", CUDA12["nvidia-cuda-runtime-cu12"], plat, cache), work)
        rt = rt / "nvidia" / "cuda_runtime"
        nvcc = unpack(fetch_wheel("nvidia-cuda-nvcc-cu12", CUDA12["nvidia-cuda-nvcc-cu12"], plat, cache), work)
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


def build(arch: str, out: Path, tvm_src: Path, cache: Path, cuda_home: Path | None, jobs: int) -> dict:
    spec = ARCHES[arch]
    cxx = os.environ.get("CXX_" + arch.upper(), spec["cxx"])
    if shutil.which(cxx) is None:
        raise SystemExit(f"{cxx} not found (Debian: apt install g++-aarch64-linux-gnu for aarch64)")
    nm = "aarch64-linux-gnu-nm" if arch == "aarch64" and shutil.which("aarch64-linux-gnu-nm") else "nm"
    dest = out / arch
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cuda12-runtime-") as tmp:
        work = Path(tmp)
        d = layout(arch, cache, work, cuda_home)
        version_h = (d["cuda_include"] / "cuda.h").read_text(errors="replace")
        cuda_version = int(re.search(r"#define CUDA_VERSION (\d+)", version_h).group(1))
        if cuda_version // 1000 != 12:
            raise SystemExit(f"{d['cuda_include']}/cuda.h is CUDA {cuda_version}; this builds against CUDA 12")
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
        flags = [
            "-std=c++17",
            "-O2",
            "-fPIC",
            "-fvisibility=hidden",
            "-DNDEBUG",
            "-DTVM_RUNTIME_EXPORTS",
            "-DTVM_FFI_EXPORTS",
            *[f"-I{p}" for p in includes],
        ]
        # reproducible: the temporary build paths (in __FILE__ of error messages) do not reach the binary
        flags += [f"-ffile-prefix-map={p}=tvm" for p in (work, tvm_src, d["tvm"], d["ffi"], d["cuda_include"])]
        flags += ["-frandom-seed=inferx"]
        # the sources include headers by relative path: build in a tree of the snapshot's src/ with the
        # wheel's src/ laid over it (the wheel's headers are the ones its libraries were built with)
        tree = work / "tree"
        shutil.copytree(tvm_src / "src", tree / "src")
        shutil.copytree(d["tvm"] / "src", tree / "src", dirs_exist_ok=True)
        objects, procs, inputs = [], [], {}
        for rel in SOURCES:
            src = tvm_src / rel
            inputs[rel] = sha256_file(src)
            text = src.read_text()
            patched = patch_for_cuda_before_12_8(text) if cuda_version < 12080 else text
            local = tree / rel
            local.write_text(patched)
            obj = work / (Path(rel).stem + ".o")
            objects.append(obj)
            procs.append(
                subprocess.Popen([cxx, *flags, "-c", str(local), "-o", str(obj)], stderr=subprocess.PIPE, text=True)
            )
            if len(procs) >= jobs:
                _wait(procs.pop(0))
        for p in procs:
            _wait(p)
        # link-time only: the device's real libcuda.so.1 is what loads
        stub = compile_stub(driver_symbols(objects, nm), work / "libcuda.so", cxx.replace("g++", "gcc"))
        lib = dest / "libtvm_runtime_cuda.so"
        tmp_lib = work / "libtvm_runtime_cuda.so"
        cudart = d["cudart_lib"] / "libcudart.so.12"
        link = [
            cxx,
            "-shared",
            "-Wl,-soname,libtvm_runtime_cuda.so",
            "-Wl,-rpath,$ORIGIN",
            "-Wl,--no-undefined",
            "-o",
            str(tmp_lib),
            *map(str, objects),
            str(d["tvm"] / "lib" / "libtvm_runtime.so"),
            str(d["ffi"] / "lib" / "libtvm_ffi.so"),
            str(cudart),
            str(stub),
            "-lpthread",
        ]
        r = subprocess.run(link, capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"link failed:\n{r.stderr[-4000:]}")
        shutil.move(str(tmp_lib), lib)
        compiler = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
        inputs["libtvm_runtime.so"] = sha256_file(d["tvm"] / "lib" / "libtvm_runtime.so")
        inputs["libtvm_ffi.so"] = sha256_file(d["ffi"] / "lib" / "libtvm_ffi.so")
        inputs["cuda.h"] = sha256_file(d["cuda_include"] / "cuda.h")
    machine, needed = readelf(lib)
    problems = []
    if spec["machine"] not in machine:
        problems.append(f"machine is {machine}, not {spec['machine']}")
    if "libcudart.so.12" not in needed:
        problems.append(f"does not NEED libcudart.so.12 ({needed})")
    if any(n.startswith("libcudart.so.13") for n in needed):
        problems.append("NEEDs libcudart.so.13")
    if problems:
        raise SystemExit(f"{lib}: " + "; ".join(problems))
    record = {
        "library": str(lib.relative_to(out)),
        "sha256": sha256_file(lib),
        "arch": arch,
        "machine": machine,
        "needed": needed,
        "cuda_version": cuda_version,
        "tvm": pinned("apache-tvm"),
        "tvm_ffi": pinned("apache-tvm-ffi"),
        "compiler": compiler,
        "patched_for_cuda_before_12_8": cuda_version < 12080,
        "inputs_sha256": inputs,
        "cuda_source": str(cuda_home) if cuda_home else "PyPI " + ", ".join(f"{k}=={v}" for k, v in CUDA12.items()),
    }
    (dest / "build.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def _wait(p: subprocess.Popen) -> None:
    _, err = p.communicate()
    if p.returncode:
        raise SystemExit(f"compile failed:\n{err[-4000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--arch", choices=sorted(ARCHES), default=os.uname().machine if os.uname().machine in ARCHES else "x86_64"
    )
    ap.add_argument("--out", type=Path, default=REPO / "build" / "cuda12-runtime")
    ap.add_argument(
        "--tvm-src",
        type=Path,
        default=REPO / "scripts" / "tvm_cuda_runtime_src",
        help="TVM sources of the three files (default scripts/tvm_cuda_runtime_src)",
    )
    ap.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inferx_edge" / "wheels",
    )
    ap.add_argument("--cuda-home", type=Path, default=None, help="a CUDA 12 toolkit (on a Jetson: /usr/local/cuda)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--sign", type=Path, default=None, metavar="KEY", help="Ed25519 private key: write build.json.sig")
    args = ap.parse_args()
    if args.sign is not None and not args.sign.is_file():
        raise SystemExit(f"--sign {args.sign}: no such key file (python -m inferx_edge keygen makes one)")
    missing = [s for s in SOURCES if not (args.tvm_src / s).exists()]
    if missing:
        raise SystemExit(f"{args.tvm_src} lacks {missing} (pass --tvm-src)")
    rec = build(args.arch, args.out, args.tvm_src, args.cache, args.cuda_home, args.jobs)
    sig = args.out / args.arch / "build.json.sig"
    if args.sign is not None:
        from inferx_edge.package.signing import sign_manifest

        sig.write_bytes(sign_manifest((args.out / args.arch / "build.json").read_bytes(), args.sign, "build.json"))
        print(f"signed {sig}")
    elif sig.exists():
        sig.unlink()  # a signature of an earlier build would not match this record
    print(
        f"wrote {args.out / rec['library']} (sha256 {rec['sha256'][:16]}..., {rec['machine']}, "
        f"CUDA {rec['cuda_version']}, NEEDED {', '.join(n for n in rec['needed'] if 'cud' in n)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
