"""Inference BatchNorm as x * a + b with a and b computed at build time."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import run_on_cpu


def _bn_block(axis: int, training: bool = False, center: bool = True, scale: bool = True):
    """relu(batch_norm(x)[0]) over a [2, 6, 5, 4] input, channel axis ``axis``; the BatchNorm's
    parameters are weights (``main``'s parameters after the input)."""
    from tvm import relax

    shape = [2, 6, 5, 4]
    c = shape[axis]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    params = [relax.Var(n, relax.TensorType([c], "float32")) for n in ("gamma", "beta", "mean", "var")]
    with bb.function("main", [x, *params], attrs={"num_input": 1}):
        with bb.dataflow():
            bn = relax.op.nn.batch_norm(
                x, *params, axis=axis, epsilon=1e-3, center=center, scale=scale, training=training
            )
            t = bb.emit(bn)
            out = bb.emit_output(relax.op.nn.relu(bb.emit(relax.TupleGetItem(t, 0))))
        bb.emit_func_output(out)
    return bb.get()


def _args(axis: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    c = [2, 6, 5, 4][axis]
    x = rng.standard_normal((2, 6, 5, 4)).astype(np.float32)
    gamma, beta, mean = (rng.standard_normal(c).astype(np.float32) for _ in range(3))
    return [x, gamma, beta, mean, (rng.random(c) + 0.05).astype(np.float32)]


def _ops(mod) -> list[str]:
    return [
        getattr(getattr(b.value, "op", None), "name", type(b.value).__name__)
        for blk in mod["main"].body.blocks
        for b in blk.bindings
    ]


def _reference(args, axis: int, center: bool = True, scale: bool = True) -> np.ndarray:
    x, gamma, beta, mean, var = (a.astype(np.float64) for a in args)
    along = [1, 1, 1, 1]
    along[axis] = -1
    y = (x - mean.reshape(along)) / np.sqrt(var.reshape(along) + 1e-3)
    y = y * gamma.reshape(along) if scale else y
    return np.maximum(y + beta.reshape(along) if center else y, 0)


@pytest.mark.parametrize(("axis", "center", "scale"), [(3, True, True), (1, True, True), (3, False, False)])
def test_batch_norm_becomes_a_baked_multiply_add(axis, center, scale):
    """No batch_norm op and no square root left once the weight-only scale and shift are baked; the
    model's per-element work is one multiply and one add. Results match float64 BatchNorm."""
    from inferx_edge.compiler.passes import bake_weight_transforms, batch_norm_scale_shift

    mod = _bn_block(axis, center=center, scale=scale)
    rewritten = batch_norm_scale_shift(mod)
    assert "relax.nn.batch_norm" not in _ops(rewritten)
    args = _args(axis)
    baked, _names, weights = bake_weight_transforms(rewritten, args[1:])
    assert _ops(baked) == ["relax.multiply", "relax.add", "relax.nn.relu"]
    (got,) = run_on_cpu(baked, args[0], *weights)
    want = _reference(args, axis, center, scale)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run_on_cpu(mod, *args)[0], want, rtol=1e-5, atol=1e-5)  # TVM's own BatchNorm agrees


def test_training_batch_norm_is_left_alone():
    """A BatchNorm that normalizes with its batch's statistics (``training``) is not an inference one."""
    from inferx_edge.compiler.passes import batch_norm_scale_shift

    mod = _bn_block(3, training=True)
    assert "relax.nn.batch_norm" in _ops(batch_norm_scale_shift(mod))


def test_fp16_batch_norm_folds_in_float32():
    """fp16 input with a mean far larger than its spread (x ~ 300 +- 0.5): folded in fp16, ``x * a``
    and ``b = beta - mean * a`` would cancel to a few bits; computed in float32 and rounded once, the
    result is within fp16 rounding of float64."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import bake_weight_transforms, batch_norm_scale_shift

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 6, 5, 4], "float16"))
    params = [relax.Var(n, relax.TensorType([4], "float16")) for n in ("gamma", "beta", "mean", "var")]
    with bb.function("main", [x, *params], attrs={"num_input": 1}):
        with bb.dataflow():
            t = bb.emit(relax.op.nn.batch_norm(x, *params, axis=3, epsilon=1e-3, training=False))
            out = bb.emit_output(relax.TupleGetItem(t, 0))
        bb.emit_func_output(out)
    rng = np.random.default_rng(2)
    xs = (300 + rng.uniform(-0.5, 0.5, (2, 6, 5, 4))).astype(np.float16)
    gamma, beta = (rng.standard_normal(4).astype(np.float16) for _ in range(2))
    mean, var = np.full(4, 300, np.float16), np.full(4, 0.1, np.float16)
    baked, _names, weights = bake_weight_transforms(batch_norm_scale_shift(bb.get()), [gamma, beta, mean, var])
    vm = relax.VirtualMachine(relax.build(baked, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(a) for a in (xs, *weights)]).numpy()
    assert got.dtype == np.float16
    want = (xs.astype(np.float64) - 300) / np.sqrt(var.astype(np.float64) + 1e-3) * gamma + beta
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)
