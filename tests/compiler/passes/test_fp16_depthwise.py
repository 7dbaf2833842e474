"""Float depthwise convolutions of int8 variants read fp16: cast behind a clip, saturated otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import relu6_depthwise


@pytest.mark.parametrize("clip_first", [True, False])
def test_float_depthwise_reads_fp16(clip_first):
    """int8 CUDA variants keep depthwise convs float; their input is stored fp16 (behind a ReLU6 cast as
    it is: bounded; an unbounded input saturated to fp16's range first). Same results within fp16
    rounding."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import clip_to_min_max, convert_layout, fp16_depthwise

    mod = convert_layout(relu6_depthwise(clip_first), "NHWC")
    rewritten = fp16_depthwise(mod)
    convs = [
        b.value
        for blk in rewritten["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.conv2d"
    ]
    dtypes = [(str(c.args[0].ty.dtype), str(c.ty.dtype)) for c in convs]
    assert dtypes == [("float32", "float32"), ("float16", "float32")]
    saturations = [
        b.value
        for blk in rewritten["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call)
        and getattr(b.value.op, "name", "") == "relax.maximum"
        and isinstance(b.value.args[1], tvm.ir.expr.Constant)
        and float(b.value.args[1].value.numpy()) == -65504.0
    ]
    assert len(saturations) == (1 if clip_first else 2)  # the weight always, the input where unbounded
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 8, 10, 10), (16, 8, 1, 1), (16, 1, 3, 3))]

    def run(m):
        vm = relax.VirtualMachine(relax.build(m, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()

    ref = run(clip_to_min_max(relu6_depthwise(clip_first)))
    np.testing.assert_allclose(run(rewritten), ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())


def test_unbounded_depthwise_input_saturates_never_inf():
    """A depthwise input beyond fp16's range becomes +-65504 in the fp16 read, not inf."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import convert_layout, fp16_depthwise

    mod = fp16_depthwise(convert_layout(relu6_depthwise(False), "NHWC"))
    x = np.zeros((2, 8, 10, 10), np.float32)
    x[0, 0, 5, 5] = 1e6
    w1 = np.zeros((16, 8, 1, 1), np.float32)
    w1[:, 0] = 1.0
    w2 = np.zeros((16, 1, 3, 3), np.float32)
    w2[:, 0, 1, 1] = 1.0
    vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(a) for a in (x, w1, w2)]).numpy()
    assert np.isfinite(got).all() and got.max() == 65504.0
