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
    assert _conv_dtypes(rewritten) == [("float32", "float32"), ("float16", "float16")]  # 9 elements: summed in fp16
    assert str(rewritten["main"].body.body.ty.dtype) == "float32"  # widened for the epilogue
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


def _calls(mod, op: str) -> list:
    """``main``'s calls of the Relax operator ``op`` (e.g. "relax.nn.conv2d"), in order."""
    from tvm import relax

    return [
        b.value
        for blk in mod["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == op
    ]


def _conv_dtypes(mod):
    """(input dtype, accumulator dtype) of each conv of ``main``."""
    return [(str(c.args[0].ty.dtype), str(c.ty.dtype)) for c in _calls(mod, "relax.nn.conv2d")]


@pytest.mark.parametrize(
    ("k", "groups", "accumulator"),
    [(7, 16, "float16"), (9, 16, "float32"), (3, 4, "float16"), (3, 2, "float32")],
)
def test_short_reductions_accumulate_in_fp16(k, groups, accumulator):
    """Depthwise and grouped convs summing at most 64 elements per output (7x7: 49; 3x3 over 4
    channels: 36) accumulate in fp16, longer ones (9x9: 81; 3x3 over 8: 72) in fp32; either way the
    result is float32 and within fp16 accumulation error of float64 (a relative bound that fp16 sums
    of these lengths meet, and that a conv reading the wrong weights or window would not)."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import clip_to_min_max, convert_layout, fp16_depthwise

    rewritten = fp16_depthwise(convert_layout(relu6_depthwise(True, k, groups), "NHWC"))
    assert _conv_dtypes(rewritten)[1] == ("float16", accumulator)
    rng = np.random.default_rng(1)
    shapes = ((2, 8, 10, 10), (16, 8, 1, 1), (16, 16 // groups, k, k))
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    # float64 reference: the same graph on fp16-rounded operands (what the fp16 reads see)
    mid = np.clip(np.einsum("nchw,oc->nohw", args[0].astype(np.float64), args[1][:, :, 0, 0]), 0, 6)
    mid16 = mid.astype(np.float16).astype(np.float64)
    w16 = args[2].astype(np.float16).astype(np.float64)
    pad = np.pad(mid16, ((0, 0), (0, 0), (k // 2, k // 2), (k // 2, k // 2)))
    cin = 16 // groups
    ref = np.zeros((2, 16, 10, 10))
    for o in range(16):
        g = o // (16 // groups)
        for c in range(cin):
            for i in range(k):
                for j in range(k):
                    ref[:, o] += pad[:, g * cin + c, i : i + 10, j : j + 10] * w16[o, c, i, j]
    vm = relax.VirtualMachine(relax.build(rewritten, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()
    assert got.dtype == np.float32
    scale = np.abs(ref).max()
    err = np.abs(got - ref).max() / scale
    assert err < (4e-3 if accumulator == "float16" else 2e-3), err
    ref32 = np.asarray(
        relax.VirtualMachine(relax.build(clip_to_min_max(relu6_depthwise(True, k, groups)), "llvm"), tvm.cpu())["main"](
            *[tvm.runtime.tensor(a) for a in args]
        ).numpy()
    )
    assert np.abs(ref32 - ref).max() / scale < 2e-3  # the reference is the graph's


def _depthwise_layer_norm(residual: bool):
    """NHWC 7x7 depthwise conv + bias -> LayerNorm over channels (ConvNeXt's block start), batch 2;
    ``residual``: the conv's output is also added to the LayerNorm's output. Weights are parameters."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 14, 14, 32], "float32"))
    w = relax.Var("w", relax.TensorType([32, 7, 7, 1], "float32"))
    bias = relax.Var("bias", relax.TensorType([1, 1, 1, 32], "float32"))
    g = relax.Var("g", relax.TensorType([32], "float32"))
    b = relax.Var("b", relax.TensorType([32], "float32"))
    with bb.function("main", [x, w, bias, g, b], attrs={"num_input": 1}):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=[3] * 4, groups=32, data_layout="NHWC", kernel_layout="OHWI"))
            y = bb.emit(relax.op.add(y, bias))
            z = bb.emit(relax.op.nn.layer_norm(y, g, b, [-1]))
            if residual:
                z = bb.emit(relax.op.add(z, y))
            out = bb.emit_output(z)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("residual", [False, True])
def test_layer_norm_reads_an_fp16_summed_conv_as_fp16(residual):
    """A LayerNorm whose only input is an fp16-summed depthwise conv (+ bias) reads it as fp16 (the
    conv's kernel then writes fp16); where the conv's output has another use it stays float32. Results
    within fp16 rounding of the float32 graph."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import fp16_depthwise

    mod = _depthwise_layer_norm(residual)
    rewritten = fp16_depthwise(mod)
    norms = _calls(rewritten, "relax.nn.layer_norm")
    assert [str(n.args[0].ty.dtype) for n in norms] == ["float32" if residual else "float16"]
    assert str(rewritten["main"].body.body.ty.dtype) == "float32"
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 14, 14, 32), (32, 7, 7, 1), (1, 1, 1, 32))]
    args += [(1 + 0.1 * rng.standard_normal(32)).astype(np.float32), (0.1 * rng.standard_normal(32)).astype(np.float32)]

    def run(m):
        vm = relax.VirtualMachine(relax.build(m, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()

    ref = run(mod)
    got = run(rewritten)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 5e-3, err
