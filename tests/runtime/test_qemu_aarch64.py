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
    env = dict(os.environ, PYTHONPATH=f"{sysroot / 'site'}:{REPO}")
    r = subprocess.run(
        ["qemu-aarch64-static", "-L", str(sysroot), str(sysroot / "usr/bin/python3.11"), "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info == {"machine": "aarch64", "compiler": False}
    with Engine(default_artifact) as e:
        ref = np.concatenate([e.run(x[i : i + 1])["logits"] for i in range(len(x))])
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), ref, atol=1e-4, rtol=0)
