"""Build an artifact: import -> compile each variant ahead of time -> export libraries -> package.

The Relax VM program itself is compiled to native code (``exec_mode="compiled"``), so a variant is one
self-contained shared library plus a weights file; nothing is compiled on the device.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inferx_edge import __version__
from inferx_edge.errors import BuildError, UsageError
from inferx_edge.frontend import ImportedModel, import_model
from inferx_edge.package import Manifest, Variant, write_artifact
from inferx_edge.targets import TargetSpec, get_target
from inferx_edge.targets.registry import HOST_CPU

#: Precisions ``build`` accepts. fp16: Relax ToMixedPrecision (fp16 compute and accumulation, the
#: signature stays fp32). int8: calibrated int8 x int8 -> int32 conv2d/matmul (inferx_edge.quantize).
#: mixed: int8 except the layers an accuracy budget keeps in fp32 (per-layer sensitivity).
PRECISIONS = ("fp32", "fp16", "int8", "mixed")
QUANTIZED = ("int8", "mixed")


@dataclass(frozen=True)
class BuildOptions:
    """What to build.

    Attributes
    ----------
    model : ONNX file or ``.pt2`` torch.export program.
    target : target name or alias (``python -m inferx_edge targets``).
    output : artifact file to write (replaced atomically).
    input_shapes : pinned input shapes, by input name.
    precision : one of :data:`PRECISIONS`.
    cuda_code : CUDA targets only: ``cubin`` (exact architecture, nothing compiled on the device) or
        ``ptx`` (the driver JIT-compiles it for its GPU, same or newer architecture).
    cuda_graph : CUDA targets only: the static parts of the model run as CUDA graphs (Relax
        ``RewriteCUDAGraph``), captured on a variant's first run and replayed after: one launch
        instead of one per kernel. Weights must stay at the addresses they had at capture (the
        runtime loads them once per variant).
    tuning : apply the model's tuning database for this target when one exists (kernels it does not
        cover keep default schedules: a build never fails for lack of tuning).
    tuning_root : where databases live (default ``tuning_logs/``).
    calib, calib_method : int8/mixed calibration data and method (:mod:`inferx_edge.quantize`).
    quant_plan : a plan written by ``quantize`` (thresholds and per-layer precisions): no recalibration.
    max_accuracy_drop, min_int8_share, eval_data, allow_over_budget : the accuracy budget (top-1
        points) that mixed (and, when given, int8) must hold on ``eval_data`` (:mod:`inferx_edge.quantize.mixed`).
    float_between_layers : activations stay float between int8 layers (default: int8 where every reader
        is an int8 layer; :func:`inferx_edge.quantize.rewrite.int8_boundaries`).
    """

    model: Path
    target: str
    output: Path
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    precision: str = "fp32"
    cuda_code: str = "cubin"
    cuda_graph: bool = True
    tuning: bool = True
    tuning_root: Path | None = None
    batch_sizes: tuple[int, ...] = ()
    precisions: tuple[str, ...] = ()
    calib: Path | None = None
    calib_method: str = "entropy"
    quant_plan: Path | None = None
    max_accuracy_drop: float | None = None
    min_int8_share: float = 0.5
    eval_data: Path | None = None
    allow_over_budget: bool = False
    float_between_layers: bool = False

    def variant_grid(self, model_batch: int) -> list[tuple[str, int]]:
        """(precision, batch) of every variant: ``precisions`` x ``batch_sizes`` (defaults: the single
        ``precision`` and the model's pinned batch)."""
        return [(p, b) for p in (self.precisions or (self.precision,)) for b in (self.batch_sizes or (model_batch,))]

    def __post_init__(self) -> None:
        from inferx_edge.compiler.cuda import CUDA_CODE_FORMATS

        for p in (self.precision, *self.precisions):
            if p not in PRECISIONS:
                raise UsageError(f"unknown precision '{p}'; valid: {', '.join(PRECISIONS)}")
        if any(b <= 0 for b in self.batch_sizes):
            raise UsageError(f"batch sizes must be positive, got {list(self.batch_sizes)}")
        if self.cuda_code not in CUDA_CODE_FORMATS:
            raise UsageError(f"unknown CUDA code format '{self.cuda_code}'; valid: {', '.join(CUDA_CODE_FORMATS)}")


def resolve_tvm_target(spec: TargetSpec):
    """The ``tvm.target.Target`` for ``spec``, with :data:`HOST_CPU` replaced by this machine's CPU."""
    import tvm

    def fill(d: dict[str, Any]) -> dict[str, Any]:
        d = dict(d)
        if d.get("mcpu") == HOST_CPU:
            d["mcpu"] = tvm.target.codegen.llvm_get_system_cpu()
            d.setdefault("num-cores", os.cpu_count() or 1)
        if isinstance(d.get("host"), dict):
            d["host"] = fill(d["host"])
        return d

    return tvm.target.Target(fill(spec.tvm_target))


def _linker(spec: TargetSpec):
    """``fcompile`` for ``export_library``: the target's cross compiler when the build host differs."""
    if spec.cross_compiler is None or platform.machine() == spec.host_arch:
        return None
    if shutil.which(spec.cross_compiler) is None:
        raise BuildError(
            f"target '{spec.name}' needs the cross compiler '{spec.cross_compiler}', not found on PATH; "
            f"install it (Debian/Ubuntu: apt-get install g++-aarch64-linux-gnu)"
        )
    from tvm.support import cc

    return cc.cross_compiler(spec.cross_compiler)


def apply_tuning(mod, target, work_dir: Path) -> tuple[Any, int, int, int]:
    """Legalize + fuse, then give each kernel the best schedule ``work_dir``'s MetaSchedule database
    holds, and each int8 tensor-core kernel without one the tile its int8 tile records name
    (:mod:`inferx_edge.tune.tiles`).

    Returns the module and (kernels with a tuned schedule, kernels with a recorded tile, kernels in total).
    """
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    from inferx_edge.tune import database as tdb
    from inferx_edge.tune._intrin import import_tensor_intrinsics
    from inferx_edge.tune.tiles import annotate_tiles

    mod = relax.get_pipeline("zero")(mod)
    if tdb.has_database(work_dir):
        import_tensor_intrinsics()  # traces may replay tensorize steps
        # Read a snapshot: a tuning run may be appending to the database right now (a torn last line).
        with tempfile.TemporaryDirectory(prefix="inferx_edge-db-") as snap:
            tdb.snapshot(work_dir, Path(snap))
            with target, ms.database.JSONDatabase(work_dir=snap):
                mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
    mod, tiled = annotate_tiles(mod, work_dir)
    funcs = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    tuned = sum(1 for f in funcs if f.attrs is not None and "tirx.is_scheduled" in f.attrs)
    return mod, tuned, tiled, len(funcs)


def conv_layout(spec: TargetSpec, precision: str) -> str:
    """The data layout convolutions of a variant run in.

    NHWC for fp16/int8/mixed on CUDA: dlight turns a convolution into an implicit GEMM whose operands
    are read along the reduction axis; in NCHW that axis (input channels) is strided by H*W, so each
    warp's loads were scattered (ResNet-50 int8 1x1 convs reached ~24 TOPS on an H200). In NHWC, with
    OHWI weights, both operands are contiguous along it and the output is written contiguously. int8
    weights are stored OHWI at build time (:func:`quant_kernel_layout`); fp16's OIHW -> OHWI permute fuses
    with the fp32 -> fp16 weight cast the variant does anyway. fp32 on CUDA stays NCHW.

    NHWC for float variants on CPUs too, with HWIO weights (:func:`conv_kernel_layout`): output channels
    are innermost in both the output and the weight, so MetaSchedule's tiles vectorize the
    multiply-adds along them with contiguous loads and stores. On the 2-core Zen 4 build host the tuned
    batch-64 embedded model's two main convolutions went from 400/331 us (NCHW, 1,412 trials) to
    329/257 us (NHWC, 1,574 trials), and the model from 0.82-0.86x onnxruntime's speed to 1.03-1.12x.
    int8/mixed CPU variants stay NCHW (not measured in NHWC).
    """
    if spec.is_cuda:
        return "NHWC" if precision != "fp32" else "NCHW"
    return "NCHW" if precision in QUANTIZED else "NHWC"


def conv_kernel_layout(spec: TargetSpec) -> str:
    """Float conv weight layout for NHWC convolutions: OHWI on CUDA (rows of the implicit GEMM's weight
    operand run along the reduction), HWIO on CPUs (output channels contiguous for vector loads)."""
    return "OHWI" if spec.is_cuda else "HWIO"


def quant_kernel_layout(spec: TargetSpec, precision: str) -> str:
    """How int8 conv weights are stored for a variant (OHWI where convolutions run in NHWC)."""
    return "OHWI" if conv_layout(spec, precision) == "NHWC" else "OIHW"


def convert_layout(mod, layout: str, kernel_layout: str = "OHWI"):
    """Run every ``conv2d`` in ``layout`` with ``kernel_layout`` weights (inputs and outputs converted
    where the graph needs NCHW).

    ``clip`` has no layout rule in Relax: ConvertLayout wrapped every int8 quantize (and ReLU6) in a
    transpose pair, a standalone strided kernel after each convolution (ResNet-50 int8 at batch 64 on an
    H200: about a fifth of the time). Clips become ``minimum(maximum(x, lo), hi)`` first, which convert.
    Then int8 NHWC convolutions with a channel count that is not a multiple of 4 (RGB stems) get their
    input and weight zero-padded to 4 channels: one 4-byte load per pixel instead of a byte gather
    (the stem ran at 17 TOPS, 11 % of ResNet-50's int8 batch-64 time). Stride-2 ones with at most 4
    (padded) channels then run on a space-to-depth input (:func:`space_to_depth_int8_convs`). Last,
    transposes that only move axes of extent 1 become reshapes (:func:`unit_transposes_to_reshapes`).
    """
    if layout == "NCHW":
        return mod
    from tvm import relax

    mod = clip_to_min_max(mod)
    mod = relax.transform.ConvertLayout({"relax.nn.conv2d": [layout, kernel_layout]})(mod)
    if layout == "NHWC":
        mod = space_to_depth_int8_convs(pad_int8_conv_channels(mod))
    return unit_transposes_to_reshapes(mod)


def unit_transposes_to_reshapes(mod):
    """Every ``permute_dims`` that keeps the order of the axes longer than 1 as a ``reshape`` (the same
    values in the same memory order).

    ConvertLayout transposes a one-channel NCHW input to NHWC and a pooled (N, 1, 1, C) result back;
    as transposes those are index-computing copy kernels (18 us of the embedded model's 0.67 ms at
    batch 64 on the 2-core build host, fused with the input normalization), as reshapes the
    normalization is a plain elementwise kernel and a lone reshape is a view.
    """
    import tvm
    from tvm import relax

    permute = tvm.ir.Op.get("relax.permute_dims")

    def rewrite(call):
        if call.op != permute:
            return None
        x = call.args[0]
        if not isinstance(x.ty, relax.TensorType) or x.ty.shape is None or not hasattr(x.ty.shape, "values"):
            return None
        shape = list(x.ty.shape.values)
        if any(not isinstance(d, tvm.tirx.IntImm) for d in shape):
            return None
        axes = list(reversed(range(len(shape)))) if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
        moved = [a for a in axes if int(shape[a]) != 1]
        if moved != sorted(moved):
            return None
        return relax.op.reshape(x, [int(shape[a]) for a in axes])

    return _rewrite_calls(mod, rewrite)


def _rewrite_calls(mod, rewrite):
    """``mod`` with every Relax call passed through ``rewrite(call)`` (None: keep it)."""
    from tvm import relax

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            new = rewrite(call)
            return call if new is None else new

    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gv] = _Rewriter(mod).visit_expr(func)
    return mod


