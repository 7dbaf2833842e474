"""Inference BatchNorm as one multiply-add per element, its scale and shift computed at build time."""

from __future__ import annotations


def batch_norm_scale_shift(mod):
    """Every inference ``batch_norm(x, gamma, beta, mean, var)`` (``training`` off) becomes ``x * a + b``
    with ``a = gamma / sqrt(var + eps)`` and ``b = beta - mean * a`` broadcast along its channel axis.

    TVM's legalization computes ``(x - mean) / sqrt(var + eps) * gamma + beta`` for every element: a
    square root and a division per element, where ``a`` and ``b`` depend on weights only. Written this
    way they are weight-only expressions that
    :func:`~inferx_edge.compiler.passes.bake_weight_transforms.bake_weight_transforms` computes once at
    build time, and the kernel does one multiply-add. A BatchNorm that follows a convolution is usually
    folded into it by the exporter; those left are the pre-activation ones (DenseNet's, after each
    concatenation). The batch statistics the op also returns are its ``mean`` and ``var`` as given.

    In fp16 variants ``a``, ``b`` and the multiply-add are float32 (the input widened in registers, the
    result rounded once): folded into ``b``, the mean cancels against ``x * a``, which in fp16 loses
    the bits that ``x - mean`` keeps when the mean is large against the spread.
    """
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes._rewrite import rewrite_calls_in_context

    batch_norm = tvm.ir.Op.get("relax.nn.batch_norm")

    def rewrite(call, ctx):
        if call.op != batch_norm or bool(getattr(call.attrs, "training", False)):
            return None
        x, gamma, beta, mean, var = call.args
        ndim, dtype = getattr(x.ty, "ndim", -1), str(getattr(x.ty, "dtype", ""))
        if ndim is None or ndim < 1 or dtype not in ("float32", "float16"):
            return None
        axis = int(call.attrs.axis) % ndim
        emit = ctx.builder.emit
        if dtype == "float16":  # a and b in fp32: b = beta - mean * a cancels where |mean| >> std
            x, gamma, beta, mean, var = (emit(relax.op.astype(a, "float32")) for a in (x, gamma, beta, mean, var))
        scale = emit(relax.op.rsqrt(relax.op.add(var, relax.const(float(call.attrs.epsilon), "float32"))))
        if call.attrs.scale:
            scale = emit(relax.op.multiply(gamma, scale))
        shift = emit(relax.op.negative(relax.op.multiply(mean, scale)))
        if call.attrs.center:
            shift = emit(relax.op.add(beta, shift))
        along = [1] * ndim
        along[axis] = -1
        y = emit(relax.op.multiply(x, emit(relax.op.reshape(scale, along))))
        y = emit(relax.op.add(y, emit(relax.op.reshape(shift, along))))
        return relax.Tuple([emit(relax.op.astype(y, dtype)) if dtype == "float16" else y, *call.args[3:]])

    rewritten = rewrite_calls_in_context(mod, rewrite)
    # the op's tuple is read only through [0]: canonicalized to the sum, then the tuple is dead
    return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(rewritten))
