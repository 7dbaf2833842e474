"""ONNX control flow made static at import (frontend/onnx_loops.py): Loops with a constant trip count
unrolled, the sequences they build resolved, Ifs with a constant condition inlined; each model compared
with onnxruntime. What cannot be made static is still refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from inferx_edge.errors import ModelError

ort = pytest.importorskip("onnxruntime")

SHAPE = (2, 6, 8)


def _const(name, value, dtype=np.int64):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype), name))


def _save(tmp_path, nodes, outputs=(("y", ["n", *SHAPE[1:]]),), opset=17):
    import onnx

    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", *SHAPE[1:]])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape) for o, shape in outputs],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), str(path))
    return path


def _matches(path, outputs=("y",), reference=None):
    """The import's outputs equal onnxruntime's (or ``reference(x)``'s, for models onnxruntime refuses)."""
    import tvm
    from tvm import relax

    from inferx_edge.frontend import import_model

    x = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)
    if reference is None:
        want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(list(outputs), {"x": x})
    else:
        want = reference(x)
    imported = import_model(path, {"x": SHAPE})
    vm = relax.VirtualMachine(relax.build(imported.mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in imported.params])
    got = [got] if len(outputs) == 1 else list(got)
    for g, w in zip(got, want, strict=True):
        assert g.numpy().shape == w.shape
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)


def _body(shapes_from_input: bool):
    """Loop body: acc += x[:, i:i+1, :] * (i + 1); scan output: the slice; its bounds gathered by the
    iteration number (0-d, as exporters write them) when ``shapes_from_input``."""
    nodes = [
        helper.make_node("Unsqueeze", ["i", "zero_axis"], ["i1"]),
        helper.make_node("Add", ["i1", "one"], ["i2"]),
        helper.make_node("Slice", ["x", "i1", "i2", "one"], ["part"]),
        helper.make_node("Cast", ["i2"], ["scale"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["part", "scale"], ["scaled"]),
        helper.make_node("Add", ["acc_in", "scaled"], ["acc_out"]),
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
    ]
    if shapes_from_input:  # i1 / i2 as 0-d gathers of a table, like the TorchScript exporter writes
        nodes[:3] = [
            helper.make_node("Gather", ["starts", "i"], ["i1"]),
            helper.make_node("Gather", ["ends", "i"], ["i2"]),
            helper.make_node("Slice", ["x", "i1", "i2", "one"], ["part"]),
        ]
    return helper.make_graph(
        nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, ["n", 1, SHAPE[2]]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, ["n", 1, SHAPE[2]]),
            helper.make_tensor_value_info("part", TensorProto.FLOAT, ["n", 1, SHAPE[2]]),
        ],
    )


def _loop_model(tmp_path, trips_from_shape: bool, gathered_bounds: bool):
    nodes = [
        _const("zero_axis", [0]),
        _const("one", [1]),
        _const("starts", list(range(SHAPE[1]))),
        _const("ends", list(range(1, SHAPE[1] + 1))),
        _const("cond", True, np.bool_),
        helper.make_node("Slice", ["x", "zero_axis", "one", "one"], ["first"]),
        helper.make_node("Mul", ["first", "zero_f"], ["acc0"]),
        _const("zero_f", 0.0, np.float32),
    ]
    nodes.insert(6, nodes.pop())  # zero_f before its use
    if trips_from_shape:  # the trip count is the channel count, known once the input is pinned
        nodes += [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["trips"])]
    else:
        nodes.append(_const("trips", SHAPE[1]))
    loop = helper.make_node("Loop", ["trips", "cond", "acc0"], ["acc", "parts"], body=_body(gathered_bounds))
    nodes += [
        _const("two", [2]),
        loop,
        helper.make_node("Squeeze", ["parts", "two"], ["scan"]),  # [channels, n, 1, 8] -> [channels, n, 8]
        helper.make_node("Add", ["acc", "acc"], ["y"]),
    ]
    return _save(tmp_path, nodes, outputs=(("y", ["n", 1, SHAPE[2]]), ("scan", [SHAPE[1], "n", SHAPE[2]])))


