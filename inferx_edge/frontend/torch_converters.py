"""aten ops the torch.export import converts itself instead of TVM's translator: where TVM 0.27's
conversion computes other values without an error (negative indices, SELU, nearest and fractional
resizes, grid_sample) or fails on a common pattern (GroupNorm without affine parameters, integer
floor division, one-sided integer clamps, indexing after whole axes, amax/amin/prod, concatenations
with empty vectors). Each converter says what TVM did; ``tests/frontend/test_torch_import.py`` has a
case for each that fails on TVM's own conversion. docs/architecture.md ("Conversions the frontend
owns") tabulates them. aten ops TVM's translator does not know at all are in
:mod:`~inferx_edge.frontend.torch_extra_ops` (which uses this module's operand helpers); the import
passes both tables."""

from __future__ import annotations


def _dtype(node) -> str:
    """The dtype torch recorded for an fx node's value (``float32``, ``int64``...)."""
    return str(node.meta["val"].dtype).replace("torch.", "")


def _operand(importer, arg, dtype: str):
    """An fx argument (a node or a Python number) as a Relax value of ``dtype``."""
    from tvm import relax

    if not hasattr(arg, "meta"):
        return relax.const(arg, dtype)
    value = importer.env[arg]
    return value if _dtype(arg) == dtype else importer.block_builder.emit(relax.op.astype(value, dtype))


def _integer_index(index):
    """The value torch recorded for an ``aten.index.Tensor`` index that is an integer tensor; None for
    a whole axis (None) or a boolean / uint8 mask."""
    import torch

    val = index.meta.get("val") if isinstance(index, torch.fx.Node) else None
    return None if val is None or val.dtype in (torch.bool, torch.uint8) else val


def _per_axis(scales, rank: int) -> list:
    """Resize scale factors as one per spatial axis (torch.export gives one or a list)."""
    return list(scales) if isinstance(scales, (list, tuple)) else [scales] * (rank - 2)


def _select(node, importer):
    """``aten.select.int`` (``x[:, i]``) for the translator: a negative index counts from the end. TVM's
    own conversion passes the index to an unchecked ``take`` as it is, so ``x[:, -1]`` (a sequence
    model's last step, ``h_n[-1]``) read outside the tensor: a GRU classifier's logits came out ~1e20,
    with no error. Negative indices become a one-element slice and a squeeze (slices count from the
    end, dynamic dims included)."""
    from tvm import relax

    x = importer.env[node.args[0]]
    dim, index = node.args[1], node.args[2]
    if not isinstance(index, int) or index >= 0:
        return importer.block_builder.emit(relax.op.take(x, relax.const(index, "int64"), dim))
    dim %= len(importer.shape_of(x))
    end = index + 1 if index != -1 else (1 << 63) - 1  # -1: to the end
    one = importer.block_builder.emit(relax.op.strided_slice(x, [dim], [index], [end]))
    return importer.block_builder.emit(relax.op.squeeze(one, [dim]))


def _index_tensor(node, importer):
    """``aten.index.Tensor`` (``x[:, [-1, 0]]``, ``x[idx]``) for the translator: negative entries of
    the index tensors count from the end. TVM's conversion gathers with an unchecked ``take`` or
    ``index_tensor``, which read outside the tensor for them (no error). Each integer index tensor
    becomes ``where(i < 0, i + size, i)`` for its axis, then TVM's own conversion runs on those."""
    from tvm import relax

    data = importer.env[node.args[0]]
    shape = importer.shape_of(data)
    saved = {}
    for axis, index in enumerate(node.args[1]):
        if _integer_index(index) is None or index in saved:
            continue  # None (a whole axis), a mask, or a tensor already wrapped for an earlier axis
        idx = importer.env[index]
        dtype = _dtype(index)
        size = shape[axis]
        if isinstance(size, int) or hasattr(size, "value"):
            size = relax.const(int(size), dtype)
        else:  # a dynamic dim: its value as a tensor
            size = importer.block_builder.emit(
                relax.op.astype(relax.op.shape_to_tensor(relax.ShapeExpr([size])), dtype)
            )
        wrapped = relax.op.where(relax.op.less(idx, relax.const(0, dtype)), relax.op.add(idx, size), idx)
        saved[index] = idx
        importer.env[index] = importer.block_builder.emit(wrapped)
    try:
        gathered = _adjacent_advanced_index(node, importer)
        return importer._index_tensor(node) if gathered is None else gathered
    finally:
        importer.env.update(saved)


