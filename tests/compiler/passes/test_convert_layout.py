"""Convolutions in NHWC: int8 with OHWI weights computes the same, and clips stay in NHWC."""

from __future__ import annotations

import numpy as np


def test_nhwc_int8_with_ohwi_weights_computes_the_same(tmp_path):
    """The layouts CUDA variants use (int8 weights stored OHWI, convs in NHWC), checked on this CPU
    against the NCHW/OIHW int8 module: the same int8 products and int32 sums."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import convert_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.models import DEFAULT_DATA, DEFAULT_MODEL
    from inferx_edge.quantize.driver import QuantOptions, apply_plan, make_plan

    base = import_model(DEFAULT_MODEL, {"image": (8, 1, 28, 28)})
    plan = make_plan(
        DEFAULT_MODEL, {"image": (8, 1, 28, 28)}, base, "int8", QuantOptions(calib_method="minmax"), log=lambda *a: None
    )
    with np.load(DEFAULT_DATA) as npz:
        x = npz["holdout_images"][:8, None].astype(np.float32) / np.float32(255)
    outs = []
    for kernel_layout, layout in (("OIHW", "NCHW"), ("OHWI", "NHWC")):
        q, _ = apply_plan(base, plan, "int8", kernel_layout)
        convs = [p for p in q.params if p.dtype == np.int8 and p.ndim == 4]
        assert convs
        if kernel_layout == "OHWI":  # output channels first, input channels last
            assert [p.shape for p in convs] == [(24, 3, 3, 1), (48, 3, 3, 24), (64, 3, 3, 48)]
        mod = convert_layout(q.mod, layout)
        if layout == "NHWC":  # quantize clips became min/max (no transposes); the 1-channel stride-2 stem
            script = mod.script()  # padded to 4 channels, then a 2x2 conv over 16-channel space-to-depth pixels
            assert "R.clip" not in script and script.count("R.nn.pad(") == 3
            assert 'R.Tensor((24, 2, 2, 16), dtype="int8")' in script
        vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in q.params]).numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=0, atol=1e-5)


def test_nhwc_layout_keeps_relu6_and_quantize_clips_in_nhwc():
    """Relax has no layout rule for clip: ConvertLayout put a transpose pair around every clip (ReLU6,
    int8 quantize) between NHWC convolutions. convert_layout rewrites clips to min/max first."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import convert_layout

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 8, 10, 10], "float32"))
    w1 = relax.Var("w1", relax.TensorType([8, 8, 3, 3], "float32"))
    w2 = relax.Var("w2", relax.TensorType([8, 8, 3, 3], "float32"))
    with bb.function("main", [x, w1, w2]):
        with bb.dataflow():
            y = bb.emit(relax.op.clip(relax.op.nn.conv2d(x, w1, padding=[1, 1, 1, 1]), 0, 6))
            out = bb.emit_output(relax.op.nn.conv2d(y, w2, padding=[1, 1, 1, 1]))
        bb.emit_func_output(out)
    mod = bb.get()
    nhwc = convert_layout(mod, "NHWC")
    script = nhwc.script()
    acts = [ln for ln in script.splitlines() if "R.permute_dims(" in ln and "(2, " in ln.split("=")[0]]
    assert len(acts) == 2, script  # the input to NHWC and the output back to NCHW, nothing in between
    assert "R.clip" not in script
    rng = np.random.default_rng(0)
    args = [rng.standard_normal([int(d) for d in v.ty.shape.values]).astype(np.float32) for v in mod["main"].params]
    outs = []
    for m in (mod, nhwc):
        vm = relax.VirtualMachine(relax.build(m, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        outs.append(vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy())
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)  # summation order differs


def test_onnx_clip_with_tensor_bounds_stays_in_nhwc(tmp_path):
    """ONNX Clip (opset 13, min/max inputs) imports as call_tir of TE maximum/minimum, opaque to
    ConvertLayout: MobileNetV2's ReLU6s ran as transpose-clip-transpose kernels until rewritten."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from inferx_edge.compiler.passes import convert_layout
    from inferx_edge.frontend import import_model

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes, "relu6", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 10, 10])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 10, 10])], inits,
    )  # fmt: skip
    path = tmp_path / "relu6.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)
    mod = import_model(path, {"x": (2, 8, 10, 10)}).mod
    assert "call_tir(cls.maximum" in mod.script()  # what the importer emits
    script = convert_layout(mod, "NHWC").script()
    assert "call_tir(cls.maximum" not in script and "call_tir(cls.minimum" not in script
    acts = [ln for ln in script.splitlines() if "R.permute_dims(" in ln and "(2, " in ln.split("=")[0]]
    assert len(acts) == 2, script


def test_negative_squeeze_and_permute_axes_convert_and_compute_the_same():
    """TVM's layout rules for squeeze and permute_dims fail on negative axes (std::bad_alloc, 'Invalid
    layout'); convert_layout makes them non-negative first. Every case against the unconverted module."""
    from tvm import relax

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    x = rng.standard_normal((1, 3, 6, 8)).astype(np.float32)
    tails = {
        "squeeze the last axis": lambda y: relax.op.squeeze(relax.op.sum(y, axis=[-1], keepdims=True), axis=[-1]),
        "squeeze the batch axis": lambda y: relax.op.squeeze(y, axis=[-4]),
        "permute with a negative axis": lambda y: relax.op.permute_dims(y, axes=[0, -1, 1, 2]),
    }
    for name, tail in tails.items():
        _converts_and_computes_the_same(name, x, lambda xv, t=tail: t(relax.op.nn.conv2d(xv, relax.const(w))))


def test_stacks_convert_and_compute_the_same():
    """relax.stack has no working layout rule in TVM's ConvertLayout ('Index -1 out of bounds',
    'Invalid SLayout'): ONNX Max/Min of several inputs import as stack + reduction, and torch.max(a, b)
    exported to ONNX did not build. convert_layout writes stacks as concatenations of expand_dims."""
    from tvm import relax

    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 3, 3, 3)).astype(np.float32)
    x = rng.standard_normal((1, 3, 6, 8)).astype(np.float32)
    tails = {
        "elementwise max of two branches (ONNX Max)": lambda y: relax.op.max(
            relax.op.stack([y, relax.op.negative(y)], axis=0), axis=[0]
        ),
        "stack on the last axis": lambda y: relax.op.stack([y, y * relax.const(np.float32(2))], axis=-1),
        "stack without convolutions around it": None,
    }
    for name, tail in tails.items():
        if tail is None:
            _converts_and_computes_the_same(name, x, lambda xv: relax.op.stack([xv, xv], axis=1))
        else:
            _converts_and_computes_the_same(name, x, lambda xv, t=tail: t(relax.op.nn.conv2d(xv, relax.const(w))))


def _converts_and_computes_the_same(name, x, body):
    """A one-input function ``body(x)`` built for the CPU as it is and after ``convert_layout`` to NHWC
    (HWIO weights): the same shape and values."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import convert_layout

    bb = relax.BlockBuilder()
    xv = relax.Var("x", relax.TensorType(x.shape, "float32"))
    with bb.function("main", [xv]):
        with bb.dataflow():
            out = bb.emit_output(body(xv))
        bb.emit_func_output(out)
    outs = []
    for mod in (bb.get(), convert_layout(bb.get(), "NHWC", "HWIO")):
        vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(x)).numpy())
    assert outs[0].shape == outs[1].shape, name
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5, err_msg=name)
