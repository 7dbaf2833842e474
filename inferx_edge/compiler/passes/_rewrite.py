"""Shared by the passes: rewrite every Relax call of a module through a callback (the generic part lives
in :mod:`inferx_edge.compiler.relax_rewrite`, which the CUDA pipeline's rewrites use too)."""

from __future__ import annotations

from inferx_edge.compiler.relax_rewrite import (  # noqa: F401 - the passes import them from here
    CallContext,
    rewrite_calls,
    rewrite_calls_in_context,
    static_shape,
)


def rewrite_convs(mod, rewrite):
    """``mod`` with every ``relax.nn.conv2d`` call passed through ``rewrite(call, attrs, data, weight)``
    (None: keep it)."""
    import tvm

    conv = tvm.ir.Op.get("relax.nn.conv2d")
    return rewrite_calls(mod, lambda call: rewrite(call, call.attrs, *call.args) if call.op == conv else None)


def op_name(call) -> str | None:
    """The operator name of a bound value (``"relax.reshape"``), or None: no binding, not a call, or a
    call of a function (whose ``op`` is a GlobalVar, not an Op)."""
    return getattr(getattr(call, "op", None), "name", None)


def permute_axes(call, rank: int) -> list[int]:
    """The axes of a ``permute_dims`` call over a rank-``rank`` operand (unset: reversed)."""
    return list(reversed(range(rank))) if call.attrs.axes is None else [int(a) for a in call.attrs.axes]


def swaps_last_two(call) -> bool:
    """Whether ``call`` is a ``permute_dims`` that swaps its operand's last two axes and keeps the rest
    (a 2-D transpose may leave ``axes`` unset)."""
    import tvm

    if not hasattr(call, "op") or call.op != tvm.ir.Op.get("relax.permute_dims"):
        return False
    n = call.ty.ndim
    axes = call.attrs.axes
    if axes is None:
        return n == 2
    return [int(a) for a in axes] == [*range(n - 2), n - 1, n - 2]


def nt_matmul(a, b_jk, acc_dtype: str):
    """TE: ``out[..., i, j] = sum_k a[..., i, k] * b[..., j, k]`` accumulated in ``acc_dtype``; ``b``'s
    batch axes (none for a 2-D weight) line up with ``a``'s innermost ones. The GEMM reads both
    operands along the reduction."""
    from tvm import te

    k = te.reduce_axis((0, a.shape[-1]), name="k")
    b_batch = len(b_jk.shape) - 2

    def compute(*idx):
        batch = idx[:-2]
        b_idx = (*batch[len(batch) - b_batch :], idx[-1], k)
        return te.sum(a[(*idx[:-1], k)].astype(acc_dtype) * b_jk[b_idx].astype(acc_dtype), axis=k)

    return te.compute((*a.shape[:-1], b_jk.shape[-2]), compute, name="NT_matmul")


def weight_only(expr, ctx: CallContext, weights: set) -> bool:
    """Whether ``expr`` depends on nothing but ``weights`` (a function's weight parameters) and
    constants, through the bindings ``ctx`` knows. Shapes, scalars and dtypes written into a call
    (``reshape``'s target shape) are constants; a call of no arguments is not weight-only.

    Iterative, stopping at the first input: an activation's chain of bindings runs back through the
    whole network, deeper than Python's recursion limit."""
    from tvm import relax

    stack, seen = [expr], set()
    while stack:
        e = stack.pop()
        if isinstance(e, relax.Var):
            if e in weights or e in seen:
                continue  # a variable seen before is weight-only so far: the walk stops at the first that is not
            seen.add(e)
            value = ctx.bindings.get(e)
            if value is None:
                return False  # an input
            stack.append(value)
        elif isinstance(e, relax.Call):
            if not e.args:
                return False
            stack.extend(e.args)
        elif isinstance(e, relax.Tuple):
            stack.extend(e.fields)
        elif isinstance(e, relax.TupleGetItem):
            stack.append(e.tuple_value)
        # anything else (constants, shapes, scalars, dtypes, a call's callee) is weight-only
    return True


def use_counts(mod) -> dict:
    """How many times each variable of ``mod``'s Relax functions is read (a variable never read is
    absent)."""
    from tvm import relax

    uses: dict = {}

    @relax.expr_functor.visitor
    class _Uses(relax.PyExprVisitor):
        def visit_var_(self, var):
            uses[var] = uses.get(var, 0) + 1

        def visit_dataflow_var_(self, var):
            uses[var] = uses.get(var, 0) + 1

    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            _Uses().visit_expr(func)
    return uses


def readers(mod) -> dict:
    """Each variable of ``mod``'s Relax functions -> ``[(reader variable, its call, argument index)]``, one
    entry per call argument it is (a variable read in a tuple or returned has fewer entries than
    :func:`use_counts` says)."""
    from tvm import relax

    found: dict = {}
    for b in bindings(mod):
        if isinstance(b.value, relax.Call):
            for i, a in enumerate(b.value.args):
                if isinstance(a, relax.Var):
                    found.setdefault(a, []).append((b.var, b.value, i))
    return found


def bindings(mod):
    """Every variable binding of ``mod``'s Relax functions, in order."""
    from tvm import relax

    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr):
            for blk in func.body.blocks:
                yield from blk.bindings


def weight_params(mod) -> set:
    """``main``'s weight parameters (those after its ``num_input`` inputs); none without that attribute."""
    main = mod["main"]
    if main.attrs is None or "num_input" not in main.attrs:
        return set()
    return set(main.params[int(main.attrs["num_input"]) :])


def dense_weights_along_k(mod, in_dtype: str, out_dtypes: tuple[str, ...], is_weight):
    """Every ``in_dtype`` x ``in_dtype`` ``matmul`` (``out_dtype`` one of ``out_dtypes``) whose second
    operand is a 2-D weight (``is_weight(given operand, ctx)``) as one ``NT_matmul`` kernel reading
    that weight as [J, K]: a Gemm's ``transB`` parameter as it is, any other weight through a
    ``permute_dims`` that is weight-only work (baked at build time). Accumulates in ``out_dtype``."""
    import tvm
    from tvm import relax

    matmul = tvm.ir.Op.get("relax.matmul")

    def rewrite(call, ctx):
        if call.op != matmul or len(ctx.given) != 2:
            return None
        x, w = call.args
        out_dtype = str(call.attrs.out_dtype)
        if str(x.ty.dtype) != in_dtype or str(w.ty.dtype) != in_dtype or out_dtype not in out_dtypes:
            return None
        if w.ty.ndim != 2 or x.ty.ndim < 2 or not is_weight(ctx.given[1], ctx):
            return None
        producer = ctx.producer(ctx.given[1])
        if swaps_last_two(producer):
            w_jk = ctx.rewritten(producer.args[0])  # a Gemm's transB: the weight already is [J, K]
        else:
            w_jk = ctx.builder.emit(relax.op.permute_dims(w))
        return ctx.builder.call_te(nt_matmul, x, w_jk, out_dtype, primfunc_name_hint="NT_matmul")

    return relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))
