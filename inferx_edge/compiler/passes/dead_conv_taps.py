"""Convolution taps that read only padding are dropped: the kernel shrinks to the taps some output reads
the input through."""

from __future__ import annotations


def live_taps(size: int, pad_before: int, pad_after: int, kernel: int, stride: int, dilation: int):
    """``(first, last, pad_before, pad_after)`` of the taps along one spatial axis that read the input for
    at least one output position, with the padding that keeps every output where it was — or None when
    every tap is live, none is, or the shrunk window would need a negative pad.

    Output ``o`` reads input ``o * stride - pad_before + t * dilation`` through tap ``t``; a tap that
    lands in the padding for every output only ever multiplies zeros."""
    out = (size + pad_before + pad_after - dilation * (kernel - 1) - 1) // stride + 1
    if out < 1:
        return None

    def live(t: int) -> bool:
        start = t * dilation - pad_before  # the input read by output 0
        first = -(start // stride) if start < 0 else 0  # the first output reading at or after 0
        return first < out and first * stride + start < size

    taps = [t for t in range(kernel) if live(t)]
    if not taps or (taps[0] == 0 and taps[-1] == kernel - 1):
        return None
    lo, hi = taps[0], taps[-1]
    before, after = pad_before - lo * dilation, pad_after - (kernel - 1 - hi) * dilation
    if before < 0 or after < 0:
        return None
    return lo, hi, before, after


def dead_conv_taps(mod):
    """Every ``conv2d`` with static spatial sizes whose outer taps read only zero padding for every
    output (a dilated 3x3 whose rate is not smaller than the map: DeepLabV3's ASPP branches at rates
    24 and 36 over a 20x20 map are 1x1 convolutions in effect, as the DeepLabV3 paper notes) gets the
    weight sliced to the live taps and the padding reduced by what they no longer span: the same sums,
    up to 9x fewer multiply-adds and weights.

    Runs on the imported graph, before quantization rewrites and layout conversion, for every target
    and precision; the slice is a weight-only expression, computed at build time."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes._rewrite import rewrite_convs

    def spatial(expr, layout: str) -> list[int] | None:
        """The H and W extents of ``expr``, or None unless both are static (the batch may be symbolic)."""
        values = getattr(getattr(expr.ty, "shape", None), "values", None)
        if values is None or len(values) != 4:
            return None
        hw = [values[layout.index(axis)] for axis in "HW"]
        return [int(v) for v in hw] if all(isinstance(v, tvm.tirx.IntImm) for v in hw) else None

    def rewrite(call, a, x, w):
        data, kern = str(a.data_layout), str(a.kernel_layout)
        if sorted(data) != sorted("NCHW") or sorted(kern) != sorted("OIHW"):
            return None
        xs, ks = spatial(x, data), spatial(w, kern)
        if xs is None or ks is None:
            return None
        pad = [int(p) for p in a.padding]  # top, left, bottom, right
        strides, dilation = [int(s) for s in a.strides], [int(d) for d in a.dilation]
        axes = (kern.index("H"), kern.index("W"))
        shrunk = [live_taps(xs[i], pad[i], pad[i + 2], ks[i], strides[i], dilation[i]) for i in range(2)]
        if not any(shrunk):
            return None
        (h0, h1, top, bottom), (w0, w1, left, right) = (
            span or (0, ks[i] - 1, pad[i], pad[i + 2])
            for i, span in enumerate(shrunk)  # an axis left whole
        )
        w = relax.op.strided_slice(w, axes=list(axes), begin=[h0, w0], end=[h1 + 1, w1 + 1])
        return relax.op.nn.conv2d(
            x, w, a.strides, [top, left, bottom, right], a.dilation, a.groups, data, kern, a.out_layout, a.out_dtype
        )

    return rewrite_convs(mod, rewrite)
