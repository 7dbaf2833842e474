"""Operand copies with the vector lane apart (compiler/cuda/lane_indices.py): the rewrite computes what
the copy did (run on the CPU), and padded int8 convs over channel counts that are not a multiple of the
tile depth load whole vectors on the GPU targets (CUDA source, not run)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.helpers import kernel_source, needs_nvrtc, nhwc_int8_conv


def _padded_window_copy(channels: int, rows: int = 6):
    """A copy shaped like a padded 3x3 conv's A tile: ``out[0, i, k]`` is input ``(i + kh - 1, kw, c)``
    for ``k = (kh * 3 + kw) * channels + c``, zero outside the image's ``rows`` rows."""
    from tvm import te, tirx

    x = te.placeholder((rows, 3, channels), "int8", name="x")
    depth = 9 * channels

    def element(s, i, k):
        h = i + k // (3 * channels) - 1
        inside = tirx.all(h >= 0, h < rows)
        return tirx.if_then_else(inside, x[h, k % (3 * channels) // channels, k % channels], tirx.const(0, "int8"))

    out = te.compute((1, rows, depth), element, name="out")
    return te.create_prim_func([x, out])


@pytest.mark.parametrize("channels", [96, 32, 40])
def test_lane_rewrite_computes_what_the_copy_did(channels):
    """The copy with its lane split off and its divisions simplified over the block's domains returns
    the same tensor as the plain copy (llvm) and as numpy, and its divisions no longer involve the lane."""
    import tvm
    from tvm import s_tir

    from inferx_edge.compiler.cuda.lane_indices import simplify_lane_indices

    func = _padded_window_copy(channels)
    sch = s_tir.Schedule(func)
    block = sch.get_sblock("out")
    sch.transform_block_layout(block, lambda s, i, k: (s, i, k // 4, k % 4))
    before = sch.get(block).body.script()
    simplify_lane_indices(sch, block)
    body = sch.get(block).body.script()
    lane = sch.get(block).iter_vars[-1].var.name
    assert re.search(rf"\* 4 \+ {lane}\) //", before)  # the lane sat inside the division
    assert not re.search(rf"{lane}\) //", body)  # and is out of it now

    x = np.random.default_rng(channels).integers(-128, 128, (6, 3, channels), dtype=np.int8)
    outs = []
    for f in (func, sch.mod["main"]):
        lib = tvm.tirx.build(f, target="llvm")
        out = tvm.runtime.tensor(np.zeros((1, 6, 9 * channels), np.int8))
        lib(tvm.runtime.tensor(x), out)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    expected = np.zeros((6, 9 * channels), np.int8)  # numpy: the window by hand
    for i in range(6):
        for kh in range(3):
            if 0 <= i + kh - 1 < 6:
                expected[i, kh * 3 * channels : (kh + 1) * 3 * channels] = x[i + kh - 1].reshape(-1)
    np.testing.assert_array_equal(outs[1][0], expected)


@needs_nvrtc
@pytest.mark.parametrize("target", ["h200", "jetson-orin"])
@pytest.mark.parametrize("channels", [32, 96])
def test_padded_convs_over_odd_channel_counts_load_vectors(target, channels):
    """A padded 3x3 int8 conv over 32 or 96 channels (YOLOv8n's, GoogLeNet's; not a multiple of the
    64-deep tile) loads its activations 4 bytes at a time under a lane-invariant test; TVM made the
    load element by element before (a serial loop per vector)."""
    from benchmarks.cuda_vector_census import SCALARIZED, kernels

    (kernel,) = kernels(kernel_source(target, nhwc_int8_conv(64, 20, channels, 64, 3))).values()
    assert not SCALARIZED.search(kernel)
    assert re.search(r"= \*\(int\*\)\(x_ptr", kernel)
