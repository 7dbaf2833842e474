"""scripts/build_cuda12_runtime.py: TVM's CUDA runtime library rebuilt against CUDA 12 (JetPack 6) links
libcudart.so.12 and never .13, exports the wheel's entry points, is reproducible, and the runtime loads
it instead of the wheel's when told or when the driver is CUDA 12."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "build_cuda12_runtime.py"
TVM_SRC = REPO / "scripts" / "tvm_cuda_runtime_src"

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
        [sys.executable, str(SCRIPT), "--arch", arch, "--out", str(out)], capture_output=True, text=True, timeout=900
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
    again = _build("x86_64", tmp_path)  # reproducible: same inputs, same bytes
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


def test_choice_follows_the_driver(monkeypatch, tmp_path):
    from inferx_edge.errors import TargetMismatchError
    from inferx_edge.runtime import _tvm

    monkeypatch.delenv(_tvm.CUDA_RUNTIME_ENV, raising=False)
    monkeypatch.setenv(_tvm.CUDA_RUNTIME_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setattr(_tvm, "driver_cuda_version", lambda: (13, 0))
    assert _tvm.choose_cuda_runtime()["path"] is None
    monkeypatch.setattr(_tvm, "driver_cuda_version", lambda: (12, 6))
    with pytest.raises(TargetMismatchError, match=r"supports CUDA 12\.6.*build_cuda12_runtime\.py"):
        _tvm.choose_cuda_runtime()
    plugin = tmp_path / os.uname().machine / "libtvm_runtime_cuda.so"
    plugin.parent.mkdir()
    plugin.write_bytes(b"\x7fELF")
    choice = _tvm.choose_cuda_runtime()
    assert choice["path"] == plugin and "12.6 is older" in choice["why"]
    monkeypatch.setenv(_tvm.CUDA_RUNTIME_ENV, "wheel")
    assert _tvm.choose_cuda_runtime()["path"] is None
    monkeypatch.setenv(_tvm.CUDA_RUNTIME_ENV, str(tmp_path / "missing.so"))
    with pytest.raises(TargetMismatchError, match="no such file"):
        _tvm.choose_cuda_runtime()


@pytest.mark.slow
@needs_sources
def test_aarch64_plugin_cross_builds_for_jetson(tmp_path):
    if shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip("no aarch64 cross compiler")
    rec = _build("aarch64", tmp_path)  # downloads the aarch64 wheels (PyPI) into the cache once
    assert rec["machine"] == "AArch64" and "libcudart.so.12" in rec["needed"]
    assert not any("cudart.so.13" in n for n in rec["needed"])
    assert rec["patched_for_cuda_before_12_8"]
