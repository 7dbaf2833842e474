"""A float32 tensor an fp16 kernel reads (saturated to fp16) is read as that fp16 copy by its other
consumers too: its producer writes only the fp16 copy."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_calls_in_context, use_counts
from inferx_edge.compiler.passes.fp16_depthwise import FP16_MAX, saturated_fp16


def fp16_shared_inputs(mod):
    """Every float32 value ``v`` (bound to a call) that is saturated to fp16 (``astype(minimum(maximum(v,
    -65504), 65504), float16)``, as :func:`~.fp16_depthwise.saturated_fp16` writes it) and used by
    other calls too: those other calls read ``astype(that fp16 copy, float32)`` instead of ``v``.

    Before, ``v`` was written in float32 by its producer, read back by a kernel of its own that wrote
    the fp16 copy (the saturation cannot fuse into a producer whose value has other readers), and read
    in float32 by the others. After, the saturation is the value's only reader: it fuses into the
    producer's epilogue, which writes fp16 only, and the other readers widen fp16 as they load it. A
    residual stream whose blocks start with an fp16 depthwise conv (ConvNeXt's: the stream feeds the
    depthwise conv and the next residual add) is then carried in fp16 between blocks, as an fp16
    variant carries it: each residual add still sums in float32 and is rounded to fp16 once (11
    significant bits; int8 layers around it keep 8). A value beyond fp16's range is saturated for every
    reader, never inf.

    int8 variants (after :func:`~.fp16_depthwise.fp16_depthwise`, which writes the saturations); values
    of dataflow blocks only. A value the function returns keeps its float32 copy for that return.
    """
    import tvm
    from tvm import relax

    astype, maximum, minimum = (tvm.ir.Op.get(f"relax.{n}") for n in ("astype", "maximum", "minimum"))
    uses = use_counts(mod)

    def bound_of(value, op):  # the other operand of `op(x, c)` with the constant c == +-FP16_MAX, else None
        if not isinstance(value, relax.Call) or value.op != op:
            return None
        x, c = value.args
        want = -FP16_MAX if op == maximum else FP16_MAX
        if isinstance(c, tvm.ir.expr.Constant) and c.value.numpy().size == 1 and float(c.value.numpy()) == want:
            return x
        return None

    # (saturated value v) -> the minimum/maximum variable its fp16 cast reads, per function
    @relax.expr_functor.visitor
    class _Saturations(relax.PyExprVisitor):
        def __init__(self):
            super().__init__()
            self.bindings, self.found = {}, {}

        def visit_var_binding_(self, binding):
            self.bindings[binding.var] = value = binding.value
            if not (isinstance(value, relax.Call) and value.op == astype and str(value.ty.dtype) == "float16"):
                return
            outer_var = value.args[0]
            outer = self.bindings.get(outer_var)
            for op_out, op_in in ((minimum, maximum), (maximum, minimum)):
                inner_var = bound_of(outer, op_out)
                v = bound_of(self.bindings.get(inner_var), op_in) if inner_var is not None else None
                if v is None or uses.get(inner_var) != 1 or uses.get(outer_var) != 1:
                    continue
                # a dataflow variable: all its readers are in this block, where the copy is emitted
                produced = isinstance(v, relax.DataflowVar) and isinstance(self.bindings.get(v), relax.Call)
                if produced and str(v.ty.dtype) == "float32" and uses[v] > 1:
                    self.found[v] = outer_var

    saturated: dict = {}  # v -> the variable its saturation chain's cast reads
    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            finder = _Saturations()
            finder.visit_expr(func)
            saturated.update(finder.found)
    if not saturated:
        return mod
    cast_reads = {outer: v for v, outer in saturated.items()}
    fp16_copy: dict = {}  # v -> its fp16 copy in the rewritten module

    def copy_of(v, ctx):  # the builder binds the saturation's three steps one by one
        if v not in fp16_copy:
            fp16_copy[v] = ctx.builder.emit(saturated_fp16(ctx.rewritten(v)))
        return fp16_copy[v]

    def rewrite(call, ctx):
        if call.op == astype and len(ctx.given) == 1 and ctx.given[0] in cast_reads:
            return copy_of(cast_reads[ctx.given[0]], ctx)  # the saturation itself: the shared copy
        if not any(isinstance(a, relax.Var) and a in saturated for a in ctx.given):
            return None
        args = [
            relax.op.astype(copy_of(g, ctx), "float32") if isinstance(g, relax.Var) and g in saturated else a
            for g, a in zip(ctx.given, call.args, strict=True)
        ]
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    return relax.transform.CanonicalizeBindings()(
        relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))
    )
