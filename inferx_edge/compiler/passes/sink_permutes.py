"""Transposes move past elementwise ops and cancel: a network written in NCHW that permutes to
channels-last around its blocks (ConvNeXt: ``permute`` -> LayerNorm -> Linear ... -> ``permute`` back
-> layer scale -> residual add) keeps those permutes as copy kernels after the NHWC layout conversion,
transposing the residual stream back and forth at every block.

A channel shuffle (ShuffleNet: ``concat`` -> ``reshape`` to [N, groups, C / groups, H, W] ->
``permute`` -> ``reshape`` back -> split in two) has no layout rule in ConvertLayout, so the conversion ran
it on an NCHW copy: every block's concat kernel read one branch across channels-last pixels (a 464-byte
stride between a warp's neighbouring loads) and wrote NCHW, and the next block transposed its half back.
The transposes now also move below slices, splits and concatenations of a channels-first view, and a
reshape that only splits or merges the channel axis of such a view regroups the channels-last tensor's
last axis instead, so the whole shuffle runs channels-last and its transposes cancel."""

from __future__ import annotations

import math

from inferx_edge.compiler.passes._rewrite import permute_axes, rewrite_calls_in_context, static_shape

#: an operand other than a transposed one is moved along (permuted the other way) only when it is at
#: most this share of the result's elements (scales, biases, constants); a full-size one would cost
#: the transpose this pass removes
_SMALL_OPERAND = 1 / 8

_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum", "power")
#: (``astype`` only where it does not widen: past a widening cast the transpose would move more bytes
#: when nothing cancels)
_UNARY = (
    "sigmoid", "tanh", "exp", "erf", "sqrt", "rsqrt", "negative", "abs", "round", "floor", "ceil",
    "clip", "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu",
)  # fmt: skip


def sink_permutes(mod):
    """``mod`` with ``permute_dims`` moved below elementwise ops and composed: ``f(permute(x, p))`` ->
    ``permute(f(x), p)`` for unary elementwise ops; ``g(permute(x, p), permute(y, p))`` ->
    ``permute(g(x, y), p)`` and ``g(permute(x, p), c)`` -> ``permute(g(x, c'), p)`` (``c`` a small
    operand such as a scale, ``c'`` it permuted the other way) for binary ones; then ``permute(permute(x,
    p), q)`` -> ``permute(x, p.q)``, dropped when that is the identity. One transpose of the result
    replaces one or two of the operands, so the count never grows, and pairs that meet cancel."""
    import tvm
    from tvm import relax

    permute = tvm.ir.Op.get("relax.permute_dims")
    binary = {tvm.ir.Op.get(f"relax.{n}") for n in _BINARY}
    unary = {tvm.ir.Op.get(f"relax.{n}") for n in _UNARY}
    astype = tvm.ir.Op.get("relax.astype")
    movers = {tvm.ir.Op.get(f"relax.{n}") for n in ("concat", "strided_slice", "split", "reshape")}

    def narrowing(call) -> bool:
        src, dst = call.args[0].ty.dtype, call.ty.dtype
        return tvm.DataType(str(dst)).bits <= tvm.DataType(str(src)).bits

    def bound(ctx, arg):
        value = ctx.bound(arg)
        if isinstance(value, relax.TupleGetItem):  # an item of a tuple built here (a moved split's)
            items = bound(ctx, value.tuple_value)
            return bound(ctx, items.fields[value.index]) if isinstance(items, relax.Tuple) else None
        return value

    def producer(ctx, arg):
        value = bound(ctx, arg)
        return value if isinstance(value, relax.Call) and value.op == permute else None

    def rewrite(call, ctx):
        if call.op in movers:
            return _data_movement(call, ctx, producer)
        out = static_shape(call)
        if out is None:
            return None
        rank = len(out)
        if call.op == permute:
            inner = producer(ctx, call.args[0])
            if inner is None:
                return None
            p, q = permute_axes(inner, rank), permute_axes(call, rank)
            composed = [p[a] for a in q]
            x = inner.args[0]
            return x if composed == list(range(rank)) else relax.op.permute_dims(x, composed)
        if call.op in unary or (call.op == astype and narrowing(call)):
            inner = producer(ctx, call.args[0])
            if inner is None:
                return None
            moved = relax.Call(call.op, [inner.args[0], *call.args[1:]], call.attrs, call.ty_args)
            return relax.op.permute_dims(moved, permute_axes(inner, rank))
        if call.op in binary and len(call.args) == 2:
            a, b = call.args
            pa, pb = producer(ctx, a), producer(ctx, b)
            if pa is None and pb is None:
                return None
            if pa is not None and pb is not None:
                if permute_axes(pa, rank) != permute_axes(pb, rank) or static_shape(a) != out or static_shape(b) != out:
                    return None
                return relax.op.permute_dims(relax.Call(call.op, [pa.args[0], pb.args[0]]), permute_axes(pa, rank))
            perm, other, first = (pa, b, True) if pa is not None else (pb, a, False)
            shape = static_shape(other)
            transposed = a if first else b
            if shape is None or static_shape(transposed) != out or len(shape) > rank:
                return None
            if math.prod(shape) > _SMALL_OPERAND * math.prod(out):
                return None
            p = permute_axes(perm, rank)
            inverse = [p.index(i) for i in range(rank)]
            full = [1] * (rank - len(shape)) + shape  # numpy broadcasting aligns the trailing axes
            moved = relax.op.permute_dims(relax.op.reshape(other, full) if len(shape) < rank else other, inverse)
            args = [perm.args[0], moved] if first else [moved, perm.args[0]]
            return relax.op.permute_dims(relax.Call(call.op, args), p)
        return None

    return rewrite_calls_in_context(mod, rewrite)


