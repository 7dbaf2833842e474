"""ONNX import + AOT build on this CPU, compared against onnxruntime; malformed and unsupported models."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.errors import ModelError, UsageError
from inferx_edge.frontend import import_model, parse_input_shapes
from inferx_edge.runtime import Engine
from inferx_edge.targets import host_target_name
from tests.helpers import cli, make_convnet, make_two_io

QUIET = {"log": lambda *a: None}


def _ort(path, feeds):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@pytest.fixture(scope="module")
def convnet(tmp_path_factory):
    return make_convnet(tmp_path_factory.mktemp("onnx") / "convnet.onnx")


def test_convnet_matches_onnxruntime(convnet, tmp_path):
    out = tmp_path / "convnet.ixa"
    build_artifact(
        BuildOptions(model=convnet, target=host_target_name(), output=out, input_shapes={"x": (4, 3, 16, 16)}), **QUIET
    )
    rng = np.random.default_rng(123)
    with Engine(out) as engine:
        assert engine.variant.batch == 4
        for _ in range(3):  # fresh random inputs each time
            x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32) * 2
            got = engine.run({"x": x})["prob"]
            (want,) = _ort(convnet, {"x": x})
            assert got.shape == (4, 5)
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_multi_input_multi_output_and_shared_dynamic_dim(tmp_path):
    model = make_two_io(tmp_path / "two.onnx")
    out = tmp_path / "two.ixa"
    # pinning 'a' pins the shared dim 'B' of 'b' too
    build_artifact(
        BuildOptions(model=model, target=host_target_name(), output=out, input_shapes={"a": (3, 6)}), **QUIET
    )
    rng = np.random.default_rng(7)
    feeds = {"a": rng.standard_normal((3, 6)).astype(np.float32), "b": rng.standard_normal((3, 4)).astype(np.float32)}
    with Engine(out) as engine:
        assert [s.name for s in engine.variant.outputs] == ["out_t", "out_sq"]
        assert engine.variant.inputs[1].shape == (3, 4)
        got = engine.run(feeds)
    want = _ort(model, feeds)
    for g, w in zip(got.values(), want):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)


def test_unpinned_dynamic_batch_defaults_to_one(convnet, capsys):
    imported = import_model(convnet)
    assert imported.inputs[0].shape == (1, 3, 16, 16)
    assert "building batch 1" in capsys.readouterr().err


def test_non_batch_dynamic_dim_must_be_pinned(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "T"])],
    )
    path = tmp_path / "seq.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    with pytest.raises(ModelError, match=r"dynamic dimensions 1xT; pin them with --input-shape x:1xN"):
        import_model(path)
    assert import_model(path, {"x": (1, 7)}).outputs[0].shape == (1, 7)


@pytest.mark.parametrize(
    "spec,msg",
    [
        (["x"], "malformed --input-shape 'x'"),
        (["x:1x0x3"], "malformed"),
        (["x:ax3"], "malformed"),
    ],
)
def test_malformed_input_shape_flag(spec, msg):
    with pytest.raises(UsageError, match=msg):
        parse_input_shapes(spec)


def test_input_shape_must_agree_with_model(convnet):
    with pytest.raises(UsageError, match="unknown input"):
        import_model(convnet, {"image": (1, 3, 16, 16)})
    with pytest.raises(UsageError, match="rank 4"):
        import_model(convnet, {"x": (1, 3, 16)})
    with pytest.raises(UsageError, match="dimension 1 is fixed to 3"):
        import_model(convnet, {"x": (1, 4, 16, 16)})


def test_unsupported_op_is_named(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Det", ["x"], ["d"], name="det_0"), helper.make_node("Relu", ["d"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "det.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    with pytest.raises(ModelError, match=r"operators TVM cannot import: Det \(nodes: det_0\)"):
        import_model(path)
    out = tmp_path / "det.ixa"
    r = cli("build", "--model", path, "--output", out)
    assert r.returncode == 3 and "Det" in r.stderr
    assert not out.exists() and not list(tmp_path.glob(".det.ixa*"))  # nothing half-written


def test_not_onnx_and_invalid_onnx(tmp_path):
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01this is not a protobuf\xff" * 10)
    with pytest.raises(ModelError, match="not a valid ONNX model"):
        import_model(junk)
    text = tmp_path / "readme.onnx"
    text.write_text("hello")
    with pytest.raises(ModelError, match="not a valid ONNX model"):
        import_model(text)
    # well-formed protobuf, invalid graph: a node reads an input nobody produces
    graph = helper.make_graph(
        [helper.make_node("Relu", ["nowhere"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    with pytest.raises(ModelError, match="failed ONNX validation"):
        import_model(bad)
    r = cli("build", "--model", bad, "--output", tmp_path / "bad.ixa")
    assert r.returncode == 3 and "failed ONNX validation" in r.stderr


def test_missing_model_file(tmp_path):
    with pytest.raises(UsageError, match="model file not found"):
        import_model(tmp_path / "nope.onnx")
    r = cli("build", "--model", tmp_path / "nope.onnx")
    assert r.returncode == 2 and "model file not found" in r.stderr
