"""QDQ ONNX models: the model's own int8 weights and activation scales become int8 x int8 -> int32 ops
(TVM alone would dequantize and compute in float32)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from inferx_edge.frontend import import_model
from inferx_edge.quantize.driver import QuantPlan, apply_plan, make_plan
from tests.helpers import write_onnx


def _qdq_conv_model(path, rng, zero_point=0, act_type=TensorProto.INT8):
    """x -> Quantize/Dequantize -> Conv(Dequantize(int8 W, per-channel scales)) + bias -> y."""
    wq = rng.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)
    w_scale = rng.uniform(0.001, 0.01, 8).astype(np.float32)
    bias = rng.standard_normal(8).astype(np.float32)
    np_act = np.int8 if act_type == TensorProto.INT8 else np.uint8
    inits = [
        numpy_helper.from_array(wq, "w_q"),
        numpy_helper.from_array(w_scale, "w_scale"),
        numpy_helper.from_array(np.zeros(8, np.int8), "w_zp"),
        numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
        numpy_helper.from_array(np.array(zero_point, np_act), "x_zp"),
        numpy_helper.from_array(bias, "b"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["x_q"]),
        helper.make_node("DequantizeLinear", ["x_q", "x_scale", "x_zp"], ["x_dq"]),
        helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["w_dq"], axis=0),
        helper.make_node("Conv", ["x_dq", "w_dq", "b"], ["y"], pads=[1, 1, 1, 1]),
    ]
    return write_onnx(path, nodes, {"x": [2, 4, 10, 10]}, {"y": [2, 8, 10, 10]}, inits, "qdq")


def _run(mod, params, x):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in params]).numpy()


def test_qdq_conv_computes_in_int8_with_the_models_scales_and_matches_onnxruntime(tmp_path):
    import onnxruntime as ort
    import tvm
    from tvm import relax

    rng = np.random.default_rng(0)
    path = _qdq_conv_model(tmp_path / "qdq.onnx", rng)
    im = import_model(path)
    assert im.qdq is not None and im.qdq.activations == {"w_dq": pytest.approx(127 * 0.02)}
    plan = make_plan(path, {}, im, "int8", log=lambda *a: None)
    assert plan.calibration == "qdq" and plan.amax == {"w_dq": pytest.approx(2.54)}
    q, report = apply_plan(im, plan, "int8")
    assert report["int8_mac_share"] == 1.0
    # the weights stay the model's own int8 values
    assert any(p.dtype == np.int8 and np.array_equal(p, numpy_helper.to_array(_init(path, "w_q"))) for p in q.params)
    # the compiled conv reads int8 and accumulates in int32
    lowered = relax.get_pipeline("zero")(q.mod)
    convs = [f.script() for gv, f in lowered.functions_items() if "conv2d" in gv.name_hint]
    assert convs and all('"int8")' in s and '"int32"' in s for s in convs)
    assert isinstance(lowered["main"], relax.Function) and any(
        isinstance(f, tvm.tirx.PrimFunc) for _, f in lowered.functions_items()
    )

    x = rng.uniform(-2.5, 2.5, (2, 4, 10, 10)).astype(np.float32)  # within the int8 range (-128 vs -127 clip)
    got = _run(q.mod, q.params, x)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def _init(path, name):
    import onnx

    return next(t for t in onnx.load(str(path)).graph.initializer if t.name == name)


def test_asymmetric_activation_is_reexpressed_symmetric_with_a_note(tmp_path):
    rng = np.random.default_rng(1)
    path = _qdq_conv_model(tmp_path / "u8.onnx", rng, zero_point=128, act_type=TensorProto.UINT8)
    im = import_model(path)
    assert im.qdq.activations["w_dq"] == pytest.approx(128 * 0.02)
    assert any("symmetric int8" in n for n in im.qdq.notes)


def test_onnxruntime_quantize_static_model_builds_int8_without_calibration(tmp_path):
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from inferx_edge.models import DEFAULT_DATA, DEFAULT_MODEL

    with np.load(DEFAULT_DATA) as d:
        calib = (d["calib_images"][:32, None] / 255).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"image": calib[i : i + 1]} for i in range(len(calib)))

        def get_next(self):
            return next(self.it, None)

    out = tmp_path / "fmnist_qdq.onnx"
    quantize_static(
        str(DEFAULT_MODEL), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, extra_options={"ActivationSymmetric": True},
    )  # fmt: skip
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load(str(out)).graph.node)
    im = import_model(out)
    plan = make_plan(out, {}, im, "int8", log=lambda *a: None)
    assert plan.calibration == "qdq" and len(plan.amax) == 4
    roundtrip = QuantPlan.load_text(plan.to_json(), im.sha256)
    q, report = apply_plan(im, roundtrip, "int8")
    assert report["int8_mac_share"] == 1.0 and [r["precision"] for r in report["layers"]] == ["int8"] * 4
    assert sum(p.dtype == np.int8 for p in q.params) == 4
