"""Run a Relax expression mutator over every Relax function of a module (the CUDA pipeline's own
rewrites; ``compiler.passes`` has its own call-rewriting helpers, which this layer does not import)."""

from __future__ import annotations


def mutate_functions(rewriter):
    """The module of ``rewriter`` (a ``relax.PyExprMutator`` built over a module) after it has visited
    every Relax function of that module; PrimFuncs it added land there too."""
    from tvm import relax

    for gv, func in list(rewriter.builder_.get().functions_items()):
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()
