"""fp16 dense layers of CUDA variants read their weight as [J, K], contiguous along the reduction."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import dense_weights_along_k, weight_only, weight_params


def fp16_matmul_weights_along_k(mod):
    """Every fp16 x fp16 ``matmul`` with a 2-D weight (a parameter, a constant or a weight-only
    expression of them, e.g. its fp16 cast) becomes one ``NT_matmul`` kernel that reads the weight as
    [J, K]; the transpose is weight-only work, baked at build time. Accumulation keeps the matmul's
    ``out_dtype``.

    The int8 variants got this first (:func:`~inferx_edge.compiler.passes.int8_matmul_weights_along_k`:
    ViT-B/16 int8 batch 1 on the H200 went from 0.31x to 0.62x torch.compile); an ONNX ``MatMul`` /
    ``Gemm`` weight otherwise reaches the fp16 GEMM as [K, J] and the tensor-core schedule gathers its
    tile across K rows. Matmuls of two activations (attention) are left as they are."""
    main = mod["main"]
    if main.attrs is None or "num_input" not in main.attrs:  # weights unknown
        return mod
    weights = weight_params(mod)
    return dense_weights_along_k(
        mod, "float16", ("float16", "float32"), lambda operand, ctx: weight_only(operand, ctx, weights)
    )
