"""aarch64 host code executed under qemu-user: an arm64-cpu artifact, run by the runtime with the aarch64
apache-tvm wheel and an arm64 Python, must match the x86 build of the same model.

Slow (sets up a ~400 MB arm64 userland once, in ~/.cache, then ~15 s a run): python -m pytest -m slow
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.qemu]


@pytest.fixture(scope="module")
def sysroot() -> Path:
    if shutil.which("apt-get") is None:
        pytest.skip("needs Debian/Ubuntu apt to fetch the arm64 userland")
    r = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup_qemu_aarch64.sh")], capture_output=True, text=True, timeout=1800
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return Path(r.stdout.strip().splitlines()[-1])


def _aarch64_python(sysroot: Path, code: str, **env) -> dict:
    """Run ``code`` with the arm64 Python under qemu-user (aarch64 wheels and this repository on its
    path); returns the JSON its last output line prints."""
    r = subprocess.run(
        ["qemu-aarch64-static", "-L", str(sysroot), str(sysroot / "usr/bin/python3.11"), "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=f"{sysroot / 'site'}:{REPO}", **env),
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_arm64_artifact_runs_under_qemu(sysroot, arm64_artifact, default_artifact, tmp_path):
    from inferx_edge.models import DEFAULT_DATA
    from inferx_edge.runtime import Engine

    with np.load(DEFAULT_DATA) as npz:
        x = npz["holdout_images"][:8, None].astype(np.float32) / np.float32(255)
    np.save(tmp_path / "x.npy", x)
    code = f"""
import json, platform, sys, numpy as np
from inferx_edge.runtime import Engine
x = np.load({str(tmp_path / "x.npy")!r})
with Engine({str(arm64_artifact)!r}) as e:
    y = np.concatenate([e.run(x[i:i + 1])["logits"] for i in range(len(x))])
np.save({str(tmp_path / "y.npy")!r}, y)
print(json.dumps({{"machine": platform.machine(), "compiler": "tvm.relax" in sys.modules}}))
"""
    info = _aarch64_python(sysroot, code)
    assert info == {"machine": "aarch64", "compiler": False}
    with Engine(default_artifact) as e:
        ref = np.concatenate([e.run(x[i : i + 1])["logits"] for i in range(len(x))])
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), ref, atol=1e-4, rtol=0)


def test_cuda12_runtime_for_jetson_loads_under_qemu(sysroot, arm64_artifact, tmp_path):
    """The aarch64 CUDA 12 build of TVM's CUDA runtime, in the aarch64 TVM runtime: it loads, registers
    its device API, and a Jetson artifact's loading path ends in a clean "no CUDA GPU" error (a libcuda
    stub that reports no device), not an unresolved symbol or a CUDA version error."""
    import sys
    import zipfile

    from inferx_edge.compiler.cuda.stub import compile_stub, driver_symbols
    from tests.helpers import retarget_artifact

    if shutil.which("aarch64-linux-gnu-gcc") is None:
        pytest.skip("no aarch64 cross compiler")
    out = tmp_path / "rt"
    r = subprocess.run(
        [sys.executable, "-m", "inferx_edge", "cuda-runtime", "--arch", "aarch64", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    plugin = out / "aarch64" / "libtvm_runtime_cuda.so"
    from inferx_edge.deploy.cuda12_runtime import default_cache

    wheel = next(default_cache().glob("nvidia_cuda_runtime_cu12-*aarch64*.whl"))
    with zipfile.ZipFile(wheel) as z:
        (out / "aarch64" / "libcudart.so.12").write_bytes(z.read("nvidia/cuda_runtime/lib/libcudart.so.12"))
    stub = compile_stub(
        driver_symbols([plugin], "aarch64-linux-gnu-nm"), tmp_path / "libcuda.so.1", "aarch64-linux-gnu-gcc"
    )
    orin = retarget_artifact(
        arm64_artifact,
        tmp_path / "orin.ixa",
        name="jetson-agx-orin-64gb",
        device="cuda",
        cuda_arch="sm_87",
        min_jetpack="6.0",
    )
    code = f"""
import ctypes, json
ctypes.CDLL({str(stub)!r}, mode=ctypes.RTLD_GLOBAL)
from inferx_edge.errors import TargetMismatchError
from inferx_edge.runtime import Engine, _tvm
try:
    Engine({str(orin)!r})
    outcome = "loaded"
except TargetMismatchError as exc:
    outcome = str(exc)
import tvm_ffi
print(json.dumps({{"outcome": outcome, "device_api": tvm_ffi.get_global_func("device_api.cuda", allow_missing=True) is not None,
                  "library": _tvm.cuda_runtime_choice and _tvm.cuda_runtime_choice["library"],
                  "cudart": _tvm.cuda_runtime_choice and _tvm.cuda_runtime_choice.get("cudart")}}))
"""
    got = _aarch64_python(sysroot, code, INFERX_CUDA_RUNTIME=str(plugin))
    assert got["library"] == str(plugin) and got["cudart"].endswith("libcudart.so.12")
    assert got["device_api"]
    assert "no CUDA GPU 0 is visible" in got["outcome"], got
