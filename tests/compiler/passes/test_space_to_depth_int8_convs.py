"""Stride-2 small-channel int8 convolutions on a space-to-depth input: the same int32 sums."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import nhwc_conv


@pytest.mark.parametrize(
    "shape",
    [
        (2, 16, 16, 3, 8, 7, 3),  # ResNet-50's stem, smaller: 7x7, odd padding -> 4x4 over 16 channels
        (1, 28, 28, 1, 24, 3, 1),  # MobileNetV2's / the embedded model's: 3x3 -> 2x2
        (2, 12, 10, 4, 5, 3, 0),  # no padding, H != W
        (1, 10, 10, 2, 3, 5, 2),  # even padding, odd kernel
        (1, 8, 8, 4, 4, 4, 1),  # even kernel, odd padding
        (1, 14, 14, 3, 6, 3, (1, 0, 1, 1)),  # asymmetric padding
    ],
)
def test_stride2_small_channel_int8_convs_run_on_a_space_to_depth_input(shape):
    """RGB-like stride-2 int8 convolutions become stride-1 ones over 16-channel space-to-depth pixels
    (compiler.passes.space_to_depth_int8_convs): the same int32 sums, run on this CPU."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import convert_layout

    n, h, w, c, o, k, pad = shape
    mod = nhwc_conv(n, h, w, c, o, k, pad, 2)
    rewritten = convert_layout(mod, "NHWC")
    convs = [
        b.value
        for blk in rewritten["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.conv2d"
    ]
    assert len(convs) == 1 and [int(s) for s in convs[0].attrs.strides] == [1, 1]
    assert [int(d) for d in convs[0].args[0].ty.shape.values] == [n, h // 2, w // 2, 16]
    rng = np.random.default_rng(0)
    x = rng.integers(-127, 128, (n, h, w, c)).astype(np.int8)
    wt = rng.integers(-127, 128, (o, k, k, c)).astype(np.int8)
    outs = []
    for m in (mod, rewritten):
        vm = relax.VirtualMachine(relax.build(m, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(wt)).numpy())
    np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.parametrize(
    "shape,stride",
    [
        ((1, 16, 16, 3, 8, 3, 1), 1),
        ((1, 16, 16, 8, 8, 3, 1), 2),
        ((1, 16, 16, 4, 8, 1, 0), 2),
        ((1, 15, 15, 3, 8, 3, 1), 2),
    ],
)
def test_space_to_depth_leaves_other_convolutions(shape, stride):
    """Stride 1, more than 4 channels, 1x1 kernels and odd sizes keep their convolution."""
    from inferx_edge.compiler.passes import space_to_depth_int8_convs

    mod = nhwc_conv(*shape, stride)
    assert "reshape" not in space_to_depth_int8_convs(mod).script()
