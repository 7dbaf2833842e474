"""fp16 builds of models whose frontend lowered ops straight to TE (``call_tir``): ONNX Pad with a
value, reflect Pad, Tile. ToMixedPrecision rejected them; they now stay float32 with casts around."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper


@pytest.fixture(scope="module")
def pad_tile_model(tmp_path_factory):
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Pad", ["c", "pads", "value"], ["p"], mode="constant"),  # not a conv's zero pad
        helper.make_node("Relu", ["p"], ["r"]),
        helper.make_node("Pad", ["r", "pads"], ["q"], mode="reflect"),
        helper.make_node("Conv", ["q", "w2"], ["y"]),
        helper.make_node("Tile", ["y", "reps"], ["t"]),
    ]
    graph = helper.make_graph(
        nodes,
        "pad_tile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 8, 24, 12])],
        [
            numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype(np.float32), "w2"),
            numpy_helper.from_array(np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64), "pads"),
            numpy_helper.from_array(np.array(0.5, np.float32), "value"),
            numpy_helper.from_array(np.array([1, 1, 2, 1], np.int64), "reps"),
        ],
    )
    path = tmp_path_factory.mktemp("padtile") / "pad_tile.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def test_hidden_tir_calls_come_back_unchanged(pad_tile_model):
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import hide_tir_calls
    from inferx_edge.frontend import import_model

    mod = import_model(pad_tile_model, {}).mod
    hidden, restore = hide_tir_calls(mod)
    call_tir = tvm.ir.Op.get("relax.call_tir")

    def count(m):
        n = []
        relax.analysis.post_order_visit(m["main"], lambda e: n.append(getattr(e, "op", None) == call_tir))
        return sum(n)

    assert count(mod) == 3 and count(hidden) == 0
    tvm.ir.assert_structural_equal(restore(hidden), mod)


def test_fp16_build_with_pads_and_tile_matches_onnxruntime(pad_tile_model, tmp_path):
    import onnxruntime as ort

    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.runtime import Engine

    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(str(pad_tile_model)).run(None, {"x": x})[0]
    out = tmp_path / "fp16.ixa"
    build_artifact(
        BuildOptions(model=pad_tile_model, target="x86-cpu", output=out, precisions=("fp16",)), log=lambda *a: None
    )
    with Engine(out) as engine:
        got = engine.run({"x": x})["t"]
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()