_TE_MIN_MAX = re.compile(r"(maximum|minimum)\d*$")


def clip_to_min_max(mod):
    """Every ``relax.clip(x, lo, hi)`` as ``minimum(maximum(x, lo), hi)`` (same values, layout-convertible);
    likewise the ONNX importer's Clip with tensor bounds (``call_tir`` of TE maximum/minimum against a
    0-d tensor: a folded constant or a weight) as Relax ``maximum``/``minimum``."""
    import tvm
    from tvm import relax

    clip = tvm.ir.Op.get("relax.clip")
    call_tir = tvm.ir.Op.get("relax.call_tir")
    mod = relax.transform.FoldConstant()(mod)

    def te_min_max(call):
        callee, args = call.args[0], call.args[1]
        if not isinstance(callee, tvm.ir.GlobalVar) or not isinstance(args, relax.Tuple) or len(args.fields) != 2:
            return None
        m = _TE_MIN_MAX.match(callee.name_hint)
        x, bound = args.fields
        if m is None or not isinstance(mod[callee], tvm.tirx.PrimFunc):
            return None
        if not isinstance(x.ty, relax.TensorType) or not isinstance(bound.ty, relax.TensorType):
            return None
        if bound.ty.ndim != 0 or str(bound.ty.dtype) != str(x.ty.dtype):
            return None
        return (relax.op.maximum if m.group(1) == "maximum" else relax.op.minimum)(x, bound)

    def rewrite(call):
        if call.op == call_tir:
            return te_min_max(call)
        if call.op != clip or not isinstance(call.args[0].ty, relax.TensorType):
            return None
        dtype = str(call.args[0].ty.dtype)
        if not dtype.startswith("float"):
            return None
        bounds = [getattr(a.value, "value", a.value) for a in call.args[1:3]]  # PrimValue(IntImm | int)
        lo, hi = (relax.const(np.array(float(b), dtype)) for b in bounds)
        return relax.op.minimum(relax.op.maximum(call.args[0], lo), hi)

    return _rewrite_calls(mod, rewrite)


