"""Float depthwise (and grouped) convolutions of int8 variants read their input as fp16."""

from __future__ import annotations

import math

import numpy as np

from inferx_edge.compiler.passes._rewrite import (
    rewrite_calls_in_context,
    static_shape,
    use_counts,
    weight_only,
    weight_params,
)

FP16_MAX = 65504.0

#: float depthwise and grouped convs reducing at most this many elements per output (a 7x7 window over
#: one channel: 49; 3x3 over four: 36) accumulate in fp16 -- the reductions the small-reduction kernel
#: unrolls in registers. Measured on ConvNeXt-T's 7x7 depthwise kernel over 56x56x96 maps (sm_90a
#: SASS per thread of 4 pixels x 8 channels): fp32 accumulation takes 1,568 FFMA and 952 fp16 -> fp32
#: conversions (HADD2.F32), fp16 takes 784 paired HFMA2 and 32 (the widened sums); see ``docs/zoo.md``
HALF_ACCUMULATION_MAX = 64


def saturated_fp16(x):
    """Relax: float32 ``x`` clamped to fp16's finite range and cast to fp16 (an fp16 ``x`` as it is):
    a value beyond the range becomes +-65504, never inf. The clamp fuses into the producer's kernel."""
    from tvm import relax

    if str(getattr(getattr(x, "ty", None), "dtype", "")) == "float16":
        return x
    lo, hi = relax.const(-FP16_MAX, "float32"), relax.const(FP16_MAX, "float32")
    return relax.op.astype(relax.op.minimum(relax.op.maximum(x, lo), hi), "float16")


def reduced_elements(weight, kernel_layout: str) -> float:
    """Elements a conv with ``weight`` (laid out as ``kernel_layout``) sums per output: its weight's
    elements per output channel (inf for a shape not known when compiling)."""
    dims = static_shape(weight)
    return math.prod(dims) / dims[kernel_layout.index("O")] if dims else float("inf")


def fp16_depthwise(mod):
    """Float depthwise and grouped convs (int8 variants keep them float) read their input and weights
    as fp16: the producer's epilogue writes fp16, halving the traffic of the widest tensors of
    inverted-residual networks (6x expanded), and the depthwise kernel takes 8
    channels per thread with 16-byte loads where float32 takes 4. An input clipped into fp16's range
    (ReLU6 and other constant clips) is cast as it is; any other (SiLU, hardswish, a residual stream)
    is saturated first (:func:`saturated_fp16`). fp16's 11-bit precision is far finer than the int8
    layers around it.

    Those reducing at most :data:`HALF_ACCUMULATION_MAX` elements per output also accumulate in fp16
    (paired HFMA2s instead of fp32 FMAs plus a conversion per operand, as fp16 variants compute every
    conv) and widen the sum to float32 for the epilogue; longer reductions accumulate in fp32. A sum
    beyond fp16's range is inf, as an fp16 variant's would be.

    A residual stream's cast cannot fuse into its producer while the residual add reads the float32
    value too: :func:`~.fp16_shared_inputs.fp16_shared_inputs` (the next pass) makes the add read the
    fp16 copy. Keeping such inputs float32 instead (the conv reading the stream, 4 channels per thread)
    was measured: 1.16x on ConvNeXt-T's four depthwise stages alone (``gpu_depthwise_input_h100.json``),
    no change on the whole network at batch 64 or 1 on the same H100
    (``zoo_h100_convnext_fp{16,32}_dw_input``): not taken."""
    import tvm
    from tvm import relax

    conv = tvm.ir.Op.get("relax.nn.conv2d")
    lo_hi = {tvm.ir.Op.get("relax.maximum"): "lo", tvm.ir.Op.get("relax.minimum"): "hi"}

    def bound(value):  # (kind, other operand) of maximum/minimum against a constant within fp16's range
        if not isinstance(value, relax.Call) or value.op not in lo_hi:
            return None
        for a, b in (value.args, value.args[::-1]):
            if isinstance(b, tvm.ir.expr.Constant) and np.all(np.abs(b.value.numpy()) <= FP16_MAX):
                return lo_hi[value.op], a
        return None

    def clipped(x, bindings) -> bool:
        outer = bound(bindings.get(x))
        inner = bound(bindings.get(outer[1])) if outer else None
        return bool(outer and inner and {outer[0], inner[0]} == {"lo", "hi"})

    def rewrite(call, ctx):
        if call.op != conv or call.attrs.groups == 1:
            return None
        x, w = call.args
        if str(x.ty.dtype) != "float32" or str(w.ty.dtype) != "float32":
            return None
        x16 = relax.op.astype(x, "float16") if clipped(ctx.given[0], ctx.bindings) else saturated_fp16(x)
        a = call.attrs
        half_sum = reduced_elements(w, str(a.kernel_layout)) <= HALF_ACCUMULATION_MAX
        y = relax.op.nn.conv2d(
            x16, saturated_fp16(w), a.strides, a.padding, a.dilation, a.groups, a.data_layout, a.kernel_layout,
            a.out_layout, "float16" if half_sum else "float32",
        )  # fmt: skip
        return relax.op.astype(y, "float32") if half_sum else y

    return fp16_layer_norm_inputs(rewrite_calls_in_context(mod, rewrite))


