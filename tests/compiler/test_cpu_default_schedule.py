"""Default CPU schedules for untuned kernels: parallel and vector loops, the same values as onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

from inferx_edge import models
from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.runtime import Engine
from tests.helpers import build_quietly, float_matmul_module, make_convnet


def test_untuned_kernels_get_parallel_vector_schedules():
    import tvm

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cpu.default_schedule import CPUDefaultSchedule
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target

    spec = get_target("x86-cpu")
    im = import_model(models.DEFAULT_MODEL, {"image": (4, 1, 28, 28)})
    mod = tvm.relax.get_pipeline("zero")(prepare_variant(im, variant_layout(spec, "fp32")).mod)
    target = resolve_tvm_target(spec)
    with target:
        scheduled = {
            gv.name_hint: CPUDefaultSchedule().apply(f, target, False)
            for gv, f in mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc)
        }
    convs = {n: s for n, s in scheduled.items() if "conv2d" in n}
    assert len(convs) == 3 and all(s is not None for s in convs.values())
    for s in convs.values():
        script = s.mod.script()
        assert "T.parallel" in script and "T.vectorized" in script and "_init" in script
        # a register tile: several output pixels (an unrolled loop) around the vector of output channels,
        # inside the reduction: independent accumulator chains instead of one latency-bound vector
        update = script[: script.index('sblock("conv2d_nhwc_update")')]
        assert "T.unroll" in update[-400:] and "T.vectorized" in update[-300:], script


@pytest.mark.parametrize("batch", [1, 3])
def test_untuned_builds_match_onnxruntime(tmp_path, batch):
    ort = pytest.importorskip("onnxruntime")
    from inferx_edge.runtime import Engine

    model = make_convnet(tmp_path / "convnet.onnx")  # conv, BN, pool, stride-2 conv, GAP, Gemm, softmax
    art = build_quietly(tmp_path / "c.ixa", model=model, input_shapes={"x": (batch, 3, 16, 16)}, tuning=False)
    x = np.random.default_rng(0).standard_normal((batch, 3, 16, 16)).astype(np.float32)
    (want,) = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with Engine(art) as engine:
        np.testing.assert_allclose(engine.run(x)["prob"], want, rtol=1e-4, atol=1e-5)


def test_fp16_cpu_build_of_a_silu_network_matches_onnxruntime(tmp_path):
    """fp16 CPU variants of networks with exp in fp16 (sigmoid, SiLU) build and run: they failed with
    'unknown intrinsic tirx.exp' (exit 4) while the vector exp lowering handled float32 only."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper, numpy_helper

    from inferx_edge.runtime import Engine
    from tests.helpers import write_onnx

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w"),
        numpy_helper.from_array((rng.standard_normal((10, 8)) * 0.3).astype(np.float32), "fc"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["s"]),
        helper.make_node("Mul", ["c", "s"], ["silu"]),
        helper.make_node("GlobalAveragePool", ["silu"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1),
    ]
    model = write_onnx(tmp_path / "silu.onnx", nodes, {"x": [1, 3, 16, 16]}, {"y": [1, 10]}, inits)
    art = build_quietly(tmp_path / "h.ixa", model=model, precisions=("fp16",), tuning=False)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    (want,) = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with Engine(art) as engine:
        got = engine.run(x)["y"]
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


def test_the_cpu_pipeline_gives_convolutions_this_schedule():
    """Our rule comes before dlight's general reduction rule, which also claims convolutions (and made
    them an order of magnitude slower)."""
    import tvm

    from inferx_edge.compiler.compile import relax_pipeline, resolve_tvm_target
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target

    spec = get_target("x86-cpu")
    im = import_model(models.DEFAULT_MODEL, {"image": (2, 1, 28, 28)})
    target = resolve_tvm_target(spec)
    mod = relax_pipeline(spec, target)(prepare_variant(im, variant_layout(spec, "fp32")).mod)
    convs = [
        f.script() for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint
    ]
    assert len(convs) == 3
    for script in convs:
        update = script[script.index('sblock("conv2d_nhwc_update")') - 300 :]
        assert "T.vectorized" in update[:300] and "T.parallel" in script


