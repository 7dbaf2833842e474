"""int8 matmuls of CUDA variants read their weight as [J, K], contiguous along the reduction."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import nt_matmul, rewrite_calls_in_context, swaps_last_two


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

    def rewrite(call, ctx):
        if call.op != matmul or str(call.attrs.out_dtype) != "int32":
            return None
        x, w = call.args
        if str(x.ty.dtype) != "int8" or str(w.ty.dtype) != "int8" or w.ty.ndim != 2 or x.ty.ndim < 2:
            return None
        producer = ctx.producer(ctx.given[1])
        if swaps_last_two(producer):
            w_jk = producer.args[0]  # a Gemm's transB: the parameter already is [J, K]
        else:
            w_jk = ctx.builder.emit(relax.op.permute_dims(w))  # weight-only: baked at build time
        return ctx.builder.call_te(nt_matmul, x, w_jk, "int32", primfunc_name_hint="NT_matmul")

    return relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))
