"""Mixed precision under an accuracy budget: per-layer sensitivity, greedy fp32 fallback checked on real
int8 kernels, quantization plans, and the budget's failure modes.

The model is a tiny MLP whose first layer is made sensitive on purpose: its calibration data holds one
outlier sample, so min-max calibration gives that layer's input a scale that rounds ordinary inputs to 0.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import cli


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlp")
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((32, 16)).astype(np.float32)
    w1[:, 0] = 0  # the outlier input channel does not reach the next layer's calibration
    w2 = rng.standard_normal((10, 32)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1"], ["h"], transB=1),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Gemm", ["r", "w2"], ["y"], transB=1),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = d / "mlp.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    calib = rng.standard_normal((64, 16)).astype(np.float32)
    calib[0, 0] = 2000.0  # the outlier
    np.save(d / "calib.npy", calib)
    x = rng.standard_normal((300, 16)).astype(np.float32)
    labels = (np.maximum(x @ w1.T, 0) @ w2.T).argmax(axis=1)  # fp32 is 100 % right by construction
    np.savez(d / "eval.npz", x=x, labels=labels)
    return d


def _quantize(mlp, out, *extra):
    return cli(
        "quantize", "-m", mlp / "mlp.onnx", "--calib", mlp / "calib.npy", "--calib-method", "minmax",
        "--eval-data", mlp / "eval.npz", "-o", out, *extra,
    )  # fmt: skip


def test_sensitive_layer_goes_back_to_fp32_and_build_applies_the_plan(mlp, tmp_path):
    plan_path = tmp_path / "plan.json"
    r = _quantize(mlp, plan_path, "--max-accuracy-drop", "1", "--min-int8-share", "0.3")
    assert r.returncode == 0, r.stderr
    plan = json.loads(plan_path.read_text())
    rows = {row["layer"]: row for row in plan["layers"]}
    # the outlier-calibrated layer is the sensitive one and is kept in fp32; the other stays int8
    assert rows["w1"]["drop"] > 20 and rows["w1"]["rel_error"] > rows["w2"]["rel_error"]
    assert plan["float_layers"] == ["w1"] and rows["w2"]["precision"] == "int8"
    acc = plan["accuracy"]
    assert acc["fp32"] == 100.0 and acc["int8"] < 80 and acc["drop"] <= 1.0
    assert acc["int8_mac_share"] == pytest.approx(320 / (320 + 512))
    assert "w1" in r.stdout and "fp32" in r.stdout  # the table is printed

    art = tmp_path / "mixed.ixa"
    r = cli(
        "build", "-m", mlp / "mlp.onnx", "--input-shape", "x:300x16", "--precision", "fp32,mixed",
        "--quant-plan", plan_path, "--no-tuning", "-o", art,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    from inferx_edge.package import open_artifact
    from inferx_edge.runtime import Engine

    with open_artifact(art) as a:
        rep = a.manifest.variant("mixed-b300").extra["quantization"]
        assert {row["layer"]: row["precision"] for row in rep["layers"]} == {"w1": "fp32", "w2": "int8"}
        with np.load(a.member("weights/mixed.npz")) as w:
            assert {str(w[k].dtype) for k in w.files} == {"float32", "int8"}
    ev = np.load(mlp / "eval.npz")
    with Engine(art, preload=True) as e:
        e.select("mixed-b300")
        got = e.run(ev["x"])["y"]
    assert (got.argmax(axis=1) == ev["labels"]).mean() * 100 == pytest.approx(acc["mixed"])


def test_unmet_budget_writes_nothing_unless_allowed(mlp, tmp_path):
    plan_path = tmp_path / "plan.json"
    # keeping w1 in fp32 leaves 38 % of MACs int8, below the default --min-int8-share 0.5
    r = _quantize(mlp, plan_path, "--max-accuracy-drop", "1")
    assert r.returncode == 10 and "budget not met" in r.stderr and "int8 share" in r.stderr
    assert "Traceback" not in r.stderr and not plan_path.exists()
    r = _quantize(mlp, plan_path, "--max-accuracy-drop", "1", "--allow-over-budget")
    assert r.returncode == 0 and "warning: accuracy budget not met" in r.stdout
    assert json.loads(plan_path.read_text())["float_layers"] == ["w1"]
    # an all-int8 build with a budget it cannot hold fails before writing an artifact
    art = tmp_path / "i8.ixa"
    r = cli(
        "build", "-m", mlp / "mlp.onnx", "--precision", "int8", "--calib", mlp / "calib.npy",
        "--calib-method", "minmax", "--eval-data", mlp / "eval.npz", "--max-accuracy-drop", "1", "-o", art,
    )  # fmt: skip
    assert r.returncode == 10 and "drop" in r.stderr and not art.exists()


def test_plan_for_another_model_is_refused(mlp, tmp_path):
    plan_path = tmp_path / "plan.json"
    assert _quantize(mlp, plan_path, "--precision", "int8").returncode == 0
    r = cli("build", "--precision", "int8", "--quant-plan", plan_path, "-o", tmp_path / "x.ixa")
    assert r.returncode == 2 and "made for another model" in r.stderr
    plan_path.write_text("{not json")
    r = cli("build", "--precision", "int8", "--quant-plan", plan_path, "-o", tmp_path / "x.ixa")
    assert r.returncode == 2 and "cannot read quantization plan" in r.stderr


def test_mixed_on_the_embedded_model_meets_the_default_budget(tmp_path):
    r = cli("quantize", "-o", tmp_path / "p.json")
    assert r.returncode == 0, r.stderr
    acc = json.loads((tmp_path / "p.json").read_text())["accuracy"]
    assert acc["fp32"] - acc["mixed"] <= 0.5 and acc["int8_mac_share"] >= 0.9


def test_tune_tunes_the_kernels_build_compiles_for_each_precision():
    from tvm import relax

    from inferx_edge.frontend import import_model
    from inferx_edge.models import DEFAULT_MODEL
    from inferx_edge.tune.driver import TuneOptions, _precision_module

    im = import_model(DEFAULT_MODEL, {"image": (1, 1, 28, 28)})

    from inferx_edge.targets import get_target

    def dtypes(precision, target="x86-cpu"):
        opts = TuneOptions(
            model=DEFAULT_MODEL, target=target, input_shapes={"image": (1, 1, 28, 28)}, precision=precision
        )
        mod = relax.get_pipeline("zero")(_precision_module(im, get_target(target), opts, log=lambda *a: None))
        return " ".join(f.script() for gv, f in mod.functions_items() if "conv2d" in gv.name_hint)

    assert '"int8"' in dtypes("int8") and '"int8"' not in dtypes("fp32")
    assert '"float16"' in dtypes("fp16")
    # CUDA variants run convolutions in NHWC: tuning sees the same kernels build compiles
    assert "conv2d_nhwc" in dtypes("int8", "h200") and "conv2d_nhwc" not in dtypes("int8")
    with pytest.raises(Exception, match="unknown precision 'int4'"):
        TuneOptions(model=DEFAULT_MODEL, target="x86-cpu", precision="int4")


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
