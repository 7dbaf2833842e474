"""Long reductions with few outputs become two (inner reduced axes, then outer): same results, and the
squeeze-excite pools of a batch-1 network no longer run as a handful of thread blocks."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize(
    "shape, axes, sm_count, plan",
    [
        ((1, 112, 112, 32), [1, 2], 132, ([2], [1])),  # batch-1 SE pool: 32 outputs of 12544
        ((64, 112, 112, 32), [1, 2], 132, None),  # a batch axis in front: dlight declined the first kernel
        ((1, 112, 112, 32), [1, 2], 1, None),  # a 1-SM GPU: 32 outputs are enough
        ((64, 56, 56, 144), [1, 2], 132, None),  # 9216 outputs
        ((1, 28, 28, 240), [1, 2], 132, None),  # 784 elements: short enough
        ((1, 4096, 8), [1], 132, None),  # one axis: nothing to split along
        ((1, 8, 4, 64, 16), [1, 2, 3], 132, ([3], [1, 2])),  # inner suffix of >= 16 elements
        ((2, 56, 56, 96), [1, 2], 132, None),
        ((1, 112, 112, 32), [1, 2], None, None),  # no GPU size known
    ],
)
def test_split_plan(shape, axes, sm_count, plan):
    from inferx_edge.compiler.cuda.split_reductions import split_plan

    assert split_plan(list(shape), axes, sm_count) == plan


def _reduction(op: str, shape, axes, keepdims: bool):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = getattr(relax.op, op)(x, axis=axes, keepdims=keepdims)
            out = bb.emit_output(relax.op.multiply(y, relax.const(2.0, "float32")))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("op", ["mean", "sum"])
@pytest.mark.parametrize("keepdims", [True, False])
def test_split_reductions_compute_the_same(op, keepdims):
    import tvm
    from tvm import relax

    from inferx_edge.compiler.cuda.split_reductions import split_long_reductions

    shape, axes = (1, 48, 40, 8), [1, 2]
    mod = _reduction(op, shape, axes, keepdims)
    split = split_long_reductions(132)(mod)
    calls = [b.value.op.name for b in split["main"].body.blocks[0].bindings]
    assert calls.count(f"relax.{op}") == 2  # over W, then over H: no reshape, no copy
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    outs = []
    for m in (mod, split):
        ex = relax.build(m, tvm.target.Target({"kind": "llvm"}))
        outs.append(relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy())
    assert outs[1].shape == outs[0].shape
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    expect = 2 * getattr(x.astype(np.float64), op)(axis=tuple(axes), keepdims=keepdims)
    np.testing.assert_allclose(outs[1], expect, rtol=1e-5, atol=1e-5)


def test_batch1_pool_kernels_have_many_outputs_per_launch():
    """Through the CUDA fusion passes: the pool's first kernel has an output per row and channel."""
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from inferx_edge.compiler.cuda.pipeline import fusion_passes

    mod = _reduction("mean", (1, 112, 112, 32), [1, 2], True)
    fused = tvm.transform.Sequential(fusion_passes(132))(mod)
    outputs = sorted(
        int(np.prod([int(d) for d in list(ArgInfo.from_prim_func(f))[-1].shape]))
        for _, f in fused.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
    )
    assert outputs == [32, 112 * 32], outputs
    unsplit = tvm.transform.Sequential(fusion_passes())(mod)
    assert sum(isinstance(f, tvm.tirx.PrimFunc) for _, f in unsplit.functions_items()) == 1
