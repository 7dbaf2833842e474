"""``call_tir`` bindings hidden behind opaque calls while a pass that cannot read them runs.

Relax's ``ToMixedPrecision`` checks every argument of every call for a tensor type and stops at the
PrimFunc argument of ``call_tir`` ("Expected TensorType, but got R.Callable"). Frontends emit
``call_tir`` for whatever they lower to TE directly — TVM's ONNX importer does for ``Pad`` (constant
value, reflect, edge), ``Tile``, ``ReverseSequence``, ``Einsum``, ``Resize`` with dynamic sizes and
``Clip`` with tensor bounds — so an fp16 build of any model holding one failed. Each such call
becomes a call of a function that is not in the module while the pass runs (the pass treats it as an
unknown operator: float32 in, float32 out, with casts around it), and is put back after.
"""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_calls, rewrite_calls_in_context


def hide_tir_calls(mod):
    """``(module, restore)``: ``mod`` with every ``call_tir`` replaced by a call to a placeholder
    function the module does not hold, and ``restore(module)`` that turns those calls back into the
    same ``call_tir`` (the PrimFuncs stay in the module throughout)."""
    import tvm
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    hidden: dict = {}  # placeholder GlobalVar -> the call_tir's (PrimFunc GlobalVar, attrs, type args)

    def hide(call, ctx):
        if call.op != call_tir or len(call.args) != 2 or not isinstance(call.args[1], relax.Tuple):
            return None
        params = [relax.Var(f"a{i}", a.ty) for i, a in enumerate(call.args[1].fields)]
        body = relax.Call(call_tir, [call.args[0], relax.Tuple(params)], call.attrs, call.ty_args)
        # added to get a typed GlobalVar; dropped from the module below
        gv = ctx.builder.add_func(relax.Function(params, body, call.ty), f"_tir_call_{len(hidden)}")
        hidden[gv] = (call.args[0], call.attrs, call.ty_args)
        return relax.Call(gv, list(call.args[1].fields))

    def restore(call):
        if call.op not in hidden:
            return None
        prim, attrs, ty_args = hidden[call.op]
        return relax.Call(call_tir, [prim, relax.Tuple(list(call.args))], attrs, ty_args)

    out = rewrite_calls_in_context(mod, hide)
    out = tvm.IRModule({gv: f for gv, f in out.functions_items() if gv not in hidden}, attrs=out.attrs)
    return out, (lambda module: rewrite_calls(module, restore) if hidden else module)
