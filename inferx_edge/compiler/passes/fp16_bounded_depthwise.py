"""Float depthwise convolutions of int8 variants read a clipped input as fp16."""

from __future__ import annotations

import numpy as np

from inferx_edge.compiler.passes._rewrite import rewrite_calls_in_context

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
        if str(x.ty.dtype) != "float32" or str(w.ty.dtype) != "float32" or not clipped(ctx.given[0], ctx.bindings):
            return None
        a = call.attrs
        return relax.op.nn.conv2d(
            relax.op.astype(x, "float16"), relax.op.astype(w, "float16"), a.strides, a.padding, a.dilation,
            a.groups, a.data_layout, a.kernel_layout, a.out_layout, "float32",
        )  # fmt: skip

    return rewrite_calls_in_context(mod, rewrite)
