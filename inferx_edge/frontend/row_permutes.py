"""Transposes of rows taken above the dense layer they follow, at import.

``nn.MultiheadAttention`` with ``batch_first=True`` runs on a sequence-first view: both frontends give
its output projection as ``permute(reshape(matmul(reshape(heads, [L * N, E]), W) + b, [L, N, E]),
[1, 0, 2])`` before the residual add (ViT-B/16: every layer). The dense layer treats each row on its
own, so the transpose can act on its input instead, where it composes with the head merge's own
transpose; the projection then writes batch-first rows and the residual add (and the int8 dequantize)
fuse into its kernel as they do for the MLP's layers. On a GPU the standalone transpose + add kernel
(three passes over the [N, L, E] fp32 stream) is gone.

The rewrite: ``permute(reshape(chain(reshape(x, [R, K])), S), p)``, where ``p`` keeps the last axis,
``S`` splits the R rows into x's leading axes and ``chain`` is a dense layer (``matmul`` with a 2-D
right operand) followed by row-wise elementwise ops (operands that vary only along the last axis),
becomes ``chain(reshape(permute(x, p'), S[p] + [K]))``. Each row is computed exactly as before, so values
are bitwise unchanged. Every intermediate value must have no other reader (nothing is computed twice).
"""

from __future__ import annotations

import math

#: elementwise ops a row-wise chain may hold (the second operand of a binary one varies only along the
#: last axis: a bias, a per-channel scale, a scalar)
_BINARY = ("add", "subtract", "multiply", "divide", "maximum", "minimum")
_UNARY = (
    "sigmoid", "tanh", "exp", "erf", "sqrt", "rsqrt", "negative", "abs", "round", "clip",
    "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu", "astype",
)  # fmt: skip


def hoist_row_permutes(mod):
    """``mod`` with transposes of a dense layer's rows (last axis fixed) moved to the layer's input."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes._rewrite import (
        permute_axes,
        rewrite_calls_in_context,
        static_shape,
        use_counts,
    )

    permute, reshape, matmul = (tvm.ir.Op.get(f"relax.{n}") for n in ("permute_dims", "reshape", "matmul"))
    binary = {tvm.ir.Op.get(f"relax.{n}") for n in _BINARY}
    unary = {tvm.ir.Op.get(f"relax.{n}") for n in _UNARY}
    uses = use_counts(mod)

    def single(ctx, var, op_set):
        """The call bound to ``var`` when it is one of ``op_set`` and ``var`` has no other reader."""
        value = ctx.producer(var)
        if isinstance(value, relax.Call) and value.op in op_set and uses.get(var) == 1:
            return value
        return None

    rank = 0  # the permute's rank, set per call: a row operand may not add axes

    def rows_only(expr, width: int) -> bool:
        shape = static_shape(expr)
        return (
            shape is not None
            and len(shape) <= rank
            and math.prod(shape[:-1]) == 1
            and (not shape or shape[-1] in (1, width))
        )

    def rewrite(call, ctx):
        if call.op != permute:
            return None
        out = static_shape(call)
        if out is None or len(out) < 3:
            return None
        nonlocal rank
        n = rank = len(out)
        p = permute_axes(call, n)
        if p[-1] != n - 1 or p == list(range(n)):
            return None
        split = single(ctx, ctx.given[0], {reshape})
        if split is None:
            return None
        shape = static_shape(split)
        chain_out = split.args[0]
        flat = static_shape(chain_out)
        if shape is None or flat is None or flat[-1] != shape[-1]:
            return None
        # walk back from the reshape's input to the dense layer, innermost op last
        chain, var = [], chain_out
        while True:
            value = single(ctx, var, binary | unary | {matmul})
            if value is None or static_shape(value)[:-1] != flat[:-1]:
                return None
            chain.append((var, value))
            if value.op == matmul:
                break
            if value.op in unary:
                var = value.args[0]
                continue
            a, b = value.args
            on_chain = [x for x in (a, b) if not rows_only(x, flat[-1])]
            if len(on_chain) != 1 or static_shape(on_chain[0]) != flat:
                return None
            var = on_chain[0]
        dense_var, dense = chain[-1]
        a, w = dense.args
        w_shape, a_shape = static_shape(w), static_shape(a)
        if w_shape is None or len(w_shape) != 2 or a_shape is None or a_shape[:-1] != flat[:-1]:
            return None
        merge = ctx.producer(a)
        if not isinstance(merge, relax.Call) or merge.op != reshape:
            return None
        x = merge.args[0]
        x_shape = static_shape(x)
        lead = shape[:-1]
        if x_shape is None or x_shape[: n - 1] != lead or math.prod(x_shape[n - 1 :]) != a_shape[-1]:
            return None
        # rebuild: x's leading axes permuted, rows merged in the new order, the chain on top
        axes = [*p[:-1], *range(n - 1, len(x_shape))]
        x = ctx.rewritten(x)
        inner = ctx.bound(x)
        while isinstance(inner, relax.Call) and inner.op == permute:  # transposes of transposes compose
            q = permute_axes(inner, len(axes))
            axes, x = [q[i] for i in axes], inner.args[0]
            inner = ctx.bound(x)
        # new bindings are named after the ones they replace (the quantizer keys its plan on names)
        emit, name = ctx.builder.emit, dense_var.name
        if axes != list(range(len(axes))):
            x = emit(relax.op.permute_dims(x, axes), f"{name}_input_rows")
        x = emit(relax.op.reshape(x, [*(lead[i] for i in p[:-1]), a_shape[-1]]), f"{name}_input")
        expr = relax.Call(matmul, [x, ctx.rewritten(w)], dense.attrs, dense.ty_args)
        for var, op in reversed(chain[:-1]):
            expr, name = emit(expr, f"{name}_rows"), var.name
            if op.op in unary:
                expr = relax.Call(op.op, [expr, *(ctx.rewritten(z) for z in op.args[1:])], op.attrs, op.ty_args)
                continue
            args = [ctx.rewritten(z) if rows_only(z, flat[-1]) else expr for z in op.args]
            expr = relax.Call(op.op, args, op.attrs, op.ty_args)
        return expr

    return relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))
