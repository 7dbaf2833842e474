"""Index maps through layout ops: where an element of a reshaped, transposed, sliced view lives in the
tensor the view was made from, so a kernel can read that tensor directly and the view costs nothing.

A map is a function of coordinates (ints, numpy integer arrays or TIR expressions: only ``+ * // %`` are
used) to the coordinates of the source tensor.
"""

from __future__ import annotations

import math

import numpy as np

from inferx_edge.compiler.passes._rewrite import op_name, static_shape

#: vector checks evaluate the map over at most this many (sequence, row, column-group) points
MAX_CHECKED = 1 << 24


def axis_groups(a: list[int], b: list[int]) -> list[tuple[list[int], list[int]]]:
    """The non-unit axes of two shapes of the same element count, paired into groups of equal product
    (row-major): ``[197, 1, 768]`` and ``[197, 12, 64]`` give ``([0], [0]), ([2], [1, 2])``."""
    ia = [i for i, x in enumerate(a) if x != 1]
    ib = [j for j, x in enumerate(b) if x != 1]
    out = []
    p = q = 0
    while p < len(ia):
        ga, gb, pa, pb = [ia[p]], [ib[q]], a[ia[p]], b[ib[q]]
        p, q = p + 1, q + 1
        while pa != pb:
            if pa < pb:
                ga.append(ia[p])
                pa *= a[ia[p]]
                p += 1
            else:
                gb.append(ib[q])
                pb *= b[ib[q]]
                q += 1
        out.append((ga, gb))
    return out