def _channels_first(rank: int) -> list[int]:
    """The ``permute_dims`` axes that view a channels-last tensor of ``rank`` channels-first."""
    return [0, rank - 1, *range(1, rank - 1)]


def _data_movement(call, ctx, producer):
    """``call`` (a concat, strided_slice, split or reshape) done on the channels-last tensor and followed
    by the view's transpose, where it reads a channels-first view of a channels-last 4-D tensor; None
    where it does not (other ranks and transposes are left alone)."""
    from tvm import relax

    op = call.op
    if op.name == "relax.concat":
        fields = call.args[0].fields if isinstance(call.args[0], relax.Tuple) else None
        inner = [producer(ctx, f) for f in fields or []]
        if not inner or any(i is None or _view(i) is None for i in inner):
            return None
        p = _view(inner[0])
        axis = int(call.attrs.axis) % len(p)
        return relax.op.permute_dims(relax.op.concat([i.args[0] for i in inner], axis=p[axis]), p)
    inner = producer(ctx, call.args[0])
    if inner is None:
        return None
    p, x = _view(inner), inner.args[0]
    if op.name == "relax.strided_slice":
        if p is None or not isinstance(call.args[1], relax.Tuple):
            return None
        axes = [p[int(a.value)] for a in call.args[1].fields]
        strides = call.args[4] if len(call.args) > 4 else None
        sliced = relax.op.strided_slice(x, axes, call.args[2], call.args[3], strides, call.attrs.assume_inbound)
        return relax.op.permute_dims(sliced, p)
    if op.name == "relax.split":
        if p is None:
            return None
        parts = relax.op.split(x, call.attrs.indices_or_sections, axis=p[int(call.attrs.axis) % len(p)])
        return relax.Tuple([relax.op.permute_dims(relax.TupleGetItem(parts, i), p) for i in range(len(call.ty.fields))])
    return _regroup_channels(call, inner, p)


def _view(permute) -> list[int] | None:
    """The axes of ``permute`` where it views a channels-last 4-D tensor channels-first, else None."""
    shape = static_shape(permute.args[0])
    if shape is None or len(shape) != 4:
        return None
    p = permute_axes(permute, 4)
    return p if p == _channels_first(4) else None


def _regroup_channels(call, inner, view):
    """A ``reshape`` that only splits the channel axis of a channels-first view (``view``) of ``x`` =
    ``inner.args[0]``: ``x`` reshaped along its last axis, viewed channels-first. A ``reshape`` that only
    merges channel groups (the leading axes after N of a transpose of [N, H, W, *groups]) back into one
    axis: the groups merged along the last axis, viewed channels-first. None otherwise."""
    from tvm import relax

    x, out = inner.args[0], static_shape(call)
    shape = static_shape(x)
    if out is None or shape is None:
        return None
    if view is not None:  # split: [N, C, H, W] -> [N, *groups, H, W]
        n, *spatial, c = shape
        groups = out[1 : len(out) - len(spatial)]
        if out[0] != n or out[len(out) - len(spatial) :] != spatial or len(groups) < 2 or math.prod(groups) != c:
            return None
        s, k = len(spatial), len(groups)
        regrouped = relax.op.reshape(x, [n, *spatial, *groups])
        return relax.op.permute_dims(regrouped, [0, *range(s + 1, s + 1 + k), *range(1, s + 1)])
    # merge: permute(y, [0, *group axes, 1, 2]) of y = [N, H, W, *groups] -> [N, C, H, W]
    s = len(out) - 2
    q = permute_axes(inner, len(shape))
    k = len(shape) - 1 - s
    if s != 2 or k < 2 or q[0] != 0 or q[1 + k :] != [1, 2] or sorted(q[1 : 1 + k]) != list(range(3, 3 + k)):
        return None
    if out[0] != shape[0] or out[2:] != shape[1:3] or out[1] != math.prod(shape[3:]):
        return None
    order = [0, 1, 2, *q[1 : 1 + k]]
    y = x if order == list(range(len(shape))) else relax.op.permute_dims(x, order)
    return relax.op.permute_dims(relax.op.reshape(y, [shape[0], *shape[1:3], out[1]]), _channels_first(4))
