"""int8 matmuls of CUDA variants read their weight as [J, K], contiguous along the reduction."""

from __future__ import annotations


def _transposes_last_two(call) -> bool:
    """Whether ``call`` is a ``permute_dims`` of a 2-D tensor (axes None or (1, 0))."""
    if call.ty.ndim != 2:
        return False
    axes = call.attrs.axes
    return axes is None or [int(a) for a in axes] == [1, 0]


def _nt_matmul(x, w_jk):
    """TE: ``x[..., i, k] * w[j, k]`` summed over ``k`` in int32."""
    from tvm import te

    k = te.reduce_axis((0, x.shape[-1]), name="k")
    return te.compute(
        (*x.shape[:-1], w_jk.shape[0]),
        lambda *idx: te.sum(x[(*idx[:-1], k)].astype("int32") * w_jk[idx[-1], k].astype("int32"), axis=k),
        name="NT_matmul",
    )


def int8_matmul_weights_along_k(mod):
    """Every int8 x int8 -> int32 ``matmul`` with a 2-D weight becomes one ``NT_matmul`` kernel that
    reads the weight as [J, K]: the weight's transpose (a parameter's, or the [K, J] weight an ONNX
    ``MatMul`` holds, transposed here and baked at build time) is not done before the matmul.

    Why: an ONNX ``MatMul``/``Gemm`` weight reached the GEMM kernel as [K, J] (a Gemm's ``transB`` was
    baked into the weight), so the tensor-core schedule's weight tile was gathered with 4-byte loads
    across K rows. ViT-B/16's int8 dense layers ran at 80-90 int8 TOPS on the H200 that way (its convs,
    whose OHWI weights run along K, several times that). Convolutions already read OHWI weights along
    K and are left alone; activations times activations (attention) are not int8 matmuls here."""
    import tvm
    from tvm import relax

    matmul = tvm.ir.Op.get("relax.matmul")
    permute = tvm.ir.Op.get("relax.permute_dims")

    @relax.expr_functor.mutator
    class _Rewriter(relax.PyExprMutator):
        def __init__(self, mod):
            super().__init__(mod)
            self.bindings = {}

        def visit_var_binding_(self, binding):
            self.bindings[binding.var] = binding.value
            super().visit_var_binding_(binding)

        def visit_call_(self, call):
            given_w = call.args[1] if len(call.args) == 2 else None
            call = super().visit_call_(call)
            if call.op != matmul or str(call.attrs.out_dtype) != "int32":
                return call
            x, w = call.args
            if str(x.ty.dtype) != "int8" or str(w.ty.dtype) != "int8" or w.ty.ndim != 2 or x.ty.ndim < 2:
                return call
            producer = self.bindings.get(given_w)
            if isinstance(producer, relax.Call) and producer.op == permute and _transposes_last_two(producer):
                w_jk = producer.args[0]  # a Gemm's transB: the parameter already is [J, K]
            else:
                w_jk = self.builder_.emit(relax.op.permute_dims(w))  # weight-only: baked at build time
            return self.builder_.call_te(_nt_matmul, x, w_jk, primfunc_name_hint="NT_matmul")

    rewriter = _Rewriter(mod)
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return relax.transform.DeadCodeElimination()(rewriter.builder_.get())
