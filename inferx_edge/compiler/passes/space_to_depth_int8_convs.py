"""Stride-2 int8 convolutions over few channels (stems) as stride-1 ones over a space-to-depth input."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_calls


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
    16-byte pixels of contiguous reduction instead of 4-byte ones (a stem gathering 4 bytes at a time
    is among a network's slowest kernels). The input rearrangement fuses into the kernel that quantizes the input;
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

    return rewrite_calls(mod, rewrite)
