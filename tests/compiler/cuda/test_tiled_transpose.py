"""Layout changes that move the innermost axis go through a shared-memory tile
(:mod:`inferx_edge.compiler.cuda.rules.tiled_transpose`)."""

from __future__ import annotations

import numpy as np
import pytest

from inferx_edge.compiler.schedule_check import run_serially_on_cpu
from tests.helpers import kernel_source, needs_nvrtc

_SM90 = {"kind": "cuda", "arch": "sm_90"}


def _detector_head(n: int = 2, sizes=(24, 12, 6)):
    from benchmarks.gpu_layout_kernels import detector_head

    return detector_head(n, sizes)


def _transpose(shape, axes):
    from benchmarks.gpu_layout_kernels import transpose

    return transpose(shape, axes)


def _add_transposed(shape):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    y = relax.Var("y", relax.TensorType([shape[0], shape[2], shape[1]], "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, relax.op.permute_dims(y, [0, 2, 1])))
        bb.emit_func_output(out)
    return bb.get()


def _kernel(mod):
    from benchmarks.gpu_layout_kernels import fused_kernel

    return fused_kernel(mod)


def _check_same_as_unscheduled(func, sch, n_out: int = 1):
    """The scheduled kernel (thread loops serial, on the CPU) gives what the unscheduled one gives;
    returns (random inputs, outputs). ``n_out``: the kernel's last parameters that are outputs."""
    import tvm

    rng = np.random.default_rng(0)
    shapes = [[int(d) for d in p.shape] for p in func.params]
    ins = [rng.standard_normal(s).astype("float32") for s in shapes[: len(shapes) - n_out]]
    outs = [np.zeros(s, "float32") for s in shapes[len(shapes) - n_out :]]
    got = run_serially_on_cpu(sch.mod["main"], *ins, *outs)[len(ins) :]
    ref = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), "llvm")
    args = [tvm.runtime.tensor(a) for a in (*ins, *outs)]
    ref["main"](*args)
    for g, r in zip(got, args[len(ins) :]):
        np.testing.assert_array_equal(g, r.numpy())
    return ins, got


def test_detector_head_assembly_is_tiled_and_computes_the_same():
    import tvm

    from inferx_edge.compiler.cuda.rules.tiled_transpose import TILE, tiled_transpose_rule

    func = _kernel(_detector_head())
    sch = tiled_transpose_rule().apply(func, tvm.target.Target(_SM90), False)
    assert sch is not None
    script = sch.mod["main"].script()
    assert script.count('scope="shared"') == 2  # one tile per output (box, class)
    assert f'"buffer_dim_align": [[0, 1, {TILE}, 1]]' in script  # rows padded against bank conflicts
    ins, (box, cls) = _check_same_as_unscheduled(func, sch, n_out=2)
    scales = [
        np.concatenate([ins[2 * i], ins[2 * i + 1]], -1).transpose(0, 3, 1, 2).reshape(2, 144, -1) for i in range(3)
    ]
    np.testing.assert_array_equal(np.concatenate([box, cls], 1), np.concatenate(scales, 2))


@pytest.mark.parametrize("shape,axes", [([4, 40, 40, 72], [0, 3, 1, 2]), ([3, 150, 170], [0, 2, 1])])
def test_plain_transposes_moving_the_innermost_axis_are_tiled(shape, axes):
    import tvm

    from inferx_edge.compiler.cuda.rules.tiled_transpose import tiled_transpose_rule

    func = _kernel(_transpose(shape, axes))
    sch = tiled_transpose_rule().apply(func, tvm.target.Target(_SM90), False)
    assert sch is not None
    ins, (out,) = _check_same_as_unscheduled(func, sch)
    np.testing.assert_array_equal(out, ins[0].transpose(axes))


def test_tiled_transpose_declines_kernels_that_keep_the_innermost_axis_or_are_small():
    import tvm

    from inferx_edge.compiler.cuda.rules.tiled_transpose import MIN_TRANSPOSE_EXTENT, tiled_transpose_rule

    rule, gpu = tiled_transpose_rule(), tvm.target.Target(_SM90)
    # attention's head split keeps the innermost axis: already contiguous both ways
    assert rule.apply(_kernel(_transpose([8, 197, 12, 64], [0, 2, 1, 3])), gpu, False) is None
    # an image's 3 channels moved innermost: too short an axis for a tile
    assert rule.apply(_kernel(_transpose([8, 3, 224, 224], [0, 2, 3, 1])), gpu, False) is None
    assert rule.apply(_kernel(_transpose([2, MIN_TRANSPOSE_EXTENT - 1, 4096], [0, 2, 1])), gpu, False) is None
    assert rule.apply(_kernel(_transpose([1, 32, 32], [0, 2, 1])), gpu, False) is None  # too few elements
    # a transposed input added to one read in order: tiling would make the second read strided
    assert rule.apply(_kernel(_add_transposed([4, 72, 1600])), gpu, False) is None
    assert (
        rule.apply(_kernel(_transpose([4, 40, 40, 72], [0, 3, 1, 2])), tvm.target.Target({"kind": "llvm"}), False)
        is None
    )


@needs_nvrtc
def test_detector_head_compiles_with_a_padded_shared_tile():
    """Through the whole CUDA pipeline: the rule sits ahead of the vectorized elementwise rule and
    dlight's fallback, which read the NHWC maps a channel row apart per thread."""
    src = kernel_source("h200", _detector_head())
    kernels = src.split("__global__")[1:]
    assert any("__shared__" in k and "[1056]" in k for k in kernels)  # 32 x 33 floats
    assert "__syncthreads" in src


def test_the_layout_kernel_benchmark_cases_and_references_agree_with_the_new_rules():
    """``benchmarks/gpu_layout_kernels.py`` at batch 1 (YOLOv8n's real head shapes): each case's new-rule
    schedule, run serially on the CPU, gives the benchmark's float64 reference."""
    import tvm

    from benchmarks.gpu_layout_kernels import cases, fused_kernel
    from inferx_edge.compiler.cuda.rules.column_reduction import column_reduction_rule
    from inferx_edge.compiler.cuda.rules.tiled_transpose import tiled_transpose_rule

    for name, (kind, mod, host, refs) in cases(1).items():
        rule = column_reduction_rule() if kind == "column" else tiled_transpose_rule()
        sch = rule.apply(fused_kernel(mod), tvm.target.Target(_SM90), False)
        assert sch is not None, name
        got = run_serially_on_cpu(sch.mod["main"], *host, *[np.zeros(r.shape, "float32") for r in refs])
        for g, r in zip(got[len(host) :], refs):
            np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4, err_msg=name)
