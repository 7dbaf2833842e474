"""The dlight rules of the CUDA pipeline: small and window reductions in registers, vectorized elementwise kernels."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.helpers import (
    grouped_conv,
    kernel_source,
    needs_nvrtc,
    nhwc_fp16_small_reduction,
    schedule_and_compile,
    small_conv_module,
)


@needs_nvrtc
@pytest.mark.parametrize("kind", ["depthwise", "pool"])
def test_small_reductions_get_one_output_per_thread(kind):
    """dlight gave these one 256-thread block per output element (9 products shared by 256 threads)."""
    (script,) = schedule_and_compile("h200", small_conv_module(kind))
    assert 'thread="threadIdx.x"' in script and "T.unroll" in script
    assert 'scope="local"' in script  # the accumulator (and any epilogue) stays in the thread
    assert "cross_thread" not in script and "tvm_thread_allreduce" not in script


@needs_nvrtc
@pytest.mark.parametrize("kind", ["depthwise", "depthwise-fp16", "pool"])
def test_fp16_nhwc_small_reductions_take_eight_channels_and_two_pixels_per_thread(kind):
    """Each thread copies its padded window of 8 channels into registers with 16-byte loads (the
    bounds test once per load), the depthwise weights too, for 2 pixels along W (3x3 windows: the wide
    outputs cap it at 2; int8 out has room for 4 but batch 8 keeps the thread count up with 2); the
    outputs leave 4 elements at a time. The stride-1 conv's blocks are 8 output rows x 12 threads of
    channels; over the 28 output rows of the stride-2 kernels no row count makes whole warps of 12-thread
    rows, so their blocks are 64 threads along W."""
    from inferx_edge.compiler.cuda import SMALL_REDUCTION_CHANNELS

    assert SMALL_REDUCTION_CHANNELS == 8
    kernel = kernel_source("h200", nhwc_fp16_small_reduction(kind)).split("__global__")[-1]
    threads = 96 if kind == "depthwise-fp16" else 64
    assert f"__launch_bounds__({threads})" in kernel and "tvm_thread_allreduce" not in kernel
    # 3 rows x the columns 2 pixels' windows span: 5 at stride 2, 4 at stride 1
    columns = 4 if kind == "depthwise-fp16" else 5
    assert len(re.findall(r"= \*\(uint4\*\)\(x_ptr \+", kernel)) == 3 * columns
    if kind != "pool":
        assert len(re.findall(r"= \*\(uint4\*\)\(w_ptr \+", kernel)) == 9  # 8 channels x 9 taps
    if kind == "depthwise":
        assert len(re.findall(r"\*\(int\*\)\(\w+_ptr \+ [^;]*\) = ", kernel)) == 4  # 2 pixels x 2 x 4 int8
    else:  # fp16 out: 2 pixels x 2 x 4 halves (the 0-d ReLU6 bounds: read as they are)
        assert len(re.findall(r"\*\(half4\*\)\(\w+_ptr \+ [^;]*\) = ", kernel)) == 4


def _depthwise(n, hw, c, k, stride, out_dtype="float32", group_width=1):
    """A depthwise (or narrow grouped) fp16 NHWC conv with HWIO weights and a bias, fused as build
    fuses it; ``out_dtype`` int8 adds a quantize epilogue."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, hw, hw, c], "float16"))
    w = relax.Var("w", relax.TensorType([k, k, group_width, c], "float16"))
    b = relax.Var("b", relax.TensorType([1, 1, 1, c], "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(
                x, w, strides=[stride] * 2, padding=[k // 2] * 4, groups=c // group_width, data_layout="NHWC",
                kernel_layout="HWIO", out_dtype="float32",
            )  # fmt: skip
            y = relax.op.add(y, b)
            if out_dtype == "int8":
                y = relax.op.astype(
                    relax.op.clip(relax.op.round(relax.op.multiply(y, relax.const(np.float32(9.0)))), -127, 127), "int8"
                )
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return _fused_kernel(bb.get(), "")


#: (shape, out dtype, pixels along W taken, heavy: the CPU check of its schedule takes 7-16 s on a 2-core
#: host and is a slow test)
_SMALL_REDUCTIONS = [
    ((8, 56, 96, 7, 1), "float32", 7, True),  # ConvNeXt's 7x7: a row of 13 columns serves 7 pixels
    ((64, 14, 384, 7, 1), "float32", 7, True),  # W = 14: 7 divides it
    # ... at batch 16 7 pixels would leave too few threads; 4 does not divide W
    ((16, 14, 384, 7, 1), "float32", 2, False),
    ((8, 7, 768, 7, 1), "float32", 1, False),  # W = 7: a whole row would leave too few threads at batch 8
    ((64, 7, 768, 7, 1), "float32", 7, True),  # ... at batch 64 a thread takes the whole 7-pixel row
    ((8, 56, 128, 3, 1, "int8", 4), None, 7, True),  # ResNeXt's 4-channel groups (36 elements: wide), int8 out
    ((8, 56, 144, 3, 1), "float32", 2, False),  # 3x3 with fp32 out: capped at 2
    ((16, 56, 144, 3, 2), "int8", 4, False),  # 3x3 with int8 out, stride 2
    ((8, 56, 144, 3, 2), "int8", 2, False),  # ... at batch 8 4 pixels would leave too few threads
    ((1, 28, 64, 5, 1), "float32", 1, False),
]


def _small_reduction(shape, out_dtype):
    """The kernel and its schedule for h200."""
    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import channel_vectorized_reduction
    from inferx_edge.targets import get_target

    if out_dtype is None:  # grouped: (n, hw, c, k, stride, out dtype, group width)
        *shape, out_dtype, group_width = shape
    else:
        group_width = 1
    n, hw, c, k, stride = shape
    func = _depthwise(n, hw, c, k, stride, out_dtype, group_width)
    with resolve_tvm_target(get_target("h200")) as target:
        sch = channel_vectorized_reduction(func, target)
    assert sch is not None
    return func, sch


@pytest.mark.parametrize("shape, out_dtype, pixels", [case[:3] for case in _SMALL_REDUCTIONS])
def test_small_reductions_take_pixels_along_w(shape, out_dtype, pixels):
    """The pixels along W per thread follow the window, the output width, W's divisors and the thread
    count."""
    from benchmarks.gpu_small_reduction import pixels_taken
    from inferx_edge.compiler.cuda import SMALL_REDUCTION_CHANNELS
    from inferx_edge.compiler.cuda.rules.small_reduction import SMALL_REDUCTION_PIXELS, WIDE_WINDOW_PIXELS

    func, _ = _small_reduction(shape, out_dtype)
    assert pixels_taken(func, "h200", SMALL_REDUCTION_CHANNELS, SMALL_REDUCTION_PIXELS, WIDE_WINDOW_PIXELS) == pixels


@pytest.mark.parametrize(
    "shape, out_dtype",
    [
        pytest.param(shape, dtype, marks=[pytest.mark.slow] if heavy else [])
        for shape, dtype, _, heavy in _SMALL_REDUCTIONS
    ],
)
def test_small_reduction_schedules_match_the_unscheduled_kernel(shape, out_dtype):
    """Run serially on the CPU, the schedule gives the unscheduled kernel's outputs exactly."""
    from inferx_edge.compiler.schedule_check import check_kernel

    func, sch = _small_reduction(shape, out_dtype)
    assert check_kernel(func, sch.mod["main"]) == 0.0


@pytest.mark.parametrize(
    "shape, out_dtype, aim, rows",
    [
        ((8, 56, 128, 3, 1, "int8", 4), None, 4, 4),  # ResNeXt's 4-channel groups: 4 rows x 16 threads
        ((8, 56, 96, 7, 1), "float32", 4, 8),  # 12 threads a row: 8 rows make 3 warps (4 would make 1.5)
        ((64, 14, 384, 7, 1), "float32", 4, 2),  # 48 threads a row: 2 rows (4 does not divide H)
        ((64, 7, 768, 7, 1), "float32", 4, 1),  # 96 threads a row: 7 rows would be 672 threads
        ((8, 56, 144, 3, 1), "float32", 4, 1),  # 18 threads a row: whole warps need 16 rows, 288 threads
        ((8, 56, 128, 3, 1, "int8", 4), None, 8, 8),  # the aim moves it
        ((8, 56, 128, 3, 1, "int8", 4), None, 1, 1),  # 1: off
    ],
)
def test_small_reduction_blocks_take_output_rows(shape, out_dtype, aim, rows):
    """Thread blocks hold a few whole output rows of the same pixels (whole warps, H divisible), so the
    input rows their windows share are read once per block; the schedule is still exact."""
    from benchmarks.gpu_small_reduction import rows_taken
    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import SMALL_REDUCTION_CHANNELS
    from inferx_edge.compiler.cuda.rules.small_reduction import channel_vectorized_reduction
    from inferx_edge.targets import get_target

    func, _ = _small_reduction(shape, out_dtype)
    assert rows_taken(func, "h200", SMALL_REDUCTION_CHANNELS, rows=aim) == rows
    with resolve_tvm_target(get_target("h200")) as target:
        sch = channel_vectorized_reduction(func, target, rows=aim)
    lanes = shape[2] // SMALL_REDUCTION_CHANNELS  # fp16 inputs: 8 channels a thread
    threads = rows * lanes if rows > 1 else 64
    assert re.search(rf"T.thread_binding\((T.int64\()?{threads}\)?, thread=.threadIdx.x.\)", sch.mod["main"].script())


def _int8_max_pool(n=8, hw=112, c=64, k=3, stride=2):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, hw, hw, c], "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = relax.op.nn.max_pool2d(x, [k, k], strides=[stride] * 2, padding=[k // 2] * 4, layout="NHWC")
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return _fused_kernel(bb.get(), "")


@pytest.mark.parametrize("shape", [(8, 112, 64, 3, 2), (2, 20, 64, 5, 1)])  # ResNet's stem pool, YOLO's SPPF
def test_int8_max_pools_take_sixteen_channels_per_thread(shape):
    """int8 max pooling (quantized activations) gets the same 16-byte loads as fp16: 16 channels per
    thread (pixels along W as the thread count allows), padded with -128, equal to the unscheduled
    kernel; the CUDA source (with the int8 vector-constant repair builds apply) compiles."""
    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import channel_vectorized_reduction
    from inferx_edge.compiler.schedule_check import check_kernel
    from inferx_edge.targets import get_target

    func = _int8_max_pool(*shape)
    target = resolve_tvm_target(get_target("h200"))
    with target:
        sch = channel_vectorized_reduction(func, target)
    assert sch is not None
    assert check_kernel(func, sch.mod["main"]) == 0.0
    assert re.search(r"T\.vectorized\(T\.int64\(16\)\)", sch.mod["main"].script())  # 16-byte loads


def _int8_pointwise_conv(n=8, hw=56, c=64):
    """A 1x1 int8 conv over ``c`` <= 64 input channels (int32 sums) with a requantize epilogue."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, hw, hw, c], "int8"))
    w = relax.Var("w", relax.TensorType([1, 1, c, c], "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(x, w, data_layout="NHWC", kernel_layout="HWIO", out_dtype="int32")
            y = relax.op.multiply(relax.op.astype(y, "float32"), relax.const(np.float32(0.01)))
            y = relax.op.astype(relax.op.clip(relax.op.round(y), -127, 127), "int8")
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return _fused_kernel(bb.get(), "")


@needs_nvrtc
def test_int8_convolutions_the_small_reduction_rule_sees_take_one_output_per_thread():
    """An int8 conv reducing <= 64 elements (int32 sums) that no tensor-core rule took: 16 channels
    per thread would need 16-lane int32 vectors, which CUDA codegen cannot print (the build failed);
    the rule gives it one output per thread, equal to the unscheduled kernel, and it compiles."""
    import tvm

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import channel_vectorized_reduction, device_compiler, small_reduction_rule
    from inferx_edge.compiler.schedule_check import check_kernel
    from inferx_edge.targets import get_target

    func = _int8_pointwise_conv()
    spec = get_target("h200")
    target = resolve_tvm_target(spec)
    with target:
        assert channel_vectorized_reduction(func, target) is None
        sch = small_reduction_rule().apply(func, target, False)
    assert sch is not None and re.search(
        r"T.thread_binding\((T.int64\()?256\)?, thread=.threadIdx.x.\)", sch.mod["main"].script()
    )
    assert check_kernel(func, sch.mod["main"]) == 0.0
    with device_compiler(spec, "cubin"), target:
        tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=target)


@needs_nvrtc
def test_small_reductions_keep_one_output_per_thread_when_channels_do_not_divide():
    kernel = kernel_source("h200", nhwc_fp16_small_reduction("depthwise", channels=36)).split("__global__")[-1]
    assert "__launch_bounds__(256)" in kernel and "uint4" not in kernel


@needs_nvrtc
def test_large_elementwise_kernels_are_vectorized_and_transposes_tiled():
    """int8 quantize: 4 elements per thread (dlight's fallback: one); an NCHW->NHWC transpose of 256
    channels goes through a shared-memory tile instead (``tiled_transpose``)."""
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
    scripts = schedule_and_compile("h200", bb.get())
    assert len(scripts) == 2
    (quantize,) = [s for s in scripts if '"int8"' in s and "T_transpose" not in s]
    (transpose,) = [s for s in scripts if s is not quantize]
    assert "T.vectorized(T.int64(4))" in quantize
    assert 'scope="shared"' in transpose


@needs_nvrtc
@pytest.mark.parametrize("target", ["a100", "h200"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_grouped_convolutions_get_a_register_tile_per_thread(target, dtype):
    """dlight gave each output of a grouped conv (144 products) a 256-thread block; now a thread
    accumulates 4 pixels x 4 channels in registers over a serial reduction loop, bias and ReLU applied
    in the thread."""
    kernel = kernel_source(target, grouped_conv(dtype=dtype)).split("__global__")[-1]
    assert "__launch_bounds__(128)" in kernel
    assert "tvm_thread_allreduce" not in kernel and "__shared__" not in kernel
    assert re.search(r"(float|half) group_conv2d_nhwc\w*_local\w*\[16\]", kernel)  # the 4x4 tile


def test_window_tile_shrinks_for_small_outputs_and_follows_divisibility():
    from inferx_edge.compiler.cuda.rules.window_reduction import MIN_WINDOW_THREADS, window_tile

    assert window_tile([64, 28, 28, 128]) == (4, 4)
    assert window_tile([64, 28, 30, 6]) == (2, 2)  # 30 and 6: 2 divides, 4 does not
    assert window_tile([1, 7, 7, 784]) == (1, 1)  # 38,416 outputs: one per thread
    p, c = window_tile([1, 56, 56, 64])
    assert 56 * 56 * 64 // (p * c) >= MIN_WINDOW_THREADS and (p, c) != (1, 1)


@needs_nvrtc
def test_row_reductions_are_left_to_dlight():
    """A softmax-like row sum has no window (no index mixes an output and a reduction axis): one thread
    per row would stride across rows, so the window rule declines it."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.cuda.pipeline import fusion_passes
    from inferx_edge.compiler.cuda.rules.window_reduction import window_reduction_rule

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([65536, 200], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.sum(x, axis=[1]))
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential(fusion_passes())(bb.get())
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    assert window_reduction_rule().apply(func, target, False) is None
    grouped = tvm.transform.Sequential(fusion_passes())(grouped_conv())
    (conv,) = [f for _, f in grouped.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert window_reduction_rule().apply(conv, target, False) is not None


def _fused_kernel(mod, name: str):
    """The PrimFunc of ``mod`` named like ``name`` after legalization and fusion as build does them."""
    import tvm

    from inferx_edge.compiler.cuda.pipeline import fusion_passes

    mod = tvm.transform.Sequential(fusion_passes())(mod)
    (func,) = [f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and name in gv.name_hint]
    return func


def _softmax(shape, dtype="float32"):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(x, axis=-1))
        bb.emit_func_output(out)
    return bb.get()


def _layernorm(shape, dtype="float32"):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    g, b = (relax.Var(n, relax.TensorType([shape[-1]], dtype)) for n in "gb")
    with bb.function("main", [x, g, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.layer_norm(x, g, b, axes=[-1]))
        bb.emit_func_output(out)
    return bb.get()


@needs_nvrtc
@pytest.mark.parametrize(
    "shape,kind,dtype,per_block",
    [
        ([2, 12, 197, 197], "softmax", "float32", 8),  # ViT attention: 4-d, a row length not a power of two
        ([8, 3, 49, 49], "softmax", "float16", 8),  # Swin window attention, fp16
        ([1, 197, 768], "layer_norm", "float32", 1),  # 197 rows (a prime): one warp per block
        ([4, 128, 384], "layer_norm", "float16", 8),
    ],
)
def test_short_row_reductions_take_one_warp_per_row(shape, kind, dtype, per_block):
    """Softmax and LayerNorm rows of at most 1024 elements: 32 threads own a row, the reductions are
    warp shuffles (no block-wide barrier), several rows per block; dlight gave each row a 256-thread
    block reduced through shared memory."""
    mod = (_softmax if kind == "softmax" else _layernorm)(shape, dtype)
    src = kernel_source("h200", mod).split("__global__")[-1]
    assert f"__launch_bounds__({32 * per_block})" in src
    assert "__shfl_down_sync" in src and "__syncthreads" not in src
    assert ("threadIdx.y" in src) == (per_block > 1)


def test_row_reduction_rule_declines_long_rows_few_rows_and_other_kernels():
    import tvm

    from inferx_edge.compiler.cuda.pipeline import fusion_passes
    from inferx_edge.compiler.cuda.rules.row_reduction import MAX_ROW, MIN_ROWS, row_reduction_rule

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    rule = row_reduction_rule()
    assert rule.apply(_fused_kernel(_softmax([MIN_ROWS, MAX_ROW]), "softmax"), target, False) is not None
    assert rule.apply(_fused_kernel(_softmax([MIN_ROWS, 2 * MAX_ROW]), "softmax"), target, False) is None
    assert rule.apply(_fused_kernel(_layernorm([MIN_ROWS // 2, 768]), "layer_norm"), target, False) is None
    conv = tvm.transform.Sequential(fusion_passes())(grouped_conv())
    assert all(
        rule.apply(f, target, False) is None for _, f in conv.functions_items() if isinstance(f, tvm.tirx.PrimFunc)
    )
    cpu = tvm.target.Target({"kind": "llvm"})
    assert rule.apply(_fused_kernel(_softmax([MIN_ROWS, 197]), "softmax"), cpu, False) is None
