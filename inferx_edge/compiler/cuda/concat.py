"""Concatenation written so a vectorized kernel picks its input once per vector, not once per element."""

from __future__ import annotations


def concat_compute(tensors: list, axis: int):
    """``concatenate(tensors, axis)`` as one TE compute whose element ``i`` along ``axis`` is picked by
    a search tree of ``i < start_k`` tests (``start_k``: where input ``k`` begins), each splitting the
    remaining inputs where about half of their elements lie on either side.

    TVM's own concatenate tests ``start_k <= i`` from the last input back: a chain as long as the
    inputs are many (a DenseNet layer reads a concatenation of up to 33 inputs), and a form TVM's
    arithmetic leaves alone once the axis is split for vector lanes, so the vectorizer falls back to
    one element at a time, each going down the whole chain. With ``i = 4 * io + lane`` and every
    ``start_k`` a multiple of 4, ``4 * io + lane < start_k`` simplifies to ``io < start_k / 4``: one
    test per vector, then a vector load."""
    from tvm import te, tirx

    ndim = len(tensors[0].shape)
    axis = axis + ndim if axis < 0 else axis
    ends = []
    total = 0
    for t in tensors:
        total = total + t.shape[axis]
        ends.append(total)
    shape = list(tensors[0].shape)
    shape[axis] = total

    starts = [0, *ends[:-1]]
    # split weights: the inputs' extents along ``axis`` where known, else one each
    sizes = [_static(t.shape[axis]) for t in tensors]
    if None in sizes:
        sizes = [1] * len(tensors)

    def element(*idx):
        i = idx[axis]

        def read(k):
            at = list(idx)
            at[axis] = i - starts[k]
            return tensors[k](*at)

        def pick(lo, hi):
            # inputs lo..hi-1: split where about half of their elements lie on either side
            if hi - lo == 1:
                return read(lo)
            half = sum(sizes[lo:hi]) / 2
            mid, seen = lo + 1, sizes[lo]
            while mid < hi - 1 and seen + sizes[mid] / 2 <= half:
                seen += sizes[mid]
                mid += 1
            return tirx.if_then_else(i < starts[mid], pick(lo, mid), pick(mid, hi))

        return pick(0, len(tensors))

    return te.compute(shape, element, name="concatenate", tag="injective")


def _static(extent) -> int | None:
    """``extent`` as an int, None where it is symbolic."""
    try:
        return int(extent)
    except (TypeError, ValueError):
        return None


def legalize_concat(bb, call):
    """Relax ``concat`` legalized through :func:`concat_compute` (a drop-in for TVM's rule)."""
    from tvm import relax

    t = call.args[0]
    n_field = len(t.ty.fields)
    while isinstance(t, relax.Var):
        binding = bb.lookup_binding(t)
        if not isinstance(binding, relax.Tuple | relax.Var):
            break
        t = binding
    fields = t.fields if isinstance(t, relax.Tuple) else [bb.emit(relax.TupleGetItem(t, i)) for i in range(n_field)]
    if call.attrs.axis is None:  # flattened inputs: TVM's rule
        from tvm import topi

        return bb.call_te(topi.concatenate, fields, None)
    return bb.call_te(concat_compute, fields, int(call.attrs.axis), primfunc_name_hint="concatenate")
