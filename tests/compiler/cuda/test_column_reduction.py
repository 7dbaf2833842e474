"""Softmax and norms over a short axis that is not the innermost (a detector's DFL softmax, LayerNorm over
NCHW's channels): one thread per row (:mod:`inferx_edge.compiler.cuda.rules.column_reduction`)."""

from __future__ import annotations

import numpy as np
import pytest

from inferx_edge.compiler.schedule_check import run_serially_on_cpu
from tests.helpers import kernel_source, needs_nvrtc

_SM90 = {"kind": "cuda", "arch": "sm_90"}


def _module(shape, kind: str, axis: int = 1):
    from benchmarks.gpu_layout_kernels import channel_layer_norm, dfl_softmax

    return (dfl_softmax if kind == "softmax" else channel_layer_norm)(list(shape), axis)


def _kernel(shape, kind: str, axis: int = 1):
    from benchmarks.gpu_layout_kernels import fused_kernel

    return fused_kernel(_module(shape, kind, axis))


@pytest.mark.parametrize(
    "shape,kind",
    [
        ((2, 16, 4, 840), "softmax"),  # DFL: 16 bins of 4 box sides over the anchors
        ((8, 32, 28, 28), "layer_norm"),  # LayerNorm over NCHW's channels
        ((3, 5, 2, 1500), "softmax"),  # rows not a multiple of the block
        ((1, 16, 4, 1100), "softmax"),  # batch 1: a unit axis the row analysis must skip
    ],
)
def test_short_outer_axis_reductions_take_one_thread_per_row_and_compute_the_same(shape, kind):
    import tvm

    from inferx_edge.compiler.cuda.rules.column_reduction import column_reduction_rule

    sch = column_reduction_rule().apply(_kernel(shape, kind), tvm.target.Target(_SM90), False)
    assert sch is not None
    script = sch.mod["main"].script()
    assert 'thread="threadIdx.x"' in script and "threadIdx.y" not in script
    assert 'scope="shared"' not in script  # the row's max/sum stay in the thread's registers
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 4).astype("float32")
    n = shape[1]
    if kind == "softmax":
        *_, out = run_serially_on_cpu(
            sch.mod["main"], x, np.arange(n, dtype="float32").reshape(1, n, 1, 1), np.zeros_like(x)
        )
        e = np.exp(x.astype("float64") - x.max(1, keepdims=True))
        ref = e / e.sum(1, keepdims=True) * np.arange(n).reshape(1, n, 1, 1)
    else:
        g, b = rng.standard_normal(n).astype("float32"), rng.standard_normal(n).astype("float32")
        *_, out = run_serially_on_cpu(sch.mod["main"], x, g, b, np.zeros_like(x))
        x64 = x.astype("float64")
        ref = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
        ref = ref * g.reshape(1, n, 1, 1) + b.reshape(1, n, 1, 1)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_column_rule_declines_innermost_axes_long_columns_few_rows_and_cpus():
    import tvm

    from inferx_edge.compiler.cuda.rules.column_reduction import MAX_COLUMN, MIN_COLUMN_ROWS, column_reduction_rule

    rule = column_reduction_rule()
    gpu = tvm.target.Target(_SM90)
    assert rule.apply(_kernel((1, 16, MIN_COLUMN_ROWS), "softmax"), gpu, False) is not None
    assert rule.apply(_kernel((1, 16, MIN_COLUMN_ROWS // 2), "softmax"), gpu, False) is None
    assert rule.apply(_kernel((1, MAX_COLUMN + 1, MIN_COLUMN_ROWS), "softmax"), gpu, False) is None
    # the reduced axis innermost: a warp per row (row_reduction) coalesces, one thread per row would not
    assert rule.apply(_kernel((64, 4, 8400, 16), "softmax", axis=-1), gpu, False) is None
    assert rule.apply(_kernel((1, 16, MIN_COLUMN_ROWS), "softmax"), tvm.target.Target({"kind": "llvm"}), False) is None


@needs_nvrtc
def test_dfl_softmax_compiles_to_a_thread_per_row_without_block_barriers():
    """Through the whole CUDA pipeline (the rule ahead of dlight's GeneralReduction, which gave each of
    YOLOv8n's 2.15 million 16-element rows a thread block: 2.99 of 9.15 ms at batch 64 on an H100)."""
    src = kernel_source("h200", _module((2, 16, 4, 8400), "softmax")).split("__global__")[-1]
    assert "__launch_bounds__(256)" in src
    assert "__syncthreads" not in src and "__shfl" not in src


@needs_nvrtc
def test_a_wide_channel_layer_norm_compiles_with_a_serial_loop_per_thread():
    """96 channels (ConvNeXt-style channels-first LayerNorm): more than the unrolled length, the thread's
    loop over its row stays a loop."""
    src = kernel_source("h200", _module((2, 96, 80, 80), "layer_norm")).split("__global__")[-1]
    assert "__launch_bounds__(256)" in src and "__syncthreads" not in src
    assert "for (" in src