def pad_int8_conv_channels(mod, multiple: int = 4):
    """int8 NHWC/OHWI ``conv2d`` (groups 1) whose input channels are not a multiple of ``multiple``:
    input and weight zero-padded along the channel axis (same sums)."""
    import tvm
    from tvm import relax

    conv = tvm.ir.Op.get("relax.nn.conv2d")

    def rewrite(call):
        if call.op != conv:
            return None
        a = call.attrs
        x, w = call.args
        xs, ws = x.ty, w.ty
        if (
            a.data_layout != "NHWC"
            or a.kernel_layout != "OHWI"
            or a.groups != 1
            or str(xs.dtype) != "int8"
            or str(ws.dtype) != "int8"
            or xs.shape is None
            or not all(isinstance(d, tvm.tirx.IntImm) for d in xs.shape.values)
        ):
            return None
        c = int(xs.shape.values[3])
        extra = -c % multiple
        if not extra:
            return None
        x = relax.op.nn.pad(x, [0, 0, 0, 0, 0, 0, 0, extra])
        w = relax.op.nn.pad(w, [0, 0, 0, 0, 0, 0, 0, extra])
        return relax.op.nn.conv2d(x, w, a.strides, a.padding, a.dilation, 1, "NHWC", "OHWI", a.out_layout, a.out_dtype)

    return _rewrite_calls(mod, rewrite)


