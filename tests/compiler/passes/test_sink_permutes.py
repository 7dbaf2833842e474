"""Transposes move past elementwise ops and cancel: a channels-last block inside an NCHW network (the
ConvNeXt pattern) and ShuffleNet's channel shuffles keep no transpose kernels after the NHWC conversion,
and compute the same."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.helpers import main_ops, write_onnx


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


def _shuffle_blocks(path, split: str):
    """Two ShuffleNetV2 units, NCHW, after a stem conv: two branch convs concatenated, shuffled (Reshape to [N, 2, 16, H,
    W] -> Transpose -> Reshape back) and halved (``split``: two ``Slice`` nodes or one ``Split``); the
    second half goes through a 1x1 conv + ReLU and is concatenated with the first, shuffled again; a
    1x1 conv after."""
    rng = np.random.default_rng(0)

    def w(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    def i64(name, values):
        return numpy_helper.from_array(np.array(values, np.int64), name)

    def shuffle(x, out):
        return [
            helper.make_node("Reshape", [x, "grouped"], [f"{out}_r"]),
            helper.make_node("Transpose", [f"{out}_r"], [f"{out}_t"], perm=[0, 2, 1, 3, 4]),
            helper.make_node("Reshape", [f"{out}_t", "merged"], [out]),
        ]

    if split == "slice":
        halve = [
            helper.make_node("Slice", ["s0", "zero", "half", "one"], ["h1"]),
            helper.make_node("Slice", ["s0", "half", "full", "one"], ["h2"]),
        ]
    else:
        halve = [helper.make_node("Split", ["s0", "halves"], ["h1", "h2"], axis=1)]
    nodes = [
        helper.make_node("Conv", ["x", "ws"], ["x0"], kernel_shape=[1, 1]),
        helper.make_node("Conv", ["x0", "wa"], ["a"], kernel_shape=[1, 1]),
        helper.make_node("Conv", ["x0", "wb"], ["b"], kernel_shape=[3, 3], pads=[1] * 4),
        helper.make_node("Concat", ["a", "b"], ["ab"], axis=1),
        *shuffle("ab", "s0"),
        *halve,
        helper.make_node("Conv", ["h2", "wc"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["c"], ["rc"]),
        helper.make_node("Concat", ["h1", "rc"], ["hc"], axis=1),
        *shuffle("hc", "s1"),
        helper.make_node("Conv", ["s1", "wo"], ["y"], kernel_shape=[1, 1]),
    ]
    inits = [
        w("ws", 8, 8, 1, 1),
        w("wa", 16, 8, 1, 1),
        w("wb", 16, 8, 3, 3),
        w("wc", 16, 16, 1, 1),
        w("wo", 8, 32, 1, 1),
    ]
    inits += [i64("grouped", [2, 2, 16, 8, 8]), i64("merged", [2, 32, 8, 8]), i64("halves", [16, 16])]
    inits += [i64("zero", [0]), i64("half", [16]), i64("full", [32]), i64("one", [1])]
    return write_onnx(path, nodes, {"x": [2, 8, 8, 8]}, {"y": [2, 8, 8, 8]}, inits, "shuffle")


@pytest.mark.parametrize("target,precision", [("h200", "fp16"), ("x86-cpu", "fp32")])
@pytest.mark.parametrize("split", ["slice", "split"])
def test_channel_shuffles_run_channels_last(tmp_path, target, precision, split):
    """Without the rules for slices, splits, concats and channel-only reshapes the shuffles ran on an
    NCHW copy: five more transposes (each concat's output to NCHW, each second half back to NHWC)."""
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target

    path = _shuffle_blocks(tmp_path / "s.onnx", split)
    mod = prepare_variant(import_model(path, {}), variant_layout(get_target(target), precision), bake=True).mod
    ops = main_ops(mod)
    # the input's conversion to NHWC, the output's back and one [0, 1, 2, 4, 3] regroup per shuffle
    assert ops.count("relax.permute_dims") == 4
    assert ops.count("relax.concat") == 2


@pytest.mark.parametrize("split", ["slice", "split"])
def test_channels_last_shuffles_compute_the_same_as_onnxruntime(tmp_path, split):
    _compare_with_onnxruntime(_shuffle_blocks(tmp_path / "s.onnx", split), (2, 8, 8, 8))


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
    _compare_with_onnxruntime(_convnext_blocks(tmp_path / "c.onnx"), (2, 3, 16, 16))


def _compare_with_onnxruntime(path, shape):
    """The x86 fp32 build of the ONNX model at ``path`` (input ``x`` of ``shape``) against onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import relax_pipeline, resolve_tvm_target
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target

    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
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


def test_a_reshape_that_touches_spatial_axes_keeps_its_transpose():
    """[N, C, H, W] -> [N, C, H * W] (a patch embedding's flatten) is not a channel regroup: unchanged."""
    import tvm
    from tvm import relax
    from tvm.script import relax as R

    from inferx_edge.compiler.passes import sink_permutes

    @tvm.script.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((2, 4, 6, 8), "float32")):
            with R.dataflow():
                t = R.permute_dims(x, axes=[0, 3, 1, 2])
                r = R.reshape(t, R.shape([2, 8, 24]))
                R.output(r)
            return r

    out = relax.transform.DeadCodeElimination()(sink_permutes(Mod))
    assert out["main"].script() == Mod["main"].script()
