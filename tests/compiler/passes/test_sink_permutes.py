"""Transposes move past elementwise ops and cancel: a channels-last block inside an NCHW network (the
ConvNeXt pattern) keeps no transpose kernels after the NHWC conversion, and computes the same."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.helpers import main_ops


def _convnext_blocks(path, blocks: int = 2):
    """NCHW stem conv, then ``blocks`` ConvNeXt blocks: depthwise 7x7 -> Transpose to NHWC -> LayerNorm
    -> MatMul -> GELU (erf) -> MatMul -> layer scale -> Transpose back -> residual add; then a 1x1 conv
    (opset 17)."""
    import onnx

    rng = np.random.default_rng(0)

    def w(name, *shape, scale=0.2):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    c = 16
    nodes = [helper.make_node("Conv", ["x", "ws"], ["h0"], kernel_shape=[2, 2], strides=[2, 2])]
    inits = [w("ws", c, 3, 2, 2)]
    for name, v in (("sqrt2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5)):
        inits.append(numpy_helper.from_array(np.array(v, np.float32), name))
    for i in range(blocks):
        h, o = f"h{i}", f"h{i + 1}"
        nodes += [
            helper.make_node("Conv", [h, f"dw{i}"], [f"d{i}"], kernel_shape=[7, 7], pads=[3] * 4, group=c),
            helper.make_node("Transpose", [f"d{i}"], [f"t{i}"], perm=[0, 2, 3, 1]),
            helper.make_node("LayerNormalization", [f"t{i}", f"g{i}", f"b{i}"], [f"n{i}"], axis=-1),
            helper.make_node("MatMul", [f"n{i}", f"w1_{i}"], [f"m{i}"]),
            helper.make_node("Div", [f"m{i}", "sqrt2"], [f"q{i}"]),
            helper.make_node("Erf", [f"q{i}"], [f"r{i}"]),
            helper.make_node("Add", [f"r{i}", "one"], [f"a{i}"]),
            helper.make_node("Mul", [f"m{i}", f"a{i}"], [f"p{i}"]),
            helper.make_node("Mul", [f"p{i}", "half"], [f"e{i}"]),
            helper.make_node("MatMul", [f"e{i}", f"w2_{i}"], [f"k{i}"]),
            helper.make_node("Mul", [f"k{i}", f"s{i}"], [f"l{i}"]),
            helper.make_node("Transpose", [f"l{i}"], [f"u{i}"], perm=[0, 3, 1, 2]),
            helper.make_node("Add", [h, f"u{i}"], [o]),
        ]
        inits += [w(f"dw{i}", c, 1, 7, 7), w(f"g{i}", c), w(f"b{i}", c), w(f"w1_{i}", c, 4 * c)]
        inits += [w(f"w2_{i}", 4 * c, c), w(f"s{i}", c, scale=0.5)]
    nodes.append(helper.make_node("Conv", [f"h{blocks}", "wo"], ["y"], kernel_shape=[1, 1]))
    inits.append(w("wo", 8, c, 1, 1))
    graph = helper.make_graph(
        nodes,
        "convnext",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 8, 8, 8])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("target,precision", [("h200", "fp16"), ("x86-cpu", "fp32")])
def test_channels_last_blocks_keep_no_transposes_after_the_layout_conversion(tmp_path, target, precision):
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target

    path = _convnext_blocks(tmp_path / "c.onnx", blocks=3)
    spec = get_target(target)
    mod = prepare_variant(import_model(path, {}), variant_layout(spec, precision), bake=True).mod
    # the NCHW input's conversion to NHWC and the output's back: nothing inside the blocks
    assert main_ops(mod).count("relax.permute_dims") == 2


def test_sunk_transposes_compute_the_same_as_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import relax_pipeline, resolve_tvm_target
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target

    path = _convnext_blocks(tmp_path / "c.onnx")
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    spec = get_target("x86-cpu")
    target = resolve_tvm_target(spec)
    prepared = prepare_variant(import_model(path, {}), variant_layout(spec, "fp32"), bake=True)
    vm = relax.VirtualMachine(relax.build(prepared.mod, target, relax_pipeline=relax_pipeline(spec, target)), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(w) for w in prepared.weight_arrays]).numpy()
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_a_transpose_is_not_moved_past_a_full_size_operand_or_a_widening_cast():
    """Moving it would add a full-size transpose of the other operand, or move more bytes."""
    import tvm
    from tvm import relax
    from tvm.script import relax as R

    from inferx_edge.compiler.passes import sink_permutes

    @tvm.script.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((2, 4, 6, 8), "int8"), y: R.Tensor((2, 6, 8, 4), "float32")):
            with R.dataflow():
                t = R.permute_dims(x, axes=[0, 2, 3, 1])
                f = R.astype(t, "float32")
                s = R.add(f, y)
                R.output(s)
            return s

    out = relax.transform.DeadCodeElimination()(sink_permutes(Mod))
    assert out["main"].script() == Mod["main"].script()
