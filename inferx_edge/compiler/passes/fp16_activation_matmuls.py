"""Float matmuls of two activations (attention) in int8 variants run on fp16 tensor cores."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import (
    nt_matmul,
    rewrite_calls_in_context,
    swaps_last_two,
    weight_only,
    weight_params,
)
from inferx_edge.compiler.passes.fp16_depthwise import saturated_fp16


def fp16_activation_matmuls(mod):
    """A float32 ``matmul`` whose operands are both activations (attention's Q x K^T and P x V: int8
    variants leave them float, as no weight is there to quantize) reads fp16 operands and accumulates
    in fp32 (``out_dtype`` float32): our tensor-core schedule takes it on sm_80+, where the float32 one
    ran on CUDA cores (ViT-B/16 int8 at batch 64 on the H200: 7.3 of 39 ms in its two attention
    matmuls). Both operands reach the kernel along K (``NT_matmul``): Q x K^T reads K as stored, V is
    transposed by the kernel that produces it. Operands are saturated to fp16's range before the cast,
    so a large value cannot become inf. Matmuls with a weight operand (a parameter, a constant or a
    weight-only expression of them) are left alone: int8 variants keep such float layers in fp32 by
    the accuracy budget's choice."""
    import tvm
    from tvm import relax

    matmul = tvm.ir.Op.get("relax.matmul")
    weights = weight_params(mod)

    def rewrite(call, ctx):
        if call.op != matmul or len(ctx.given) != 2 or any(weight_only(a, ctx, weights) for a in ctx.given):
            return None
        a, b = call.args
        if str(a.ty.dtype) != "float32" or str(b.ty.dtype) != "float32" or min(a.ty.ndim, b.ty.ndim) < 2:
            return None
        n = b.ty.ndim
        same_batch = a.ty.ndim == n and all(
            isinstance(x, tvm.tirx.IntImm) and isinstance(y, tvm.tirx.IntImm) and int(x) == int(y)
            for x, y in zip(list(a.ty.shape)[:-2], list(b.ty.shape)[:-2], strict=True)
        )
        if not same_batch:
            return relax.op.matmul(saturated_fp16(a), saturated_fp16(b), out_dtype="float32")
        producer = ctx.producer(ctx.given[1])
        if swaps_last_two(producer):
            b_jk = producer.args[0]  # Q x K^T: K itself is [..., J, K]
        else:
            b_jk = relax.op.permute_dims(b, [*range(n - 2), n - 1, n - 2])  # fused into V's producer
        return ctx.builder.call_te(
            nt_matmul, ctx.builder.emit(saturated_fp16(a)), ctx.builder.emit(saturated_fp16(b_jk)), "float32",
            primfunc_name_hint="NT_matmul",
        )  # fmt: skip

    return relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))