def fp16_layer_norm_inputs(mod):
    """A float32 ``layer_norm`` whose input is used by nothing else and comes from an fp16-summed conv
    (:func:`fp16_depthwise`) through a widening cast, adds of weights or constants (the bias) and
    reshapes reads that input as fp16 (saturated to fp16's range) with fp16 scale and shift, and
    widens its result: the conv's kernel writes fp16 instead of float32 and the LayerNorm kernel reads
    it (ConvNeXt's depthwise -> LayerNorm: half the bytes of the widest tensors of each block; the
    same-shape reshape its ONNX graph has in between is gone since ``convert_layout``'s
    ``drop_identity_reshapes``, or it would end the conv's fused epilogue). Statistics stay float32 (TVM's
    LayerNorm sums fp16 inputs in float32); the normalised value is rounded to fp16 before the scale,
    far finer than the int8 quantization that follows it in int8 variants."""
    import tvm
    from tvm import relax

    layer_norm, astype, add, reshape = (
        tvm.ir.Op.get(f"relax.{n}") for n in ("nn.layer_norm", "astype", "add", "reshape")
    )
    conv = tvm.ir.Op.get("relax.nn.conv2d")
    weights = weight_params(mod)
    uses = use_counts(mod)

    def value_of(expr, ctx):  # what a variable is bound to (a parameter, or an expression: itself)
        return ctx.bindings.get(expr, expr) if isinstance(expr, relax.Var) else expr

    def half_summed(expr, ctx, depth: int = 0) -> bool:
        value = value_of(expr, ctx)
        if depth > 4 or (isinstance(expr, relax.Var) and uses.get(expr, 0) > 1) or not isinstance(value, relax.Call):
            return False
        if value.op == reshape:
            return half_summed(value.args[0], ctx, depth + 1)
        if value.op == add:  # the bias: a constant or weight-only expression
            a, b = value.args
            if weight_only(b, ctx, weights):
                return half_summed(a, ctx, depth + 1)
            return weight_only(a, ctx, weights) and half_summed(b, ctx, depth + 1)
        if value.op == astype and str(value.ty.dtype) == "float32":
            inner = value_of(value.args[0], ctx)
            return isinstance(inner, relax.Call) and inner.op == conv and str(inner.ty.dtype) == "float16"
        return False

    def rewrite(call, ctx):
        if call.op != layer_norm or str(call.ty.dtype) != "float32" or not half_summed(ctx.given[0], ctx):
            return None
        x, gamma, beta = call.args
        a = call.attrs
        y = relax.op.nn.layer_norm(
            saturated_fp16(x), relax.op.astype(gamma, "float16"), relax.op.astype(beta, "float16"), a.axes,
            a.epsilon, a.center, a.scale,
        )  # fmt: skip
        return relax.op.astype(y, "float32")

    return rewrite_calls_in_context(mod, rewrite)
