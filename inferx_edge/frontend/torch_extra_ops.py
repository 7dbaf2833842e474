"""aten ops TVM 0.27's torch.export translator does not know ("Unsupported function types"), converted
by the import: ``torch.var_mean`` / ``std_mean``, ``F.adaptive_max_pool2d``, ``torch.hypot``,
``Tensor.scatter_add``, ``torch.cdist`` and ``torch.cummax`` / ``cummin``. Each has a case in
``tests/frontend/test_torch_import.py`` against torch."""

from __future__ import annotations

import math
import operator

import numpy as np

from inferx_edge.frontend.torch_converters import _dtype, _operand


def _var_mean(node, importer):
    """``aten.var_mean.correction(x, dim, *, correction, keepdim)`` (``torch.var_mean``; ``std_mean``
    decomposes to it): ``(sum((x - mean)^2) / (n - correction), mean)``, correction 1 when unset."""
    from tvm import relax

    x = importer.env[node.args[0]]
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    correction = node.kwargs.get("correction")
    keepdim = bool(node.kwargs.get("keepdim", False))
    shape = [int(d) for d in importer.shape_of(x)]
    axes = list(range(len(shape))) if dims is None or dims == [] else [dims] if isinstance(dims, int) else list(dims)
    axes = [a % len(shape) for a in axes]
    divisor = math.prod(shape[a] for a in axes) - (1 if correction is None else float(correction))
    op, bb = relax.op, importer.block_builder
    dtype = _dtype(node.args[0])
    mean = bb.emit(op.mean(x, axis=axes, keepdims=True))
    centred = bb.emit(op.subtract(x, mean))
    var = op.divide(op.sum(op.multiply(centred, centred), axis=axes, keepdims=keepdim), relax.const(divisor, dtype))
    mean = mean if keepdim else op.squeeze(mean, axis=axes)
    return bb.emit(relax.Tuple([bb.emit(var), bb.emit(mean)]))


