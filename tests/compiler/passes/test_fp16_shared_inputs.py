"""A float32 value an fp16 depthwise conv reads is read as that fp16 copy by its other readers too."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import main_bindings, op_of, run_on_cpu


def _residual_block(stream_is_output: bool = False):
    """ConvNeXt-shaped, NHWC, batch 2: a 1x1 conv makes the stream ``v``; 7x7 depthwise conv -> 1x1 conv
    -> ``v +`` that (the residual add); ``stream_is_output``: ``v`` is returned too. Weights are
    parameters."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 14, 14, 16], "float32"))
    w0 = relax.Var("w0", relax.TensorType([32, 1, 1, 16], "float32"))
    wd = relax.Var("wd", relax.TensorType([32, 7, 7, 1], "float32"))
    w1 = relax.Var("w1", relax.TensorType([32, 1, 1, 32], "float32"))
    nhwc = {"data_layout": "NHWC", "kernel_layout": "OHWI"}
    with bb.function("main", [x, w0, wd, w1], attrs={"num_input": 1}):
        with bb.dataflow():
            v = bb.emit(relax.op.nn.conv2d(x, w0, **nhwc))
            d = bb.emit(relax.op.nn.conv2d(v, wd, padding=[3] * 4, groups=32, **nhwc))
            y = bb.emit(relax.op.add(v, bb.emit(relax.op.nn.conv2d(d, w1, **nhwc))))
            out = bb.emit_output(relax.Tuple([y, v]) if stream_is_output else y)
        bb.emit_func_output(out)
    return bb.get()


def _args(seed: int = 0):
    rng = np.random.default_rng(seed)
    shapes = ((2, 14, 14, 16), (32, 1, 1, 16), (32, 7, 7, 1), (32, 1, 1, 32))
    return [
        (rng.standard_normal(s) / np.sqrt(np.prod(s[1:]) if i else 1)).astype(np.float32) for i, s in enumerate(shapes)
    ]


@pytest.mark.parametrize("stream_is_output", [False, True])
def test_residual_add_reads_the_depthwise_convs_fp16_copy(stream_is_output):
    """The stream's saturation to fp16 (written by ``fp16_depthwise`` for the depthwise conv) becomes
    the stream's only reader among the calls: the residual add widens that fp16 copy instead of reading
    float32. Results within fp16 rounding of the float32 graph; a returned stream stays exact."""
    from inferx_edge.compiler.passes import fp16_depthwise, fp16_shared_inputs

    mod = fp16_depthwise(_residual_block(stream_is_output))
    rewritten = fp16_shared_inputs(mod)
    b = main_bindings(rewritten)
    stream = next(v for v, val in b.items() if op_of(val) == "relax.nn.conv2d" and val.attrs.groups == 1)
    readers = [
        val
        for val in b.values()
        if any(getattr(a, "same_as", lambda _: False)(stream) for a in getattr(val, "args", ()))
    ]
    assert [op_of(r) for r in readers] == ["relax.maximum"]  # the saturation alone: it fuses into the conv
    add = next(val for val in b.values() if op_of(val) == "relax.add")
    widened = [b[a] for a in add.args if op_of(b.get(a)) == "relax.astype"]
    assert len(widened) == 1 and str(widened[0].args[0].ty.dtype) == "float16"
    assert str(widened[0].ty.dtype) == "float32"
    args = _args()
    ref, got = run_on_cpu(_residual_block(stream_is_output), *args), run_on_cpu(rewritten, *args)
    scale = np.abs(ref[0]).max()
    assert np.abs(got[0] - ref[0]).max() / scale < 4e-3
    assert np.abs(got[0] - ref[0]).max() / scale > 0  # the add did read the rounded copy
    if stream_is_output:
        np.testing.assert_allclose(got[1], ref[1], rtol=1e-5, atol=1e-6)


def test_values_without_an_fp16_reader_are_untouched():
    """A graph with no fp16 saturation (float32 depthwise sums never rewritten) comes back as it was."""
    import tvm

    from inferx_edge.compiler.passes import fp16_shared_inputs

    mod = _residual_block()
    tvm.ir.assert_structural_equal(fp16_shared_inputs(mod), mod)


def test_stream_beyond_fp16_saturates_for_every_reader():
    """A stream value beyond fp16's range reaches the residual add as +-65504, never inf (as the depthwise
    conv reads it)."""
    from inferx_edge.compiler.passes import fp16_depthwise, fp16_shared_inputs

    args = _args(1)
    args[0][:] = 0
    args[0][0, 3, 3, 0] = 1e6
    args[1][:] = 0
    args[1][:, 0, 0, 0] = 1.0
    args[3][:] = 0  # the branch adds nothing: the output is the stream as the add reads it
    got = run_on_cpu(fp16_shared_inputs(fp16_depthwise(_residual_block())), *args)[0]
    assert np.isfinite(got).all() and got.max() == 65504.0


def test_saturation_fuses_into_the_streams_producer():
    """After TVM's operator fusion no kernel of its own saturates the stream: the conv that makes it
    writes fp16 (the saturation in its epilogue), and no kernel writes the stream as float32."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import fp16_depthwise, fp16_shared_inputs

    def kernels(mod):
        seq = tvm.transform.Sequential(
            [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), relax.transform.FuseOps()]
        )
        fused = seq(mod)
        return {  # activation kernels (the weights' saturations are baked when building): name -> dtype
            gv.name_hint: str(f.ret_ty.dtype)
            for gv, f in fused.functions_items()
            if isinstance(f, relax.Function) and gv.name_hint != "main" and f.ret_ty.ndim == 4
            if int(f.ret_ty.shape.values[0]) == 2
        }

    before = kernels(fp16_depthwise(_residual_block()))
    after = kernels(fp16_shared_inputs(fp16_depthwise(_residual_block())))
    assert any(n.startswith("fused_maximum") for n in before)  # the saturation was a kernel of its own
    assert not any(n.startswith("fused_maximum") for n in after)
    producer = [n for n in after if n.startswith("fused_conv2d") and "maximum" in n]
    assert producer and all(after[n] == "float16" for n in producer)
