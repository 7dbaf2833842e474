"""Reshapes, transposes and slices of a value widened from fp16 move fp16 values; the widening follows them.

In an int8 variant a value that was stored in fp16 (a concatenation's, :mod:`.fp16_concat_inputs`) is
widened to float32 right after it is computed, and what reads it through data movement alone — a
channel shuffle's reshape -> transpose -> reshape, then the two halves sliced off for the next block —
read the float32 copy. TVM fuses the widening and the data movement into the producer's kernel and
writes the result where it forks (both halves read it), so the float32 copy is what travels through
memory: 4 bytes an element written and read again, for values that are fp16 to begin with. With the
widening moved below the data movement, the fork is written in fp16 and each reader widens its part
as it loads it; the values are the same (widening is exact).
"""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_calls_in_context
from inferx_edge.compiler.passes.sink_permutes import _BINARY, _UNARY

#: data movement the widening moves below (the value's first operand is the moved tensor)
_MOVES = ("reshape", "permute_dims", "strided_slice")
#: readers that fuse with a widening in front of them (the elementwise ops transposes move past, and
#: casts): where every path from the widening through data movement ends in these, moving it adds no kernel
_ELEMENTWISE = (*_BINARY, *_UNARY, "astype")


def fp16_data_movement(mod):
    """``mod`` with every fp16 -> float32 ``astype`` moved below the reshapes, transposes and slices
    that read it, where every path from it through such data movement ends in elementwise readers (a
    convolution or matmul reading the moved value would need a kernel of its own for the widening).
    The values are unchanged; what is stored between kernels is fp16."""
    import tvm
    from tvm import relax

    astype = tvm.ir.Op.get("relax.astype")
    moves = {tvm.ir.Op.get(f"relax.{n}") for n in _MOVES}
    elementwise = {tvm.ir.Op.get(f"relax.{n}") for n in _ELEMENTWISE}

    def widening(value) -> bool:
        return (
            isinstance(value, relax.Call)
            and value.op == astype
            and str(value.args[0].ty.dtype) == "float16"
            and str(value.ty.dtype) == "float32"
        )

    moved: set = set()  # original vars (widenings and data movement) the widening moves below
    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            moved |= _movable(func, widening, moves, elementwise)
    if not moved:
        return mod

    def rewrite(call, ctx):
        if call.op not in moves or not ctx.given or ctx.given[0] not in moved:
            return None
        inner = ctx.bound(call.args[0])
        if not widening(inner):
            return None
        narrow = relax.Call(call.op, [inner.args[0], *call.args[1:]], call.attrs, call.ty_args)
        return relax.op.astype(narrow, "float32")

    return relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))


def _movable(func, widening, moves, elementwise) -> set:
    """The widenings of ``func`` (and the data movement below them) whose data-movement readers all
    end in elementwise readers; a widening counts only where data movement reads it at all."""
    from tvm import relax

    bindings: dict = {}
    readers: dict = {}  # var -> [(reader var, reader value)]

    @relax.expr_functor.visitor
    class _Readers(relax.PyExprVisitor):
        def visit_var_binding_(self, binding):
            bindings[binding.var] = value = binding.value
            if isinstance(value, relax.Call):
                for arg in value.args:
                    for a in arg.fields if isinstance(arg, relax.Tuple) else [arg]:  # a concat's inputs too
                        if isinstance(a, relax.Var):
                            readers.setdefault(a, []).append((binding.var, value))
            super().visit_var_binding_(binding)

    _Readers().visit_expr(func)

    def tree(v) -> set | None:
        """``v`` and the data movement below it, or None where some path ends in a non-elementwise
        reader, reads ``v`` other than as its moved operand, or leaves the dataflow block."""
        out = {v}
        if not isinstance(v, relax.DataflowVar):
            return None  # the block's output
        for var, value in readers.get(v, []):
            if value.op in moves and value.args[0].same_as(v) and all(not a.same_as(v) for a in value.args[1:]):
                below = tree(var)
                if below is None:
                    return None
                out |= below
            elif value.op not in elementwise:
                return None
        return out

    found: set = set()
    for var, value in bindings.items():
        if not widening(value) or not any(r.op in moves for _v, r in readers.get(var, [])):
            continue
        below = tree(var)
        if below is not None:
            found |= below
    return found
