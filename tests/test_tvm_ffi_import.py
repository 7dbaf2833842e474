"""Importing TVM through inferx_edge keeps torch out of the process, and torch still works afterwards."""

import os
import subprocess
import sys

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