def _adjacent_advanced_index(node, importer):
    """``x[:, :, i, j]``-style indexing: whole leading axes (None), then several index tensors on
    adjacent axes that broadcast together, e.g. ``F.unfold``'s decomposition (``i``: (3, 3, 1, 1),
    ``j``: (3, 3)). TVM's conversion failed on these ("cannot broadcast index shapes"). The indexed
    axes are moved to the front, gathered with index tensors broadcast to one shape, and the gathered
    dims moved back to where the first indexed axis was, as torch places them. None (TVM's conversion)
    for other patterns."""
    import numpy as np
    from tvm import relax

    indices = list(node.args[1])
    at = [i for i, ix in enumerate(indices) if ix is not None]
    if len(at) < 2 or at != list(range(at[0], at[-1] + 1)) or at[0] == 0:
        return None
    vals = [_integer_index(indices[i]) for i in at]
    if any(v is None for v in vals):
        return None
    try:
        common = tuple(int(d) for d in np.broadcast_shapes(*(tuple(v.shape) for v in vals)))
    except (TypeError, ValueError):  # dynamic index shapes
        return None
    bb, op = importer.block_builder, relax.op
    data = importer.env[node.args[0]]
    rank = len(importer.shape_of(data))
    rest = [a for a in range(rank) if a not in at]
    front = bb.emit(op.permute_dims(data, [*at, *rest]))
    index = [bb.emit(op.broadcast_to(importer.env[indices[i]], common)) for i in at]
    gathered = bb.emit(op.index_tensor(front, index))  # common + the other axes, in order
    k, first = len(common), at[0]
    # the other axes before the first indexed one, then the gathered dims, then the remaining axes
    order = [k + j for j in range(first)] + list(range(k)) + [k + j for j in range(first, len(rest))]
    return bb.emit(op.permute_dims(gathered, order))


def _reduction(name: str):
    """A converter for ``aten.amax`` / ``amin`` / ``prod`` (``torch.logsumexp`` decomposes to amax),
    which TVM's translator does not know: ``(x, dim[s], keepdim)``, no dims reducing every axis."""

    def convert(node, importer):
        from tvm import relax

        x = importer.env[node.args[0]]
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        axis = None if dims is None or dims == [] else [dims] if isinstance(dims, int) else list(dims)
        return importer.block_builder.emit(getattr(relax.op, name)(x, axis=axis, keepdims=bool(keepdim)))

    return convert


def _native_group_norm(node, importer):
    """``aten.native_group_norm`` ``(x, weight, bias, N, C, HxW, groups, eps)``: a GroupNorm without
    affine parameters (``nn.GroupNorm(affine=False)``, ``F.group_norm(x, g)``) passes None for them,
    which TVM's conversion handed on as is (an internal null-pointer error); they become ones and
    zeros."""
    import numpy as np
    from tvm import relax

    x = importer.env[node.args[0]]
    shape = importer.shape_of(x)
    dtype = _dtype(node.args[0])
    channels = int(shape[1])
    gamma, beta = (
        importer.env[node.args[i]] if node.args[i] is not None else relax.const(np.full(channels, fill, dtype))
        for i, fill in ((1, 1.0), (2, 0.0))
    )
    groups = node.args[6] if len(node.args) > 6 else 1
    eps = node.args[7] if len(node.args) > 7 else 1e-5
    axes = list(range(2, len(shape)))
    return importer.block_builder.emit(
        relax.op.nn.group_norm(x, gamma, beta, num_groups=groups, channel_axis=1, axes=axes, epsilon=eps)
    )


def _elu(node, importer):
    """``aten.elu(x, alpha, scale, input_scale)`` = ``scale * (x if x > 0 else alpha * (exp(x *
    input_scale) - 1))``. TVM's conversion drops ``scale`` and ``input_scale``: ``nn.SELU`` (which
    torch.export writes as ``elu(x, 1.6733, 1.0507)``) came out 5 % low on positive inputs, no error."""
    from tvm import relax

    x = importer.env[node.args[0]]
    dtype = _dtype(node.args[0])
    alpha, scale, input_scale = (
        node.args[i] if len(node.args) > i else node.kwargs.get(key, 1.0)
        for i, key in ((1, "alpha"), (2, "scale"), (3, "input_scale"))
    )
    op, const = relax.op, lambda v: relax.const(float(v), dtype)
    negative = op.multiply(const(alpha), op.subtract(op.exp(op.multiply(x, const(input_scale))), const(1.0)))
    out = op.where(op.greater(x, const(0.0)), x, negative)
    return importer.block_builder.emit(op.multiply(out, const(scale)) if scale != 1.0 else out)


