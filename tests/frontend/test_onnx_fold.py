"""Shape subgraphs of dynamic-batch exports (channel shuffles, computed Expand targets) fold to
constants once the input shapes are pinned, so TVM's ONNX frontend imports them; the result matches
onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.frontend import import_model
from inferx_edge.frontend.onnx_fold import fold_shape_subgraphs
from inferx_edge.runtime import Engine


def _const(name, values):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, np.int64), name))


def _shuffle(src: str, tag: str) -> list:
    """A channel shuffle (groups 2) as torch exports ``x.view(n, 2, c // 2, h, w).transpose(1, 2)
    .reshape(n, c, h, w)`` with a dynamic batch: every dim read by Shape -> Gather, the channel count
    divided at run time."""
    t = lambda s: f"{tag}_{s}"  # noqa: E731
    nodes = [_const(t("two"), 2), _const(t("ax"), [0])]
    dims = []
    for i in range(4):
        nodes += [
            helper.make_node("Shape", [src], [t(f"s{i}")]),
            _const(t(f"i{i}"), i),
            helper.make_node("Gather", [t(f"s{i}"), t(f"i{i}")], [t(f"d{i}")], axis=0),
        ]
        dims.append(t(f"d{i}"))
    nodes += [
        helper.make_node("Div", [dims[1], t("two")], [t("half")]),
        helper.make_node("Cast", [t("half")], [t("half_i")], to=TensorProto.INT64),
    ]
    parts = []
    for name in (dims[0], t("two"), t("half_i"), dims[2], dims[3], dims[1]):
        nodes.append(helper.make_node("Unsqueeze", [name, t("ax")], [name + "_u"]))
        parts.append(name + "_u")
    nodes += [
        helper.make_node("Concat", parts[:5], [t("shape5")], axis=0),
        helper.make_node("Reshape", [src, t("shape5")], [t("r")]),
        helper.make_node("Transpose", [t("r")], [t("t")], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Concat", [parts[0], parts[5], parts[3], parts[4]], [t("shape4")], axis=0),
        helper.make_node("Reshape", [t("t"), t("shape4")], [t("out")]),
    ]
    return nodes


def shuffle_model(path):
    """Conv, then two channel shuffles in a row (ShuffleNet's stages; the second reads the shape of the
    first's result), then an Expand whose target is computed from the input's shape, then a multiply."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])]
    nodes += _shuffle("c", "a") + _shuffle("a_out", "b")
    nodes += [
        _const("st", [0]),
        _const("en", [1]),
        _const("flat", [8, 6, 6]),
        helper.make_node("Shape", ["x"], ["xs"]),
        helper.make_node("Slice", ["xs", "st", "en"], ["nb"]),
        helper.make_node("Concat", ["nb", "flat"], ["target"], axis=0),
        helper.make_node("Expand", ["g", "target"], ["gate"]),
        helper.make_node("Mul", ["b_out", "gate"], ["y"]),
    ]
    g = numpy_helper.from_array(rng.standard_normal((8, 1, 1)).astype(np.float32), "g")
    graph = helper.make_graph(
        nodes,
        "shuffle",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 8, 6, 6])],
        [w, g],
    )
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    return path


def test_shape_subgraphs_fold_and_the_build_matches_onnxruntime(tmp_path):
    path = shuffle_model(tmp_path / "shuffle.onnx")
    art = build_artifact(
        BuildOptions(
            model=path, target="x86-cpu", output=tmp_path / "s.ixa", input_shapes={"x": (3, 3, 6, 6)}, tuning=False
        ),
        log=lambda *a: None,
    )
    assert art.variants[0].batch == 3
    x = np.random.default_rng(1).standard_normal((3, 3, 6, 6)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with Engine(tmp_path / "s.ixa", trust=False) as engine:
        got = engine.run(x)["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_folding_leaves_no_shape_ops_and_keeps_the_original(tmp_path):
    import onnx

    model = onnx.load(str(shuffle_model(tmp_path / "shuffle.onnx")))
    before = [n.op_type for n in model.graph.node]
    folded, n = fold_shape_subgraphs(model, {"x": (2, 3, 6, 6)})
    ops = [nd.op_type for nd in folded.graph.node]
    assert n > 0 and "Shape" not in ops and "Gather" not in ops and "Concat" not in ops
    assert [nd.op_type for nd in model.graph.node] == before  # the caller's model is untouched
    assert folded.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2
    import_model(tmp_path / "shuffle.onnx", {"x": (2, 3, 6, 6)})  # imports without error
