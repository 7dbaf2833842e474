"""``python -m inferx_edge cuda-runtime``: TVM's CUDA runtime library rebuilt against CUDA 12 (JetPack 6)
links libcudart.so.12 and never .13, exports the wheel's entry points, is reproducible, and the runtime
loads it instead of the wheel's when told or when the driver is CUDA 12."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

TVM_SRC = REPO / "inferx_edge" / "deploy" / "tvm_cuda_runtime_src"

needs_sources = pytest.mark.skipif(not (TVM_SRC / "src").exists(), reason="TVM runtime sources absent")


def _cuda12_headers() -> bool:
    try:
        import nvidia.cuda_nvcc  # noqa: F401
        import nvidia.cuda_runtime  # noqa: F401
    except ImportError:
        return False
    return True


def _build(arch: str, out: Path) -> dict:
    r = subprocess.run(
        [sys.executable, "-m", "inferx_edge", "cuda-runtime", "--arch", arch, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads((out / arch / "build.json").read_text())


def _defined(lib: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1] for line in out.splitlines()}


@pytest.fixture(scope="module")
def x86_plugin(tmp_path_factory):
    if os.uname().machine != "x86_64" or not _cuda12_headers():
        pytest.skip("needs an x86-64 host with the cuda12 extra (CUDA 12 headers from PyPI)")
    out = tmp_path_factory.mktemp("cuda12")
    return out, _build("x86_64", out)


@needs_sources
def test_x86_plugin_links_cuda12_and_exports_the_wheels_entry_points(x86_plugin, tmp_path):
    import tvm

    from inferx_edge.package.bundle import sha256_file

    out, rec = x86_plugin
    lib = out / rec["library"]
    assert "libcudart.so.12" in rec["needed"] and not any("cudart.so.13" in n for n in rec["needed"])
    assert rec["cuda_version"] // 1000 == 12 and rec["sha256"] == sha256_file(lib)
    wheel = Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
    tvm_entry = {s for s in _defined(wheel) if s.startswith("_ZN3tvm7runtime")}
    assert tvm_entry and tvm_entry <= _defined(lib)
    # every CUDA runtime symbol it imports is versioned libcudart.so.12: it binds to that library even
    # in a process where another library (e.g. torch's) has mapped libcudart.so.13
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", str(lib)], capture_output=True, text=True, check=True).stdout
    cudart = [line.split()[7] for line in syms.splitlines() if " UND " in line and " cuda" in line]
    assert cudart and all(name.endswith("@libcudart.so.12") for name in cudart), cudart


@needs_sources
@pytest.mark.slow  # a second 20-30 s build on a 2-core host
def test_x86_plugin_build_is_reproducible(x86_plugin, tmp_path):
    _, rec = x86_plugin
    again = _build("x86_64", tmp_path)  # same inputs, same bytes
    assert again["sha256"] == rec["sha256"]


@needs_sources
def test_runtime_loads_the_cuda12_plugin_when_told(x86_plugin, tmp_path):
    """In a fresh process (this one may hold the wheel's library): a libcuda stub that reports no
    device, the plugin forced by INFERX_CUDA_RUNTIME; its device API registers and answers."""
    out, rec = x86_plugin
    code = """
import ctypes, json
from inferx_edge.runtime import _tvm
tvm = _tvm.import_tvm_runtime()
import tvm as full
from inferx_edge.compiler.cuda.stub import _build_stub
ctypes.CDLL(str(_build_stub(_tvm.tvm_lib_dir() / "libtvm_runtime_cuda.so")), mode=ctypes.RTLD_GLOBAL)
_tvm.load_cuda_backend(tvm)
import tvm_ffi
print(json.dumps({"choice": {k: str(v) for k, v in _tvm.cuda_runtime_choice.items()},
                  "device_api": tvm_ffi.get_global_func("device_api.cuda", allow_missing=True) is not None,
                  "exist": bool(tvm.cuda(0).exist)}))
"""
    env = {**os.environ, "INFERX_CUDA_RUNTIME": str(out / rec["library"]), "XDG_CACHE_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["choice"]["library"] == str(out / rec["library"]) and "libcudart.so.12" in got["choice"]["cudart"]
    assert got["device_api"] and got["exist"] is False  # registered; the stub driver has no device


def _fake_tvm_cuda_lib(path: Path, cudart: int) -> Path:
    """A real shared library that NEEDs libcudart.so.<cudart> (as TVM's CUDA runtime does), built with gcc."""
    path.parent.mkdir(parents=True, exist_ok=True)
    src = path.parent / "empty.c"
    src.write_text("int inferx_fake_symbol(void) { return 0; }\n")
    dep = path.parent / f"libcudart.so.{cudart}"
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{dep.name}", "-o", str(dep), str(src)], check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(src), "-Wl,--no-as-needed", str(dep)], check=True)
    return path


needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to make a stand-in library")


@needs_gcc
def test_choice_follows_the_driver_and_the_installed_runtime(monkeypatch, tmp_path):
    from inferx_edge.errors import TargetMismatchError
    from inferx_edge.runtime import _tvm

    wheel = _fake_tvm_cuda_lib(tmp_path / "wheel" / "libtvm_runtime_cuda.so", 13)
    monkeypatch.setattr(_tvm, "tvm_lib_dir", lambda: wheel.parent)
    monkeypatch.delenv(_tvm.CUDA_RUNTIME_ENV, raising=False)
    monkeypatch.setenv(_tvm.CUDA_RUNTIME_DIR_ENV, str(tmp_path / "dir"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setattr(_tvm, "driver_cuda_version", lambda: (13, 0))
    assert _tvm.choose_cuda_runtime(trust=False)["path"] is None
    monkeypatch.setattr(_tvm, "driver_cuda_version", lambda: (12, 6))
    with pytest.raises(TargetMismatchError, match=r"supports CUDA 12\.6.*libcudart\.so\.13.*inferx_edge cuda-runtime"):
        _tvm.choose_cuda_runtime(trust=False)
    plugin = _fake_tvm_cuda_lib(tmp_path / "dir" / os.uname().machine / "libtvm_runtime_cuda.so", 12)
    choice = _tvm.choose_cuda_runtime(trust=False)
    assert choice["path"] == plugin and "12.6 is older" in choice["why"] and choice["cudart_major"] == 12
    # a TVM built on the device against its CUDA 12 is left alone: its library already fits the driver
    own = _fake_tvm_cuda_lib(tmp_path / "jetson-built" / "libtvm_runtime_cuda.so", 12)
    monkeypatch.setattr(_tvm, "tvm_lib_dir", lambda: own.parent)
    assert _tvm.choose_cuda_runtime(trust=False)["path"] is None
    monkeypatch.setenv(_tvm.CUDA_RUNTIME_ENV, "wheel")
    assert _tvm.choose_cuda_runtime(trust=False)["path"] is None
    monkeypatch.setenv(_tvm.CUDA_RUNTIME_ENV, str(tmp_path / "missing.so"))
    with pytest.raises(TargetMismatchError, match="no such file"):
        _tvm.choose_cuda_runtime(trust=False)
    # forcing a library whose CUDA runtime is newer than the driver is refused, not dlopen'ed
    monkeypatch.setenv(_tvm.CUDA_RUNTIME_ENV, str(wheel))
    with pytest.raises(TargetMismatchError, match=r"links libcudart\.so\.13.*supports CUDA 12\.6"):
        _tvm.choose_cuda_runtime(trust=False)
    monkeypatch.setenv(_tvm.CUDA_RUNTIME_ENV, str(tmp_path / "empty.c"))
    (tmp_path / "empty.c").write_text("not a library")
    with pytest.raises(TargetMismatchError, match="not a usable library"):
        _tvm.choose_cuda_runtime(trust=False)


@needs_gcc
def test_a_cuda12_runtime_is_checked_against_its_record_and_the_trust_store(monkeypatch, tmp_path):
    import json as _json

    from inferx_edge.errors import TargetMismatchError
    from inferx_edge.package.bundle import sha256_file
    from inferx_edge.package.signing import generate_keypair, sign_manifest
    from inferx_edge.runtime import _tvm

    monkeypatch.setattr(_tvm, "driver_cuda_version", lambda: (12, 6))
    plugin = _fake_tvm_cuda_lib(tmp_path / "rt" / "libtvm_runtime_cuda.so", 12)
    monkeypatch.setenv(_tvm.CUDA_RUNTIME_ENV, str(plugin))
    record = plugin.parent / "build.json"
    record.write_text(_json.dumps({"sha256": "0" * 64}))
    with pytest.raises(TargetMismatchError, match="does not match the sha256"):
        _tvm.choose_cuda_runtime(trust=False)
    record.write_text(_json.dumps({"sha256": sha256_file(plugin), "cuda_version": 12060}))
    assert _tvm.choose_cuda_runtime(trust=False)["sha256"] == sha256_file(plugin)
    key, pub, fp = generate_keypair(tmp_path / "keys")
    other_key, _, _ = generate_keypair(tmp_path / "other")
    with pytest.raises(TargetMismatchError, match="not signed, and the trust store"):
        _tvm.choose_cuda_runtime(trust=pub)  # a trust store requires signed native code
    (plugin.parent / "build.json.sig").write_bytes(sign_manifest(record.read_bytes(), other_key, "build.json"))
    with pytest.raises(TargetMismatchError, match="not in the trust store"):
        _tvm.choose_cuda_runtime(trust=pub)
    (plugin.parent / "build.json.sig").write_bytes(sign_manifest(record.read_bytes(), key, "build.json"))
    assert _tvm.choose_cuda_runtime(trust=pub)["signer"] == fp
    record.write_text(record.read_text().replace("12060", "12080"))  # record edited after signing
    with pytest.raises(TargetMismatchError, match="does not match"):
        _tvm.choose_cuda_runtime(trust=pub)


@pytest.mark.slow
@needs_sources
def test_aarch64_plugin_cross_builds_for_jetson(tmp_path):
    if shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip("no aarch64 cross compiler")
    rec = _build("aarch64", tmp_path)  # downloads the aarch64 wheels (PyPI) into the cache once
    assert rec["machine"] == "AArch64" and "libcudart.so.12" in rec["needed"]
    assert not any("cudart.so.13" in n for n in rec["needed"])
    assert rec["patched_for_cuda_before_12_8"]


def test_cuda_status_reports_what_deploy_needs():
    r = subprocess.run(
        [sys.executable, "-m", "inferx_edge.runtime.cuda_status"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["arch"] == os.uname().machine and doc["installed_cudart"] == 13  # the apache-tvm 0.27 wheel's
    assert doc["works"] is bool(doc["driver_cuda"] and doc["driver_cuda"][0] >= 13)
