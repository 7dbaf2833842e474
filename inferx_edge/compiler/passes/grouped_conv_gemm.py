"""Grouped convolutions of CUDA fp16/int8 variants as batched GEMMs on tensor cores."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_calls_in_context
from inferx_edge.compiler.passes.fp16_depthwise import saturated_fp16

#: the tensor-core schedule's smallest GEMM width and depth (output channels and taps x input
#: channels of one group): narrower groups are merged (block-diagonal weights) up to it
MIN_GROUP_GEMM = 16

#: at most this many groups merged into one (the merged GEMM does that many times the work). Measured
#: on the H200 (``benchmarks/results/gpu_grouped_conv_h200_gemm.json``): ResNeXt's 8-wide groups merged
#: two to a GEMM beat the window kernel 5x at batch 64 (113 vs 580 us), its 4-wide ones merged four to
#: a GEMM lost (254 vs 160 us; 11.4 vs 5.4 us at batch 1), so those stay on the window kernel
MAX_MERGE = 2


def merge_factor(groups: int, in_per_group: int, out_per_group: int, taps: int) -> int | None:
    """How many adjacent groups one GEMM takes so its width (output channels) and depth (taps x input
    channels) reach :data:`MIN_GROUP_GEMM`: the smallest divisor of ``groups`` that does, at most
    :data:`MAX_MERGE`; None when none does (or the conv is depthwise: one input channel per group)."""
    if in_per_group < 2 or out_per_group < 1:
        return None
    for k in range(1, MAX_MERGE + 1):
        if groups % k == 0 and k * out_per_group >= MIN_GROUP_GEMM and k * in_per_group * taps >= MIN_GROUP_GEMM:
            return k
    return None


def grouped_gemm_te(x, w5, strides, padding, dilation, acc_dtype: str):
    """TE: an NHWC grouped convolution as ``out[n, h, w, g, j] = sum_{kh, kw, ci} x[n, h*s + kh*d,
    w*s + kw*d, g*Cg + ci] * w5[g, j, kh, kw, ci]``, the zero padding a stage of its own. The group is
    an axis of both operands and the output (a GEMM batch), the reduction runs along ``ci`` in both, so
    the tensor-core schedule reads both operands along K."""
    from tvm import te, topi

    n, h, w, _c = x.shape
    groups, jg, kh_n, kw_n, cg = w5.shape
    (sh, sw), (dh, dw) = strides, dilation
    top, left, bottom, right = padding
    if top or left or bottom or right:
        x = topi.nn.pad(x, [0, top, left, 0], [0, bottom, right, 0], name="pad")
    oh = (h + top + bottom - (kh_n - 1) * dh - 1) // sh + 1
    ow = (w + left + right - (kw_n - 1) * dw - 1) // sw + 1
    kh = te.reduce_axis((0, kh_n), name="kh")
    kw = te.reduce_axis((0, kw_n), name="kw")
    ci = te.reduce_axis((0, cg), name="ci")
    out = te.compute(
        (n, oh, ow, groups, jg),
        lambda b, i, j, g, o: te.sum(
            x[b, i * sh + kh * dh, j * sw + kw * dw, g * cg + ci].astype(acc_dtype)
            * w5[g, o, kh, kw, ci].astype(acc_dtype),
            axis=[kh, kw, ci],
        ),
        name="group_conv_gemm",
    )
    return topi.reshape(out, (n, oh, ow, groups * jg))


def block_diagonal(w, groups: int, k: int):
    """Relax: OHWI grouped weights ``w`` (``[groups * J, KH, KW, C]``, a bound variable) as ``[groups / k,
    k * J, KH, KW, k * C]`` whose groups are ``k`` original ones on the diagonal (zeros elsewhere), i.e.
    the same convolution with ``groups / k`` groups. Weight-only: computed at build time."""
    import numpy as np
    from tvm import relax

    o, kh, kw, c = (int(d) for d in w.ty.shape.values)
    j = o // groups
    if k == 1:
        return relax.op.reshape(w, [groups, j, kh, kw, c])
    w7 = relax.op.reshape(w, [groups // k, k, j, kh, kw, 1, c])
    eye = np.eye(k, dtype=str(w.ty.dtype)).reshape(1, k, 1, 1, 1, k, 1)
    return relax.op.reshape(relax.op.multiply(w7, relax.const(eye)), [groups // k, k * j, kh, kw, k * c])


def grouped_conv_gemm(mod, saturate: bool):
    """Every grouped (not depthwise) NHWC convolution with OHWI weights becomes one batched-GEMM kernel
    (:func:`grouped_gemm_te`) with fp16 operands, reshaped back to NHWC: the tensor-core schedule runs
    it on sm_80+ where the window-reduction kernel ran it on CUDA cores (RegNet, ResNeXt: 3-8x cuDNN's
    fp16 time at batch 64; as one GEMM about cuDNN fp16's time on the H200). Groups narrower than
    :data:`MIN_GROUP_GEMM` are merged (:func:`merge_factor`, :func:`block_diagonal`); a conv no merge
    makes wide enough is left to the window kernel.

    ``saturate`` (int8/mixed variants, whose float layers are float32): the operands are clamped to
    fp16's range and cast, the accumulation stays float32, the result float32 (the precedent of
    attention's matmuls there). fp16 variants' convs already read fp16 and keep their result dtype."""
    import tvm
    from tvm import relax

    conv = tvm.ir.Op.get("relax.nn.conv2d")

    def rewrite(call, ctx):
        if call.op != conv:
            return None
        a = call.attrs
        groups = int(a.groups)
        if groups == 1 or a.data_layout != "NHWC" or a.kernel_layout != "OHWI" or a.out_layout not in ("", "NHWC"):
            return None
        x, w = call.args
        shapes = [getattr(t.ty, "shape", None) for t in (x, w)]
        if any(s is None or not all(isinstance(d, tvm.tirx.IntImm) for d in s.values) for s in shapes):
            return None
        dtypes = {str(x.ty.dtype), str(w.ty.dtype)}
        if dtypes != ({"float32"} if saturate else {"float16"}):
            return None
        o, kh, kw, cg = (int(d) for d in w.ty.shape.values)
        k = merge_factor(groups, cg, o // groups, kh * kw)
        if k is None:
            return None
        out_dtype = "float32" if saturate else str(call.ty.dtype)
        b = ctx.builder
        w5 = b.emit(block_diagonal(b.emit(saturated_fp16(w)), groups, k))
        strides = [int(s) for s in a.strides]
        padding = [int(p) for p in a.padding]
        dilation = [int(d) for d in a.dilation]
        return b.call_te(
            grouped_gemm_te, b.emit(saturated_fp16(x)), w5, strides, padding, dilation, out_dtype,
            primfunc_name_hint="group_conv_gemm",
        )  # fmt: skip

    return relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))
