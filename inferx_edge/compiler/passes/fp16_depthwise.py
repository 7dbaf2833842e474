"""Float depthwise (and grouped) convolutions of int8 variants read their input as fp16."""

from __future__ import annotations

import numpy as np

from inferx_edge.compiler.passes._rewrite import rewrite_calls_in_context

FP16_MAX = 65504.0


def saturated_fp16(x):
    """Relax: float32 ``x`` clamped to fp16's finite range and cast to fp16 (an fp16 ``x`` as it is):
    a value beyond the range becomes +-65504, never inf. The clamp fuses into the producer's kernel."""
    from tvm import relax

    if str(getattr(getattr(x, "ty", None), "dtype", "")) == "float16":
        return x
    lo, hi = relax.const(-FP16_MAX, "float32"), relax.const(FP16_MAX, "float32")
    return relax.op.astype(relax.op.minimum(relax.op.maximum(x, lo), hi), "float16")


def _read_elsewhere(mod):
    """A test of whether a variable of ``mod``'s Relax functions is read by more than one binding (or
    the function's result; a variable bound to another counts as that one) or is a parameter: a cast
    of it cannot fuse into the kernel that produced it."""
    from collections import Counter

    from tvm import relax

    root, uses, params = {}, Counter(), set()
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        params.update(func.params)
        for block in func.body.blocks:
            for binding in block.bindings:
                if isinstance(binding.value, relax.Var):  # an alias, not a read
                    root[binding.var] = root.get(binding.value, binding.value)
                else:
                    uses.update(root.get(v, v) for v in relax.analysis.free_vars(binding.value))
        uses.update(root.get(v, v) for v in relax.analysis.free_vars(func.body.body))
    return lambda var: root.get(var, var) in params or uses[root.get(var, var)] > 1


def fp16_depthwise(mod):
    """Float depthwise and grouped convs (int8 variants keep them float) read their input and weights
    as fp16 and accumulate in fp32: the producer's epilogue writes fp16, halving the traffic of the
    widest tensors of inverted-residual networks (6x expanded), and the depthwise kernel takes 8
    channels per thread with 16-byte loads where float32 takes 4. An input clipped into fp16's range
    (ReLU6 and other constant clips) is cast as it is; any other (SiLU, hardswish) is saturated first
    (:func:`saturated_fp16`). fp16's 11-bit precision is far finer than the int8 layers around it.

    A conv whose input is also read elsewhere (a residual stream, as in ConvNeXt's blocks) or is a
    parameter keeps it float32: there the cast would be a kernel of its own (read fp32, write fp16)
    before the conv reads the copy, 8 bytes moved per element where reading the fp32 input moves 4.
    Measured on an H100 (``gpu_depthwise_input_h100.json``): ConvNeXt-T's four 7x7 stages at batch 64
    took 488 us as fp16 input with its cast kernel, 422 us reading fp32 (1.23x and 1.26x at 56x56 and
    28x28, 5-6 % slower at 14x14 and 7x7, where the fp32 kernel's 4 channels per thread cost more than
    the cast saves)."""
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

    read_elsewhere = _read_elsewhere(mod)

    def rewrite(call, ctx):
        if call.op != conv or call.attrs.groups == 1 or read_elsewhere(ctx.given[0]):
            return None
        x, w = call.args
        if str(x.ty.dtype) != "float32" or str(w.ty.dtype) != "float32":
            return None
        x16 = relax.op.astype(x, "float16") if clipped(ctx.given[0], ctx.bindings) else saturated_fp16(x)
        a = call.attrs
        return relax.op.nn.conv2d(
            x16, saturated_fp16(w), a.strides, a.padding, a.dilation, a.groups, a.data_layout, a.kernel_layout,
            a.out_layout, "float32",
        )  # fmt: skip

    return rewrite_calls_in_context(mod, rewrite)