def _adaptive_max_pool2d(node, importer):
    """``aten.adaptive_max_pool2d(x, output_size)``: output cell (i, j) is the maximum over rows
    ``floor(i H / oh) .. ceil((i + 1) H / oh)`` and the same columns (torch's windows, overlapping when
    the size does not divide). A maximum over a rectangle is the maximum over its rows of the maxima over
    its columns, so the windows are taken one axis at a time. Returns ``(values,)``: the indices output
    (``return_indices=True``) is refused by name."""
    from tvm import relax

    from inferx_edge.errors import ModelError

    if any(getattr(u, "target", None) is operator.getitem and u.args[1] == 1 for u in node.users):
        raise ModelError("adaptive_max_pool2d with return_indices=True: the indices output is not supported")
    x = importer.env[node.args[0]]
    size = node.args[1]
    size = [size, size] if isinstance(size, int) else list(size)
    shape = [int(d) for d in importer.shape_of(x)]
    op, bb = relax.op, importer.block_builder
    for axis, out in ((len(shape) - 2, size[0]), (len(shape) - 1, size[1])):
        extent = shape[axis]
        out = extent if out is None else int(out)
        if out == extent:
            continue
        windows = [(i * extent // out, -(-(i + 1) * extent // out)) for i in range(out)]
        parts = [
            op.max(op.strided_slice(x, axes=[axis], begin=[a], end=[b]), axis=[axis], keepdims=True) for a, b in windows
        ]
        x = bb.emit(parts[0] if out == 1 else op.concat(parts, axis=axis))
    return bb.emit(relax.Tuple([x]))


def _hypot(node, importer):
    """``aten.hypot(a, b)`` = ``sqrt(a^2 + b^2)``."""
    from tvm import relax

    a, b = (_operand(importer, arg, _dtype(node)) for arg in node.args[:2])
    op = relax.op
    return importer.block_builder.emit(op.sqrt(op.add(op.multiply(a, a), op.multiply(b, b))))


def _scatter_add(node, importer):
    """``aten.scatter_add(x, dim, index, src)``: ``x`` with ``src[i...]`` added at ``index`` along ``dim``
    (Relax's ``scatter_elements`` with an add reduction; ``src`` cut to the index's shape, as torch reads it)."""
    from tvm import relax

    x, index, src = (importer.env[node.args[i]] for i in (0, 2, 3))
    dim = int(node.args[1])
    ishape = [int(d) for d in importer.shape_of(index)]
    sshape = [int(d) for d in importer.shape_of(src)]
    bb = importer.block_builder
    if ishape != sshape:
        src = bb.emit(relax.op.strided_slice(src, list(range(len(ishape))), [0] * len(ishape), ishape))
    return bb.emit(relax.op.scatter_elements(x, index, src, axis=dim % len(ishape), reduction="add"))


def cdist_values(importer, a, b, p: float, dtype: str):
    """The p-norm distance of every row pair of ``a [.., P, M]`` and ``b [.., R, M]`` from the broadcast
    differences ``[.., P, R, M]`` (torch's matrix-product shortcut for p = 2 on long inputs rounds
    differently, by ~1e-6 relative)."""
    from tvm import relax

    op, bb = relax.op, importer.block_builder
    d = op.abs(op.subtract(op.expand_dims(a, -2), op.expand_dims(b, -3)))
    if p == 0:
        return bb.emit(op.sum(op.astype(op.not_equal(d, relax.const(0.0, dtype)), dtype), axis=[-1]))
    if math.isinf(p):
        return bb.emit(op.max(d, axis=[-1]))
    if p == 1:
        return bb.emit(op.sum(d, axis=[-1]))
    if p == 2:
        return bb.emit(op.sqrt(op.sum(op.multiply(d, d), axis=[-1])))
    total = op.sum(op.power(d, relax.const(p, dtype)), axis=[-1])
    return bb.emit(op.power(total, relax.const(1.0 / p, dtype)))


def _cdist(node, importer):
    """``aten._cdist_forward(x1, x2, p, compute_mode)``: :func:`cdist_values`."""
    a, b = (importer.env[node.args[i]] for i in (0, 1))
    p = float(node.args[2]) if len(node.args) > 2 else 2.0
    return cdist_values(importer, a, b, p, _dtype(node.args[0]))


def shifted_along(t, dim: int, shape: list[int], step: int, fill, dtype: str):
    """``t`` moved ``step`` places along ``dim`` (a log-step scan's earlier partner), the first ``step``
    places filled with ``fill``."""
    from tvm import relax

    op = relax.op
    head = list(shape)
    head[dim] = step
    body = op.strided_slice(t, axes=[dim], begin=[0], end=[shape[dim] - step])
    filler = op.broadcast_to(relax.const(np.full([1] * len(shape), fill), dtype), head)
    return op.concat([filler, body], axis=dim)


def _running(largest: bool):
    """A converter for ``aten.cummax`` / ``cummin(x, dim)``: ``(values, indices)``, the running extreme
    and where it was last reached (torch's tie rule: the later index), as a log-step scan over the axis
    (``combine(earlier, later) = later if later >= earlier else earlier`` is associative). NaNs are not
    propagated as torch does."""

    def convert(node, importer):
        from tvm import relax

        x = importer.env[node.args[0]]
        shape = [int(d) for d in importer.shape_of(x)]
        dim = int(node.args[1]) % len(shape)
        length, op, bb = shape[dim], relax.op, importer.block_builder
        dtype = _dtype(node.args[0])
        info = np.finfo(dtype) if dtype.startswith("float") else np.iinfo(dtype)
        pad = -np.inf if largest and dtype.startswith("float") else np.inf if dtype.startswith("float") else None
        pad = (info.min if largest else info.max) if pad is None else pad
        view = [1] * len(shape)
        view[dim] = length
        idx = bb.emit(op.broadcast_to(relax.const(np.arange(length).reshape(view), "int64"), shape))
        vals, step = x, 1
        while step < length:
            sv, si = shifted_along(vals, dim, shape, step, pad, dtype), shifted_along(idx, dim, shape, step, 0, "int64")
            later = op.greater_equal(vals, sv) if largest else op.less_equal(vals, sv)
            vals, idx = bb.emit(op.where(later, vals, sv)), bb.emit(op.where(later, idx, si))
            step *= 2
        return bb.emit(relax.Tuple([vals, idx]))

    return convert


def _index_put(node, importer):
    """``aten.index_put(x, indices, values, accumulate)`` with whole axes (None) around adjacent index
    tensors (``F.fold``'s decomposition: ``[None, None, rows, cols]`` with accumulate). TVM's converter
    reshaped every whole axis's arange to ``[d, 1, ...]`` at the same position, so two of them broadcast
    against each other instead of spanning their own axes (F.fold came out wrong, silently). Here the
    index space is torch's: leading whole axes, the broadcast index tensors, trailing whole axes.
    Without accumulate: Relax's ``index_put`` with each index reshaped into its own place. With it:
    the whole axes moved last and a ``scatter_nd`` add over the index tensors' tuples (its loop over
    tuples is serial, so repeated indices add up; TVM's ``index_put`` adds in a parallel loop). Index
    tensors separated by a whole axis are refused by name."""
    from tvm import relax

    from inferx_edge.errors import ModelError

    x = importer.env[node.args[0]]
    given = list(node.args[1])
    values = importer.env[node.args[2]]
    accumulate = bool(node.args[3]) if len(node.args) > 3 else bool(node.kwargs.get("accumulate", False))
    shape = [int(d) for d in importer.shape_of(x)]
    given += [None] * (len(shape) - len(given))
    adv = [i for i, g in enumerate(given) if g is not None]
    if not adv or adv != list(range(adv[0], adv[-1] + 1)):
        raise ModelError("index_put with index tensors separated by whole axes: not supported")
    op, bb = relax.op, importer.block_builder
    ishapes = [[int(d) for d in importer.shape_of(importer.env[given[i]])] for i in adv]
    n_adv, before, after = max(len(s) for s in ishapes), adv[0], len(shape) - 1 - adv[-1]
    space = np.broadcast_shapes(*ishapes)
    whole = [a for a in range(len(shape)) if a not in adv]
    if accumulate:
        # data [adv axes.., whole axes..]; indices [*space, len(adv)]; updates [*space, whole dims..]
        perm = adv + whole
        idx = [op.broadcast_to(op.astype(importer.env[given[a]], "int64"), list(space)) for a in adv]
        stacked = bb.emit(op.concat([op.expand_dims(i, -1) for i in idx], axis=-1))
        full = [shape[a] for a in range(before)] + list(space) + [shape[a] for a in range(adv[-1] + 1, len(shape))]
        vperm = list(range(before, before + n_adv)) + list(range(before)) + list(range(before + n_adv, len(full)))
        updates = bb.emit(op.permute_dims(op.broadcast_to(values, full), vperm))
        scattered = bb.emit(op.scatter_nd(bb.emit(op.permute_dims(x, perm)), stacked, updates, "add"))
        return bb.emit(op.permute_dims(scattered, [perm.index(a) for a in range(len(shape))]))
    rank = before + n_adv + after
    indices = []
    for axis, g in enumerate(given):
        if g is None:
            pos = axis if axis < before else before + n_adv + (axis - adv[-1] - 1)
            view = [1] * rank
            view[pos] = shape[axis]
            indices.append(relax.const(np.arange(shape[axis], dtype="int64").reshape(view), "int64"))
        else:
            ishape = ishapes[adv.index(axis)]
            view = [1] * before + [1] * (n_adv - len(ishape)) + ishape + [1] * after
            indices.append(bb.emit(op.reshape(op.astype(importer.env[g], "int64"), view)))
    return bb.emit(op.index_put(x, relax.Tuple(indices), values, accumulate))


#: aten op name (as TVM's translator keys them) -> converter
EXTRA_OPS = {
    "index_put.default": _index_put,
    "var_mean.correction": _var_mean,
    "adaptive_max_pool2d.default": _adaptive_max_pool2d,
    "hypot.default": _hypot,
    "scatter_add.default": _scatter_add,
    "_cdist_forward.default": _cdist,
    "cummax.default": _running(True),
    "cummin.default": _running(False),
}
