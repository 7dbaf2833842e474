"""Slice assignments exported as ScatterND over a broadcast index grid (frontend/onnx_scatter.py):
rewritten as slices and concatenations at import, the grid never materialized; each model compared
with onnxruntime. Scatters that are not into a box are left to the frontend and still match."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

ort = pytest.importorskip("onnxruntime")

SHAPE = (2, 6, 8)


def _const(name, value, dtype=np.int64):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype), name))


def _grid(ranges):
    """Nodes building the index grid of ``x[r0, r1, r2]`` (each ``r`` a ``(start, limit, step)`` of
    constants, or ``"n"``: the whole batch axis, from the input's shape) as a torch export writes it:
    ``Range -> Reshape -> Expand -> Unsqueeze``, concatenated along the last axis; the grid's name."""
    k = len(ranges)
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        _const("zero", 0),
        _const("one", 1),
        helper.make_node("Gather", ["shp", "zero"], ["n"]),
    ]
    extents = []
    for j, r in enumerate(ranges):
        if r == "n":
            nodes.append(helper.make_node("Range", ["zero", "n", "one"], [f"r{j}"]))
            extents.append("n1")
        else:
            nodes += [_const(f"a{j}", r[0]), _const(f"b{j}", r[1]), _const(f"c{j}", r[2])]
            nodes.append(helper.make_node("Range", [f"a{j}", f"b{j}", f"c{j}"], [f"r{j}"]))
            extents.append(f"len{j}")
            nodes += [helper.make_node("Shape", [f"r{j}"], [f"len{j}"])]
    nodes.append(helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]))
    nodes.append(helper.make_node("Concat", extents, ["gshape"], axis=0))
    pieces = []
    for j in range(k):
        nodes.append(_const(f"rs{j}", [-1] + [1] * (k - 1 - j)))
        nodes.append(helper.make_node("Reshape", [f"r{j}", f"rs{j}"], [f"rr{j}"]))
        nodes.append(helper.make_node("Expand", [f"rr{j}", "gshape"], [f"e{j}"]))
        nodes.append(_const(f"last{j}", [-1]))
        nodes.append(helper.make_node("Unsqueeze", [f"e{j}", f"last{j}"], [f"u{j}"]))
        pieces.append(f"u{j}")
    nodes.append(helper.make_node("Concat", pieces, ["idx"], axis=-1))
    return nodes


def _model(tmp_path, ranges, reduction="none", opset=18):
    """``y = x`` with ``y[box] (op)= 3 * x[box]`` through a ScatterND (``ranges`` as :func:`_grid`;
    the updates sliced from ``x``: only the scatter reads the grid)."""
    import onnx

    nodes = _grid(ranges)
    starts = [0 if r == "n" else r[0] for r in ranges]
    ends = [2**62 if r == "n" else r[1] for r in ranges]
    steps = [1 if r == "n" else r[2] for r in ranges]
    nodes += [_const("ss", starts), _const("se", ends), _const("sa", list(range(len(ranges)))), _const("st", steps)]
    nodes.append(helper.make_node("Slice", ["x", "ss", "se", "sa", "st"], ["xs"]))
    nodes.append(_const("three", 3.0, np.float32))
    nodes.append(helper.make_node("Mul", ["xs", "three"], ["upd"]))
    attrs = {} if reduction == "none" else {"reduction": reduction}
    nodes.append(helper.make_node("ScatterND", ["x", "idx", "upd"], ["y"], **attrs))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", *SHAPE[1:]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", *SHAPE[1:]])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def _rewritten(path):
    """(the model as the import folds and rewrites it, scatters rewritten)."""
    import onnx

    from inferx_edge.frontend.onnx_fold import fold_shape_subgraphs
    from inferx_edge.frontend.onnx_scatter import box_scatters

    folded, _ = fold_shape_subgraphs(onnx.load(str(path)), {"x": SHAPE})
    return box_scatters(folded, {"x": SHAPE})