def _resize_by_scale(importer, x, scales, linear: bool):
    """``x`` (NCHW) resized along H and W by ``scales`` as torch does when it is given scale factors and
    ``in * scale`` is not a whole number: the output has ``floor(in * scale)`` pixels, and source
    coordinates use ``1 / scale`` (float32, as torch computes them), not the size ratio Relax's
    ``resize2d`` takes. Each axis is a gather of precomputed source rows (nearest: ``floor(dst / s)``;
    linear, half-pixel: two rows and their weights, negative coordinates clamped to 0)."""
    import numpy as np
    from tvm import relax

    bb = importer.block_builder
    shape = importer.shape_of(x)
    dtype = str(x.ty.dtype)
    for axis, scale in zip((2, 3), scales, strict=True):
        size = int(shape[axis])
        out = int(np.floor(size * float(scale)))
        inv = np.float32(1.0 / float(scale))
        dst = np.arange(out, dtype=np.float32)
        if not linear:
            src = np.minimum(np.floor(dst * inv).astype(np.int64), size - 1)
            x = bb.emit(relax.op.take(x, relax.const(src), axis=axis))
            continue
        coord = np.maximum(inv * (dst + np.float32(0.5)) - np.float32(0.5), np.float32(0.0))
        lo = np.minimum(coord.astype(np.int64), size - 1)
        hi = np.minimum(lo + 1, size - 1)
        frac = (coord - lo.astype(np.float32)).astype(dtype)
        bcast = [1] * len(shape)
        bcast[axis] = out
        w = relax.const(frac.reshape(bcast))
        a = relax.op.take(x, relax.const(lo), axis=axis)
        b = relax.op.take(x, relax.const(hi), axis=axis)
        x = bb.emit(relax.op.add(a, relax.op.multiply(relax.op.subtract(b, a), w)))
    return x


def _fractional_scales(importer, x, scales) -> list | None:
    """``scales`` (one or one per spatial axis) when some spatial size times its scale is not a whole
    number (where torch's sampling differs from a size-ratio resize), else None."""
    if not scales:
        return None
    shape = importer.shape_of(x)
    scales = _per_axis(scales, len(shape))
    if len(shape) != 4 or any(not hasattr(shape[i], "value") and not isinstance(shape[i], int) for i in (2, 3)):
        return None
    products = [int(shape[i]) * float(scales[i - 2]) for i in (2, 3)]
    return scales if any(p != int(p) for p in products) else None


def _upsample_nearest2d(node, importer):
    """``aten.upsample_nearest2d.vec(x, size, scale_factors)``: torch's "nearest" takes source pixel
    ``floor(i * in / out)`` (asymmetric coordinates, floor). TVM's conversion resized with half-pixel
    coordinates and rounding, the rule of "nearest-exact": a 5 -> 3 downsample picked other pixels
    (no error); integer upsamples happen to agree. Scales that give no whole output size sample with
    the scale itself (:func:`_resize_by_scale`)."""
    from tvm import relax

    x = importer.env[node.args[0]]
    size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
    scales = None if size else (node.args[2] if len(node.args) > 2 else node.kwargs.get("scale_factors"))
    fractional = _fractional_scales(importer, x, scales)
    if fractional is not None:
        return _resize_by_scale(importer, x, fractional, linear=False)
    if not size:
        shape = importer.shape_of(x)
        scales = _per_axis(scales, len(shape))
        size = [int(int(shape[i]) * scales[i - 2]) for i in range(2, len(shape))]
    resize = relax.op.image.resize2d(
        x, size, layout="NCHW", method="nearest_neighbor",
        coordinate_transformation_mode="asymmetric", rounding_method="floor",
    )  # fmt: skip
    return importer.block_builder.emit(resize)


def _upsample_bilinear2d(node, importer):
    """``aten.upsample_bilinear2d.vec(x, size, align_corners, scale_factors)``: with scale factors whose
    output size is not whole (5 pixels x 1.5), torch samples with ``1 / scale`` where TVM's conversion
    used the size ratio (41 % off, no error); those go through :func:`_resize_by_scale`, the rest
    through TVM's conversion."""
    x = importer.env[node.args[0]]
    size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
    align = node.args[2] if len(node.args) > 2 else node.kwargs.get("align_corners", False)
    scales = None if size else (node.args[3] if len(node.args) > 3 else node.kwargs.get("scale_factors"))
    fractional = None if align else _fractional_scales(importer, x, scales)
    if fractional is not None:
        return _resize_by_scale(importer, x, fractional, linear=True)
    return importer._upsample_bilinear2d(node)


