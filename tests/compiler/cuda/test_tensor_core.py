"""The tensor-core schedule of int8/fp16 GEMMs and convolutions, compiled for sm_80/sm_87/sm_90 with NVRTC (structural checks)."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

from tests.helpers import (
    int8_conv1x1,
    int8_matmul_module,
    int8_tensor_cores,
    kernel_source,
    needs_nvrtc,
    nhwc_conv,
    nhwc_int8_conv,
    schedule_and_compile,
    small_conv_module,
)


@needs_nvrtc
def test_fp16_rgb_stem_compiles_on_tensor_cores():
    """A 7x7 stride-2 fp16 conv over 3 channels (K = 147, not a multiple of a load's 2 halves): its
    predicated activation loads gather across pixels; compiles on mma like the other fp16 convs."""

    (script,) = schedule_and_compile("h200", nhwc_conv(2, 64, 64, 3, 64, 7, 3, 2, "float16"))
    assert 'mma("m16n8k16", "row", "col", "fp16", "fp16", "fp16"' in script


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
    mod = int8_matmul_module(256)
    with device_compiler(spec, "cubin") as record, tvm_target:
        scheduled = cuda_pipeline(tvm_target)(mod)
        scripts = [f.script() for _, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
        mma = [s for s in scripts if int8_tensor_cores(s)]  # int8 in, int32 accumulate
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
        relax.build(int8_matmul_module(256), tvm_target)


@needs_nvrtc
@pytest.mark.parametrize("target", ["a100", "h200"])
def test_fp16_convolution_uses_tensor_cores(target):
    """fp16 convs take the int8 kernels' tensor-core schedule from sm_80: ldmatrix + mma.sync.m16n8k16
    with fp16 accumulation, 16-byte loads (8 halves) where unpredicated. (dlight's own rule skipped fp16
    tensor cores on sm_90a: its arch parser rejects the 'a'.)"""
    (script,) = schedule_and_compile(target, small_conv_module("fp16-conv"))
    assert "ldmatrix" in script and 'mma("m16n8k16", "row", "col", "fp16", "fp16", "fp16"' in script
    assert "software_pipeline" not in script  # the rule's default tile is synchronous


@needs_nvrtc
def test_fp16_tiles_compile_with_cp_async_and_wide_loads():
    """Every load width in a tile text is bytes: fp16 tiles load 16 bytes as 8 halves (the conv's
    NHWC input and OHWI weight), with the cp.async pipeline; the accumulator tile is fp16."""
    from tvm import relax

    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.compiler.tuning import tile_groups

    import_tensor_intrinsics()
    mod = nhwc_conv(8, 28, 28, 256, 256, 1, 0, 1, "float16")
    (group,) = tile_groups(relax.get_pipeline("zero")(mod))  # the tile search sees the fp16 kernel
    assert group.extents == [8 * 28 * 28, 256, 256] and not group.input_padded
    kernel = kernel_source("h200", mod, "2x4.2x4.k4.v16.w16.async.mma").split("__global__")[-1]
    assert "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16" in kernel
    copies = re.findall(r"cp_async_legacy_c[ag]_(\d+)_\d+_\d+\([^;]*, (\w+)_ptr,", kernel)
    assert {(int(n), src) for n, src in copies} == {(16, "x"), (16, "w")}


@needs_nvrtc
def test_wide_weight_loads_fall_back_to_4_bytes_for_k_by_j_weights():
    """A classifier GEMM whose weight reaches the kernel transposed ([K, J], as ONNX Gemm's does): the
    tile search's 16-byte weight-load twins (.w16) gathered across rows and failed in CUDA codegen
    (int32x16); they now compile with 4-byte weight loads. OHWI convolution weights keep 16 bytes
    (see the cp.async test above)."""
    source = kernel_source("h200", int8_matmul_module(64, 1000, 2048), "2x1.2x1.k4.v16.a8.w16.mma")
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
    (script,) = schedule_and_compile(target, bb.get())
    assert int8_tensor_cores(script) and "software_pipeline" not in script


@needs_nvrtc
@pytest.mark.parametrize("c,o", [(144, 24), (24, 144), (32, 16)])
def test_narrow_int8_convolutions_run_on_tensor_cores(c, o):
    (script,) = schedule_and_compile("h200", nhwc_int8_conv(8, 28, c, o, 1))
    assert int8_tensor_cores(script)


@needs_nvrtc
def test_int8_mma_kernel_compiles_with_onnx_style_weight_names():
    """TVM 0.27's mma.sync codegen substitutes the letters A-F of its asm template one after another:
    a weight buffer named like ONNX's ``onnx::Conv_566`` got the accumulator's address spliced into
    its name (the CUDA did not compile) until the schedule renamed the kernel's buffers."""
    from tvm import relax

    mod = int8_conv1x1([8, 14, 14, 128], 128, lambda y: relax.op.astype(y, "float32"), weight="onnx__Conv_5_int8")
    (script,) = schedule_and_compile("h200", mod)
    assert int8_tensor_cores(script) and "onnx__conv_5_int8" in script


@needs_nvrtc
def test_batch1_int8_convolution_with_49_rows_runs_on_tensor_cores():
    """ResNet-50's last 3x3 conv at batch 1 (7x7 pixels): a 32x32 tile on tensor cores (it ran on CUDA
    cores when tensor cores needed 64 rows)."""
    (script,) = schedule_and_compile("h200", nhwc_int8_conv(1, 7, 512, 512, 3))
    assert int8_tensor_cores(script)
    assert 'T.thread_binding(T.int64(16), thread="blockIdx.y")' in script  # 512 / 32 column tiles


@needs_nvrtc
def test_int8_activations_use_16_byte_loads_unless_predicated():
    """16-byte activation loads where nothing pads them; 4 bytes for a padded conv input by default
    (TVM 0.27 miscompiles predicated wider int8 loads: make_int4 of 16 chars). The default tile loads
    OHWI weights (along K) 16 bytes at a time in both."""
    (unpadded,) = schedule_and_compile("h200", nhwc_int8_conv(8, 16, 256, 256, 1))
    assert unpadded.count("T.vectorized(T.int64(16))") == 2  # activations and weights
    (padded,) = schedule_and_compile("h200", nhwc_int8_conv(8, 16, 64, 64, 3))
    assert padded.count("T.vectorized(T.int64(16))") == 1  # weights only


@needs_nvrtc
@pytest.mark.parametrize("pipeline", ["", "async3"])
def test_two_fragment_buffers_load_the_next_step_while_multiplying(pipeline):
    """.r2: the loop over 32-deep steps inside a shared-memory stage is software-pipelined (its first
    step's ldmatrix loads hoisted into a prologue), with or without the cp.async pipeline around it:
    twice the ldmatrix call sites of the one-buffer kernel."""
    tile = "2x4.2x4.k8.v16" + (f".{pipeline}" if pipeline else "")
    mod = int8_matmul_module(256, 256, 1024)
    one, two = (
        next(k for k in kernel_source("h200", mod, t).split("__global__") if "mma.sync" in k)
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
        ex = relax.build(nhwc_int8_conv(8, 16, 64, 64, 3), target, relax_pipeline=cuda_pipeline(target, cfg))
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
        ex = relax.build(nhwc_int8_conv(8, 16, 1024, 256, 1), target, relax_pipeline=cuda_pipeline(target, cfg))
    # the compiled kernel had its copies spread over the math where another stage is in flight
    assert record["interleaved_pipeline_loops"] == (in_flight >= 2)
    (cuda,) = [m for m in ex.mod.imports[0].imports if m.kind == "cuda"]
    source = cuda.inspect_source("cuda")
    kernel = source.split("__global__")[-1]
    assert "cp.async.commit_group" in source and "ptx_cp_async" in kernel
    assert f"wait_group_{in_flight}();" in kernel and f"wait_group_{in_flight + 1}();" not in kernel
    with target:
        legal = relax.transform.LegalizeOps()(nhwc_int8_conv(8, 16, 256, 256, 1))
    func = next(f for _, f in legal.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    with pytest.raises(ValueError, match="unknown tile load pipeline"):
        tensor_core_schedule(func, target, replace(DEFAULT_TILE, pipeline="reg"))


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

    mod = int8_conv1x1([8, 28, 28, 64], 256, quantize)
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
            ex = relax.build(nhwc_int8_conv(8, 16, 256, 256, 1), target, relax_pipeline=cuda_pipeline(target, cfg))
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
            ex = relax.build(nhwc_int8_conv(8, 16, 256, 256, 3), target, relax_pipeline=cuda_pipeline(target, cfg))
        (cuda,) = [m for m in ex.mod.imports[0].imports if m.kind == "cuda"]
        kernel = cuda.inspect_source("cuda").split("__global__")[-1]
        if pipeline:  # the copy helper named by its width, called with the weight as source
            widths.append(
                sorted({int(n) for n in re.findall(r"cp_async_legacy_c[ag]_(\d+)_\d+_\d+\([^;]*, w_ptr,", kernel)})
            )
        else:
            widths.append(sorted({{"int": 4, "int4": 16}[t] for t in re.findall(r"= \*\((int4?)\*\)\(w_ptr", kernel)}))
    assert widths == [[4], [16]]


@needs_nvrtc
def test_squeeze_excite_gate_fused_with_its_broadcast_is_left_to_the_other_rules():
    """EfficientNet's squeeze-excite: a 1x1 conv over pooled channels (a GEMM of batch x channels),
    sigmoid, then a multiply broadcasting the gate over the whole feature map, fused in one kernel. The
    tensor-core schedule cannot inline that epilogue into its tile (it asserted and failed the int8
    build); it now declines such kernels, which compile under the next rule with nothing logged."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import pass_config, resolve_tvm_target
    from inferx_edge.compiler.cuda import cuda_pipeline, device_compiler
    from inferx_edge.compiler.guarded_schedule import FallbackLog
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.targets import get_target

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 1, 1, 64], "int8"))
    w = relax.Var("w", relax.TensorType([144, 1, 1, 64], "int8"))
    feat = relax.Var("feat", relax.TensorType([2, 28, 28, 144], "float32"))
    with bb.function("main", [x, w, feat]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(x, w, data_layout="NHWC", kernel_layout="OHWI", out_dtype="int32")
            gate = relax.op.sigmoid(relax.op.multiply(relax.op.astype(y, "float32"), relax.const(np.float32(0.01))))
            q = relax.op.round(relax.op.multiply(relax.op.multiply(gate, feat), relax.const(np.float32(20.0))))
            out = bb.emit_output(relax.op.astype(relax.op.clip(q, -127, 127), "int8"))
        bb.emit_func_output(out)
    mod = bb.get()
    import_tensor_intrinsics()
    spec = get_target("h200")
    target = resolve_tvm_target(spec)
    with FallbackLog() as log, device_compiler(spec, "cubin") as record, target, pass_config():
        relax.build(mod, target, relax_pipeline=cuda_pipeline(target, sm_count=spec.sm_count))
    assert log.entries == []
    assert record["kernels_modules"]
    assert tvm is not None


@needs_nvrtc
@pytest.mark.parametrize("target", ["h200", "a100", "jetson-orin"])
def test_deep_unpadded_int8_gemms_get_the_three_buffer_pipeline_by_default(target):
    """Without a tuning database a 1024-deep int8 GEMM builds with 128-deep stages in three cp.async
    buffers on sm_80/sm_87/sm_90 (the default tile rule); a 512-deep one keeps synchronous loads."""
    deep = kernel_source(target, int8_matmul_module(256, 256, 1024))
    shallow = kernel_source(target, int8_matmul_module(256, 256, 512))
    assert "cp.async.cg.shared.global" in deep and "cp.async.commit_group" in deep
    assert "cp.async" not in shallow


@needs_nvrtc
@pytest.mark.parametrize(("channels", "load"), [(232, "int2"), (116, "int"), (58, "char2"), (256, "int4")])
def test_loads_along_k_shrink_to_a_divisor_of_k(channels, load):
    """A 1x1 int8 conv over ``channels`` (ShuffleNetV2's 232, 116, 58): 16-byte weight loads along K
    could run past a row's end, which made TVM load the tile byte by byte; the vector shrinks to the
    largest power of two dividing K instead, and nothing is left serial."""
    from benchmarks.cuda_vector_census import SCALARIZED, kernels

    (kernel,) = kernels(kernel_source("h200", int8_conv1x1([64, 28, 28, channels], 128, lambda y: y))).values()
    assert not SCALARIZED.search(kernel)
    assert set(re.findall(r"= \*\((\w+)\*\)\(w_ptr", kernel)) == {load}


@needs_nvrtc
@pytest.mark.parametrize(("channels", "store"), [(58, "half2"), (29, None), (116, "half4")])
def test_epilogue_stores_shrink_to_a_divisor_of_the_output_channels(channels, store):
    """An int8 1x1 conv with ``channels`` outputs (ShuffleNetV2's 58) and an fp16 result: 4-wide stores
    along J would cross the end of a row, which made TVM store the tile element by element; the
    epilogue vector shrinks to the largest power of two dividing J (58: 2, 29: 1) and nothing is serial."""
    from tvm import relax

    from benchmarks.cuda_vector_census import SCALARIZED, kernels

    mod = int8_conv1x1([64, 28, 28, 64], channels, lambda y: relax.op.astype(y, "float16"))
    (kernel,) = kernels(kernel_source("h200", mod)).values()
    assert not SCALARIZED.search(kernel)
    assert set(re.findall(r"\*\((half\d)\*\)\(\w+_ptr \+", kernel)) == ({store} if store else set())
