"""benchmarks/gpu_depthwise_input.py: its two module forms, its float64 reference and its kernels."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import needs_nvrtc


@pytest.mark.parametrize("fp16_input", [True, False])
def test_both_forms_match_the_float64_reference_on_the_cpu(fp16_input):
    import tvm
    from tvm import relax

    from benchmarks.gpu_depthwise_input import random_inputs, reference, residual_depthwise

    shape = (2, 12, 16, 7)
    x, r, w, b = random_inputs(*shape)
    ex = tvm.compile(residual_depthwise(*shape, fp16_input), "llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    weights = w.astype(np.float16) if fp16_input else w
    s, y = vm["main"](*(tvm.runtime.tensor(a) for a in (x, r, weights, b)))
    np.testing.assert_allclose(s.numpy(), x + r, rtol=0, atol=0)
    ref = reference(x, r, weights.astype(np.float32), b)
    err = np.abs(y.numpy() - ref).max() / np.abs(ref).max()
    assert err < (2e-3 if fp16_input else 1e-6)  # fp16 rounds the input to 11 bits


def test_the_fp16_form_has_the_extra_cast_kernel():
    from benchmarks.gpu_depthwise_input import kernel_names, parse_shape, residual_depthwise

    n, hw, c, k = parse_shape("4x14x32k7")
    fp16, fp32 = (kernel_names(residual_depthwise(n, hw, c, k, f)) for f in (True, False))
    assert len(fp16) == len(fp32) + 1 and any("cast" in name for name in fp16)
    with pytest.raises(SystemExit, match="NxHWxCkK"):
        parse_shape("64x56x96")


@needs_nvrtc
@pytest.mark.slow  # 17-19 s on a 2-core host (two GPU builds of a benchmark's kernels); run with -m slow
def test_both_forms_build_for_the_gpu():
    from benchmarks.gpu_depthwise_input import build, residual_depthwise

    for fp16_input in (True, False):
        assert build(residual_depthwise(8, 28, 64, 7, fp16_input), "h200") is not None
