"""The zoo's distinctive blocks, small and built in code: fp32 on x86 against onnxruntime; int8 and fp16
for sm_80 / sm_87 / sm_90 with structural checks (every GEMM large enough runs on tensor cores).

The blocks: squeeze-excite, hardswish + SiLU, LayerNorm + GELU MLP, multi-head attention, grouped conv,
channel shuffle, resize (nearest + bilinear), a concat-heavy dense neck, an atrous (dilated) pyramid.
The default run compiles each block's CUDA variants for one architecture (rotating over the three);
``-m slow`` compiles all of them.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import needs_nvrtc

_RNG = np.random.default_rng(7)


def _w(name, *shape, scale=0.2):
    return numpy_helper.from_array((_RNG.standard_normal(shape) * scale).astype(np.float32), name)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _conv(x, out, w, groups=1, k=3):
    pad = [k // 2] * 4
    return helper.make_node("Conv", [x, w], [out], kernel_shape=[k, k], pads=pad, group=groups)


def squeeze_excite():
    nodes = [
        _conv("x", "c", "w0"),
        helper.make_node("GlobalAveragePool", ["c"], ["p"]),
        helper.make_node("Conv", ["p", "w1", "b1"], ["s"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["s"], ["r"]),
        helper.make_node("Conv", ["r", "w2", "b2"], ["e"], kernel_shape=[1, 1]),
        helper.make_node("HardSigmoid", ["e"], ["g"], alpha=1 / 6, beta=0.5),
        helper.make_node("Mul", ["c", "g"], ["y"]),
    ]
    inits = [_w("w0", 32, 16, 3, 3), _w("w1", 8, 32, 1, 1), _w("b1", 8), _w("w2", 32, 8, 1, 1), _w("b2", 32)]
    return nodes, inits, (2, 16, 12, 12)


def hardswish_silu():
    nodes = [
        _conv("x", "a", "w0"),
        helper.make_node("HardSwish", ["a"], ["h"]),
        _conv("h", "b", "w1", k=1),
        helper.make_node("Sigmoid", ["b"], ["sb"]),
        helper.make_node("Mul", ["b", "sb"], ["y"]),
    ]
    return nodes, [_w("w0", 32, 16, 3, 3), _w("w1", 32, 32, 1, 1)], (2, 16, 12, 12)


def layernorm_gelu():
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["n", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h"]),
        helper.make_node("Div", ["h", "sqrt2"], ["hd"]),
        helper.make_node("Erf", ["hd"], ["he"]),
        helper.make_node("Add", ["he", "one"], ["h1"]),
        helper.make_node("Mul", ["h", "h1"], ["h2"]),
        helper.make_node("Mul", ["h2", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "w2"], ["o"]),
        helper.make_node("Add", ["o", "x"], ["y"]),
    ]
    inits = [
        _w("g", 64, scale=1.0), _w("b", 64), _w("w1", 64, 128), _w("b1", 128), _w("w2", 128, 64),
        numpy_helper.from_array(np.float32(np.sqrt(2)), "sqrt2"), numpy_helper.from_array(np.float32(1), "one"),
        numpy_helper.from_array(np.float32(0.5), "half"),
    ]  # fmt: skip
    return nodes, inits, (2, 24, 64)


def attention():
    """Four heads of width 16 over 24 tokens, torch's MultiheadAttention as ONNX spells it."""
    nodes = []
    for n in "qkv":
        nodes += [
            helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}0"]),
            helper.make_node("Reshape", [f"{n}0", "heads"], [f"{n}1"]),
            helper.make_node("Transpose", [f"{n}1"], [n], perm=[0, 2, 3, 1] if n == "k" else [0, 2, 1, 3]),
        ]
    nodes += [
        helper.make_node("MatMul", ["q", "k"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s"]),
        helper.make_node("Softmax", ["s"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["a"]),
        helper.make_node("Transpose", ["a"], ["at"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["at", "merged"], ["am"]),
        helper.make_node("MatMul", ["am", "wo"], ["y"]),
    ]
    inits = [_w(f"w{n}", 64, 64) for n in "qkvo"] + [
        _i64("heads", [2, 24, 4, 16]), _i64("merged", [2, 24, 64]),
        numpy_helper.from_array(np.float32(0.25), "scale"),
    ]  # fmt: skip
    return nodes, inits, (2, 24, 64)


def grouped_conv():
    """ResNeXt/RegNet's bottleneck: 1x1, grouped 3x3 (groups of 8 channels), 1x1."""
    nodes = [
        _conv("x", "a", "w0", k=1),
        helper.make_node("Relu", ["a"], ["ra"]),
        _conv("ra", "c", "w", groups=4),
        helper.make_node("Relu", ["c"], ["rc"]),
        _conv("rc", "y", "w1", k=1),
    ]
    return nodes, [_w("w0", 32, 32, 1, 1), _w("w", 32, 8, 3, 3), _w("w1", 32, 32, 1, 1)], (2, 32, 12, 12)


def channel_shuffle():
    nodes = [
        _conv("x", "c", "w", k=1),
        helper.make_node("Reshape", ["c", "split"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3, 4]),
        helper.make_node("Reshape", ["t", "merged"], ["s"]),
        _conv("s", "y", "w2", groups=32),  # depthwise after the shuffle, as ShuffleNet's branch
    ]
    inits = [_w("w", 32, 16, 1, 1), _i64("split", [2, 2, 16, 12, 12]), _i64("merged", [2, 32, 12, 12])]
    return nodes, inits + [_w("w2", 32, 1, 3, 3)], (2, 16, 12, 12)


def resize():
    nodes = [
        _conv("x", "c", "w"),
        helper.make_node("Resize", ["c", "", "scales"], ["up_n"], mode="nearest"),
        helper.make_node("Resize", ["c", "", "scales"], ["up_l"], mode="linear",
                         coordinate_transformation_mode="half_pixel"),
        helper.make_node("Add", ["up_n", "up_l"], ["y"]),
    ]  # fmt: skip
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    return nodes, [_w("w", 32, 16, 3, 3), scales], (2, 16, 8, 8)


def concat_neck():
    """DenseNet-style: every conv reads the concatenation of all earlier outputs; a pooled transition."""
    nodes, have, inits = [], ["x"], []
    for i in range(3):
        cat = "x" if i == 0 else f"cat{i}"
        if i:
            nodes.append(helper.make_node("Concat", list(have), [cat], axis=1))
        nodes += [_conv(cat, f"c{i}", f"w{i}"), helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
        inits.append(_w(f"w{i}", 16, 16 * (i + 1), 3, 3))
        have.append(f"r{i}")
    nodes += [
        helper.make_node("Concat", list(have), ["all"], axis=1),
        _conv("all", "t", "wt", k=1),
        helper.make_node("MaxPool", ["t"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ]
    return nodes, inits + [_w("wt", 32, 64, 1, 1)], (2, 16, 12, 12)


def atrous_pyramid():
    """DeepLabV3's ASPP over an 8x8 map: a 1x1 branch and 3x3 branches dilated 2, 12 and 36, concatenated,
    then a 1x1. The rate-12 and rate-36 branches read only padding through their outer taps."""
    nodes = [_conv("x", "b0", "w0", k=1)]
    for i, rate in enumerate((2, 12, 36), 1):
        nodes.append(
            helper.make_node(
                "Conv", ["x", f"w{i}"], [f"b{i}"], kernel_shape=[3, 3], pads=[rate] * 4, dilations=[rate] * 2
            )
        )
    nodes += [
        helper.make_node("Concat", ["b0", "b1", "b2", "b3"], ["cat"], axis=1),
        helper.make_node("Relu", ["cat"], ["r"]),
        _conv("r", "y", "wy", k=1),
    ]
    inits = [_w("w0", 16, 16, 1, 1)] + [_w(f"w{i}", 16, 16, 3, 3) for i in (1, 2, 3)] + [_w("wy", 32, 64, 1, 1)]
    return nodes, inits, (2, 16, 8, 8)


BLOCKS = {
    f.__name__: f
    for f in (
        squeeze_excite, hardswish_silu, layernorm_gelu, attention, grouped_conv, channel_shuffle, resize,
        concat_neck, atrous_pyramid,
    )
}  # fmt: skip
#: output shape of each block (ONNX graphs declare their output shapes)
OUT = {
    "squeeze_excite": (2, 32, 12, 12),
    "hardswish_silu": (2, 32, 12, 12),
    "layernorm_gelu": (2, 24, 64),
    "attention": (2, 24, 64),
    "grouped_conv": (2, 32, 12, 12),
    "channel_shuffle": (2, 32, 12, 12),
    "resize": (2, 32, 16, 16),
    "concat_neck": (2, 32, 6, 6),
    "atrous_pyramid": (2, 32, 8, 8),
}
ARCHS = {"a100": "sm_80", "jetson-orin": "sm_87", "h200": "sm_90"}


def _model(tmp_path, name):
    nodes, inits, shape = BLOCKS[name]()
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(OUT[name]))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    return path, shape


def block_quantizer(tmp_path, path, imported, shape):
    """The int8 quantizer ``build`` would use for a block, calibrated on 8 seeded random samples."""
    from inferx_edge.quantize.driver import QuantOptions, quantizer, resolve_plan

    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(1).standard_normal((8, *shape[1:])).astype(np.float32))
    plan = resolve_plan(path, {}, imported, "int8", QuantOptions(calib=calib), log=lambda *a: None)
    return quantizer(plan, "int8")


@pytest.mark.parametrize("name", list(BLOCKS))
def test_block_fp32_on_x86_matches_onnxruntime(tmp_path, name):
    ort = pytest.importorskip("onnxruntime")
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import relax_pipeline, resolve_tvm_target
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target

    path, shape = _model(tmp_path, name)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    spec = get_target("x86-cpu")
    target = resolve_tvm_target(spec)
    prepared = prepare_variant(import_model(path, {}), variant_layout(spec, "fp32"), bake=True)
    ex = relax.build(prepared.mod, target, relax_pipeline=relax_pipeline(spec, target))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(w) for w in prepared.weight_arrays]).numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4 * max(np.abs(want).max(), 1e-6)


def _cuda_cases():
    cases = []
    for i, name in enumerate(BLOCKS):
        for j, target in enumerate(ARCHS):
            marks = [needs_nvrtc] + ([] if j == i % len(ARCHS) else [pytest.mark.slow])
            cases += [pytest.param(name, target, p, marks=marks, id=f"{name}-{target}-{p}") for p in ("int8", "fp16")]
    return cases


@pytest.mark.parametrize("name,target,precision", _cuda_cases())
def test_block_compiles_for_cuda_with_tensor_cores_on_every_gemm(tmp_path, name, target, precision):
    """Built as ``build`` builds the variant (int8 calibrated on 8 random samples); the device code is
    compiled for the target's architecture, and every GEMM our tensor-core rule accepts (int8 x int8 ->
    int32 or fp16, every dim >= 16) is scheduled with mma instructions."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import pass_config, relax_pipeline, resolve_tvm_target
    from inferx_edge.compiler.cuda import device_compiler
    from inferx_edge.compiler.cuda.analysis import _matmul_signature, tile_gemm_extents
    from inferx_edge.compiler.cuda.pipeline import fusion_passes
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target

    path, shape = _model(tmp_path, name)
    imported = import_model(path, {})
    quantize = block_quantizer(tmp_path, path, imported, shape) if precision == "int8" else None
    spec = get_target(target)
    target_ = resolve_tvm_target(spec)
    mod = prepare_variant(imported, variant_layout(spec, precision), quantize=quantize, target=target_).mod
    fused = tvm.transform.Sequential(fusion_passes())(mod)
    gemms = {  # kernel -> its operand dtype (an int8 variant's attention matmuls are fp16)
        gv.name_hint: _matmul_signature(f)[0][0]
        for gv, f in fused.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc) and tile_gemm_extents(f)
    }
    with device_compiler(spec, "cubin") as record, target_, pass_config(async_copy=True):
        scheduled = relax_pipeline(spec, target_)(mod)
        relax.build(mod, target_, relax_pipeline=relax_pipeline(spec, target_))
    assert record["kernels_modules"]
    scripts = {gv.name_hint: f.script() for gv, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert gemms, sorted(scripts)  # every block has a convolution or dense layer large enough
    if name == "grouped_conv":  # the grouped 3x3 conv is a batched GEMM too (passes/grouped_conv_gemm.py)
        assert any("group_conv_gemm" in g for g in gemms), sorted(gemms)
    mma = {
        "int8": 'mma("m16n8k32", "row", "col", "int8", "int8", "int32"',
        "float16": 'mma("m16n8k16", "row", "col", "fp16"',
    }
    for g, dtype in gemms.items():
        assert mma[dtype] in scripts[g] and "ldmatrix" in scripts[g], g
    if precision == "int8":
        assert "int8" in gemms.values()
