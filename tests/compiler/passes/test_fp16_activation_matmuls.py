"""Attention's activation x activation matmuls of int8 CUDA variants read fp16 (fp32 accumulation)."""

from __future__ import annotations

import numpy as np

from tests.helpers import fused_gemms, kernel_source, needs_nvrtc


def _attention(b=2, h=4, s=50, d=32, weight: bool = False):
    """softmax(Q K^T / sqrt(d)) V over (b, h, s, d) inputs; with ``weight`` also a float dense layer
    (a [d, d] parameter) on the result, which must stay float32."""
    from tvm import relax

    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((b, h, s, d), "float32")) for n in "qkv")
    w = relax.Var("w", relax.TensorType((d, d), "float32"))
    with bb.function("main", [q, k, v, w] if weight else [q, k, v]):
        with bb.dataflow():
            scores = relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2]))
            p = relax.op.nn.softmax(relax.op.multiply(scores, relax.const(np.float32(d**-0.5))), axis=-1)
            y = relax.op.matmul(p, v)
            out = bb.emit_output(relax.op.matmul(y, relax.op.permute_dims(w)) if weight else y)
        bb.emit_func_output(out)
    mod = bb.get()
    mod["main"] = mod["main"].with_attr("num_input", 3)
    return mod


def _matmul_dtypes(mod):
    """(operand dtypes, output dtype) of every matmul: Relax ``matmul`` calls and NT_matmul kernels."""
    out = []
    for blk in mod["main"].body.blocks:
        for b in blk.bindings:
            name = getattr(getattr(b.value, "op", None), "name", "")
            if name == "relax.matmul":
                operands = b.value.args
            elif name == "relax.call_tir" and b.value.args[0].name_hint.startswith("NT_matmul"):
                operands = b.value.args[1].fields
            else:
                continue
            out.append((tuple(str(x.ty.dtype) for x in operands), str(b.value.ty.dtype)))
    return out


def test_attention_matmuls_read_fp16_and_weights_stay_float32():
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import fp16_activation_matmuls

    rewritten = fp16_activation_matmuls(_attention(weight=True))
    half, single = ("float16", "float16"), ("float32", "float32")
    assert _matmul_dtypes(rewritten) == [(half, "float32"), (half, "float32"), (single, "float32")]
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((2, 4, 50, 32)).astype(np.float32) for _ in range(3)]
    args.append(rng.standard_normal((32, 32)).astype(np.float32))

    def run(m):
        vm = relax.VirtualMachine(relax.build(m, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()

    ref = run(_attention(weight=True))
    assert np.abs(run(rewritten) - ref).max() <= 2e-3 * np.abs(ref).max()


def test_values_beyond_fp16_saturate_instead_of_becoming_inf():
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import fp16_activation_matmuls

    rewritten = fp16_activation_matmuls(_attention(b=1, h=1, s=16, d=16))
    vm = relax.VirtualMachine(relax.build(rewritten, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    q = np.full((1, 1, 16, 16), 1e6, np.float32)
    out = vm["main"](*[tvm.runtime.tensor(a) for a in (q, q, np.ones_like(q))]).numpy()
    assert np.isfinite(out).all()


def test_both_attention_operands_reach_the_gemm_along_k():
    """Q x K^T reads K as stored; P x V reads V transposed by its producer: the schedule's 16-byte
    operand loads along K for both (a [K, J] operand is gathered 4 bytes at a time)."""
    from inferx_edge.compiler.passes import fp16_activation_matmuls

    gemms = sorted(fused_gemms(fp16_activation_matmuls(_attention(2, 12, 197, 64))))
    assert gemms == [([197, 64, 197], True), ([197, 197, 64], True)]


@needs_nvrtc
def test_attention_matmuls_compile_to_fp16_mma_with_fp32_accumulation():
    from inferx_edge.compiler.passes import fp16_activation_matmuls

    source = kernel_source("h200", fp16_activation_matmuls(_attention()))
    assert source.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") >= 2 and "ldmatrix" in source