def _loop_reference(x):
    acc = sum(x[:, i : i + 1, :] * (i + 1) for i in range(x.shape[1]))
    return [2 * acc, x.transpose(1, 0, 2)]


@pytest.mark.parametrize("trips_from_shape, gathered_bounds", [(False, False), (True, False), (True, True)])
def test_a_loop_with_a_static_trip_count_is_unrolled(tmp_path, trips_from_shape, gathered_bounds):
    """Compared with onnxruntime, or with numpy where the bounds are 0-d (onnxruntime refuses those; the
    TorchScript exporter writes them)."""
    path = _loop_model(tmp_path, trips_from_shape, gathered_bounds)
    _matches(path, outputs=("y", "scan"), reference=_loop_reference if gathered_bounds else None)


def test_sequences_a_loop_builds_are_resolved(tmp_path):
    """A loop inserting one slice per iteration into a sequence, read back with SequenceAt and
    ConcatFromSequence (MViTv2's pooling attention, as the TorchScript exporter writes it)."""
    body = helper.make_graph(
        [
            helper.make_node("Unsqueeze", ["i", "zero_axis"], ["i1"]),
            helper.make_node("Add", ["i1", "one"], ["i2"]),
            helper.make_node("Slice", ["x", "i1", "i2", "one"], ["part"]),
            helper.make_node("SequenceInsert", ["seq_in", "part"], ["seq_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_value_info("seq_in", _sequence_type()),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_value_info("seq_out", _sequence_type()),
        ],
    )
    nodes = [
        _const("zero_axis", [0]),
        _const("one", [1]),
        _const("trips", 3),
        _const("cond", True, np.bool_),
        _const("last", -1),
        helper.make_node("SequenceEmpty", [], ["empty"], dtype=TensorProto.FLOAT),
        helper.make_node("Loop", ["trips", "cond", "empty"], ["seq"], body=body),
        helper.make_node("SequenceAt", ["seq", "last"], ["tail"]),
        helper.make_node("ConcatFromSequence", ["seq"], ["cat"], axis=1),
        helper.make_node("Mul", ["cat", "tail"], ["y"]),
    ]
    _matches(_save(tmp_path, nodes, outputs=(("y", ["n", 3, SHAPE[2]]),)))


def _sequence_type():
    return helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, ["n", 1, SHAPE[2]]))


@pytest.mark.parametrize("squeeze", [True, False])
def test_an_if_on_a_shape_is_its_branch(tmp_path, squeeze):
    """``if x.shape[0] == 2: squeeze else identity``-style branches on pinned shapes."""
    then_branch = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n", *SHAPE[1:]])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["n", *SHAPE[1:]])],
    )
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        _const("zero", 0),
        helper.make_node("Gather", ["shape", "zero"], ["batch"]),
        _const("want", SHAPE[0] if squeeze else SHAPE[0] + 1),
        helper.make_node("Equal", ["batch", "want"], ["cond"]),
        helper.make_node("If", ["cond"], ["picked"], then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Add", ["picked", "x"], ["y"]),
    ]
    _matches(_save(tmp_path, nodes))


def test_a_loop_whose_condition_is_computed_is_still_refused_by_name(tmp_path):
    body = _body(False)
    body.node[-1].CopyFrom(helper.make_node("Greater", ["i", "zero_i"], ["cond_out"]))
    body.node.insert(0, _const("zero_i", 2))
    nodes = [
        _const("zero_axis", [0]),
        _const("one", [1]),
        _const("zero_f", 0.0, np.float32),
        _const("trips", 4),
        _const("cond", True, np.bool_),
        helper.make_node("Slice", ["x", "zero_axis", "one", "one"], ["first"]),
        helper.make_node("Mul", ["first", "zero_f"], ["acc0"]),
        helper.make_node("Loop", ["trips", "cond", "acc0"], ["y", "parts"], body=body, name="the_loop"),
    ]
    from inferx_edge.frontend import import_model

    with pytest.raises(ModelError, match="Loop.*the_loop"):
        import_model(_save(tmp_path, nodes, outputs=(("y", ["n", 1, SHAPE[2]]),)), {"x": SHAPE})
