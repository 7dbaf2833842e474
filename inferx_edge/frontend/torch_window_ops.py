"""Windowed aten ops TVM 0.27's torch.export translator gets wrong without an error, or does not know,
converted by the import (each matched against torch in ``tests/frontend/test_torch_math_ops.py``):

- ``F.avg_pool2d(divisor_override=d)``: TVM's converter dropped the override (divided by the window
  size); here the window sum over ``d``.
- ``F.interpolate(antialias=True)`` (bilinear / bicubic): TVM's converter ignored antialiasing when
  downscaling (1.5 off on a 9 x 8 -> 3 x 4 resize); here torch's separable filter as one constant
  interpolation matrix per axis (``Wh @ x @ Ww^T``).
- ``Tensor.unfold(dim, size, step)`` (sliding windows as a new last axis): unsupported; here a gather of
  the windows' positions.
- ``nn.ConvTranspose3d``: refused by TVM's translator; here Relax's ``conv3d_transpose``."""

from __future__ import annotations

import numpy as np

from inferx_edge.frontend.onnx_resize import keys_far, keys_near
from inferx_edge.frontend.torch_converters import _dtype


def _avg_pool2d(node, importer):
    args = list(node.args) + [None] * (7 - len(node.args))
    divisor = args[6] if args[6] is not None else node.kwargs.get("divisor_override")
    if divisor is None:
        return importer._avg_pool2d(node)
    from tvm import relax

    from inferx_edge.errors import ModelError

    kernel = args[1]
    kernel = [kernel, kernel] if isinstance(kernel, int) else list(kernel)
    stride = args[2] if args[2] not in (None, []) else kernel
    padding = args[3] if args[3] is not None else 0
    if args[4]:
        raise ModelError("avg_pool2d with divisor_override and ceil_mode=True: not supported")
    x = importer.env[node.args[0]]
    mean = importer._avg_pool2d_impl(x, kernel, stride, padding, False, True)  # every window is whole
    scale = relax.const(kernel[0] * kernel[1] / float(divisor), _dtype(node))
    return importer.block_builder.emit(relax.op.multiply(mean, scale))


def _aa_filter(mode: str):
    if mode == "bilinear":
        return lambda x: np.maximum(1.0 - np.abs(x), 0.0)

    def cubic(x, a=-0.5):
        x = np.abs(x)
        return np.where(x < 1, keys_near(x, a), np.where(x < 2, keys_far(x, a), 0.0))

    return cubic


def antialias_matrix(mode: str, size: int, out: int, scale_hint: float | None) -> np.ndarray:
    """``[out, size]`` weights of torch's antialiased resize along one axis (align_corners=False):
    a ``mode`` filter stretched by the downscale factor, centred on each output pixel, normalised."""
    scale = 1.0 / scale_hint if scale_hint else size / out
    interp = 2 if mode == "bilinear" else 4
    support = interp * 0.5 * scale if scale >= 1.0 else interp * 0.5
    invscale = 1.0 / scale if scale >= 1.0 else 1.0
    filt = _aa_filter(mode)
    m = np.zeros((out, size), np.float64)
    for i in range(out):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), size)
        w = filt((np.arange(lo, hi) - center + 0.5) * invscale)
        if w.sum() != 0:
            m[i, lo:hi] = w / w.sum()
    return m


def _upsample_aa(mode: str):
    def convert(node, importer):
        from tvm import relax

        from inferx_edge.errors import ModelError

        x = importer.env[node.args[0]]
        out_size = [int(v) for v in node.args[1]]
        align = bool(node.args[2]) if len(node.args) > 2 else False
        if align:
            raise ModelError(f"antialiased {mode} interpolation with align_corners=True: not supported")
        scales = [node.args[3] if len(node.args) > 3 else None, node.args[4] if len(node.args) > 4 else None]
        shape = [int(d) for d in importer.shape_of(x)]
        dtype = _dtype(node)
        wh, ww = (
            antialias_matrix(mode, shape[axis], out_size[k], scales[k]).astype(dtype) for k, axis in ((0, -2), (1, -1))
        )
        op, bb = relax.op, importer.block_builder
        cols = bb.emit(op.matmul(x, relax.const(np.ascontiguousarray(ww.T), dtype)))
        return bb.emit(op.matmul(relax.const(wh, dtype), cols))

    return convert


def _tensor_unfold(node, importer):
    """``aten.unfold(x, dim, size, step)``: windows ``x[.., i*step : i*step+size, ..]`` along ``dim``,
    the window count in ``dim``'s place and the window as a new last axis."""
    from tvm import relax

    x = importer.env[node.args[0]]
    shape = [int(d) for d in importer.shape_of(x)]
    dim, size, step = int(node.args[1]) % len(shape), int(node.args[2]), int(node.args[3])
    n = (shape[dim] - size) // step + 1
    index = np.arange(n)[:, None] * step + np.arange(size)[None, :]
    op, bb = relax.op, importer.block_builder
    taken = bb.emit(op.take(x, relax.const(index.astype("int64"), "int64"), axis=dim))  # [.., n, size, ..]
    rank = len(shape) + 1
    perm = [a for a in range(rank) if a != dim + 1] + [dim + 1]
    return bb.emit(op.permute_dims(taken, perm))


def _convolution(node, importer):
    """``aten.convolution`` as TVM's translator converts it, plus the transposed 3-D case it refused
    ("Unsupported transposed convolution dimensionality: 5"): Relax's ``conv3d_transpose``."""
    x = importer.env[node.args[0]]
    transposed = bool(node.args[6]) if len(node.args) > 6 else False
    if not (transposed and len(importer.shape_of(x)) == 5):
        return importer._convolution(node)
    from tvm import relax

    args = importer.retrieve_args(node)
    weight, bias = args[1], args[2]
    stride, padding, dilation, output_padding, groups = args[3], args[4], args[5], args[7], args[8]
    bb = importer.block_builder
    out = bb.emit(
        relax.op.nn.conv3d_transpose(
            x, weight, strides=stride, padding=padding, output_padding=output_padding, dilation=dilation,
            groups=groups, data_layout="NCDHW", kernel_layout="IODHW",
        )
    )  # fmt: skip
    if bias is None:
        return out
    return bb.emit(relax.op.add(out, relax.op.reshape(bias, (1, -1, 1, 1, 1))))


#: aten op name (as TVM's translator keys them) -> converter
WINDOW_OPS = {
    "convolution.default": _convolution,
    "avg_pool2d.default": _avg_pool2d,
    "_upsample_bilinear2d_aa.default": _upsample_aa("bilinear"),
    "_upsample_bicubic2d_aa.default": _upsample_aa("bicubic"),
    "unfold.default": _tensor_unfold,
}
