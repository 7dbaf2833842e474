"""int8 matmuls of CUDA variants read their weight as [J, K], contiguous along the reduction."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import dense_weights_along_k


def int8_matmul_weights_along_k(mod):
    """Every int8 x int8 -> int32 ``matmul`` with a 2-D weight becomes one ``NT_matmul`` kernel that
    reads the weight as [J, K]: the weight's transpose (a parameter's, or the [K, J] weight an ONNX
    ``MatMul`` holds, transposed here and baked at build time) is not done before the matmul.

    Why: an ONNX ``MatMul``/``Gemm`` weight reached the GEMM kernel as [K, J] (a Gemm's ``transB`` was
    baked into the weight), so the tensor-core schedule's weight tile was gathered with 4-byte loads
    across K rows. ViT-B/16's int8 dense layers ran at 80-90 int8 TOPS on the H200 that way (its convs,
    whose OHWI weights run along K, several times that). Convolutions already read OHWI weights along
    K and are left alone; activations times activations (attention) are not int8 matmuls here."""
    # an int8 x int8 -> int32 matmul's 2-D int8 operand is a quantized weight by construction
    return dense_weights_along_k(mod, "int8", ("int32",), lambda _operand, _ctx: True)
