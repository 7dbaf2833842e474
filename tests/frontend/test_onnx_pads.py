"""Zero Pad nodes in front of convolutions (TensorFlow-style "same" padding) fold into the Conv."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.helpers import main_ops


def _padded_net(
    path, opset: int = 13, value: float = 0.0, axes_pad=(0, 0, 0, 1, 0, 0, 1, 2), bounds_as_initializers=False
):
    """Conv 1x1 -> Clip (ReLU6) -> Pad -> depthwise 3x3 stride 2 -> Pad -> Conv 1x1 -> output. The clip's
    bounds are Constant nodes (as exporters write them) or 0-d initializers."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((8, 1, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32), "w2")
    pads = numpy_helper.from_array(np.array(axes_pad, np.int64), "pads")
    w0 = numpy_helper.from_array((rng.standard_normal((8, 8, 1, 1)) * 0.5).astype(np.float32), "w0")
    inits = [w0, w1, w2, pads]
    pad_inputs = ["c", "pads"]
    if value:
        inits.append(numpy_helper.from_array(np.array(value, np.float32), "v"))
        pad_inputs.append("v")
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["x0"], kernel_shape=[1, 1]),
        helper.make_node("Clip", ["x0", "lo", "hi"], ["c"]),
        helper.make_node("Pad", pad_inputs, ["p"], mode="constant"),
        helper.make_node("Conv", ["p", "w1"], ["d"], kernel_shape=[3, 3], strides=[2, 2], group=8),
        helper.make_node("Pad", ["d", "pads2"], ["q"]),
        helper.make_node("Conv", ["q", "w2"], ["y"], kernel_shape=[1, 1], pads=[1, 0, 0, 1]),
    ]
    bounds = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", 0.0), ("hi", 6.0))]
    if bounds_as_initializers:
        inits += bounds
    else:
        nodes[:0] = [helper.make_node("Constant", [], [b.name], value=b) for b in bounds]
    inits.append(numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads2"))
    import onnx

    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 8, 12, 12])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4, 9, 10])
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", opset)]
    )
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def test_zero_pads_fold_into_the_convs_and_compute_the_same(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    import onnx
    import tvm
    from tvm import relax

    from inferx_edge.frontend import import_model
    from inferx_edge.frontend.onnx_pads import fold_pads_into_convs

    path = _padded_net(tmp_path / "p.onnx")
    folded, n = fold_pads_into_convs(onnx.load(str(path)))
    assert n == 2 and "Pad" not in [node.op_type for node in folded.graph.node]
    pads = {
        node.output[0]: list(a.ints)
        for node in folded.graph.node
        if node.op_type == "Conv"
        for a in node.attribute
        if a.name == "pads"
    }
    assert list(pads["d"]) == [0, 1, 1, 2] and list(pads["y"]) == [2, 1, 1, 2]  # added to the conv's own
    imported = import_model(path, {})
    assert not [op for op in main_ops(imported.mod) if "pad" in op]
    x = np.random.default_rng(1).uniform(-2, 8, (2, 8, 12, 12)).astype(np.float32)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    vm = relax.VirtualMachine(relax.build(imported.mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in imported.params]).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [{"value": 1.0}, {"axes_pad": (0, 1, 0, 0, 0, 0, 0, 0)}, {"axes_pad": (0, 0, -1, 0, 0, 0, 0, 0)}],
    ids=["nonzero-value", "pads-channels", "crops"],
)
def test_pads_that_are_not_plain_spatial_zero_padding_stay(tmp_path, kwargs):
    import onnx

    from inferx_edge.frontend.onnx_pads import fold_pads_into_convs

    folded, n = fold_pads_into_convs(onnx.load(str(_padded_net(tmp_path / "p.onnx", **kwargs))))
    assert n == 1  # only the second Pad (plain spatial zeros) folds
    assert [node.op_type for node in folded.graph.node].count("Pad") == 1


