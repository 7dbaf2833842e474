"""Shared by the passes: rewrite every Relax call of a module through a callback."""

from __future__ import annotations


def rewrite_calls(mod, rewrite):
    """``mod`` with every Relax call passed through ``rewrite(call)`` (None: keep it)."""
    from tvm import relax

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            new = rewrite(call)
            return call if new is None else new

    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gv] = _Rewriter(mod).visit_expr(func)
    return mod


def rewrite_convs(mod, rewrite):
    """``mod`` with every ``relax.nn.conv2d`` call passed through ``rewrite(call, attrs, data, weight)``
    (None: keep it)."""
    import tvm

    conv = tvm.ir.Op.get("relax.nn.conv2d")
    return rewrite_calls(mod, lambda call: rewrite(call, call.attrs, *call.args) if call.op == conv else None)
