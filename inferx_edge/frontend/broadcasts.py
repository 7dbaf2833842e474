"""Explicit broadcasts an operator would do by itself, removed at import.

torch.export decomposes ``nn.MultiheadAttention``'s input projection of a sequence-first (L, N, E)
input into ``matmul(x, broadcast_to(weight.T, (L, E, 3E)))``: ViT-B/16's twelve in-projections each
broadcast a 768 x 2304 weight 197 times. Left in, that broadcast is weight-only work, so the build
computes it ahead of time (4.2 G floats, the build host ran out of memory) and the int8 quantizer
sees an activation, not a weight. ``matmul`` and the elementwise binary operators broadcast their
operands themselves, so the explicit ``broadcast_to`` goes wherever the result keeps its shape; a
``broadcast_to`` to the shape its operand already has goes everywhere. Values are unchanged.
"""

from __future__ import annotations

import numpy as np

#: operators that broadcast every operand numpy-style
ELEMENTWISE = (
    "add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum",
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal", "where",
)  # fmt: skip


def drop_redundant_broadcasts(mod):
    """``mod`` without the ``broadcast_to`` calls whose consumer broadcasts the same way by itself."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes._rewrite import rewrite_calls_in_context, static_shape

    bcast = tvm.ir.Op.get("relax.broadcast_to")
    matmul = tvm.ir.Op.get("relax.matmul")
    elementwise = {tvm.ir.Op.get(f"relax.{n}") for n in ELEMENTWISE}

    def source(ctx, i):
        """The operand under a ``broadcast_to`` producing argument ``i`` (rewritten) and its static
        shape, or None."""
        producer = ctx.producer(ctx.given[i])
        if not isinstance(producer, relax.Call) or producer.op != bcast:
            return None
        inner = ctx.rewritten(producer.args[0])
        shape = static_shape(inner)
        return None if shape is None else (inner, shape)

    def rewrite(call, ctx):
        if call.op == bcast:
            shape = static_shape(call.args[0])
            target = [int(d) for d in call.args[1].values] if isinstance(call.args[1], relax.ShapeExpr) else None
            return call.args[0] if shape is not None and shape == target else None
        if call.op != matmul and call.op not in elementwise:
            return None
        args = list(call.args)
        shapes = [static_shape(a) for a in args]
        if any(s is None for s in shapes):
            return None
        want = _result_shape(call.op == matmul, shapes)
        if want is None:  # a form this check does not model (e.g. a 1-D matmul operand): leave it
            return None
        changed = False
        for i in range(len(args)):
            found = source(ctx, i)
            if found is None:
                continue
            inner, before = found
            trial = [*shapes[:i], before, *shapes[i + 1 :]]
            if _result_shape(call.op == matmul, trial) == want:
                args[i], shapes[i], changed = inner, before, True
        if not changed:
            return None
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    return relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))


def _result_shape(is_matmul: bool, shapes: list[list[int]]) -> tuple | None:
    """The output shape numpy's broadcasting gives (``matmul``: over the batch axes, matrices of at
    least two axes only), None where the operands do not broadcast."""
    try:
        if not is_matmul:
            return tuple(np.broadcast_shapes(*map(tuple, shapes)))
        a, b = shapes
        if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
            return None
        return (*np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2])), a[-2], b[-1])
    except ValueError:
        return None
