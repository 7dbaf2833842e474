"""ONNX LSTM / GRU / RNN nodes are unrolled at import (and Celu written with supported ops); both
compute what onnxruntime computes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.errors import ModelError
from inferx_edge.frontend import import_model
from inferx_edge.runtime import Engine
from inferx_edge.targets import host_target_name

ort = pytest.importorskip("onnxruntime")


def _built_and_run(tmp_path, path, feeds: dict) -> list[np.ndarray]:
    out = tmp_path / (path.stem + ".ixa")
    build_artifact(BuildOptions(model=path, target=host_target_name(), output=out), log=lambda *a: None)
    with Engine(out) as engine:
        return list(engine.run(feeds).values())


def _onnxruntime(path, feeds: dict) -> list[np.ndarray]:
    return ort.InferenceSession(str(path)).run(None, feeds)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["forward", "bidirectional"])
def test_torch_exported_recurrent_layers_match_onnxruntime(tmp_path, kind, bidirectional):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    rnn = getattr(torch.nn, kind)(6, 5, num_layers=2, bidirectional=bidirectional, batch_first=bidirectional)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = rnn

        def forward(self, x):
            y, *_ = self.rnn(x)
            return y

    x = torch.randn(3, 7, 6)
    path = tmp_path / f"{kind}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net().eval(), (x,), str(path), dynamo=False, input_names=["x"], output_names=["y"])
    (got,) = _built_and_run(tmp_path, path, {"x": x.numpy()})
    (want,) = _onnxruntime(path, {"x": x.numpy()})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _model(path, node, inputs: dict, outputs: dict, inits: dict, opset: int = 14):
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs.items()],
        [numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()],
    )
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString())
    return path


def _weights(rng, dirs: int, gates: int, hidden: int, features: int, peepholes: bool = False) -> dict:
    w = {
        "W": rng.standard_normal((dirs, gates * hidden, features)) * 0.5,
        "R": rng.standard_normal((dirs, gates * hidden, hidden)) * 0.5,
        "B": rng.standard_normal((dirs, 2 * gates * hidden)) * 0.5,
    }
    if peepholes:
        w["P"] = rng.standard_normal((dirs, 3 * hidden)) * 0.5
    return w


def test_lstm_with_peepholes_initial_states_and_all_outputs_reversed(tmp_path):
    rng = np.random.default_rng(0)
    s, n, f, h = 5, 2, 3, 4
    inits = _weights(rng, 1, 4, h, f, peepholes=True)
    node = helper.make_node(
        "LSTM", ["x", "W", "R", "B", "", "h0", "c0", "P"], ["y", "yh", "yc"], name="lstm", hidden_size=h,
        direction="reverse",
    )  # fmt: skip
    path = _model(
        tmp_path / "lstm.onnx", node, {"x": [s, n, f], "h0": [1, n, h], "c0": [1, n, h]},
        {"y": [s, 1, n, h], "yh": [1, n, h], "yc": [1, n, h]}, inits,
    )  # fmt: skip
    feeds = {
        k: rng.standard_normal(v).astype(np.float32)
        for k, v in (("x", (s, n, f)), ("h0", (1, n, h)), ("c0", (1, n, h)))
    }
    got, want = _built_and_run(tmp_path, path, feeds), _onnxruntime(path, feeds)
    assert len(got) == 3
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("linear_before_reset", [0, 1])
def test_bidirectional_gru_both_reset_forms(tmp_path, linear_before_reset):
    rng = np.random.default_rng(1)
    s, n, f, h = 4, 3, 5, 6
    node = helper.make_node(
        "GRU", ["x", "W", "R", "B"], ["y", "yh"], name="gru", hidden_size=h, direction="bidirectional",
        linear_before_reset=linear_before_reset,
    )  # fmt: skip
    path = _model(
        tmp_path / "gru.onnx", node, {"x": [s, n, f]}, {"y": [s, 2, n, h], "yh": [2, n, h]}, _weights(rng, 2, 3, h, f)
    )
    feeds = {"x": rng.standard_normal((s, n, f)).astype(np.float32)}
    for g, w in zip(_built_and_run(tmp_path, path, feeds), _onnxruntime(path, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_batch_major_layout_matches_the_sequence_major_model(tmp_path):
    """``layout=1`` ([batch, sequence, ...] tensors) gives the layout-0 model's outputs transposed."""
    rng = np.random.default_rng(2)
    s, n, f, h = 6, 2, 3, 4
    inits = _weights(rng, 2, 4, h, f)
    attrs = {"hidden_size": h, "direction": "bidirectional"}
    seq = _model(
        tmp_path / "seq.onnx", helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh"], **attrs),
        {"x": [s, n, f]}, {"y": [s, 2, n, h], "yh": [2, n, h]}, inits,
    )  # fmt: skip
    bat = _model(
        tmp_path / "bat.onnx", helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh"], layout=1, **attrs),
        {"x": [n, s, f]}, {"y": [n, s, 2, h], "yh": [n, 2, h]}, inits,
    )  # fmt: skip
    x = rng.standard_normal((s, n, f)).astype(np.float32)
    y, yh = _onnxruntime(seq, {"x": x})
    got_y, got_yh = _built_and_run(tmp_path, bat, {"x": x.transpose(1, 0, 2).copy()})
    np.testing.assert_allclose(got_y, y.transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_yh, yh.transpose(1, 0, 2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("extra_inputs", "attrs", "match"),
    [
        ({}, {"activations": ["Relu", "Tanh", "Tanh"]}, r"LSTM node 'rnn': activations \['Relu', 'Tanh', 'Tanh'\]"),
        ({}, {"clip": 3.0}, r"LSTM node 'rnn': attribute 'clip' is not supported"),
        ({"lens": [2]}, {}, r"LSTM node 'rnn': per-batch sequence_lens given at run time"),
        ({"fp16": True}, {}, r"LSTM node 'rnn': its weights are float16; float32 recurrent layers"),
    ],
)
def test_what_cannot_be_unrolled_is_a_model_error_naming_the_node(tmp_path, extra_inputs, attrs, match):
    rng = np.random.default_rng(3)
    inputs = ["x", "W", "R", "B", "lens" if "lens" in extra_inputs else ""]
    node = helper.make_node("LSTM", inputs, ["y"], name="rnn", hidden_size=4, **attrs)
    graph_inputs = {"x": [5, 2, 3]}
    path = _model(tmp_path / "bad.onnx", node, graph_inputs, {"y": [5, 1, 2, 4]}, _weights(rng, 1, 4, 4, 3))
    import onnx

    m = onnx.load(str(path))
    if "lens" in extra_inputs:  # an int32 input, as the spec types sequence_lens
        m.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [2]))
    if "fp16" in extra_inputs:  # the weights stored as float16
        for t in m.graph.initializer:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    onnx.save(m, str(path))
    with pytest.raises(ModelError, match=match):
        import_model(path, {})


def test_celu_is_written_with_supported_ops(tmp_path):
    """ONNX Celu had no converter in TVM; it imports as its definition and matches onnxruntime."""
    node = helper.make_node("Celu", ["x"], ["y"], alpha=0.7)
    path = _model(tmp_path / "celu.onnx", node, {"x": [3, 8]}, {"y": [3, 8]}, {}, opset=13)
    feeds = {"x": (np.random.default_rng(4).standard_normal((3, 8)) * 3).astype(np.float32)}
    (got,) = _built_and_run(tmp_path, path, feeds)
    (want,) = _onnxruntime(path, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
