"""Float depthwise convolutions of int8 variants read fp16 only behind a clip."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import relu6_depthwise


@pytest.mark.parametrize("clip_first", [True, False])
def test_float_depthwise_reads_fp16_only_behind_a_clip(clip_first):
    """int8 CUDA variants keep depthwise convs float; behind a ReLU6 their input is stored fp16
    (bounded: cannot overflow); an unbounded input stays fp32. Same results within fp16 rounding."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import clip_to_min_max, convert_layout, fp16_bounded_depthwise

    mod = convert_layout(relu6_depthwise(clip_first), "NHWC")
    rewritten = fp16_bounded_depthwise(mod)
    convs = [
        b.value
        for blk in rewritten["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.conv2d"
    ]
    dtypes = [(str(c.args[0].ty.dtype), str(c.ty.dtype)) for c in convs]
    assert dtypes == [("float32", "float32"), ("float16" if clip_first else "float32", "float32")]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 8, 10, 10), (16, 8, 1, 1), (16, 1, 3, 3))]

    def run(m):
        vm = relax.VirtualMachine(relax.build(m, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()

    ref = run(clip_to_min_max(relu6_depthwise(clip_first)))
    np.testing.assert_allclose(run(rewritten), ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())
