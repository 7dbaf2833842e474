"""Float matmuls of two activations (attention) in int8 variants run on fp16 tensor cores."""

from __future__ import annotations

from inferx_edge.compiler.passes.fp16_bounded_depthwise import FP16_MAX


def _nt_batched(a, b_jk):
    """TE: ``a[..., i, k] * b[..., j, k]`` summed over ``k`` in float32 (same batch dims)."""
    from tvm import te

    k = te.reduce_axis((0, a.shape[-1]), name="k")
    return te.compute(
        (*a.shape[:-1], b_jk.shape[-2]),
        lambda *idx: te.sum(
            a[(*idx[:-1], k)].astype("float32") * b_jk[(*idx[:-2], idx[-1], k)].astype("float32"), axis=k
        ),
        name="NT_matmul",
    )


def _swap_last_two(ndim: int) -> list[int]:
    return [*range(ndim - 2), ndim - 1, ndim - 2]


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
    permute = tvm.ir.Op.get("relax.permute_dims")
    main = mod["main"]
    n_inputs = int(main.attrs["num_input"]) if main.attrs is not None and "num_input" in main.attrs else None
    weights = set(main.params[n_inputs:]) if n_inputs is not None else set()

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.weight_only = set(weights)
            self.bindings = {}

        def visit_var_binding_(self, binding):
            v = binding.value
            self.bindings[binding.var] = v
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

            n = b.ty.ndim
            producer = self.bindings.get(given[1])
            if (
                isinstance(producer, relax.Call)
                and producer.op == permute
                and producer.attrs.axes is not None
                and [int(x) for x in producer.attrs.axes] == _swap_last_two(n)
            ):
                b_jk = producer.args[0]  # Q x K^T: K itself is [..., J, K]
            else:
                b_jk = relax.op.permute_dims(b, _swap_last_two(n))  # fused into V's producer
            same_batch = a.ty.ndim == n and all(
                isinstance(x, tvm.tirx.IntImm) and isinstance(y, tvm.tirx.IntImm) and int(x) == int(y)
                for x, y in zip(list(a.ty.shape)[:-2], list(b.ty.shape)[:-2], strict=True)
            )
            if not same_batch:
                return relax.op.matmul(half(a), half(b), out_dtype="float32")
            return self.builder_.call_te(
                _nt_batched, self.builder_.emit(half(a)), self.builder_.emit(half(b_jk)), primfunc_name_hint="NT_matmul"
            )

    rewriter = _Rewriter(mod)
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return relax.transform.DeadCodeElimination()(rewriter.builder_.get())
