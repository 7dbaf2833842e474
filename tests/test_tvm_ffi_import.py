"""Importing TVM through inferx_edge keeps torch out of the process, and torch still works afterwards."""

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

PROBE = """
import sys
import inferx_edge, tvm, tvm.relax
loaded = "torch" in sys.modules
import numpy as np, torch
x = torch.arange(6, dtype=torch.float32).reshape(2, 3)
t = tvm.runtime.from_dlpack(x)  # the standard __dlpack__ protocol
assert np.array_equal(t.numpy(), x.numpy())
assert torch.equal(torch.from_dlpack(tvm.runtime.tensor(x.numpy())), x)
print("torch loaded with tvm:", loaded)
"""


def _probe(**env) -> str:
    r = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env={**os.environ, **env}, timeout=300
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_tvm_loads_without_torch_and_torch_tensors_still_cross():
    assert "torch loaded with tvm: False" in _probe()


def test_the_hook_can_be_switched_off():
    assert "torch loaded with tvm: True" in _probe(INFERX_TVM_FFI_TORCH="1")


def test_a_torch_export_imports_after_tvm_loaded_without_torch(tmp_path):
    """The torch frontend after TVM loaded torch-free (the CLI's order): same outputs as torch."""
    import torch

    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 64, 4)
    )
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    torch.export.save(torch.export.export(net.eval(), (x,)), str(tmp_path / "net.pt2"))
    np.save(tmp_path / "x.npy", x.numpy())
    np.save(tmp_path / "want.npy", net(x).detach().numpy())
    code = f"""
import sys
import inferx_edge, tvm
assert "torch" not in sys.modules
import numpy as np
from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.runtime import Engine
d = {str(tmp_path)!r}
build_artifact(BuildOptions(model=d + "/net.pt2", target="x86-cpu", output=d + "/net.ixa"), log=lambda *a: None)
with Engine(d + "/net.ixa") as e:
    (got,) = e.run(np.load(d + "/x.npy")).values()
np.testing.assert_allclose(got, np.load(d + "/want.npy"), atol=1e-4)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
