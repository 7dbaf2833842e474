"""int8 dense layers of CUDA variants read their weights along K."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import fused_gemms, make_mlp


def _dense(transposed: bool, x_shape=(2, 20, 64), j: int = 48):
    """int8 x @ W -> int32, scaled, bias added; W a parameter as an ONNX MatMul holds it ([K, J]) or as a
    Gemm with transB does (``permute_dims`` of a [J, K] parameter)."""
    from tvm import relax

    k = x_shape[-1]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, "int8"))
    w = relax.Var("w", relax.TensorType((j, k) if transposed else (k, j), "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.op.permute_dims(w) if transposed else w, out_dtype="int32"))
            y = relax.op.multiply(relax.op.astype(y, "float32"), relax.const(np.float32(0.25)))
            out = bb.emit_output(relax.op.add(y, relax.const(np.arange(j, dtype=np.float32))))
        bb.emit_func_output(out)
    mod = bb.get()
    mod["main"] = mod["main"].with_attr("num_input", 1)
    return mod


def _gemm_kernels(mod):
    """(extents, weights along K) of every int8 GEMM kernel after legalization and fusion."""
    return fused_gemms(mod, ("int8", "int32"))


@pytest.mark.parametrize("transposed", [False, True])
def test_dense_weights_reach_the_gemm_as_j_by_k_and_results_stay_exact(transposed):
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import bake_weight_transforms, int8_matmul_weights_along_k

    rng = np.random.default_rng(0)
    x = rng.integers(-127, 128, size=(2, 20, 64), dtype=np.int8)
    w = rng.integers(-127, 128, size=(48, 64) if transposed else (64, 48), dtype=np.int8)
    assert _gemm_kernels(bake_weight_transforms(_dense(transposed), [w])[0]) == [([40, 48, 64], False)]

    mod, _, arrays = bake_weight_transforms(int8_matmul_weights_along_k(_dense(transposed)), [w])
    assert [a.shape for a in arrays] == [(48, 64)]
    assert _gemm_kernels(mod) == [([40, 48, 64], True)]
    vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(arrays[0])).numpy()
    w_kj = w.T if transposed else w
    np.testing.assert_array_equal(got, (x.astype(np.int64) @ w_kj.astype(np.int64)) * 0.25 + np.arange(48))


def test_float_and_activation_matmuls_are_left_alone():
    """Only int8 x int8 weights: a float matmul and a 3-D (batched, activation) operand keep their form."""
    from tvm import relax

    from inferx_edge.compiler.passes import int8_matmul_weights_along_k
    from tests.helpers import main_ops

    bb = relax.BlockBuilder()
    q = relax.Var("q", relax.TensorType((2, 4, 8, 16), "int8"))
    k = relax.Var("k", relax.TensorType((2, 4, 8, 16), "int8"))
    f = relax.Var("f", relax.TensorType((8, 16), "float32"))
    g = relax.Var("g", relax.TensorType((16, 4), "float32"))
    with bb.function("main", [q, k, f, g]):
        with bb.dataflow():
            a = bb.emit(relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2]), out_dtype="int32"))
            b = bb.emit(relax.op.matmul(f, g))
            out = bb.emit_output(relax.Tuple([a, b]))
        bb.emit_func_output(out)
    assert main_ops(int8_matmul_weights_along_k(bb.get())).count("relax.matmul") == 2


def test_cuda_int8_variants_of_an_onnx_mlp_read_every_dense_weight_along_k(tmp_path):
    """Through prepare_variant as build runs it for h200 (no GPU needed: nothing is compiled); the x86
    int8 variant keeps the [K, J] weights its vector schedule reads along J."""
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.quantize.driver import QuantOptions, quantizer, resolve_plan
    from inferx_edge.targets import get_target

    model = make_mlp(tmp_path / "mlp.onnx")
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32))
    imported = import_model(model, {})
    plan = resolve_plan(model, {}, imported, "int8", QuantOptions(calib=calib), log=lambda *a: None)
    for target, along_k in (("h200", True), ("x86-cpu", False)):
        prepared = prepare_variant(
            imported, variant_layout(get_target(target), "int8"), quantize=quantizer(plan, "int8"), bake=True
        )
        assert sorted(_gemm_kernels(prepared.mod)) == [([16, 32, 128], along_k), ([16, 128, 64], along_k)]