def _grid_sampler_2d(node, importer):
    """``aten.grid_sampler_2d(x, grid, interpolation, padding, align_corners)``: torch's grid is (N, H,
    W, 2); Relax's ``image.grid_sample`` takes (N, 2, H, W). TVM's conversion passed torch's grid as it
    was, so the output had the wrong shape (N, C, W, 2) and values, no error. The grid is transposed."""
    from tvm import relax

    x, grid = importer.env[node.args[0]], importer.env[node.args[1]]
    mode, padding, align = (node.args[i] if len(node.args) > i else d for i, d in ((2, 0), (3, 0), (4, False)))
    grid = importer.block_builder.emit(relax.op.permute_dims(grid, [0, 3, 1, 2]))
    sample = relax.op.image.grid_sample(
        x, grid, method={0: "bilinear", 1: "nearest", 2: "bicubic"}[mode], layout="NCHW",
        padding_mode={0: "zeros", 1: "border", 2: "reflection"}[padding], align_corners=bool(align),
    )  # fmt: skip
    return importer.block_builder.emit(sample)


def _clamp(node, importer):
    """``aten.clamp(x, min, max)`` with one bound None: TVM's conversion wrote the other as an infinite
    float bound, which an integer tensor's legalization could not cast ("Cannot convert infinity to
    BigInt": ``counts.clamp(min=1)`` failed the build). One-sided and integer clamps are a maximum
    and/or a minimum in the dtype torch gives the result; two-sided float ones stay a clip."""
    from tvm import relax

    dtype = _dtype(node)
    out = _operand(importer, node.args[0], dtype)
    low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    if dtype.startswith("float") and all(isinstance(b, (int, float)) for b in (low, high)):
        return importer.block_builder.emit(relax.op.clip(out, low, high))  # as TVM converts it (ReLU6)
    if low is not None:
        out = relax.op.maximum(out, _operand(importer, low, dtype))
    if high is not None:
        out = relax.op.minimum(out, _operand(importer, high, dtype))
    return importer.block_builder.emit(out)


def _div_mode(node, importer):
    """``aten.div.Tensor_mode(a, b, rounding_mode)`` (``torch.div(x, 3, rounding_mode="floor")``, an
    integer tensor's ``//``): TVM's conversion made a Python divisor an int32 constant next to a float32
    or int64 tensor and the import failed. Both operands take the result's dtype; "floor" is floor
    division (Python's, for integers too), "trunc" rounds toward zero."""
    from tvm import relax

    dtype = _dtype(node)
    a, b = (_operand(importer, arg, dtype) for arg in node.args[:2])
    mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
    op = relax.op
    if mode == "floor":
        out = op.floor_divide(a, b) if dtype.startswith(("int", "uint")) else op.floor(op.divide(a, b))
    elif mode == "trunc" and dtype.startswith(("int", "uint")):  # exact below 2**53
        wide = op.trunc(op.divide(op.astype(a, "float64"), op.astype(b, "float64")))
        out = op.astype(wide, dtype)
    elif mode == "trunc":
        out = op.trunc(op.divide(a, b))
    else:
        out = op.divide(a, b)
    return importer.block_builder.emit(out)


def _cat(node, importer):
    """``aten.cat(tensors, dim=0)``: torch skips 1-D empty inputs whatever the others' rank
    (``torch.cat([torch.empty(0), k], dim=-2)``: how transformers' GPT-2 starts its key / value cache);
    TVM's conversion refused the mix ("Concat expects all input tensors to have same ndim"). Those
    inputs are dropped (an input left alone is the result); the rest concatenate as TVM does."""
    from tvm import relax

    tensors = list(node.args[0])
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    vals = [t.meta["val"] for t in tensors]
    kept = [t for t, v in zip(tensors, vals, strict=True) if not (v.ndim == 1 and v.numel() == 0)] or tensors[:1]
    if len(kept) == 1:
        return importer.env[kept[0]]
    return importer.block_builder.emit(relax.op.concat([importer.env[t] for t in kept], axis=dim))


#: aten ops converted here instead of by TVM's translator (see each function)
CONVERTERS = {
    "cat.default": _cat,
    "select.int": _select,
    "index.Tensor": _index_tensor,
    "amax.default": _reduction("max"),
    "amin.default": _reduction("min"),
    "prod.dim_int": _reduction("prod"),
    "native_group_norm.default": _native_group_norm,
    "elu.default": _elu,
    "upsample_nearest2d.vec": _upsample_nearest2d,
    "upsample_bilinear2d.vec": _upsample_bilinear2d,
    "grid_sampler_2d.default": _grid_sampler_2d,
    "clamp.default": _clamp,
    "div.Tensor_mode": _div_mode,
}