def test_boolean_mask_kernels_build_and_match_onnxruntime(tmp_path):
    """Attention-mask arithmetic stores bool tensors; vectorized i1 stores failed LLVM codegen
    ("dtype mismatch on BufferStore: buffer's dtype is T.bool ... int8x64"), so BERT-style encoders
    did not build for x86. Bool kernels now stay scalar inside their parallel loops."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("Less", ["x", "one"], ["small"]),
        helper.make_node("And", ["pos", "small"], ["mask"]),
        helper.make_node("Expand", ["mask", "shape"], ["wide"]),
        helper.make_node("Where", ["wide", "x", "neg"], ["y"]),
    ]
    inits = [
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("one", TensorProto.FLOAT, [], [1.0]),
        helper.make_tensor("neg", TensorProto.FLOAT, [], [-1e4]),
        helper.make_tensor("shape", TensorProto.INT64, [4], [2, 4, 64, 64]),
    ]
    graph = helper.make_graph(
        nodes,
        "mask",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 1, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 64, 64])],
        inits,
    )
    path = tmp_path / "mask.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    build_artifact(
        BuildOptions(model=path, target="x86-cpu", output=tmp_path / "m.ixa", tuning=False), log=lambda *a: None
    )
    x = np.random.default_rng(0).uniform(-1, 2, (2, 1, 64, 64)).astype(np.float32)
    (ref,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    with Engine(tmp_path / "m.ixa", trust=False) as engine:
        np.testing.assert_array_equal(engine.run(x)["y"], ref)


@pytest.mark.parametrize("group_width", [4, 8, 32])
def test_grouped_convs_vectorize_within_one_group_and_stay_exact(group_width):
    """A vector of output channels spanning several groups gathers its inputs (ResNeXt's 4-wide groups
    ran at 7 GFLOPS): vectors narrower than a group are one group's channels, with one input broadcast."""
    import re

    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cpu.default_schedule import cpu_pipeline
    from inferx_edge.targets import get_target

    c = 128
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 14, 14, c], "float32"))
    w = relax.Var("w", relax.TensorType([3, 3, group_width, c], "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(
                x, w, padding=[1, 1, 1, 1], groups=c // group_width, data_layout="NHWC", kernel_layout="HWIO"
            )
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    target = resolve_tvm_target(get_target("x86-cpu"))
    scheduled = cpu_pipeline(target)(bb.get())
    (script,) = [f.script() for gv, f in scheduled.functions_items() if "conv2d" in gv.name_hint]
    lanes = int(re.search(r"T\.vectorized\(T\.int64\((\d+)\)\)", script[script.index("_update") - 400 :]).group(1))
    assert lanes <= group_width  # AVX2: 8 lanes, AVX-512: 16; a 4-wide group gets 4
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((1, 14, 14, c)).astype("float32"), rng.standard_normal((3, 3, group_width, c))
    vm = relax.VirtualMachine(relax.build(bb.get(), target, relax_pipeline=cpu_pipeline(target)), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(ws.astype("float32"))).numpy()
    padded = np.pad(xs.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = np.zeros((1, 14, 14, c))
    for o in range(c):
        g = o // group_width
        for kh in range(3):
            for kw in range(3):
                window = padded[:, kh : kh + 14, kw : kw + 14, g * group_width : (g + 1) * group_width]
                want[..., o] += window @ ws[kh, kw, :, o]
    np.testing.assert_allclose(got, np.maximum(want, 0), rtol=1e-4, atol=1e-4)


def test_a_unit_axis_above_the_vector_axis_does_not_make_a_one_row_tile():
    """A sequence-first (tokens, 1, features) x (features, out) matmul (ViT's QKV projection): the tile's
    rows come from the token axis, not the unit batch axis (a one-row tile ran at 48 GFLOPS)."""
    import re

    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cpu.default_schedule import cpu_pipeline
    from inferx_edge.targets import get_target

    tokens, k, n = 37, 64, 96
    mod = float_matmul_module((tokens, 1, k), (k, n))
    target = resolve_tvm_target(get_target("x86-cpu"))
    scheduled = cpu_pipeline(target)(mod)
    (script,) = [f.script() for gv, f in scheduled.functions_items() if "matmul" in gv.name_hint]
    update = script[: script.index("_update")]
    unrolled = [int(r) for r in re.findall(r"in T\.unroll\(T\.int64\((\d+)\)\)", update[-700:])]
    # accumulators = rows x vectors: several token rows share each weight vector load (a one-row tile
    # has only its vectors unrolled: 2)
    assert len(unrolled) == 2 and np.prod(unrolled) >= 4, script
    rng = np.random.default_rng(1)
    xs, ws = rng.standard_normal((tokens, 1, k)), rng.standard_normal((k, n))
    vm = relax.VirtualMachine(relax.build(mod, target, relax_pipeline=cpu_pipeline(target)), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xs.astype("float32")), tvm.runtime.tensor(ws.astype("float32"))).numpy()
    np.testing.assert_allclose(got, xs @ ws, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("pixels", [7, 8])  # 7: a ragged register tile (6 rows + a guarded tail), 8: whole tiles
def test_elementwise_epilogues_run_per_register_tile_and_stay_exact(pixels):
    """bias + residual + hardswish after a 1x1 convolution: one consumer block computed inside the
    convolution's parallel loop right after each tile's reduction, no separate pass per elementwise op
    (MobileNetV3's 7x7x960 -> 160 projection ran 2x slower with three passes)."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cpu.default_schedule import cpu_pipeline
    from inferx_edge.targets import get_target

    c_in, c_out = 40, 32
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, pixels, pixels, c_in), "float32"))
    w = relax.Var("w", relax.TensorType((1, 1, c_in, c_out), "float32"))
    b = relax.Var("b", relax.TensorType((1, 1, 1, c_out), "float32"))
    r = relax.Var("r", relax.TensorType((1, pixels, pixels, c_out), "float32"))
    with bb.function("main", [x, w, b, r]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, data_layout="NHWC", kernel_layout="HWIO"))
            y = bb.emit(relax.op.add(relax.op.add(y, b), r))
            gate = bb.emit(relax.op.divide(relax.op.clip(relax.op.add(y, relax.const(3.0)), 0, 6), relax.const(6.0)))
            out = bb.emit_output(relax.op.multiply(y, gate))
        bb.emit_func_output(out)
    mod = bb.get()
    target = resolve_tvm_target(get_target("x86-cpu"))
    scheduled = cpu_pipeline(target)(mod)
    (script,) = [f.script() for gv, f in scheduled.functions_items() if "conv2d" in gv.name_hint]
    assert script.count("T.parallel") == 1, script  # the epilogue shares the convolution's parallel loop
    after = script[script.index('sblock("conv2d_nhwc_update")') :]
    assert after.count("T.sblock(") == 1 and "T.vectorized" in after, script  # one vectorized consumer
    rng = np.random.default_rng(2)
    xs, ws = rng.standard_normal((1, pixels, pixels, c_in)), rng.standard_normal((1, 1, c_in, c_out))
    bs, rs = rng.standard_normal((1, 1, 1, c_out)), rng.standard_normal((1, pixels, pixels, c_out))
    vm = relax.VirtualMachine(relax.build(mod, target, relax_pipeline=cpu_pipeline(target)), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(a.astype("float32")) for a in (xs, ws, bs, rs)]).numpy()
    y = np.einsum("nhwc,co->nhwo", xs, ws[0, 0]) + bs + rs
    np.testing.assert_allclose(got, y * np.clip(y + 3, 0, 6) / 6, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("out_channels", [27, 21, 9])
def test_odd_output_channel_counts_get_divisor_vectors_and_stay_exact(out_channels):
    """No power-of-two vector divides 27 or 21 output channels (ESPCN's last conv, a 21-class head),
    and a convolution cannot be padded to whole vectors: such a conv ran as a guarded scalar tail (10x
    slower than onnxruntime end to end). Its vectors are now a divisor of the channels."""
    import re

    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cpu.default_schedule import _lanes, _odd_vector_width, cpu_pipeline
    from inferx_edge.targets import get_target

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 12, 12, 32], "float32"))
    w = relax.Var("w", relax.TensorType([3, 3, 32, out_channels], "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="HWIO")
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    target = resolve_tvm_target(get_target("x86-cpu"))
    lanes = _odd_vector_width(out_channels, _lanes(target, 32))  # AVX-512: 9, 7, 9; AVX2: 3, 7, 3
    assert lanes is not None and lanes >= 3
    scheduled = cpu_pipeline(target)(bb.get())
    (script,) = [f.script() for gv, f in scheduled.functions_items() if "conv2d" in gv.name_hint]
    update = script[script.index("_update") - 400 :]
    assert int(re.search(r"T\.vectorized\(T\.int64\((\d+)\)\)", update).group(1)) == lanes
    rng = np.random.default_rng(0)
    xs, ws = rng.standard_normal((1, 12, 12, 32)), rng.standard_normal((3, 3, 32, out_channels))
    vm = relax.VirtualMachine(relax.build(bb.get(), target, relax_pipeline=cpu_pipeline(target)), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xs.astype("float32")), tvm.runtime.tensor(ws.astype("float32"))).numpy()
    padded = np.pad(xs, ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = sum(padded[:, kh : kh + 12, kw : kw + 12, :] @ ws[kh, kw] for kh in range(3) for kw in range(3))
    np.testing.assert_allclose(got, np.maximum(want, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows, red", [(1024, 32), (1000, 512)])
def test_matrix_vector_kernels_take_this_schedule_not_dlights_gemv(rows, red):
    """A matrix times a vector (a 1-channel 1x1 conv, a classifier row): dlight's CPU GEMV rule took
    these and vectorized 128 outputs around their reduction loops, which LLVM took minutes to compile
    where the rows are a multiple of 128 (DPT's depth head: 629 s); the pipeline leaves that rule out and
    the project's schedule takes them (benchmarks/cpu_gemv_rule.py: faster to run as well)."""
    import tvm
    from tvm import relax
    from tvm.s_tir import dlight as dl

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cpu.default_schedule import cpu_pipeline
    from inferx_edge.compiler.guarded_schedule import schedule_rule
    from inferx_edge.targets import get_target

    mod = float_matmul_module((rows, red), (red, 1))
    target = resolve_tvm_target(get_target("x86-cpu"))
    with target:
        plain = relax.transform.LegalizeOps()(mod)
        (kernel,) = [f for _, f in plain.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
        assert dl.cpu.GEMV().apply(kernel, target, False) is not None  # what took it before
    scheduled = cpu_pipeline(target)(mod)
    rules = {schedule_rule(f) for _, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    assert rules == {"CPUDefaultSchedule"}, rules
    rng = np.random.default_rng(2)
    xs, ws = rng.standard_normal((rows, red)), rng.standard_normal((red, 1))
    vm = relax.VirtualMachine(relax.build(mod, target, relax_pipeline=cpu_pipeline(target)), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(xs.astype("float32")), tvm.runtime.tensor(ws.astype("float32"))).numpy()
    np.testing.assert_allclose(got, xs @ ws, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "m, rows, red, bias, want",
    [
        (None, 1000, 512, False, True),  # a matrix times a vector
        (None, 300, 256, True, True),  # with a bias after it (computed per output, right after)
        (1, 200, 384, False, True),  # a dense layer at one row, weight [out, in]
        (8, 200, 384, False, False),  # eight rows: the register tile reuses each weight load
        (None, 1000, 64, False, False),  # a short reduction: the register tile was faster
    ],
)
def test_dot_products_of_contiguous_rows(m, rows, red, bias, want):
    """Reductions whose largest operand is contiguous along the reduction and whose other operands are
    one row of it take row_dot (vector accumulators along the row, rfactor; 2-7x the register tile
    on such shapes here, benchmarks/cpu_gemv_rule.py), others keep the register tile; both match numpy."""
    import tvm
    from tvm import te

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cpu.default_schedule import CPUDefaultSchedule
    from inferx_edge.targets import get_target

    r = te.reduce_axis((0, red), name="r")
    if m is None:
        a, v = te.placeholder((rows, red), name="a"), te.placeholder((red,), name="v")
        out = te.compute((rows,), lambda i: te.sum(a[i, r] * v[r], axis=r), name="o")
    else:
        v, a = te.placeholder((m, red), name="x"), te.placeholder((rows, red), name="w")
        out = te.compute((m, rows), lambda i, j: te.sum(v[i, r] * a[j, r], axis=r), name="o")
    tensors = [a, v, out]
    if bias:
        b = te.placeholder((rows,), name="b")
        tensors = [a, v, b, te.compute((rows,), lambda i: out[i] + b[i], name="y")]
    target = resolve_tvm_target(get_target("x86-cpu"))
    with target:
        sch = CPUDefaultSchedule().apply(te.create_prim_func(tensors), target, False)
    assert ("_rf" in sch.mod["main"].script()) == want
    lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=target)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal([int(d) for d in t.shape]).astype("float32") for t in tensors[:-1]]
    got = tvm.runtime.tensor(np.zeros([int(d) for d in tensors[-1].shape], "float32"))
    lib["main"](*[tvm.runtime.tensor(x) for x in args], got)
    A, V = (x.astype(np.float64) for x in args[:2])
    ref = A @ V if m is None else V @ A.T
    ref = ref + args[2] if bias else ref
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=1e-4)