def _matches(path):
    import tvm
    from tvm import relax

    from inferx_edge.frontend import import_model

    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    imported = import_model(path, {"x": SHAPE})
    vm = relax.VirtualMachine(relax.build(imported.mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in imported.params]).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not np.array_equal(want, x)  # the scatter wrote something


@pytest.mark.parametrize(
    "ranges, reduction",
    [
        (("n", (1, 4, 1), (2, 7, 1)), "none"),  # x[:, 1:4, 2:7] = ...
        (("n", (1, 4, 1), (2, 7, 1)), "add"),  # x[:, 1:4, 2:7] += ...
        (("n", (0, 6, 1), (-6, -1, 1)), "mul"),  # negative indices, a whole middle axis
        (((1, 2, 1), (3, 6, 1)), "none"),  # two indexed axes of three, batch row 1 only
        (("n", (0, 6, 1), (0, 8, 1)), "max"),  # the whole tensor
    ],
)
@pytest.mark.parametrize("fold_limit", [None, 16], ids=["grid-folded", "grid-lazy"])
def test_box_scatter_becomes_slices(tmp_path, monkeypatch, ranges, reduction, fold_limit):
    """Small grids fold to a constant; large ones (a fold limit below the grid's size here) stay a
    broadcast subgraph, evaluated lazily."""
    if fold_limit:
        monkeypatch.setattr("inferx_edge.frontend.onnx_fold.FOLD_LIMIT", fold_limit)
    path = _model(tmp_path, ranges, reduction)
    model, count = _rewritten(path)
    ops = [n.op_type for n in model.graph.node]
    assert count == 1
    assert "ScatterND" not in ops and "Expand" not in ops  # the grid is gone, not just unused
    _matches(path)


@pytest.mark.parametrize("ranges", [("n", (1, 4, 1), (6, 1, -1)), ("n", (0, 6, 2), (2, 7, 1))])
@pytest.mark.parametrize("fold_limit", [None, 16], ids=["grid-folded", "grid-lazy"])
def test_scatter_off_a_box_is_left_alone(tmp_path, monkeypatch, ranges, fold_limit):
    if fold_limit:
        monkeypatch.setattr("inferx_edge.frontend.onnx_fold.FOLD_LIMIT", fold_limit)
    path = _model(tmp_path, ranges)
    model, count = _rewritten(path)
    assert count == 0 and "ScatterND" in [n.op_type for n in model.graph.node]
    _matches(path)


def test_constant_indices_into_leading_rows(tmp_path):
    """Indices given as a constant (rows 1..3 of axis 0, k = 1 < rank) are a box too."""
    from inferx_edge.frontend.onnx_scatter import box_scatters

    nodes = [
        _const("idx", [[1], [2], [3]]),
        _const("upd", np.arange(3 * 6 * 8).reshape(3, 6, 8), np.float32),
        helper.make_node("ScatterND", ["x", "idx", "upd"], ["y"]),
    ]
    shape = (5, 6, 8)
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewritten, count = box_scatters(model, {"x": shape})
    assert count == 1
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)

    def run(m):
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]

    np.testing.assert_array_equal(run(rewritten), run(model))


def test_indices_behind_a_long_chain_are_left_alone():
    """Indices computed at run time through thousands of adds (a residual stream's depth): the lazy
    walk stops after a few producers instead of recursing through them all."""
    from inferx_edge.frontend.onnx_scatter import box_scatters

    nodes = [_const("zero", 0), _const("upd", np.ones(3, np.float32), np.float32)]
    prev = "idx"
    for i in range(3000):
        nodes.append(helper.make_node("Add", [prev, "zero"], [f"a{i}"]))
        prev = f"a{i}"
    nodes.append(helper.make_node("ScatterND", ["x", prev, "upd"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, (5,)),
            helper.make_tensor_value_info("idx", TensorProto.INT64, (3, 1)),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (5,))],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewritten, count = box_scatters(model, {"x": (5,), "idx": (3, 1)})
    assert count == 0 and rewritten is model