def test_clip_before_a_padded_depthwise_conv_reaches_the_fp16_depthwise_pass(tmp_path):
    """With the Pad folded, the ReLU6 clip is the depthwise conv's input: an int8 CUDA variant reads it
    as fp16 (before, the NCHW pad between them hid it)."""
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.quantize.driver import QuantOptions, quantizer, resolve_plan
    from inferx_edge.targets import get_target

    path = _padded_net(tmp_path / "p.onnx")
    imported = import_model(path, {})
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(1).uniform(-2, 8, (8, 8, 12, 12)).astype(np.float32))
    quantize = quantizer(resolve_plan(path, {}, imported, "int8", QuantOptions(calib=calib)), "int8")
    mod = prepare_variant(imported, variant_layout(get_target("h200"), "int8"), quantize=quantize, bake=True).mod
    script = mod["main"].script()
    depthwise = [line for line in script.splitlines() if "groups=8" in line]
    assert len(depthwise) == 1 and 'out_dtype="float16"' in depthwise[0]  # fp16 operands, a 3x3 window: fp16 sums
    assert 'R.Tensor((2, 12, 12, 8), dtype="float16")' in script  # the clipped input, cast for it
    assert main_ops(mod).count("relax.permute_dims") == 2  # the input and the output: none around a pad


def test_a_clip_with_0d_initializer_bounds_builds_for_cuda_int8(tmp_path):
    """0-d weights reach the build-time weight transforms as 0-d arrays (np.ascontiguousarray made them
    shape (1,), and the int8 CUDA variant of such a clip failed with 'Mismatched lo.ndim')."""
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.quantize.driver import QuantOptions, quantizer, resolve_plan
    from inferx_edge.targets import get_target

    path = _padded_net(tmp_path / "p.onnx", bounds_as_initializers=True)
    imported = import_model(path, {})
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(1).uniform(-2, 8, (8, 8, 12, 12)).astype(np.float32))
    quantize = quantizer(resolve_plan(path, {}, imported, "int8", QuantOptions(calib=calib)), "int8")
    prepared = prepare_variant(imported, variant_layout(get_target("h200"), "int8"), quantize=quantize, bake=True)
    assert [a.shape for a in prepared.weight_arrays if a.ndim == 0]  # the bounds stay scalars


