"""Float matmuls of two activations (attention) in int8 variants run on fp16 tensor cores."""

from __future__ import annotations

from inferx_edge.compiler.passes.fp16_bounded_depthwise import FP16_MAX


def fp16_activation_matmuls(mod):
    """A float32 ``matmul`` whose operands are both activations (attention's Q x K^T and P x V: int8
    variants leave them float, as no weight is there to quantize) reads fp16 operands and accumulates
    in fp32 (``out_dtype`` float32): our tensor-core schedule takes it on sm_80+, where the float32 one
    ran on CUDA cores (ViT-B/16 int8 at batch 64 on the H200: 7.3 of 39 ms in its two attention
    matmuls). Operands are saturated to fp16's range before the cast, so a large value cannot become
    inf. Matmuls with a weight operand (a parameter, a constant or a weight-only expression of them)
    are left alone: int8 variants keep such float layers in fp32 by the accuracy budget's choice."""
    import tvm
    from tvm import relax

    matmul = tvm.ir.Op.get("relax.matmul")
    main = mod["main"]
    n_inputs = int(main.attrs["num_input"]) if main.attrs is not None and "num_input" in main.attrs else None
    weights = set(main.params[n_inputs:]) if n_inputs is not None else set()

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.weight_only = set(weights)

        def visit_var_binding_(self, binding):
            v = binding.value
            if isinstance(v, relax.Call) and v.args and all(self._is_weight(a) for a in v.args):
                self.weight_only.add(binding.var)
            super().visit_var_binding_(binding)

        def _is_weight(self, e) -> bool:
            return isinstance(e, tvm.ir.expr.Constant) or (isinstance(e, relax.Var) and e in self.weight_only)

        def visit_call_(self, call):
            given = list(call.args)
            call = super().visit_call_(call)
            if call.op != matmul or len(given) != 2 or any(self._is_weight(a) for a in given):
                return call
            a, b = call.args
            if str(a.ty.dtype) != "float32" or str(b.ty.dtype) != "float32" or min(a.ty.ndim, b.ty.ndim) < 2:
                return call

            def half(x):
                lo, hi = relax.const(-FP16_MAX, "float32"), relax.const(FP16_MAX, "float32")
                return relax.op.astype(relax.op.minimum(relax.op.maximum(x, lo), hi), "float16")

            return relax.op.matmul(half(a), half(b), out_dtype="float32")

    rewriter = _Rewriter(mod)
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()
