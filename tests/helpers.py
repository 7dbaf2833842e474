"""Shared by the tests: tiny models built in code (ONNX and Relax), CUDA kernel helpers, the CLI in a
subprocess, and skip markers for missing tools. Nothing here downloads anything; RNGs are seeded."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from inferx_edge.errors import BuildError

REPO = Path(__file__).resolve().parent.parent


def write_onnx(path: Path, nodes, inputs: dict, outputs: dict, inits, name: str = "g") -> Path:
    """An opset-13 float ONNX model from ``nodes``, ``{name: shape}`` inputs/outputs and initializers."""

    def infos(io):
        return [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in io.items()]

    graph = helper.make_graph(nodes, name, infos(inputs), infos(outputs), inits)
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    return path


def make_convnet(path: Path, seed: int = 0, batch: int | str = "N") -> Path:
    """Conv -> BatchNorm -> Relu -> MaxPool -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Softmax."""
    rng = np.random.default_rng(seed)

    def init(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        init("w1", 8, 3, 3, 3),
        init("b1", 8),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "bn_s"),
        init("bn_b", 8),
        init("bn_m", 8, scale=0.1),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "bn_v"),
        init("w2", 16, 8, 3, 3),
        init("fc_w", 5, 16),
        init("fc_b", 5),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [batch, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def make_two_io(path: Path) -> Path:
    """Two inputs (float32 and int64 index-free), two outputs: MatMul+Add+Tanh and Concat/Mul."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["a", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["s"]),
        helper.make_node("Tanh", ["s"], ["out_t"]),
        helper.make_node("Concat", ["a", "a"], ["cat"], axis=1),
        helper.make_node("Mul", ["cat", "cat"], ["out_sq"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two_io",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["B", 6]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["B", 4]),
        ],
        [
            helper.make_tensor_value_info("out_t", TensorProto.FLOAT, ["B", 4]),
            helper.make_tensor_value_info("out_sq", TensorProto.FLOAT, ["B", 12]),
        ],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m inferx_edge ARGS`` in a subprocess, capturing output."""
    return subprocess.run(
        [sys.executable, "-m", "inferx_edge", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


def cli_in_process(*args, capsys) -> tuple[int, str]:
    """``python -m inferx_edge ARGS`` run in this process (``main``): (exit code, stderr). For error
    paths that end before any real work: a subprocess spends 5-9 s importing TVM first. Tests of what a
    separate process does (signals, exit on a traceback) use :func:`cli`."""
    from inferx_edge.__main__ import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    return code, capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nvrtc12_available() -> bool:
    from inferx_edge.compiler.cuda import find_nvrtc

    try:
        find_nvrtc(12)
    except BuildError:
        return False
    return True


needs_nvrtc = pytest.mark.skipif(not nvrtc12_available(), reason="pip install '.[cuda12]' (NVRTC 12)")


needs_cross = pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None, reason="no aarch64 cross compiler")


def run_on_cpu(mod, *arrays) -> list[np.ndarray]:
    """``mod``'s main built for this CPU (llvm) and run on ``arrays``: its outputs, a single one as a
    one-element list."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in arrays])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def main_ops(mod) -> list[str]:
    """The operator names ``mod``'s main calls, in order."""
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings if hasattr(b.value, "op")]


def main_bindings(mod) -> dict:
    """``mod``'s main: each bound variable -> its value."""
    return {b.var: b.value for blk in mod["main"].body.blocks for b in blk.bindings}


def op_of(value) -> str:
    """The operator name of a bound value ("" for anything but an operator call)."""
    return getattr(getattr(value, "op", None), "name", "")


def int8_matmul_module(m: int, j: int | None = None, k: int | None = None):
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