def test_a_pad_by_nothing_is_an_identity_and_the_model_converts_to_fp16(tmp_path):
    """Swin pads feature maps to whole windows; where they already are whole the Pad is all zeros. As
    a TIR function it kept the fp16 conversion from running (ToMixedPrecision rejects call_tir)."""
    import onnx
    import tvm
    from tvm import relax

    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.frontend.onnx_pads import fold_pads_into_convs
    from inferx_edge.targets import get_target

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((6, 6)) * 0.3).astype(np.float32), "w")
    zeros = numpy_helper.from_array(np.zeros(6, np.int64), "zeros")
    nodes = [
        helper.make_node("Pad", ["x", "zeros"], ["p"], mode="constant"),
        helper.make_node("MatMul", ["p", "w"], ["y"]),
    ]
    x_info = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 7, 6])
    y_info = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 7, 6])
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x_info], [y_info], [w, zeros]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    path = tmp_path / "z.onnx"
    path.write_bytes(model.SerializeToString())
    folded, n = fold_pads_into_convs(model)
    assert n == 1 and [node.op_type for node in folded.graph.node] == ["Identity", "MatMul"]
    spec = get_target("x86-cpu")
    prepared = prepare_variant(import_model(path, {}), variant_layout(spec, "fp16"), bake=True)
    x = rng.standard_normal((2, 7, 6)).astype(np.float32)
    vm = relax.VirtualMachine(relax.build(prepared.mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(a) for a in prepared.weight_arrays]).numpy()
    np.testing.assert_allclose(got, x @ numpy_helper.to_array(w), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    "attrs, in_hw, out_hw",
    [
        ({"strides": [2, 2], "output_shape": [10, 10]}, (5, 5), (10, 10)),  # the extra pixel at the start
        ({"strides": [2, 2], "output_shape": [10, 10], "auto_pad": "SAME_UPPER"}, (5, 5), (10, 10)),  # at the end
        ({"strides": [3, 3], "output_shape": [14, 13]}, (4, 4), (14, 13)),  # beyond the natural 12: output padding
        ({"strides": [2, 2], "dilations": [2, 2], "output_shape": [9, 11]}, (4, 5), (9, 11)),
    ],
)
def test_conv_transpose_output_shape_gives_that_shape(tmp_path, attrs, in_hw, out_hw):
    """TVM's ONNX frontend ignored ConvTranspose's output_shape (a 5x5 -> 10x10 stride-2 one came out
    11x11, no error); the import writes the pads and output padding the specification derives."""
    ort = pytest.importorskip("onnxruntime")
    import onnx
    import tvm
    from onnx import TensorProto
    from tvm import relax

    from inferx_edge.frontend import import_model

    w = np.random.default_rng(0).standard_normal((3, 4, 3, 3)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], kernel_shape=[3, 3], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, *in_hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, *out_hw])], [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    path = tmp_path / "convt.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    x = np.random.default_rng(1).standard_normal((1, 3, *in_hw)).astype(np.float32)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    imported = import_model(path, {})
    vm = relax.VirtualMachine(relax.build(imported.mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in imported.params]).numpy()
    assert got.shape == want.shape == (1, 4, *out_hw)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "mode, transform, scale, extra",
    [
        ("linear", "half_pixel", 1.5, {}), ("linear", "align_corners", 0.7, {}),
        ("linear", "pytorch_half_pixel", 2.3, {}), ("nearest", "asymmetric", 0.7, {}),
        ("nearest", "half_pixel", 1.5, {}), ("nearest", "tf_half_pixel_for_nn", 0.34, {}),
        ("linear", "half_pixel", 2.0, {}), ("cubic", "half_pixel", 1.5, {}), ("cubic", "align_corners", 0.7, {}),
        ("cubic", "asymmetric", 2.3, {"exclude_outside": 1, "cubic_coeff_a": -0.5}),
        ("cubic", "pytorch_half_pixel", 0.6, {"exclude_outside": 1}),
        ("linear", "half_pixel", 0.7, {"antialias": 1}),
    ],
)  # fmt: skip
def test_resizes_by_scales_without_whole_sizes_sample_as_onnx(tmp_path, mode, transform, scale, extra):
    """ONNX maps a Resize's output pixels back with its scales; TVM's importer uses the ratio of the
    rounded sizes, which differs where size x scale is not whole (9 x 0.7, 7 x 1.5) and silently gave
    other values. Nearest, linear and cubic ones (cubic_coeff_a, exclude_outside) are lowered to gathers
    at import and match onnxruntime (H and W scaled differently); an antialiased downscale is refused
    with an error saying how to re-export."""
    import onnx
    import tvm
    from onnx import TensorProto
    from tvm import relax

    from inferx_edge.errors import ModelError
    from inferx_edge.frontend import import_model

    ort = pytest.importorskip("onnxruntime")
    scales = numpy_helper.from_array(np.array([1, 1, scale, scale * 1.1], np.float32), "s")
    node = helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode, nearest_mode="round_prefer_ceil",
                            coordinate_transformation_mode=transform, **extra)  # fmt: skip
    out = [1, 2, int(np.float32(9) * np.float32(scale)), int(np.float32(7) * np.float32(scale * 1.1))]
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 9, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)], [scales],
    )  # fmt: skip
    path = tmp_path / "resize.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18 if extra else 13)]), str(path))
    if extra.get("antialias"):
        with pytest.raises(
            ModelError, match=r"\(linear/half_pixel\).*not whole output sizes.*Re-export it with output sizes"
        ):
            import_model(path, {})
        return
    x = np.random.default_rng(2).standard_normal((1, 2, 9, 7)).astype(np.float32)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    imported = import_model(path, {})
    vm = relax.VirtualMachine(relax.build(imported.mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in imported.params]).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_constants_below_a_size_leave_weights_alone():
    """The rewrites that read indices, shapes and scales ask for values of few elements: initializers
    and Constant nodes above the limit are not copied to numpy."""
    from inferx_edge.frontend.onnx_pads import _constants

    big, small = np.zeros((10, 10), np.float32), np.arange(4, dtype=np.int64)
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["c_small"], value=numpy_helper.from_array(small, "c_small")),
            helper.make_node("Constant", [], ["c_big"], value=numpy_helper.from_array(big, "c_big")),
        ],
        "g", [], [helper.make_tensor_value_info("c_small", 7, [4])],
        [numpy_helper.from_array(big, "w"), numpy_helper.from_array(small, "i")],
    )  # fmt: skip
    model = helper.make_model(graph)
    assert sorted(_constants(model)) == ["c_big", "c_small", "i", "w"]
    limited = _constants(model, max_elements=16)
    assert sorted(limited) == ["c_small", "i"]
    np.testing.assert_array_equal(limited["i"], small)
