"""fp16 dense layers of CUDA variants read their weight as [J, K], contiguous along the reduction."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import nt_matmul, rewrite_calls_in_context, swaps_last_two, weight_only


def fp16_matmul_weights_along_k(mod):
    """Every fp16 x fp16 ``matmul`` with a 2-D weight (a parameter, a constant or a weight-only
    expression of them, e.g. its fp16 cast) becomes one ``NT_matmul`` kernel that reads the weight as
    [J, K]; the transpose is weight-only work, baked at build time. Accumulation keeps the matmul's
    ``out_dtype``.

    The int8 variants got this first (:func:`~inferx_edge.compiler.passes.int8_matmul_weights_along_k`:
    ViT-B/16 int8 batch 1 on the H200 went from 0.31x to 0.62x torch.compile); an ONNX ``MatMul`` /
    ``Gemm`` weight otherwise reaches the fp16 GEMM as [K, J] and the tensor-core schedule gathers its
    tile across K rows. Matmuls of two activations (attention) are left as they are."""
    import tvm
    from tvm import relax

    matmul = tvm.ir.Op.get("relax.matmul")
    main = mod["main"]
    n_inputs = int(main.attrs["num_input"]) if main.attrs is not None and "num_input" in main.attrs else None
    if n_inputs is None:
        return mod
    weights = set(main.params[n_inputs:])

    def rewrite(call, ctx):
        if call.op != matmul or len(ctx.given) != 2:
            return None
        x, w = call.args
        if str(x.ty.dtype) != "float16" or str(w.ty.dtype) != "float16" or w.ty.ndim != 2 or x.ty.ndim < 2:
            return None
        out_dtype = str(call.attrs.out_dtype)
        if out_dtype not in ("float16", "float32") or not weight_only(ctx.given[1], ctx, weights):
            return None
        producer = ctx.producer(ctx.given[1])
        if swaps_last_two(producer):
            w_jk = ctx.rewritten(producer.args[0])  # a Gemm's transB: already [J, K]
        else:
            w_jk = ctx.builder.emit(relax.op.permute_dims(w))  # weight-only: baked at build time
        return ctx.builder.call_te(nt_matmul, x, w_jk, out_dtype, primfunc_name_hint="NT_matmul")

    return relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))
