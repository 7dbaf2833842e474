"""int8 NHWC convolutions with a channel count off a multiple of 4 get zero-padded channels."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_convs


def pad_int8_conv_channels(mod, multiple: int = 4):
    """int8 NHWC/OHWI ``conv2d`` (groups 1) whose input channels are not a multiple of ``multiple``:
    input and weight zero-padded along the channel axis (same sums)."""
    import tvm
    from tvm import relax

    def rewrite(call, a, x, w):
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

    return rewrite_convs(mod, rewrite)