def _space_to_depth_axis(pad_before: int, kernel: int, size: int, out: int) -> tuple[int, ...] | None:
    """For one spatial axis of a stride-2 convolution: (zero taps added before the kernel, taps after,
    stride-1 kernel size, padding before, padding after) of the same convolution on the space-to-depth
    input (half the size, pixel pairs as channels); None when it does not map."""
    shift = pad_before % 2  # an odd padding: one zero tap in front makes every tap pair start on an even row
    taps = kernel + shift
    taps += taps % 2
    k2, before = taps // 2, (pad_before + shift) // 2
    after = out - 1 + k2 - before - size // 2
    if size % 2 or after < 0:
        return None
    return shift, taps - kernel - shift, k2, before, after


def space_to_depth_int8_convs(mod, max_channels: int = 16):
    """int8 NHWC/OHWI ``conv2d`` with stride 2, a kernel wider than 1 and at most ``max_channels`` / 4
    input channels (RGB stems, padded to 4): the same sums as a stride-1 convolution over the
    space-to-depth input ``X[n, i, j, (p, q, c)] = x[n, 2i+p, 2j+q, c]`` with the weight rearranged
    alike (zero taps added where the kernel is odd or the padding is odd; ResNet-50's 7x7 stem becomes
    4x4 over 16 channels, MobileNetV2's 3x3 one 2x2). Each output pixel's inputs are then whole
    16-byte pixels of contiguous reduction instead of 4-byte ones: ResNet-50's stem, the
    ``I x 64 x 196`` implicit GEMM gathered 4 bytes at a time, was its slowest kernel at batch 64 on
    an H200 (0.20 ms of 2.3). The input rearrangement fuses into the kernel that quantizes the input;
    the weight's is done at build time (:func:`bake_weight_transforms`)."""
    import tvm
    from tvm import relax

    conv = tvm.ir.Op.get("relax.nn.conv2d")

    def static(shape):
        return shape is not None and all(isinstance(d, tvm.tirx.IntImm) for d in shape.values)

    def rewrite(call):
        if call.op != conv:
            return None
        a = call.attrs
        x, w = call.args
        xs, ws, ys = x.ty, w.ty, call.ty
        if (
            a.data_layout != "NHWC"
            or a.kernel_layout != "OHWI"
            or a.out_layout != "NHWC"
            or a.groups != 1
            or [int(v) for v in a.strides] != [2, 2]
            or [int(v) for v in a.dilation] != [1, 1]
            or str(xs.dtype) != "int8"
            or str(ws.dtype) != "int8"
            or not (static(xs.shape) and static(ws.shape) and static(ys.shape))
        ):
            return None
        n, h, wd, c = (int(v) for v in xs.shape.values)
        o, kh, kw, _ = (int(v) for v in ws.shape.values)
        oh, ow = int(ys.shape.values[1]), int(ys.shape.values[2])
        pt, pl, _, _ = (int(v) for v in a.padding)
        if 4 * c > max_channels or kh < 2 or kw < 2:
            return None
        rows, cols = _space_to_depth_axis(pt, kh, h, oh), _space_to_depth_axis(pl, kw, wd, ow)
        if rows is None or cols is None:
            return None
        w = relax.op.nn.pad(w, [0, 0, rows[0], rows[1], cols[0], cols[1], 0, 0])
        w = relax.op.reshape(w, [o, rows[2], 2, cols[2], 2, c])
        w = relax.op.reshape(relax.op.permute_dims(w, [0, 1, 3, 2, 4, 5]), [o, rows[2], cols[2], 4 * c])
        x = relax.op.reshape(x, [n, h // 2, 2, wd // 2, 2, c])
        x = relax.op.reshape(relax.op.permute_dims(x, [0, 1, 3, 2, 4, 5]), [n, h // 2, wd // 2, 4 * c])
        padding = [rows[3], cols[3], rows[4], cols[4]]
        return relax.op.nn.conv2d(x, w, 1, padding, 1, 1, "NHWC", "OHWI", "NHWC", a.out_dtype)

    return _rewrite_calls(mod, rewrite)


#: weight transforms are done at build time unless they would grow the stored weights beyond this
#: factor of the model's own (e.g. a weight broadcast to an activation's shape)
MAX_BAKED_GROWTH = 2.0


def bake_weight_transforms(mod, params: list[np.ndarray] | None = None, log=None):
    """Move work that depends only on weights out of the model (Relax ``LiftTransformParams``): bias
    reshapes and layout transposes, fp16 casts, channel pads, transposed matmul weights. ``main`` then
    takes the transformed weights. With ``params`` (the model's weight arrays in ``main``'s order) the
    transforms run once here, on the build host's CPU, and their results are what the artifact stores:
    a device never runs them. (They were one small kernel each per inference: 4 of the embedded
    model's 11 on a CPU, 13 in MobileNetV2's int8 CUDA variant.)

    Returns ``(module, weight names, weight arrays or None)``; the module unchanged (and ``params`` as
    given) when nothing is lifted or the transformed weights would be over :data:`MAX_BAKED_GROWTH`
    times larger.
    """
    import tvm
    from tvm import relax

    main = mod["main"]
    num_input = int(main.attrs["num_input"])
    original = [p.name for p in main.params[num_input:]]
    lifted = relax.transform.LiftTransformParams()(mod)
    if not any(gv.name_hint == "main_transform_params" for gv, _ in lifted.functions_items()):
        return mod, original, params
    transform = lifted["main_transform_params"]
    kept = tvm.IRModule({gv: f for gv, f in lifted.functions_items() if gv.name_hint != "main_transform_params"})
    new_main = kept["main"]
    baked = _unique([p.name for p in new_main.params[num_input:]])
    if params is None:
        return kept, baked, None
    tmod = tvm.IRModule({"main": transform.with_attr("global_symbol", "main")})
    for gv, f in kept.functions_items():
        if not isinstance(f, relax.Function):
            tmod[gv] = f
    host = tvm.target.Target({"kind": "llvm"})
    with host:
        exe = relax.build(tmod, host)
    out = relax.VirtualMachine(exe, tvm.cpu())["main"]([tvm.runtime.tensor(np.ascontiguousarray(p)) for p in params])
    arrays = [o.numpy() for o in out]
    before, after = sum(p.nbytes for p in params), sum(a.nbytes for a in arrays)
    if after > MAX_BAKED_GROWTH * before + (1 << 20):
        if log:
            log(f"      weight transforms kept in the model: their results ({after >> 20} MiB) outgrow the weights")
        return mod, original, params
    return kept, baked, arrays


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(n if not k else f"{n}#{k}")
    return out


FP16_MAX = 65504.0


def fp16_bounded_depthwise(mod):
    """Float depthwise convs (int8 variants keep them float) whose input is clipped into fp16's range
    (ReLU6 and other constant clips) read that input as fp16 and accumulate in fp32: the producer's
    epilogue writes fp16, halving the traffic of MobileNetV2's widest (6x expanded) tensors. A clip
    bounds the values, so fp16 cannot overflow; its 11-bit precision is far finer than the int8 layers
    around it."""
    import tvm
    from tvm import relax

    conv = tvm.ir.Op.get("relax.nn.conv2d")
    lo_hi = {tvm.ir.Op.get("relax.maximum"): "lo", tvm.ir.Op.get("relax.minimum"): "hi"}
    bindings = {
        b.var: b.value
        for _, f in mod.functions_items()
        if isinstance(f, relax.Function)
        for blk in f.body.blocks
        for b in blk.bindings
    }

    def bound(value):  # (kind, other operand) of maximum/minimum against a constant within fp16's range
        if not isinstance(value, relax.Call) or value.op not in lo_hi:
            return None
        for a, b in (value.args, value.args[::-1]):
            if isinstance(b, tvm.ir.expr.Constant) and np.all(np.abs(b.value.numpy()) <= FP16_MAX):
                return lo_hi[value.op], a
        return None

    def clipped(x) -> bool:
        outer = bound(bindings.get(x))
        inner = bound(bindings.get(outer[1])) if outer else None
        return bool(outer and inner and {outer[0], inner[0]} == {"lo", "hi"})

    def rewrite(call):
        if call.op != conv or call.attrs.groups == 1:
            return None
        x, w = call.args
        if str(x.ty.dtype) != "float32" or str(w.ty.dtype) != "float32" or not clipped(x):
            return None
        a = call.attrs
        return relax.op.nn.conv2d(
            relax.op.astype(x, "float16"), relax.op.astype(w, "float16"), a.strides, a.padding, a.dilation,
            a.groups, a.data_layout, a.kernel_layout, a.out_layout, "float32",
        )  # fmt: skip

    return _rewrite_calls(mod, rewrite)


def prepare_module(
    imported: ImportedModel,
    target,
    precision: str = "fp32",
    tuning_dir: Path | None = None,
    layout: str = "NCHW",
    bake: bool = False,
    log=None,
    kernel_layout: str = "OHWI",
):
    """The Relax module a variant compiles: fp16 cast for ``fp16``; convolutions in ``layout``
    (:func:`conv_layout`); weight-only work moved to build time (:func:`bake_weight_transforms`);
    tuned schedules from ``tuning_dir``.

    Returns the module, the tuning summary (None without a database), and the weights ``main`` takes
    as ``(names, arrays)`` (arrays computed only with ``bake``; else None).
    """
    from tvm import relax

    from inferx_edge.compiler.tvm_ops import vectorizable_nearbyint

    vectorizable_nearbyint()
    mod, tuned = imported.mod, None
    if precision == "fp16":
        mod = relax.transform.ToMixedPrecision(out_dtype="float16")(mod)
    mod = convert_layout(mod, layout, kernel_layout)
    if layout == "NHWC" and precision in QUANTIZED:  # CUDA int8/mixed: their float depthwise convs
        mod = fp16_bounded_depthwise(mod)
    mod, names, arrays = bake_weight_transforms(mod, list(imported.params) if bake else None, log)
    if tuning_dir is not None:
        mod, n_tuned, n_tiled, n_total = apply_tuning(mod, target, tuning_dir)
        tuned = {"database": str(tuning_dir), "kernels_tuned": n_tuned, "tiles": n_tiled, "kernels": n_total}
    return mod, tuned, (names, arrays)


def relax_pipeline(spec: TargetSpec, target):
    """The Relax pipeline for ``spec``: TVM's default, or ours for CUDA (:mod:`.cuda_pipeline`)."""
    if not spec.is_cuda:
        return "default"
    from inferx_edge.compiler.cuda_pipeline import cuda_pipeline

    return cuda_pipeline(target, sm_count=spec.sm_count)


def compile_variant(
    imported: ImportedModel,
    spec: TargetSpec,
    out_path: Path,
    cuda_code: str = "cubin",
    tuning_dir: Path | None = None,
    precision: str = "fp32",
    cuda_graph: bool = True,
    log=None,
) -> dict[str, Any]:
    """Compile ``imported.mod`` for ``spec`` and export the shared library to ``out_path``.

    CUDA kernels are compiled here, on the build host (see :mod:`inferx_edge.compiler.cuda`). With
    ``tuning_dir`` (a MetaSchedule database) tuned schedules replace the defaults where recorded.
    The returned record's ``"weights"`` is ``(names, arrays)``: what the library's ``main`` takes after
    the inputs (weight transforms already applied, :func:`bake_weight_transforms`).
    """
    from tvm import relax

    from inferx_edge.compiler.cuda import device_compiler

    target = resolve_tvm_target(spec)
    t0 = time.perf_counter()
    mod, tuned, weights = prepare_module(
        imported, target, precision, tuning_dir, conv_layout(spec, precision), bake=True, log=log,
        kernel_layout=conv_kernel_layout(spec),
    )  # fmt: skip
    cuda_ctx = device_compiler(spec, cuda_code) if spec.is_cuda else contextlib.nullcontext(None)
    cuda_graph = cuda_graph and spec.is_cuda
    try:
        with cuda_ctx as cuda_record, target, pass_config(cuda_graph, async_copy=spec.is_cuda):
            pipeline = relax_pipeline(spec, target)
            executable = relax.build(mod, target, relax_pipeline=pipeline, exec_mode="compiled")
    except BuildError:
        raise
    except Exception as exc:  # TVMError from any pass or codegen
        raise BuildError(f"compiling {imported.name} for {spec.name} failed: {type(exc).__name__}: {exc}") from exc
    if spec.is_cuda and not cuda_record["kernels_modules"]:
        raise BuildError(f"no CUDA kernels were compiled ahead of time for {spec.name}; refusing to ship CUDA source")
    t1 = time.perf_counter()
    fcompile = _linker(spec)
    try:
        if fcompile is None:
            executable.export_library(str(out_path))
        else:
            executable.export_library(str(out_path), fcompile=fcompile)
    except Exception as exc:
        raise BuildError(f"linking the {spec.name} library failed: {exc}") from exc
    return {
        "tvm_target": _plain(target.export()),
        "compile_s": round(t1 - t0, 3),
        "link_s": round(time.perf_counter() - t1, 3),
        "linker": spec.cross_compiler if fcompile is not None else "host",
        "cuda": cuda_record,
        "cuda_graph": cuda_graph,
        "conv_layout": conv_layout(spec, precision),
        "tuning": tuned,
        "weights": weights,
    }


def pass_config(cuda_graph: bool = False, async_copy: bool = False):
    """The PassContext a variant compiles under. ``async_copy``: shared-memory copies in pipeline stages
    marked asynchronous become ``cp.async`` (CUDA sm_80+; only loops our schedules annotate)."""
    import tvm

    return tvm.transform.PassContext(
        config={"relax.backend.use_cuda_graph": bool(cuda_graph), "tirx.use_async_copy": bool(async_copy)}
    )


#: Oldest JetPack whose driver supports a given CUDA version (6.0: CUDA 12.2; 6.1/6.2: 12.6; 7: 13.0).
_MIN_JETPACK = {"12.0": "6.0", "12.2": "6.0", "12.6": "6.1", "13.0": "7.0"}


def cuda_requirements(cuda: dict[str, Any]) -> dict[str, Any]:
    """What the device must have for this device code: driver CUDA version, JetPack for Jetsons."""
    version = cuda["toolkit"].split()[-1]
    major = int(version.split(".")[0])
    # cubins load on any driver of the same major version (minor version compatibility); PTX needs a
    # driver at least as new as the compiler that wrote it.
    min_cuda = f"{major}.0" if cuda["code"] == "cubin" else version
    return {
        "cuda_code": cuda["code"],
        "cuda_code_arch": cuda["arch"],
        "cuda_toolkit": cuda["toolkit"],
        "min_driver_cuda": min_cuda,
        "min_jetpack": _MIN_JETPACK.get(min_cuda),
    }


def _weights_member(files: dict, precision: str, variant: str, names: list[str], arrays: list[np.ndarray]) -> str:
    """The artifact member holding a variant's weights: an existing file with the same weights (e.g. the
    other batch sizes of a precision), else ``weights/<precision>.npz``, else ``weights/<variant>.npz``."""
    for member, (n, a) in files.items():
        if n == names and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, arrays)):
            return member
    member = f"weights/{precision}.npz" if f"weights/{precision}.npz" not in files else f"weights/{variant}.npz"
    files[member] = (names, arrays)
    return member


def _plain(obj: Any) -> Any:
    """TVM containers (Map, Array, String, IntImm) to JSON-ready Python values."""
    if isinstance(obj, (str, bool, int, float)) or obj is None:
        return obj if not isinstance(obj, str) else str(obj)
    if hasattr(obj, "items"):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) or hasattr(obj, "__len__") and hasattr(obj, "__getitem__"):
        return [_plain(v) for v in obj]
    if hasattr(obj, "value"):
        return obj.value
    return str(obj)


def _toolchain_versions(spec: TargetSpec) -> dict[str, str]:
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    cxx = spec.cross_compiler if spec.cross_compiler and platform.machine() != spec.host_arch else "g++"
    try:
        versions["cxx"] = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        versions["cxx"] = "unknown"
    return versions


def build_artifact(opts: BuildOptions, log=print, spec: TargetSpec | None = None) -> Manifest:
    """Run the whole build and write ``opts.output``. Returns the manifest written.

    One variant per (precision, batch size) of ``opts.variant_grid()``; all share one weights file.
    ``spec`` overrides the registry entry named by ``opts.target`` (a derived target, e.g. a device's
    GPU code paired with another host CPU for verification).
    """
    from inferx_edge.runtime._tvm import set_default_cpu_threads

    set_default_cpu_threads()  # calibration and build-time weight transforms run on this CPU
    import tvm

    from inferx_edge.tune import database as tdb

    spec = spec or get_target(opts.target)
    log(f"[1/4] importing {opts.model}")
    base = import_model(opts.model, opts.input_shapes)
    for t in base.inputs:
        log(f"      input  {t.describe()}")
    for t in base.outputs:
        log(f"      output {t.describe()}")

    variants, members, infos = [], {}, []
    weight_files: dict[str, tuple[list[str], list[np.ndarray]]] = {}  # member -> (names, arrays)
    base_batch = base.inputs[0].shape[0] if base.inputs and base.inputs[0].shape else 1
    grid = opts.variant_grid(base_batch)
    plans = {}
    for precision in dict.fromkeys(p for p, _ in grid if p in QUANTIZED):
        from inferx_edge.quantize.driver import resolve_plan

        log(f"[1/4] quantizing for {precision}")
        plans[precision] = resolve_plan(
            opts.model,
            opts.input_shapes,
            base,
            precision,
            opts.quant_plan,
            opts.calib,
            opts.calib_method,
            opts.max_accuracy_drop,
            opts.min_int8_share,
            opts.eval_data,
            opts.allow_over_budget,
            log,
            opts.float_between_layers,
        )
    with tempfile.TemporaryDirectory(prefix="inferx_edge-build-") as tmp:
        tmp = Path(tmp)
        for i, (precision, batch) in enumerate(grid, 1):
            imported = base
            if batch != base_batch:
                shapes = {**opts.input_shapes, **{t.name: (batch, *t.shape[1:]) for t in base.inputs}}
                imported = import_model(opts.model, shapes)
            quant_report = None
            if precision in QUANTIZED:
                from inferx_edge.quantize.driver import apply_plan

                imported, quant_report = apply_plan(
                    imported, plans[precision], precision, quant_kernel_layout(spec, precision)
                )
                n8 = sum(1 for r in quant_report["layers"] if r["precision"] == "int8")
                log(
                    f"      {precision}: {n8} of {len(quant_report['layers'])} layers int8, "
                    f"{quant_report['int8_mac_share'] * 100:.1f} % of conv/matmul MACs"
                )
            name = f"{precision}-b{batch}"
            log(f"[2/4] compiling variant {name} ({i}/{len(grid)}) for {spec.name} ({spec.description})")
            lib = tmp / f"{name}.so"
            tuning_dir = tdb.find_database(spec, imported, precision, opts.tuning_root) if opts.tuning else None
            info = compile_variant(imported, spec, lib, opts.cuda_code, tuning_dir, precision, opts.cuda_graph, log=log)
            names, arrays = info.pop("weights")
            weights_member = _weights_member(weight_files, precision, name, names, arrays)
            if info["tuning"]:
                t = info["tuning"]
                log(
                    f"      tuning database {tuning_dir}: {t['kernels_tuned']} of {t['kernels']} kernels tuned"
                    + (f", {t['tiles']} tensor-core kernels with measured tiles" if t["tiles"] else "")
                    + ", the rest default schedules"
                )
            else:
                log(
                    f"      no tuning database for this model and target: default schedules "
                    f"(python -m inferx_edge tune --target {spec.name})"
                )
            log(f"      compiled in {info['compile_s']:.1f} s, linked in {info['link_s']:.1f} s ({info['linker']})")
            variants.append(
                Variant(
                    name=name,
                    precision=precision,
                    batch=int(batch),
                    library=f"lib/{name}.so",
                    weights=weights_member,
                    params=tuple(names),
                    inputs=imported.inputs,
                    outputs=imported.outputs,
                    tuned=bool(info["tuning"] and (info["tuning"]["kernels_tuned"] or info["tuning"]["tiles"])),
                    extra=({"tuning": info["tuning"]} if info["tuning"] else {})
                    | ({"cuda_graph": True} if info["cuda_graph"] else {})
                    | {"conv_layout": info["conv_layout"]}
                    | ({"quantization": quant_report} if quant_report else {}),
                )
            )
            members[f"lib/{name}.so"] = lib
            infos.append(info)

        log(f"[3/4] writing weights ({', '.join(weight_files)}; variants with the same weights share a file)")
        for member, (names, arrays) in weight_files.items():
            path = tmp / Path(member).name
            np.savez(path, **dict(zip(names, arrays)))
            members[member] = path

        info = infos[0]
        target_record = spec.summary() | {"tvm_target": info["tvm_target"]}
        if info["cuda"]:
            target_record |= cuda_requirements(info["cuda"])
            log(f"      device code: {info['cuda']['code']} for {info['cuda']['arch']} by {info['cuda']['toolkit']}")
        manifest = Manifest(
            inferx_edge_version=__version__,
            tvm_version=tvm.__version__,
            created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            model=base.describe(),
            target=target_record,
            variants=tuple(variants),
            default_variant=variants[0].name,
            files={},
            build={
                "host": f"{platform.node()} {platform.machine()}",
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                "toolchain": _toolchain_versions(spec),
                "compile_s": round(sum(i["compile_s"] for i in infos), 3),
            },
        )
        log(f"[4/4] packaging {opts.output}")
        return write_artifact(opts.output, manifest, members)