def common_refinement(shapes: list[list[int]]) -> list[int] | None:
    """The coarsest shape (no unit axes) that every one of ``shapes`` (same element count, row-major)
    is a merging of: ``[4096, 3]`` and ``[64, 64, 3]`` give ``[64, 64, 3]``. None where the axes cross
    (``[6, 4]`` and ``[4, 6]``)."""
    total = math.prod(shapes[0])
    cuts = {total}
    for shape in shapes:
        if math.prod(shape) != total:
            return None
        prefix = 1
        for x in shape:
            prefix *= x
            cuts.add(prefix)
    out, last = [], 1
    for c in sorted(cuts):
        if c % last:
            return None
        if c != last:
            out.append(c // last)
        last = c
    return out


def reshape_coords(coords: list, a: list[int], b: list[int]) -> list:
    """Coordinates over shape ``b`` of the element at ``coords`` over shape ``a`` (same element count,
    row-major). Axes are paired into groups of equal product (:func:`axis_groups`), so axes a reshape
    keeps pass through untouched and only a split or merged group needs a division."""
    out: list = [0] * len(b)
    for ga, gb in axis_groups(a, b):
        lin = coords[ga[0]]
        for i in ga[1:]:
            lin = lin * a[i] + coords[i]
        inner = math.prod(b[j] for j in gb)
        for k, j in enumerate(gb):
            inner //= b[j]
            x = lin if inner == 1 else lin // inner
            out[j] = x if k == 0 else x % b[j]
    return out


def _axes(values, rank: int) -> list[int]:
    return [int(a) % rank for a in values]


def source_of(expr, ctx, coords, *, scalars: bool):
    """Walk ``expr`` back through reshape, permute_dims, expand_dims, squeeze, take of a constant
    index, float casts and (``scalars``) multiplications by a constant: ``(source expr, coordinate map
    over the source, constant factor, steps)``, ``coords`` being the map over ``expr`` itself and
    ``steps`` a hashable account of the layout ops walked (equal steps from equal starts: equal maps)."""
    import tvm

    factor, steps = 1.0, []
    for _ in range(64):
        call = ctx.producer(expr)
        name = op_name(call)
        if name is None or not call.args:
            break
        shape = static_shape(call)
        src = call.args[0]
        src_shape = static_shape(src)
        if shape is None or src_shape is None:
            break
        if name == "relax.reshape":
            coords = _compose(coords, lambda c, sh=shape, ss=src_shape: reshape_coords(c, sh, ss))
            steps.append(("reshape", tuple(shape), tuple(src_shape)))
        elif name == "relax.permute_dims":
            axes = (
                list(reversed(range(len(src_shape))))
                if call.attrs.axes is None
                else _axes(call.attrs.axes, len(src_shape))
            )
            coords = _compose(coords, lambda c, ax=axes: [c[ax.index(i)] for i in range(len(ax))])
            steps.append(("permute", tuple(axes)))
        elif name == "relax.expand_dims":
            added = set(_axes(call.attrs.axis, len(shape)))
            coords = _compose(coords, lambda c, ad=added: [x for i, x in enumerate(c) if i not in ad])
            steps.append(("expand", tuple(sorted(added))))
        elif name == "relax.squeeze":
            gone = (
                [i for i, x in enumerate(src_shape) if x == 1]
                if call.attrs.axis is None
                else _axes(call.attrs.axis, len(src_shape))
            )
            gone = sorted(gone)
            coords = _compose(coords, lambda c, g=gone: _insert_zeros(c, g))
            steps.append(("squeeze", tuple(gone)))
        elif name == "relax.take":
            index = call.args[1]
            if not isinstance(index, tvm.ir.expr.Constant) or index.value.numpy().ndim != 0:
                break
            axis = int(call.attrs.axis) % len(src_shape)
            k = int(index.value.numpy()) % src_shape[axis]
            coords = _compose(coords, lambda c, a=axis, kk=k: [*c[:a], kk, *c[a:]])
            steps.append(("take", axis, k))
        elif name == "relax.astype":
            if str(src.ty.dtype) not in ("float16", "float32"):
                break
        elif name in ("relax.multiply", "relax.divide") and scalars:
            k = constant_value(call.args[1], ctx)
            if k is None and name == "relax.multiply":
                k, src = constant_value(src, ctx), call.args[1]
            if not k or static_shape(src) != shape:
                break
            factor = factor / k if name == "relax.divide" else factor * k
        else:
            break
        expr = src
    return expr, coords, factor, tuple(steps)


def constant_value(expr, ctx=None) -> float | None:
    """A Relax constant with one element or a scalar written into a call, as a float; else None. With ``ctx``, also a variable bound
    to such a constant through reshapes and float casts (torch exports its attention scale as
    ``reshape(reshape(const, [1, 1, 1, 1]))``)."""
    import tvm

    for _ in range(16):
        if isinstance(expr, tvm.ir.expr.Constant):
            value = expr.value
            if isinstance(value, int | float):  # a scalar written into the call (clip's bounds)
                return float(value)
            if not hasattr(value, "numpy"):  # a PrimValue's IntImm / FloatImm
                return float(value.value) if hasattr(value, "value") else None
            return float(value.numpy().reshape(())) if value.numpy().size == 1 else None
        call = ctx.producer(expr) if ctx is not None else None
        name = op_name(call)
        if name not in ("relax.reshape", "relax.astype"):
            return None
        if name == "relax.astype" and str(call.args[0].ty.dtype) not in ("float16", "float32"):
            return None
        expr = call.args[0]
    return None


def _compose(outer, inner):
    return lambda *k: inner(outer(*k))


def _insert_zeros(coords: list, positions: list[int]) -> list:
    out = list(coords)
    for p in positions:
        out.insert(p, 0)
    return out


_CHECKED: dict = {}


def vector_width(index, shape: list[int], extents: tuple[int, int, int], width: int, key=None) -> int:
    """Elements per load along the last kernel coordinate: ``width`` where ``index`` maps every group of
    ``width`` consecutive columns (starting at multiples of 8) to consecutive, ``width``-aligned
    elements of a row-major ``shape`` tensor (checked over every point), else 1. A ``key`` that fully
    describes ``index`` (the layout steps it came from) caches the answer: a transformer's layers repeat
    the same maps, and one check of ViT-B/16's at batch 64 evaluates 1.2 M points."""
    if key is not None:
        cache_key = (key, tuple(shape), tuple(extents), width)
        if cache_key not in _CHECKED:
            _CHECKED[cache_key] = vector_width(index, shape, extents, width)
        return _CHECKED[cache_key]
    nb, rows, cols = extents
    if cols % 8 or nb * rows * (cols // 8) > MAX_CHECKED:
        return 1
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    n, r, c = np.meshgrid(np.arange(nb), np.arange(rows), np.arange(0, cols, 8), indexing="ij")

    def flat(cc):
        return sum(np.asarray(x, np.int64) * st for x, st in zip(index(n, r, cc), strides, strict=True))

    base = flat(c)
    if np.any(base % width):
        return 1
    for e in range(1, 8):
        if not np.array_equal(flat(c + e), base + e):
            return 1
    return width
