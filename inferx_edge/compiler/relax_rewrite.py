"""Relax rewriting shared by the compiler's passes (``compiler.passes``) and the CUDA pipeline's own
rewrites (``compiler.cuda``, which may not import ``compiler.passes``): every call of a module through a
callback, a mutator over every function, static shapes, kernel launches per call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class CallContext:
    """What :func:`rewrite_calls_in_context` tells its callback about a call.

    Attributes
    ----------
    given : the call's arguments as the module wrote them (before rewriting), for :meth:`producer`.
    bindings : every variable bound so far, to the value the module bound it to.
    builder : the rewriter's block builder (``emit``, ``call_te``: new bindings and PrimFuncs).
    var : the variable the module bound this call to (None for a call nested in another expression).
    """

    given: list
    bindings: dict
    builder: Any
    visit: Any = None  # the rewriter's visit_expr: an original expression as rewritten so far
    var: Any = None

    def producer(self, arg):
        """The value the module bound ``arg`` (one of :attr:`given`) to, or None (a parameter, a
        constant)."""
        return self.bindings.get(arg)

    def bound(self, var):
        """The value the rewritten module bound ``var`` (a variable of the rewritten module, such as an
        argument of the call being rewritten) to, or None (a parameter, not a variable)."""
        from tvm import relax

        if not isinstance(var, relax.Var):
            return None
        try:
            return self.builder.lookup_binding(var)
        except Exception:  # noqa: BLE001 - not bound in this function
            return None

    def rewritten(self, expr):
        """``expr`` (e.g. an argument of a :meth:`producer`) as it stands in the rewritten module: a
        variable whose binding was rewritten has been renamed."""
        return self.visit(expr)


def rewrite_calls_in_context(mod, rewrite):
    """``mod`` with every Relax call passed through ``rewrite(call, ctx)`` (None: keep it), where
    ``call`` has its arguments already rewritten and ``ctx`` is a :class:`CallContext`. PrimFuncs the
    callback makes with ``ctx.builder.call_te`` land in the returned module."""
    from tvm import relax

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.bindings = {}
            self.binding = None

        def visit_var_binding_(self, binding):
            self.bindings[binding.var] = binding.value
            self.binding = binding
            super().visit_var_binding_(binding)

        def visit_call_(self, call):
            given = list(call.args)
            bound = self.binding is not None and self.binding.value.same_as(call)
            var = self.binding.var if bound else None
            call = super().visit_call_(call)
            new = rewrite(call, CallContext(given, self.bindings, self.builder_, self.visit_expr, var))
            return call if new is None else new

    return mutate_functions(_Rewriter(mod))


def rewrite_calls(mod, rewrite):
    """``mod`` with every Relax call passed through ``rewrite(call)`` (None: keep it)."""
    return rewrite_calls_in_context(mod, lambda call, _ctx: rewrite(call))


def mutate_functions(rewriter):
    """The module of ``rewriter`` (a ``relax.PyExprMutator`` built over a module) after it has visited
    every Relax function of that module; PrimFuncs it added land there too."""
    from tvm import relax

    for gv, func in list(rewriter.builder_.get().functions_items()):
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()


def call_counts(mod) -> dict[str, int]:
    """How many times ``mod``'s Relax functions call each of its functions (``call_tir`` of a PrimFunc:
    a kernel launch); repeated blocks of a network share one kernel."""
    import collections

    import tvm
    from tvm import relax

    counts: collections.Counter = collections.Counter()

    @relax.expr_functor.visitor
    class _Calls(relax.PyExprVisitor):
        def visit_call_(self, call):
            if call.args and isinstance(call.args[0], tvm.ir.GlobalVar):
                counts[call.args[0].name_hint] += 1
            super().visit_call_(call)

    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            _Calls().visit_expr(func)
    return dict(counts)


def static_shape(expr) -> list[int] | None:
    """``expr``'s tensor shape when every dimension is a constant, else None."""
    import tvm
    from tvm import relax

    ty = getattr(expr, "ty", None)
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not hasattr(ty.shape, "values"):
        return None
    dims = list(ty.shape.values)
    if any(not isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return [int(d) for d in dims]
