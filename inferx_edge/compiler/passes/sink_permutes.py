"""Transposes move past elementwise ops and cancel: a network written in NCHW that permutes to
channels-last around its blocks (ConvNeXt: ``permute`` -> LayerNorm -> Linear ... -> ``permute`` back
-> layer scale -> residual add) keeps those permutes as copy kernels after the NHWC layout conversion,
transposing the residual stream back and forth at every block."""

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

    def narrowing(call) -> bool:
        src, dst = call.args[0].ty.dtype, call.ty.dtype
        return tvm.DataType(str(dst)).bits <= tvm.DataType(str(src)).bits

    def producer(ctx, arg):
        if not isinstance(arg, relax.Var):
            return None
        try:
            value = ctx.builder.lookup_binding(arg)
        except Exception:  # noqa: BLE001 - not bound in this function (a parameter)
            return None
        return value if isinstance(value, relax.Call) and value.op == permute else None

    def rewrite(call, ctx):
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
