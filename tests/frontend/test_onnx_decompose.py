"""ONNX nodes TVM's frontend has no converter for (``uses ONNX operators TVM cannot import``), written
with supported ops at import (``frontend/onnx_decompose.py``): each model imports, builds for this CPU
and matches onnxruntime; a node whose needed value is not constant is still named as unsupported."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from inferx_edge.errors import ModelError

ort = pytest.importorskip("onnxruntime")


def _model(tmp_path, node, shape, out_shape, inits=(), opset=18, extra_inputs=()):
    import onnx

    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape)), *extra_inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))],
        list(inits),
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def _matches_onnxruntime(path, x, rtol=1e-5, atol=1e-5):
    import tvm
    from tvm import relax

    from inferx_edge.frontend import import_model

    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    imported = import_model(path, {})
    vm = relax.VirtualMachine(relax.build(imported.mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in imported.params]).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


@pytest.mark.parametrize("p, axis", [(2, -1), (1, 1), (2, 0)])
def test_lp_normalization(tmp_path, p, axis):
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
    node = helper.make_node("LpNormalization", ["x"], ["y"], p=p, axis=axis)
    _matches_onnxruntime(_model(tmp_path, node, x.shape, x.shape), x)


@pytest.mark.parametrize("batch_axis, time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence(tmp_path, batch_axis, time_axis):
    shape = [5, 3, 2] if time_axis == 0 else [3, 5, 2]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    node = helper.make_node("ReverseSequence", ["x", "l"], ["y"], batch_axis=batch_axis, time_axis=time_axis)
    path = _model(tmp_path, node, shape, shape, [_i64("l", [5, 1, 3])])
    _matches_onnxruntime(path, x, rtol=0, atol=0)


@pytest.mark.parametrize("target, axes", [([4, 9], [1, 2]), ([2, 3, 8, 3], None), ([7], [-1])])
def test_center_crop_pad(tmp_path, target, axes):
    shape = [2, 3, 6, 5]
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    out = list(shape)
    for a, t in zip(axes or range(4), target, strict=True):
        out[a] = t
    kw = {"axes": axes} if axes else {}
    node = helper.make_node("CenterCropPad", ["x", "s"], ["y"], **kw)
    _matches_onnxruntime(_model(tmp_path, node, shape, out, [_i64("s", target)]), x, rtol=0, atol=0)


@pytest.mark.parametrize(
    "channels, inverse, onesided, length",
    [(1, 0, 0, None), (2, 0, 0, None), (1, 0, 1, None), (2, 1, 0, None), (1, 0, 0, 12), (2, 0, 0, 6)],
)
def test_dft(tmp_path, channels, inverse, onesided, length):
    shape = [2, 8, channels]
    x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    n = length or 8
    out = [2, n // 2 + 1 if onesided else n, 2]
    inputs = ["x", "n" if length else "", "ax"]
    inits = [_i64("ax", 1)] + ([_i64("n", length)] if length else [])
    node = helper.make_node("DFT", inputs, ["y"], inverse=inverse, onesided=onesided)
    _matches_onnxruntime(_model(tmp_path, node, shape, out, inits, opset=20), x, rtol=1e-4, atol=1e-4)


def test_a_node_with_a_runtime_value_is_still_named(tmp_path):
    """ReverseSequence with sequence lengths given at run time cannot be rewritten: the import says
    which operator it cannot take."""
    from inferx_edge.frontend import import_model

    node = helper.make_node("ReverseSequence", ["x", "l"], ["y"], batch_axis=1, time_axis=0)
    lens = helper.make_tensor_value_info("l", TensorProto.INT64, [3])
    path = _model(tmp_path, node, [5, 3, 2], [5, 3, 2], extra_inputs=[lens])
    with pytest.raises(ModelError, match="ReverseSequence"):
        import_model(path, {})


@pytest.mark.parametrize(
    "image, block, attrs",
    [((5, 5), (2, 2), {}), ((6, 7), (3, 2), {"strides": [2, 1], "pads": [1, 0, 1, 1]}), ((7, 7), (2, 3), {"dilations": [2, 1], "strides": [1, 2]})],
)  # fmt: skip
def test_col2im(tmp_path, image, block, attrs):
    (h, w), (kh, kw) = image, block
    dh, dw = attrs.get("dilations", [1, 1])
    sh, sw = attrs.get("strides", [1, 1])
    ph0, pw0, ph1, pw1 = attrs.get("pads", [0, 0, 0, 0])
    oh = (h + ph0 + ph1 - dh * (kh - 1) - 1) // sh + 1
    ow = (w + pw0 + pw1 - dw * (kw - 1) - 1) // sw + 1
    shape = [2, 3 * kh * kw, oh * ow]
    x = np.random.default_rng(4).standard_normal(shape).astype(np.float32)
    node = helper.make_node("Col2Im", ["x", "im", "bl"], ["y"], **attrs)
    path = _model(tmp_path, node, shape, [2, 3, h, w], [_i64("im", list(image)), _i64("bl", list(block))])
    _matches_onnxruntime(path, x)


@pytest.mark.parametrize("window, frame, onesided", [("hann", None, 1), (None, 8, 1), ("hann", 16, 0)])
def test_stft(tmp_path, window, frame, onesided):
    shape = [2, 50, 1]
    x = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    n = frame or 16
    frames = (50 - n) // 6 + 1
    inits = [_i64("step", 6)]
    inputs = ["x", "step", "", ""]
    if window:
        inits.append(numpy_helper.from_array(np.hanning(n).astype(np.float32), "w"))
        inputs[2] = "w"
    if frame:
        inits.append(_i64("len", frame))
        inputs[3] = "len"
    node = helper.make_node("STFT", inputs, ["y"], onesided=onesided)
    out = [2, frames, n // 2 + 1 if onesided else n, 2]
    _matches_onnxruntime(_model(tmp_path, node, shape, out, inits, opset=17), x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_det(tmp_path, n):
    x = np.random.default_rng(6).standard_normal((4, 2, n, n)).astype(np.float32)
    node = helper.make_node("Det", ["x"], ["y"])
    _matches_onnxruntime(_model(tmp_path, node, x.shape, [4, 2]), x)


def test_det_of_larger_matrices_is_still_named(tmp_path):
    from inferx_edge.frontend import import_model

    node = helper.make_node("Det", ["x"], ["y"])
    with pytest.raises(ModelError, match="Det"):
        import_model(_model(tmp_path, node, [2, 4, 4], [2]), {})