def float_matmul_module(x_shape: tuple, w_shape: tuple):
    """x @ w in float32 (``x`` may carry leading batch axes)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "float32"))
    w = relax.Var("w", relax.TensorType(w_shape, "float32"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, w))
        bb.emit_func_output(out)
    return bb.get()


def fused_gemms(mod, dtypes: tuple | None = None) -> list[tuple[list[int], bool]]:
    """(I, J, K extents, weights along K) of every matmul-like kernel of ``mod`` after legalization and
    fusion (the kernels a CUDA build schedules), only those of ``dtypes`` (input, output) when given."""
    import tvm

    from inferx_edge.compiler.cuda.analysis import _matmul_signature, weights_along_k
    from inferx_edge.compiler.cuda.pipeline import fusion_passes

    fused = tvm.transform.Sequential(fusion_passes())(mod)
    out = []
    for _, f in fused.functions_items():
        sig = _matmul_signature(f) if isinstance(f, tvm.tirx.PrimFunc) else None
        if sig is not None and (dtypes is None or sig[0] == dtypes):
            out.append((sig[1], weights_along_k(f)))
    return out


def int8_tensor_cores(script: str) -> bool:
    """A scheduled kernel loads int8 tiles with ldmatrix and multiplies them with mma.sync.m16n8k32."""
    return "ldmatrix" in script and 'mma("m16n8k32", "row", "col", "int8", "int8", "int32"' in script


def small_conv_module(kind: str):
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


def schedule_and_compile(target: str, mod):
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


def nhwc_fp16_small_reduction(kind: str, channels: int = 96):
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


def grouped_conv(n: int = 8, hw: int = 28, c: int = 128, group_width: int = 16, dtype: str = "float32"):
    """A RegNet/ResNeXt-style grouped 3x3 conv (NHWC, OHWI weights) with bias and ReLU."""
    from benchmarks.gpu_grouped_conv import grouped_conv_module

    return grouped_conv_module(n, hw, c, group_width, 1, dtype)


def kernel_source(target: str, mod, tile: str | None = None) -> str:
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


def int8_conv1x1(nhwc: list[int], out_channels: int, epilogue, weight: str = "w"):
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


def nhwc_int8_conv(n: int, hw: int, c: int, o: int, k: int):
    """A square int8 NHWC conv, stride 1, same padding."""
    return nhwc_conv(n, hw, hw, c, o, k, k // 2, 1)


def relu6_depthwise(clip_first: bool, k: int = 3, groups: int = 16):
    """conv -> (ReLU6 if clip_first) -> ``k`` x ``k`` depthwise conv (grouped where ``groups`` < 16),
    NCHW batch 2; weights as parameters."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 8, 10, 10], "float32"))
    w1 = relax.Var("w1", relax.TensorType([16, 8, 1, 1], "float32"))
    w2 = relax.Var("w2", relax.TensorType([16, 16 // groups, k, k], "float32"))
    with bb.function("main", [x, w1, w2], attrs={"num_input": 1}):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w1))
            if clip_first:
                y = bb.emit(relax.op.clip(y, 0, 6))
            out = bb.emit_output(relax.op.nn.conv2d(y, w2, padding=[k // 2] * 4, groups=groups))
        bb.emit_func_output(out)
    return bb.get()


def nhwc_conv(n, h, w, c, o, k, pad, stride, dtype: str = "int8"):
    """An NHWC conv with OHWI weights: int8 -> int32, or float16 -> float16."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, h, w, c], dtype))
    wt = relax.Var("w", relax.TensorType([o, k, k, c], dtype))
    out_dtype = "int32" if dtype == "int8" else dtype
    with bb.function("main", [x, wt]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, wt, stride, pad, 1, 1, "NHWC", "OHWI", "NHWC", out_dtype))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def main_loop(kernel: str) -> str:
    """The body of the first loop of ``kernel`` that commits a cp.async group (the pipelined k loop)."""
    from inferx_edge.compiler.cuda.c_scanner import _close

    for m in re.finditer(r"for \(int (\w+) = 0; \1 < \d+; \+\+\1\) \{", kernel):
        body = kernel[m.end() : _close(kernel, m.end() - 1)]
        if "commit_group();" in body:
            return body
    raise AssertionError("no pipelined loop")


def make_mlp(path: Path) -> Path:
    """MatMul -> Add -> Relu -> MatMul -> Add, batch 16: the tuning tests' model (two dense tasks)."""
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.2, n)
        for n, s in (("w1", (64, 128)), ("b1", (128,)), ("w2", (128, 32)), ("b2", (32,)))
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["o"]),
        helper.make_node("Add", ["o", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 32])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def local_gpu() -> tuple[int, int] | None:
    """(major, minor) compute capability of CUDA device 0, or None when no driver or no device (read
    through the driver API: nothing is initialised in TVM)."""
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count, major, minor, dev = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return None
    if cuda.cuDeviceGet(ctypes.byref(dev), 0) != 0:
        return None
    cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
    return major.value, minor.value


#: the registry target whose device code runs on a GPU of this compute capability
GPU_TARGETS = {(8, 0): "a100", (8, 7): "jetson-orin", (9, 0): "h200"}

needs_gpu = pytest.mark.skipif(local_gpu() is None, reason="no NVIDIA GPU with a driver on this machine")


def quantized_conv(scale: float, weight: str = "w", hw: int = 14, c: int = 128, k: int = 3):
    """NHWC int8 conv -> int32 -> float scale -> int8 quantize, as the int8 variants fuse it."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([8, hw, hw, c], "int8"))
    w = relax.Var(weight, relax.TensorType([c, k, k, c], "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(
                x, w, padding=[k // 2] * 4, data_layout="NHWC", kernel_layout="OHWI", out_dtype="int32"
            )  # fmt: skip
            y = relax.op.multiply(relax.op.astype(y, "float32"), relax.const(np.float32(scale)))
            y = relax.op.astype(relax.op.clip(relax.op.round(y), -128, 127), "int8")
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def fused(mod):
    from tvm import relax

    return relax.get_pipeline("zero")(mod)


def build_quietly(output: Path, **options) -> Path:
    """``build_artifact`` of ``BuildOptions(output=output, **options)``, without its log; the model
    defaults to the embedded one and the target to this host's CPU."""
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.models import DEFAULT_MODEL
    from inferx_edge.targets import host_target_name

    options.setdefault("model", DEFAULT_MODEL)
    options.setdefault("target", host_target_name())
    build_artifact(BuildOptions(output=output, **options), log=lambda *a: None)
    return output


def retarget_artifact(src: Path, dst: Path, sign_key: Path | None = None, **target) -> Path:
    """Re-package an artifact with other target fields (as if built for another device), signed with
    ``sign_key`` when given."""
    import dataclasses

    from inferx_edge.package import open_artifact, read_manifest, write_artifact

    m = read_manifest(src)
    with open_artifact(src) as art:
        members = {n: art.member(n) for n in m.files}
        write_artifact(dst, dataclasses.replace(m, target=m.target | target), members, sign_key=sign_key)
    return dst
