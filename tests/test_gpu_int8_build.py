"""INT8 variants for sm_80 / sm_87 / sm_90 built on this GPU-less host, and the int8 tensor-core
workaround for TVM 0.27's dlight schedule (checked on the scheduled TIR and by compiling)."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.models import DEFAULT_MODEL
from inferx_edge.package import open_artifact
from inferx_edge.package.elf import elf_machine, embedded_cuda_code
from tests.test_cross_targets import needs_cross, needs_nvrtc


@needs_nvrtc
@pytest.mark.parametrize(
    "target,sm,machine",
    [
        ("a100", "sm_80", "x86_64"),
        ("h200", "sm_90", "x86_64"),
        pytest.param("jetson-orin", "sm_87", "aarch64", marks=needs_cross),
    ],
)
def test_int8_variant_compiles_for_each_gpu_architecture(tmp_path, target, sm, machine):
    out = tmp_path / f"{target}.ixa"
    build_artifact(
        BuildOptions(model=DEFAULT_MODEL, target=target, output=out, precisions=("int8",), tuning=False),
        log=lambda *a: None,
    )
    with open_artifact(out) as art:
        v = art.manifest.variant("int8-b1")
        lib = art.member(v.library)
        assert elf_machine(lib) == machine and set(embedded_cuda_code(lib)["cubin"]) == {sm}
        assert v.extra["quantization"]["int8_mac_share"] == 1.0
        with np.load(art.member(v.weights)) as w:
            assert sum(w[k].dtype == np.int8 for k in w.files) == 4


@needs_nvrtc
@pytest.mark.parametrize(
    "target,sm",
    [("a100", "sm_80"), ("h200", "sm_90"), pytest.param("jetson-orin", "sm_87", marks=needs_cross)],
)
def test_fp16_variant_runs_its_convolutions_on_mma_for_each_gpu_architecture(tmp_path, monkeypatch, target, sm):
    dump = tmp_path / "cuda"
    monkeypatch.setenv("INFERX_DUMP_CUDA", str(dump))
    out = tmp_path / f"{target}.ixa"
    build_artifact(
        BuildOptions(model=DEFAULT_MODEL, target=target, output=out, precisions=("fp16",), tuning=False),
        log=lambda *a: None,
    )
    with open_artifact(out) as art:
        lib = art.member(art.manifest.variant("fp16-b1").library)
        assert set(embedded_cuda_code(lib)["cubin"]) == {sm}
    source = "".join(f.read_text() for f in dump.iterdir())
    assert "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16" in source and "ldmatrix" in source


@needs_nvrtc
def test_fp16_rgb_stem_compiles_on_tensor_cores():
    """A 7x7 stride-2 fp16 conv over 3 channels (K = 147, not a multiple of a load's 2 halves): its
    predicated activation loads gather across pixels; compiles on mma like the other fp16 convs."""
    from benchmarks.gpu_conv_int8 import conv_module

    (script,) = _schedule_and_compile("h200", conv_module(2, 64, 3, 64, 7, 2, "float16"))
    assert 'mma("m16n8k16", "row", "col", "fp16", "fp16", "fp16"' in script


def _int8_matmul_module(m: int, j: int | None = None, k: int | None = None):
    """x[m, k] @ w[j, k]^T as int8 -> int32, scaled to float (square m x m x m by default); the
    transposed weight reaches the GEMM kernel as [K, J], like an ONNX Gemm's classifier weight."""
    from tvm import relax

    j, k = j or m, k or m
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "int8"))
    w = relax.Var("w", relax.TensorType((j, k), "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.op.permute_dims(w), out_dtype="int32"))
            out = bb.emit_output(relax.op.multiply(relax.op.astype(y, "float32"), relax.const(np.float32(0.5))))
        bb.emit_func_output(out)
    return bb.get()


def _int8_tensor_cores(script: str) -> bool:
    """A scheduled kernel loads int8 tiles with ldmatrix and multiplies them with mma.sync.m16n8k32."""
    return "ldmatrix" in script and 'mma("m16n8k32", "row", "col", "int8", "int8", "int32"' in script


@needs_nvrtc
@pytest.mark.parametrize("target", ["a100", "h200"])
def test_large_int8_matmul_uses_tensor_cores_and_compiles(target):
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import cuda_pipeline, device_compiler
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.targets import get_target

    import_tensor_intrinsics()
    spec = get_target(target)
    tvm_target = resolve_tvm_target(spec)
    mod = _int8_matmul_module(256)
    with device_compiler(spec, "cubin") as record, tvm_target:
        scheduled = cuda_pipeline(tvm_target)(mod)
        scripts = [f.script() for _, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
        mma = [s for s in scripts if _int8_tensor_cores(s)]  # int8 in, int32 accumulate
        assert mma and not any("software_pipeline" in s for s in mma)
        relax.build(mod, tvm_target, relax_pipeline=cuda_pipeline(tvm_target))
    assert record["kernels_modules"]


@needs_nvrtc
def test_stock_dlight_int8_tensorization_still_fails_to_compile():
    """Guards the workaround: when a TVM upgrade fixes dlight's int8 wmma pipeline, this fails and
    ``inferx_edge.compiler.cuda`` can go."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import device_compiler
    from inferx_edge.targets import get_target

    spec = get_target("a100")
    tvm_target = resolve_tvm_target(spec)
    with device_compiler(spec, "cubin"), tvm_target, pytest.raises(tvm.error.InternalError, match="fragment_info_"):
        relax.build(_int8_matmul_module(256), tvm_target)


def _conv_module(kind: str):
    """A depthwise conv (+ReLU6, + int8 quantize), a 3x3 max pool, or an fp16 3x3 conv, NCHW batch 8."""
    from tvm import relax

    dtype = "float16" if kind == "fp16-conv" else "float32"
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([8, 96, 56, 56], dtype))
    w = relax.Var("w", relax.TensorType([96, 1 if kind == "depthwise" else 96, 3, 3], dtype))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            if kind == "depthwise":
                y = bb.emit(
                    relax.op.clip(relax.op.nn.conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1], groups=96), 0, 6)
                )
                y = relax.op.astype(relax.op.round(relax.op.divide(y, relax.const(np.float32(0.05)))), "int8")
            elif kind == "pool":
                y = relax.op.nn.max_pool2d(x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1])
            else:
                y = relax.op.nn.relu(relax.op.nn.conv2d(x, w, padding=[1, 1, 1, 1], out_dtype="float16"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _schedule_and_compile(target: str, mod):
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import cuda_pipeline, device_compiler
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.targets import get_target

    import_tensor_intrinsics()
    spec = get_target(target)
    tvm_target = resolve_tvm_target(spec)
    with device_compiler(spec, "cubin") as record, tvm_target:
        scheduled = cuda_pipeline(tvm_target, sm_count=spec.sm_count)(mod)
        relax.build(mod, tvm_target, relax_pipeline=cuda_pipeline(tvm_target, sm_count=spec.sm_count))
    assert record["kernels_modules"]
    return [f.script() for _, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


@needs_nvrtc
@pytest.mark.parametrize("kind", ["depthwise", "pool"])
def test_small_reductions_get_one_output_per_thread(kind):
    """dlight gave these one 256-thread block per output element (9 products shared by 256 threads)."""
    (script,) = _schedule_and_compile("h200", _conv_module(kind))
    assert 'thread="threadIdx.x"' in script and "T.unroll" in script
    assert 'scope="local"' in script  # the accumulator (and any epilogue) stays in the thread
    assert "cross_thread" not in script and "tvm_thread_allreduce" not in script


def _nhwc_fp16_small_reduction(kind: str, channels: int = 96):
    """MobileNetV2's fp16 depthwise conv as int8 variants run it (NHWC, fp32 accumulation, bias, ReLU6,
    int8 quantize of its output), as fp16 variants run it (fp16 out, ReLU6 bounds as 0-d tensors like
    ONNX Clip's), or ResNet's fp16 3x3 max pool; batch 8, 56x56."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([8, 56, 56, channels], "float16"))
    w = relax.Var("w", relax.TensorType([channels, 3, 3, 1], "float16"))
    b = relax.Var("b", relax.TensorType([1, 1, 1, channels], "float32"))
    low, high = (relax.Var(n, relax.TensorType([], "float16")) for n in ("low", "high"))
    with bb.function("main", [x, w, b, low, high] if kind == "depthwise-fp16" else [x, w, b]):
        with bb.dataflow():
            if kind == "depthwise":
                y = relax.op.nn.conv2d(
                    x, w, strides=[2, 2], padding=[1, 1, 1, 1], groups=channels, data_layout="NHWC",
                    kernel_layout="OHWI", out_dtype="float32",
                )  # fmt: skip
                y = relax.op.clip(relax.op.add(y, b), 0, 6)
                y = relax.op.astype(relax.op.round(relax.op.multiply(y, relax.const(np.float32(20.0)))), "int8")
            elif kind == "depthwise-fp16":
                y = relax.op.nn.conv2d(
                    x, w, padding=[1, 1, 1, 1], groups=channels, data_layout="NHWC", kernel_layout="OHWI"
                )
                y = relax.op.minimum(relax.op.maximum(y, low), high)
            else:
                y = relax.op.nn.max_pool2d(x, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1], layout="NHWC")
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _kernel_source(target: str, mod, tile: str | None = None) -> str:
    """The CUDA source of ``mod`` built for ``target`` as build compiles it (cp.async allowed), every
    tensor-core kernel with ``tile`` when given."""
    from tvm import relax

    from inferx_edge.compiler.compile import pass_config, resolve_tvm_target
    from inferx_edge.compiler.cuda import TileConfig, cuda_pipeline, device_compiler
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.targets import get_target

    import_tensor_intrinsics()
    spec = get_target(target)
    tvm_target = resolve_tvm_target(spec)
    cfg = TileConfig.parse(tile) if tile else None
    with device_compiler(spec, "cubin"), tvm_target, pass_config(async_copy=True):
        pipeline = cuda_pipeline(tvm_target, sm_count=spec.sm_count, tile_config=cfg)
        ex = relax.build(mod, tvm_target, relax_pipeline=pipeline)
    (cuda,) = [m for m in ex.mod.imports[0].imports if m.kind == "cuda"]
    return cuda.inspect_source("cuda")


@needs_nvrtc
@pytest.mark.parametrize("kind", ["depthwise", "depthwise-fp16", "pool"])
def test_fp16_nhwc_small_reductions_take_eight_channels_per_thread(kind):
    """Each thread copies its padded 3x3 window of 8 channels into registers with 16-byte loads (the
    bounds test once per tap), the depthwise weights too; the int8 output leaves 4 bytes at a time."""
    from inferx_edge.compiler.cuda import SMALL_REDUCTION_CHANNELS

    assert SMALL_REDUCTION_CHANNELS == 8
    kernel = _kernel_source("h200", _nhwc_fp16_small_reduction(kind)).split("__global__")[-1]
    assert "__launch_bounds__(64)" in kernel and "tvm_thread_allreduce" not in kernel
    assert len(re.findall(r"= \*\(uint4\*\)\(x_ptr \+", kernel)) == 9  # one per tap
    if kind == "depthwise":
        assert len(re.findall(r"= \*\(uint4\*\)\(w_ptr \+", kernel)) == 9  # 8 channels x 9 taps
        assert len(re.findall(r"\*\(int\*\)\(\w+_ptr \+ [^;]*\) = ", kernel)) == 2  # 2 x 4 int8 outputs
    else:  # fp16 out: 2 x 4 halves (the 0-d ReLU6 bounds: read as they are)
        assert len(re.findall(r"\*\(half4\*\)\(\w+_ptr \+ [^;]*\) = ", kernel)) == 2


@needs_nvrtc
def test_small_reductions_keep_one_output_per_thread_when_channels_do_not_divide():
    kernel = _kernel_source("h200", _nhwc_fp16_small_reduction("depthwise", channels=36)).split("__global__")[-1]
    assert "__launch_bounds__(256)" in kernel and "uint4" not in kernel


@needs_nvrtc
@pytest.mark.parametrize("target", ["a100", "h200"])
def test_fp16_convolution_uses_tensor_cores(target):
    """fp16 convs take the int8 kernels' tensor-core schedule from sm_80: ldmatrix + mma.sync.m16n8k16
    with fp16 accumulation, 16-byte loads (8 halves) where unpredicated. (dlight's own rule skipped fp16
    tensor cores on sm_90a: its arch parser rejects the 'a'.)"""
    (script,) = _schedule_and_compile(target, _conv_module("fp16-conv"))
    assert "ldmatrix" in script and 'mma("m16n8k16", "row", "col", "fp16", "fp16", "fp16"' in script
    assert "software_pipeline" not in script  # the rule's default tile is synchronous


@needs_nvrtc
def test_fp16_tiles_compile_with_cp_async_and_wide_loads():
    """Every load width in a tile text is bytes: fp16 tiles load 16 bytes as 8 halves (the conv's
    NHWC input and OHWI weight), with the cp.async pipeline; the accumulator tile is fp16."""
    from tvm import relax

    from benchmarks.gpu_conv_int8 import conv_module
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.compiler.tuning import tile_groups

    import_tensor_intrinsics()
    mod = conv_module(8, 28, 256, 256, 1, 1, "float16")
    (group,) = tile_groups(relax.get_pipeline("zero")(mod))  # the tile search sees the fp16 kernel
    assert group.extents == [8 * 28 * 28, 256, 256] and not group.input_padded
    kernel = _kernel_source("h200", mod, "2x4.2x4.k4.v16.w16.async.mma").split("__global__")[-1]
    assert "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16" in kernel
    copies = re.findall(r"cp_async_legacy_c[ag]_(\d+)_\d+_\d+\([^;]*, (\w+)_ptr,", kernel)
    assert {(int(n), src) for n, src in copies} == {(16, "x"), (16, "w")}


@needs_nvrtc
def test_wide_weight_loads_fall_back_to_4_bytes_for_k_by_j_weights():
    """A classifier GEMM whose weight reaches the kernel transposed ([K, J], as ONNX Gemm's does): the
    tile search's 16-byte weight-load twins (.w16) gathered across rows and failed in CUDA codegen
    (int32x16); they now compile with 4-byte weight loads. OHWI convolution weights keep 16 bytes
    (see the cp.async test above)."""
    source = _kernel_source("h200", _int8_matmul_module(64, 1000, 2048), "2x1.2x1.k4.v16.a8.w16.mma")
    assert "mma.sync.aligned.m16n8k32" in source


@needs_nvrtc
@pytest.mark.parametrize("target", ["a100", "h200"])
def test_nhwc_int8_convolution_is_an_implicit_gemm_on_tensor_cores(target):
    """CUDA int8 variants run convs in NHWC with OHWI weights (see compiler.variant.variant_layout)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([8, 56, 56, 128], "int8"))
    w = relax.Var("w", relax.TensorType([128, 3, 3, 128], "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(
                x, w, padding=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI", out_dtype="int32"
            )
            out = bb.emit_output(relax.op.nn.relu(relax.op.astype(y, "float32")))
        bb.emit_func_output(out)
    (script,) = _schedule_and_compile(target, bb.get())
    assert _int8_tensor_cores(script) and "software_pipeline" not in script


@needs_nvrtc
def test_cuda_graph_is_on_by_default_and_can_be_turned_off(tmp_path):
    for graph in (True, False):
        out = tmp_path / f"g{graph}.ixa"
        build_artifact(
            BuildOptions(model=DEFAULT_MODEL, target="h200", output=out, tuning=False, cuda_graph=graph),
            log=lambda *a: None,
        )
        with open_artifact(out) as art:
            v = art.manifest.variants[0]
            assert v.extra.get("cuda_graph", False) is graph
            assert (b"vm.builtin.cuda_graph.run_or_capture" in art.member(v.library).read_bytes()) is graph


@needs_nvrtc
def test_large_elementwise_kernels_are_vectorized():
    """int8 quantize and NCHW->NHWC transposes: 4 elements per thread (dlight's fallback: one)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([8, 56, 56, 256], "float32"))
    y = relax.Var("y", relax.TensorType([8, 256, 56, 56], "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            q = relax.op.divide(x, relax.const(np.float32(0.1)))
            q = relax.op.astype(relax.op.clip(relax.op.round(q), -127, 127), "int8")
            out = bb.emit_output(relax.Tuple([q, relax.op.permute_dims(y, [0, 2, 3, 1])]))
        bb.emit_func_output(out)
    scripts = _schedule_and_compile("h200", bb.get())
    assert len(scripts) == 2 and all("T.vectorized(T.int64(4))" in s for s in scripts)


def _int8_conv1x1(nhwc: list[int], out_channels: int, epilogue, weight: str = "w"):
    """A Relax module: NHWC int8 1x1 conv (OHWI int8 weights named ``weight``), int32 result through
    ``epilogue``."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(nhwc, "int8"))
    w = relax.Var(weight, relax.TensorType([out_channels, 1, 1, nhwc[-1]], "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(x, w, data_layout="NHWC", kernel_layout="OHWI", out_dtype="int32")
            out = bb.emit_output(epilogue(y))
        bb.emit_func_output(out)
    return bb.get()


def _nhwc_int8_conv(n: int, hw: int, c: int, o: int, k: int):
    from benchmarks.gpu_conv_int8 import conv_module

    return conv_module(n, hw, c, o, k, 1)


def test_int8_tile_shrinks_until_every_sm_has_a_block():
    from inferx_edge.compiler.cuda import DEFAULT_TILE, TILE_LADDER, tile_for

    assert tile_for((64 * 56 * 56, 256, 576), 132) == DEFAULT_TILE  # batch 64: the big tile
    assert tile_for((49, 512, 4608), None) == DEFAULT_TILE  # no SM count: the big tile
    small = tile_for((49, 512, 4608), 132)  # batch-1 layer 4: 4 blocks with the big tile
    assert small == TILE_LADDER[-1] and small.warps_i * small.frags_i * 16 == 32
    # batch-64 layer 4 (3136 x 512): 25 x 4 blocks of 128x128 < 132 SMs; 64x128 gives 49 x 4
    assert tile_for((3136, 512, 2048), 132) == TILE_LADDER[1]


def test_int8_tile_does_not_double_64_output_channels():
    from inferx_edge.compiler.cuda import DEFAULT_TILE, tile_for

    def tile(c):
        return 16 * c.warps_i * c.frags_i, 16 * c.warps_j * c.frags_j

    assert tile(tile_for((64 * 56 * 56, 64, 576), 132)) == (128, 64)  # ResNet-50 layer 1, batch 64
    assert tile(tile_for((64 * 112 * 112, 64, 196), None)) == (128, 64)  # its stem
    assert tile(tile_for((64 * 14 * 14, 160, 960), 132)) == (128, 64)  # 160 -> 192, not 256
    assert tile_for((64 * 56 * 56, 96, 576), 132) == DEFAULT_TILE  # 96 -> 128 either way
    assert tile_for((64 * 7 * 7, 576, 96), None) == DEFAULT_TILE  # 640 for 576: within 1/8


def test_narrow_int8_gemms_get_narrow_tiles_and_shallow_stages():
    """MobileNetV2's 16-32-channel pointwise convolutions: tensor cores with 16- or 32-column tiles and
    32-deep stages for K <= 32, instead of CUDA cores."""
    from inferx_edge.compiler.cuda import tile_for

    def tile(c):
        return 16 * c.warps_i * c.frags_i, 16 * c.warps_j * c.frags_j, 16 * c.k_frags

    assert tile(tile_for((64 * 56 * 56, 24, 144), 132)) == (128, 32, 64)  # project 144 -> 24
    assert tile(tile_for((64 * 112 * 112, 16, 32), 132)) == (128, 16, 32)  # project 32 -> 16
    assert tile(tile_for((64 * 56 * 56, 144, 24), 132))[1:] == (64, 32)  # expand 24 -> 144
    assert tile(tile_for((64 * 14 * 14, 48, 576), 132))[1] == 16  # 48 = 3 x 16, not 64
    assert tile(tile_for((64 * 56 * 56, 64, 576), 132))[1] == 64  # 64 channels as before


@needs_nvrtc
@pytest.mark.parametrize("c,o", [(144, 24), (24, 144), (32, 16)])
def test_narrow_int8_convolutions_run_on_tensor_cores(c, o):
    (script,) = _schedule_and_compile("h200", _nhwc_int8_conv(8, 28, c, o, 1))
    assert _int8_tensor_cores(script)


@needs_nvrtc
def test_int8_mma_kernel_compiles_with_onnx_style_weight_names():
    """TVM 0.27's mma.sync codegen substitutes the letters A-F of its asm template one after another:
    a weight buffer named like ONNX's ``onnx::Conv_566`` got the accumulator's address spliced into
    its name (the CUDA did not compile) until the schedule renamed the kernel's buffers."""
    from tvm import relax

    mod = _int8_conv1x1([8, 14, 14, 128], 128, lambda y: relax.op.astype(y, "float32"), weight="onnx__Conv_5_int8")
    (script,) = _schedule_and_compile("h200", mod)
    assert _int8_tensor_cores(script) and "onnx__conv_5_int8" in script


@needs_nvrtc
def test_batch1_int8_convolution_with_49_rows_runs_on_tensor_cores():
    """ResNet-50's last 3x3 conv at batch 1 (7x7 pixels): a 32x32 tile on tensor cores (it ran on CUDA
    cores when tensor cores needed 64 rows)."""
    (script,) = _schedule_and_compile("h200", _nhwc_int8_conv(1, 7, 512, 512, 3))
    assert _int8_tensor_cores(script)
    assert 'T.thread_binding(T.int64(16), thread="blockIdx.y")' in script  # 512 / 32 column tiles


@needs_nvrtc
def test_int8_activations_use_16_byte_loads_unless_predicated():
    """16-byte activation loads where nothing pads them; 4 bytes for a padded conv input (TVM 0.27
    miscompiles predicated wider int8 loads: make_int4 of 16 chars) and for weights."""
    (unpadded,) = _schedule_and_compile("h200", _nhwc_int8_conv(8, 16, 256, 256, 1))
    assert unpadded.count("T.vectorized(T.int64(16))") == 1
    (padded,) = _schedule_and_compile("h200", _nhwc_int8_conv(8, 16, 64, 64, 3))
    assert "T.vectorized(T.int64(16))" not in padded


def test_constant_int8_vectors_are_packed_into_ints():
    from inferx_edge.compiler.cuda import fix_int8_vector_constants

    zeros = "make_int4(" + ", ".join(["(signed char)0"] * 16) + ")"
    assert fix_int8_vector_constants(f"v = {zeros};") == "v = make_int4(0, 0, 0, 0);"
    mixed = "make_int2(" + ", ".join(["(signed char)-1"] * 7 + ["(signed char)3"]) + ")"
    assert fix_int8_vector_constants(mixed) == "make_int2(-1, 67108863)"  # bytes ff ff ff 03, little-endian
    assert fix_int8_vector_constants("make_int4(a, b, c, d)") == "make_int4(a, b, c, d)"


@needs_nvrtc
def test_int8_accumulators_leave_registers_without_warp_shuffles():
    """TVM reads the accumulators it stores to shared memory through a __shfl_sync of the thread's
    own lane (one per value); the CUDA source the device compiler gets has none left."""
    from inferx_edge.compiler.cuda import drop_own_lane_shuffles

    source = _kernel_source("h200", _int8_matmul_module(256), "2x4.2x4.k4.v16.a8.w16.async.mma")
    own = "__shfl_sync(__activemask(), matmul_intermediate_reindex_shared_dyn_warp_ptr["
    assert "mma.sync.aligned.m16n8k32" in source and own in source
    assert "__shfl_sync(__activemask()" not in drop_own_lane_shuffles(source)


def test_own_lane_shuffles_are_dropped_and_others_kept():
    from inferx_edge.compiler.cuda import drop_own_lane_shuffles as drop

    assert drop("x = __shfl_sync(__activemask(), a[f(b, c)], ((int)threadIdx.x), 32);") == "x = (a[f(b, c)]);"
    kept = (
        "x = __shfl_sync(__activemask(), a[i], (((int)threadIdx.x) + 1), 32);",  # another lane
        "x = __shfl_sync(__activemask(), a[i], ((int)threadIdx.x), 16);",  # half-warp groups
        "x = __shfl_sync(mask, a[i], ((int)threadIdx.x), 32);",
        "#define __shfl_sync(mask, var, lane, width) __shfl((var), (lane), (width))",
    )
    for code in kept:
        assert drop(code) == code
    two = "y = __shfl_sync(__activemask(), p[0], ((int)threadIdx.x), 32) + __shfl_sync(__activemask(), q, ((int)threadIdx.x), 32);"
    assert drop(two) == "y = (p[0]) + (q);"


@needs_nvrtc
@pytest.mark.parametrize("pipeline", ["", "async3"])
def test_two_fragment_buffers_load_the_next_step_while_multiplying(pipeline):
    """.r2: the loop over 32-deep steps inside a shared-memory stage is software-pipelined (its first
    step's ldmatrix loads hoisted into a prologue), with or without the cp.async pipeline around it:
    twice the ldmatrix call sites of the one-buffer kernel."""
    tile = "2x4.2x4.k8.v16" + (f".{pipeline}" if pipeline else "")
    mod = _int8_matmul_module(256, 256, 1024)
    one, two = (
        next(k for k in _kernel_source("h200", mod, t).split("__global__") if "mma.sync" in k)
        for t in (tile + ".mma", tile + ".r2.mma")
    )
    assert one.count("ldmatrix") and two.count("ldmatrix") == 2 * one.count("ldmatrix")


@needs_nvrtc
def test_padded_convolution_compiles_with_16_byte_predicated_loads():
    """A 16-byte load of a padded input takes a 16-lane int8 zero outside the image, which TVM 0.27
    prints as make_int4 of 16 chars (does not compile) unless the CUDA source is repaired."""
    from tvm import relax

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import DEFAULT_TILE, cuda_pipeline, device_compiler
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.targets import get_target

    import_tensor_intrinsics()
    spec = get_target("h200")
    target = resolve_tvm_target(spec)
    cfg = replace(DEFAULT_TILE, padded_vector=16)
    with device_compiler(spec, "cubin"), target:
        ex = relax.build(_nhwc_int8_conv(8, 16, 64, 64, 3), target, relax_pipeline=cuda_pipeline(target, cfg))
    (cuda,) = [m for m in ex.mod.imports[0].imports if m.kind == "cuda"]
    assert "int4 condval" in cuda.inspect_source("cuda")  # the predicated 16-byte activation load


@needs_nvrtc
@pytest.mark.parametrize("pipeline,in_flight", [("async", 1), ("async3", 2), ("async4", 3)])
def test_async_copy_pipeline_compiles_to_cp_async(pipeline, in_flight):
    """cp.async double (async), triple (async3) or quadruple (async4) buffering: the main loop waits
    until at most 1, 2 or 3 stages' copies are pending."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import pass_config, resolve_tvm_target
    from inferx_edge.compiler.cuda import DEFAULT_TILE, cuda_pipeline, device_compiler, tensor_core_schedule
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.targets import get_target

    import_tensor_intrinsics()
    spec = get_target("a100")
    target = resolve_tvm_target(spec)
    cfg = replace(DEFAULT_TILE, pipeline=pipeline, k_frags=8)
    with device_compiler(spec, "cubin") as record, target, pass_config(async_copy=True):
        ex = relax.build(_nhwc_int8_conv(8, 16, 1024, 256, 1), target, relax_pipeline=cuda_pipeline(target, cfg))
    # the compiled kernel had its copies spread over the math where another stage is in flight
    assert record["interleaved_pipeline_loops"] == (in_flight >= 2)
    (cuda,) = [m for m in ex.mod.imports[0].imports if m.kind == "cuda"]
    source = cuda.inspect_source("cuda")
    kernel = source.split("__global__")[-1]
    assert "cp.async.commit_group" in source and "ptx_cp_async" in kernel
    assert f"wait_group_{in_flight}();" in kernel and f"wait_group_{in_flight + 1}();" not in kernel
    with target:
        legal = relax.transform.LegalizeOps()(_nhwc_int8_conv(8, 16, 256, 256, 1))
    func = next(f for _, f in legal.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    with pytest.raises(ValueError, match="unknown tile load pipeline"):
        tensor_core_schedule(func, target, replace(DEFAULT_TILE, pipeline="reg"))


def test_compiler_errors_keep_the_errors_not_the_warnings():
    from inferx_edge.compiler.cuda import compiler_errors

    log = "\n".join(
        [
            f'k.cu({i}): warning #177-D: variable "v{i}" was declared but never referenced\n  int v;\n  ^'
            for i in range(400)
        ]
        + ["k.cu(900): error: too many arguments in function call", "  make_int4(0, 0, 0, 0, 0)", "  ^"]
        + ['1 error detected in the compilation of "k.cu".']
    )
    text = compiler_errors(log)
    assert text.startswith("k.cu(900): error: too many arguments") and "make_int4" in text and "warning" not in text
    assert compiler_errors("ptxas fatal: something") == "ptxas fatal: something"


def _relu6_depthwise(clip_first: bool):
    """conv -> (ReLU6 if clip_first) -> depthwise conv, NCHW batch 2; weights as parameters."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 8, 10, 10], "float32"))
    w1 = relax.Var("w1", relax.TensorType([16, 8, 1, 1], "float32"))
    w2 = relax.Var("w2", relax.TensorType([16, 1, 3, 3], "float32"))
    with bb.function("main", [x, w1, w2], attrs={"num_input": 1}):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w1))
            if clip_first:
                y = bb.emit(relax.op.clip(y, 0, 6))
            out = bb.emit_output(relax.op.nn.conv2d(y, w2, padding=[1, 1, 1, 1], groups=16))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("clip_first", [True, False])
def test_float_depthwise_reads_fp16_only_behind_a_clip(clip_first):
    """int8 CUDA variants keep depthwise convs float; behind a ReLU6 their input is stored fp16
    (bounded: cannot overflow); an unbounded input stays fp32. Same results within fp16 rounding."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import clip_to_min_max, convert_layout, fp16_bounded_depthwise

    mod = convert_layout(_relu6_depthwise(clip_first), "NHWC")
    rewritten = fp16_bounded_depthwise(mod)
    convs = [
        b.value
        for blk in rewritten["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.conv2d"
    ]
    dtypes = [(str(c.args[0].ty.dtype), str(c.ty.dtype)) for c in convs]
    assert dtypes == [("float32", "float32"), ("float16" if clip_first else "float32", "float32")]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 8, 10, 10), (16, 8, 1, 1), (16, 1, 3, 3))]

    def run(m):
        vm = relax.VirtualMachine(relax.build(m, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()

    ref = run(clip_to_min_max(_relu6_depthwise(clip_first)))
    np.testing.assert_allclose(run(rewritten), ref, rtol=2e-3, atol=2e-3 * np.abs(ref).max())


@needs_nvrtc
def test_int8_quantize_epilogue_stores_4_bytes_at_a_time():
    """The rounding step of an int8 quantize (TIR nearbyint) used to make TVM scalarize the conv
    epilogue: one byte stored per instruction. It now runs per lane inside the vectorized epilogue,
    whose steps are unrolled."""
    import re

    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import pass_config, resolve_tvm_target
    from inferx_edge.compiler.cuda import EPILOGUE_UNROLL, cuda_pipeline, device_compiler
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.targets import get_target

    def quantize(y):
        q = relax.op.round(relax.op.multiply(relax.op.astype(y, "float32"), relax.const(np.float32(0.01))))
        return relax.op.astype(relax.op.clip(q, -127, 127), "int8")

    mod = _int8_conv1x1([8, 28, 28, 64], 256, quantize)
    import_tensor_intrinsics()
    spec = get_target("h200")
    target = resolve_tvm_target(spec)
    with device_compiler(spec, "cubin"), target, pass_config():
        ex = relax.build(mod, target, relax_pipeline=cuda_pipeline(target, sm_count=spec.sm_count))
    (cuda,) = [m for m in ex.mod.imports[0].imports if m.kind == "cuda"]
    source = cuda.inspect_source("cuda")
    assert re.search(r"\.w = nearbyintf\(", source)  # the rounding, per lane of a float4
    assert not re.search(r"_s < 4", source)  # no scalarized epilogue loop
    # 8 steps of 4 lanes unrolled (a 64 x 128 tile: 16 steps per thread), their loads issued together
    assert source.count("nearbyintf(") == 4 * EPILOGUE_UNROLL
    assert isinstance(tvm.ir.Op.get("tirx.nearbyint").get_attr("TVectorizable"), (bool, int))


def _int8_nhwc_conv(n, h, w, c, o, k, pad, stride):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, h, w, c], "int8"))
    wt = relax.Var("w", relax.TensorType([o, k, k, c], "int8"))
    with bb.function("main", [x, wt]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, wt, stride, pad, 1, 1, "NHWC", "OHWI", "NHWC", "int32"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    "shape",
    [
        (2, 16, 16, 3, 8, 7, 3),  # ResNet-50's stem, smaller: 7x7, odd padding -> 4x4 over 16 channels
        (1, 28, 28, 1, 24, 3, 1),  # MobileNetV2's / the embedded model's: 3x3 -> 2x2
        (2, 12, 10, 4, 5, 3, 0),  # no padding, H != W
        (1, 10, 10, 2, 3, 5, 2),  # even padding, odd kernel
        (1, 8, 8, 4, 4, 4, 1),  # even kernel, odd padding
        (1, 14, 14, 3, 6, 3, (1, 0, 1, 1)),  # asymmetric padding
    ],
)
def test_stride2_small_channel_int8_convs_run_on_a_space_to_depth_input(shape):
    """RGB-like stride-2 int8 convolutions become stride-1 ones over 16-channel space-to-depth pixels
    (compiler.passes.space_to_depth_int8_convs): the same int32 sums, run on this CPU."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import convert_layout

    n, h, w, c, o, k, pad = shape
    mod = _int8_nhwc_conv(n, h, w, c, o, k, pad, 2)
    rewritten = convert_layout(mod, "NHWC")
    convs = [
        b.value
        for blk in rewritten["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.conv2d"
    ]
    assert len(convs) == 1 and [int(s) for s in convs[0].attrs.strides] == [1, 1]
    assert [int(d) for d in convs[0].args[0].ty.shape.values] == [n, h // 2, w // 2, 16]
    rng = np.random.default_rng(0)
    x = rng.integers(-127, 128, (n, h, w, c)).astype(np.int8)
    wt = rng.integers(-127, 128, (o, k, k, c)).astype(np.int8)
    outs = []
    for m in (mod, rewritten):
        vm = relax.VirtualMachine(relax.build(m, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(wt)).numpy())
    np.testing.assert_array_equal(outs[1], outs[0])


@pytest.mark.parametrize(
    "shape,stride",
    [
        ((1, 16, 16, 3, 8, 3, 1), 1),
        ((1, 16, 16, 8, 8, 3, 1), 2),
        ((1, 16, 16, 4, 8, 1, 0), 2),
        ((1, 15, 15, 3, 8, 3, 1), 2),
    ],
)
def test_space_to_depth_leaves_other_convolutions(shape, stride):
    """Stride 1, more than 4 channels, 1x1 kernels and odd sizes keep their convolution."""
    from inferx_edge.compiler.passes import space_to_depth_int8_convs

    mod = _int8_nhwc_conv(*shape, stride)
    assert "reshape" not in space_to_depth_int8_convs(mod).script()


@needs_nvrtc
@pytest.mark.parametrize("intrin", ["mma", "wmma"])
def test_padded_accumulator_tile_changes_only_its_row_stride(intrin):
    """``acc_pad`` 8: the shared int32 tile the epilogue reads has rows of 128 + 8 ints (the mma store
    wrote 8 rows per instruction into the same 4 banks); without it, rows of 128."""
    import re

    from tvm import relax

    from inferx_edge.compiler.compile import pass_config, resolve_tvm_target
    from inferx_edge.compiler.cuda import DEFAULT_TILE, cuda_pipeline, device_compiler
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.targets import get_target

    import_tensor_intrinsics()
    spec = get_target("h200")
    target = resolve_tvm_target(spec)
    strides = []
    for pad in (0, 8):
        cfg = replace(DEFAULT_TILE, intrin=intrin, acc_pad=pad)  # 128 x 128 tile
        with device_compiler(spec, "cubin"), target, pass_config():
            ex = relax.build(_nhwc_int8_conv(8, 16, 256, 256, 1), target, relax_pipeline=cuda_pipeline(target, cfg))
        (cuda,) = [m for m in ex.mod.imports[0].imports if m.kind == "cuda"]
        kernel = cuda.inspect_source("cuda").split("__global__")[-1]
        # the epilogue's 16-byte reads of the accumulator tile: row index (threadIdx.x >> 4) times the row stride
        reads = re.findall(
            r"\*\(int4\*\)\(\(\(int\*\)buf_dyn_shmem_ptr\) \+ [^;]*?threadIdx\.x\) >> 4\) \* (\d+)\)", kernel
        )
        assert reads, kernel[-3000:]
        strides.append(int(reads[0]))
    assert strides == [128, 136]


@needs_nvrtc
@pytest.mark.parametrize("pipeline", ["", "async"])
def test_16_byte_weight_loads_compile_for_ohwi_conv_weights(pipeline):
    """``weight_vector`` 16: the conv's OHWI int8 weight (contiguous along K) is loaded 16 bytes at a
    time, synchronously or with cp.async; by default 4."""
    from tvm import relax

    from inferx_edge.compiler.compile import pass_config, resolve_tvm_target
    from inferx_edge.compiler.cuda import DEFAULT_TILE, cuda_pipeline, device_compiler
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.targets import get_target

    import_tensor_intrinsics()
    spec = get_target("h200")
    target = resolve_tvm_target(spec)
    widths = []
    for wv in (4, 16):
        cfg = replace(DEFAULT_TILE, pipeline=pipeline, weight_vector=wv)
        with device_compiler(spec, "cubin"), target, pass_config(async_copy=True):
            ex = relax.build(_nhwc_int8_conv(8, 16, 256, 256, 3), target, relax_pipeline=cuda_pipeline(target, cfg))
        (cuda,) = [m for m in ex.mod.imports[0].imports if m.kind == "cuda"]
        kernel = cuda.inspect_source("cuda").split("__global__")[-1]
        if pipeline:  # the copy helper named by its width, called with the weight as source
            widths.append(
                sorted({int(n) for n in re.findall(r"cp_async_legacy_c[ag]_(\d+)_\d+_\d+\([^;]*, w_ptr,", kernel)})
            )
        else:
            widths.append(sorted({{"int": 4, "int4": 16}[t] for t in re.findall(r"= \*\((int4?)\*\)\(w_ptr", kernel)}))
    assert widths == [[4], [16]]


def _main_loop(kernel: str) -> str:
    """The body of the first loop of ``kernel`` that commits a cp.async group (the pipelined k loop)."""
    from inferx_edge.compiler.cuda.c_scanner import _close

    for m in re.finditer(r"for \(int (\w+) = 0; \1 < \d+; \+\+\1\) \{", kernel):
        body = kernel[m.end() : _close(kernel, m.end() - 1)]
        if "commit_group();" in body:
            return body
    raise AssertionError("no pipelined loop")


@needs_nvrtc
@pytest.mark.parametrize(
    "tile,lead",
    [
        ("2x4.4x4.k8.v16.a8.w16.async3.mma", 2),  # the 8-warp 128x256 tile
        ("2x4.4x4.k8.v16.a8.w16.r2.async3.mma", 2),  # with fragment double buffering
        ("2x4.2x4.k8.v16.async4.mma", 3),  # four buffers
    ],
)
def test_pipelined_copies_are_spread_over_the_math_steps(tile, lead):
    """TVM's pipelined loop (barrier, all copies of stage k+L, commit, wait(L), barrier, math) becomes
    CUTLASS's: wait(L-1), one barrier, the math with each 32-deep step issuing its share of the
    copies, commit; the build's CUDA record counts the loops it rewrote."""
    from inferx_edge.compiler.cuda import interleave_pipelined_copies

    source = _kernel_source("h200", _int8_matmul_module(256, 512, 2048), tile)
    kernel = next(k for k in source.split("__global__") if "mma.sync" in k)
    before = _main_loop(kernel)
    assert before.count("__syncthreads();") == 2 and f"wait_group_{lead}();" in before
    new, changed = interleave_pipelined_copies(source)
    assert changed == 1 and interleave_pipelined_copies(new)[1] == 0  # rewritten loops do not match again
    after = _main_loop(next(k for k in new.split("__global__") if "mma.sync" in k))
    assert after.count("__syncthreads();") == 1 and f"wait_group_{lead - 1}();" in after
    head, _, math = after.partition("__syncthreads();")
    assert "ptx_cp_async_legacy" not in head and math.rstrip().endswith("commit_group();")
    # every copy now sits inside the loop over 32-deep steps, split by that loop's variable
    steps = re.search(r"for \(int (\w+) = 0; \1 < (\d+); \+\+\1\) \{", math)
    spread = re.findall(rf"for \(int (\w+) = {steps.group(1)} \* (\d+); ", math)
    assert len(spread) == 2 and math.index("ptx_cp_async_legacy") > steps.start()
    copies = dict(re.findall(r"for \(int (\w+) = 0; \1 < (\d+); \+\+\1\) \{\s*ptx_cp_async_legacy", before))
    assert all(int(per) * int(steps.group(2)) >= int(copies[v]) for v, per in spread)  # every copy, once


@needs_nvrtc
def test_padded_convolutions_keep_their_synchronous_loads_ahead_of_the_math():
    """A padded convolution loads its activations synchronously (predicated, zero outside the image):
    those loads stay in one burst right after the barrier; the weights' cp.async copies are spread."""
    from inferx_edge.compiler.cuda import interleave_pipelined_copies

    source = _kernel_source("h200", _nhwc_int8_conv(8, 16, 256, 256, 3), "2x4.2x4.k8.v16.p16.a8.w16.async3.mma")
    new, changed = interleave_pipelined_copies(source)
    assert changed == 1
    after = _main_loop(next(k for k in new.split("__global__") if "mma.sync" in k))
    steps = re.search(
        r"for \(int (\w+) = 0; \1 < \d+; \+\+\1\) \{", after.split("__syncthreads();")[1].split("condval")[-1]
    )
    first_step = after.index(steps.group(0))
    assert after.count("__syncthreads();") == 1 and after.index("condval") < first_step < after.index(
        "ptx_cp_async_legacy"
    )


def test_interleaving_leaves_other_loops_alone():
    """Loops without TVM's pipeline shape are not touched: no cp.async group, a second barrier among
    the copies, a stage of one step (nothing to spread over), two buffers (one stage in flight)."""
    from inferx_edge.compiler.cuda.c_scanner import _statements
    from inferx_edge.compiler.cuda.source_patches import interleave_pipelined_copies

    plain = "__global__ void k(int* a) {\n  for (int i = 0; i < 4; ++i) {\n    a[i] = 1;\n  }\n}\n"
    assert interleave_pipelined_copies(plain) == (plain, 0)
    loop = (
        "  for (int k0 = 0; k0 < 6; ++k0) {\n    __syncthreads();\n"
        "    for (int c = 0; c < 4; ++c) {\n      ptx_cp_async_legacy_cg_16_1_1(s, c, g, k0);\n    }\n"
        "    tvm_builtin_ptx_cp_async_commit_group_async_commit_group();\n"
        "    tvm_builtin_ptx_cp_async_wait_group_async_wait_group_2();\n    __syncthreads();\n"
        "    for (int k1 = 0; k1 < STEPS; ++k1) {\n      mma(k1);\n    }\n  }\n"
    )
    new, changed = interleave_pipelined_copies(loop.replace("STEPS", "2"))
    assert changed == 1 and "for (int c = k1 * 2; c < k1 * 2 + 2; ++c)" in new and new.count("__syncthreads") == 1
    assert "wait_group_1();" in new and new.rstrip().endswith("}")
    two_buffers = loop.replace("STEPS", "2").replace("wait_group_2", "wait_group_1")
    assert interleave_pipelined_copies(two_buffers)[1] == 0  # one stage in flight: left as TVM emits it
    assert interleave_pipelined_copies(loop.replace("STEPS", "1"))[1] == 0  # one step per stage
    barrier_inside = loop.replace("      ptx_cp_async", "      __syncthreads();\n      ptx_cp_async")
    assert interleave_pipelined_copies(barrier_inside.replace("STEPS", "2"))[1] == 0
    three = loop.replace("STEPS", "3").replace("c < 4", "c < 8")
    assert "c < min(k1 * 3 + 3, 8)" in interleave_pipelined_copies(three)[0]  # uneven shares
    # statements: braces inside asm strings and char literals, if/else chains, braceless bodies
    body = 'asm("{%0}" : "=r"(x));\nif (a) { b(); } else if (c) { d(); } else { e(); }\nchar q = \'{\';\nfor (;;) f();\n{ g(); }'
    assert _statements(body) == [
        'asm("{%0}" : "=r"(x));',
        "if (a) { b(); } else if (c) { d(); } else { e(); }",
        "char q = '{';",
        "for (;;) f();",
        "{ g(); }",
    ]
