"""Transposes of a dense layer's rows moved to where they compose with another transpose, at import.

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

The other direction, :func:`sink_row_permutes`: the in-projection's transpose in front of the dense
layer moves below it and its bias add when the result only reaches another transpose (the head split),
so the LayerNorm's output feeds the GEMM as it is.
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


class _Rows:
    """What both rewrites share: the module's use counts, the row-wise ops, and a dense layer's chain."""

    def __init__(self, mod):
        import tvm

        from inferx_edge.compiler.passes._rewrite import use_counts

        self.permute, self.reshape, self.matmul = (
            tvm.ir.Op.get(f"relax.{n}") for n in ("permute_dims", "reshape", "matmul")
        )
        self.binary = {tvm.ir.Op.get(f"relax.{n}") for n in _BINARY}
        self.unary = {tvm.ir.Op.get(f"relax.{n}") for n in _UNARY}
        self.chained = self.binary | self.unary | {self.matmul}  # what a dense layer's chain may hold
        self.uses = use_counts(mod)

    def single(self, ctx, var, ops):
        """The call bound to ``var`` when it is one of ``ops`` and ``var`` has no other reader."""
        from tvm import relax

        value = ctx.producer(var)
        if isinstance(value, relax.Call) and value.op in ops and self.uses.get(var) == 1:
            return value
        return None

    @staticmethod
    def rows_only(expr, width: int, rank: int) -> bool:
        """Whether ``expr`` varies only along the last axis (``width`` or 1 long) and has at most ``rank`` axes."""
        from inferx_edge.compiler.passes._rewrite import static_shape

        shape = static_shape(expr)
        return (
            shape is not None
            and len(shape) <= rank
            and math.prod(shape[:-1]) == 1
            and (not shape or shape[-1] in (1, width))
        )

    def chain(self, ctx, var, rank: int, first=None):
        """[(variable, call)] from ``var`` (bound to ``first`` if given, else to a call read only once)
        back through row-wise ops to a ``matmul`` with a 2-D right operand, that matmul last; None where
        the walk meets anything else."""
        from inferx_edge.compiler.passes._rewrite import static_shape

        flat = static_shape(var)
        if flat is None:
            return None
        chain = []
        while True:
            value = first if first is not None and not chain else self.single(ctx, var, self.chained)
            if value is None or static_shape(value) is None or static_shape(value)[:-1] != flat[:-1]:
                return None
            chain.append((var, value))
            if value.op == self.matmul:
                w = static_shape(value.args[1])
                return chain if w is not None and len(w) == 2 else None
            if value.op in self.unary:
                var = value.args[0]
                continue
            on_chain = [x for x in value.args if not self.rows_only(x, flat[-1], rank)]
            if len(on_chain) != 1 or static_shape(on_chain[0]) != flat:
                return None
            var = on_chain[0]

    def rebuild(self, ctx, x, chain, rank: int, width: int):
        """The chain's ops (innermost last, as :meth:`chain` gives them) applied to the rewritten input
        ``x`` of its matmul; bindings are named after the ones they replace (the quantizer keys its plan
        on names). The outermost op is returned unbound."""
        from tvm import relax

        dense_var, dense = chain[-1]
        expr = relax.Call(self.matmul, [x, ctx.rewritten(dense.args[1])], dense.attrs, dense.ty_args)
        name = dense_var.name
        for var, op in reversed(chain[:-1]):
            expr, name = ctx.builder.emit(expr, f"{name}_rows"), var.name
            if op.op in self.unary:
                expr = relax.Call(op.op, [expr, *(ctx.rewritten(z) for z in op.args[1:])], op.attrs, op.ty_args)
                continue
            args = [ctx.rewritten(z) if self.rows_only(z, width, rank) else expr for z in op.args]
            expr = relax.Call(op.op, args, op.attrs, op.ty_args)
        return expr


def hoist_row_permutes(mod):
    """``mod`` with transposes of a dense layer's rows (last axis fixed) moved to the layer's input."""
    from tvm import relax

    from inferx_edge.compiler.passes._rewrite import permute_axes, rewrite_calls_in_context, static_shape

    rows = _Rows(mod)

    def rewrite(call, ctx):
        if call.op != rows.permute:
            return None
        out = static_shape(call)
        if out is None or len(out) < 3:
            return None
        n = len(out)
        p = permute_axes(call, n)
        if p[-1] != n - 1 or p == list(range(n)):
            return None
        split = rows.single(ctx, ctx.given[0], {rows.reshape})
        if split is None:
            return None
        shape, flat = static_shape(split), static_shape(split.args[0])
        if shape is None or flat is None or flat[-1] != shape[-1]:
            return None
        chain = rows.chain(ctx, split.args[0], n)
        if chain is None:
            return None
        a = chain[-1][1].args[0]
        a_shape = static_shape(a)
        merge = ctx.producer(a)
        if a_shape is None or a_shape[:-1] != flat[:-1] or getattr(merge, "op", None) != rows.reshape:
            return None
        x = merge.args[0]
        x_shape = static_shape(x)
        lead = shape[:-1]
        if x_shape is None or x_shape[: n - 1] != lead or math.prod(x_shape[n - 1 :]) != a_shape[-1]:
            return None
        # x's leading axes permuted (composed with the transposes that made x), rows merged in the new order
        axes = [*p[:-1], *range(n - 1, len(x_shape))]
        x = ctx.rewritten(x)
        inner = ctx.bound(x)
        while isinstance(inner, relax.Call) and inner.op == rows.permute:
            q = permute_axes(inner, len(axes))
            axes, x = [q[i] for i in axes], inner.args[0]
            inner = ctx.bound(x)
        name = chain[-1][0].name
        if axes != list(range(len(axes))):
            x = ctx.builder.emit(relax.op.permute_dims(x, axes), f"{name}_input_rows")
        x = ctx.builder.emit(relax.op.reshape(x, [*(lead[i] for i in p[:-1]), a_shape[-1]]), f"{name}_input")
        return rows.rebuild(ctx, x, chain, n, flat[-1])

    return relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))


#: readers that only move data (a transpose among them is a copy kernel already, or on CUDA the fused
#: attention kernel's index maps)
_VIEWS = ("relax.reshape", "relax.expand_dims", "relax.squeeze")


def sink_row_permutes(mod):
    """``mod`` with a transpose of rows (last axis fixed) feeding a dense layer moved below the layer and
    its row-wise epilogue, where every reader of the result reaches another transpose through reshapes
    only: ``matmul(permute(x, p), W) + b`` -> ``permute(matmul(x, W) + b, p)``, which composes with that
    transpose (no new copy, even where the layer's output is wider than its input).
    ``nn.MultiheadAttention``'s sequence-first input projection then reads the LayerNorm's batch-first
    rows, and the transpose joins the head split's own (a copy kernel already, or the fused attention
    kernel's index maps on CUDA)."""
    from tvm import relax

    from inferx_edge.compiler.passes._rewrite import (
        op_name,
        permute_axes,
        readers,
        rewrite_calls_in_context,
        static_shape,
    )

    rows = _Rows(mod)
    found_readers = readers(mod)

    def to_transposes(var, depth: int = 0) -> bool:
        """Whether every reader of ``var`` reaches a transpose through reshapes only."""
        found = found_readers.get(var, [])
        if not found or len(found) != rows.uses.get(var, 0) or depth > 8:
            return False  # unread, returned, or a long way off
        for reader, value, _ in found:
            name = op_name(value)
            if name != "relax.permute_dims" and not (name in _VIEWS and to_transposes(reader, depth + 1)):
                return False
        return True

    def rewrite(call, ctx):
        var = ctx.var
        if var is None or call.op not in rows.chained or not to_transposes(var):
            return None
        out = static_shape(call)
        if out is None or len(out) < 3:
            return None
        n = len(out)
        chain = rows.chain(ctx, var, n, first=ctx.producer(var))
        if chain is None:
            return None
        given = chain[-1][1].args[0]
        moved = rows.single(ctx, given, {rows.permute})
        if moved is None:
            return None
        p = permute_axes(moved, n)
        if p[-1] != n - 1 or p == list(range(n)):
            return None
        x = ctx.rewritten(moved.args[0])
        return relax.op.permute_dims(ctx.builder.emit(rows.rebuild(ctx, x, chain, n, out[-1]), f"{var.name}_rows"), p)

    return relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))
