"""fp16 dense layers of CUDA variants read their weights along K (as int8 ones do)."""

from __future__ import annotations

import numpy as np

from tests.helpers import fused_gemms, make_mlp, needs_nvrtc


def _prepared(tmp_path, target: str):
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target

    imported = import_model(make_mlp(tmp_path / "mlp.onnx"), {})
    return imported, prepare_variant(imported, variant_layout(get_target(target), "fp16"), bake=True)


def test_cuda_fp16_variant_of_an_onnx_mlp_reads_every_dense_weight_along_k_and_computes_the_same(tmp_path):
    """Through prepare_variant as build runs it for h200; the module computes on this CPU what the
    unrewritten fp16 module computes (fp16 products, same accumulation dtype)."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import to_fp16

    imported, prepared = _prepared(tmp_path, "h200")
    assert sorted(fused_gemms(prepared.mod, ("float16", "float16"))) == [([16, 32, 128], True), ([16, 128, 64], True)]
    assert all(a.dtype == np.float16 for a in prepared.weight_arrays if a.ndim == 2)  # cast and transposed at build
    x = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)

    def run(mod, weights):
        vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        return vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(w) for w in weights]).numpy()

    want = run(to_fp16(imported.mod), imported.params)
    np.testing.assert_allclose(run(prepared.mod, prepared.weight_arrays), want, rtol=2e-3, atol=2e-3)


def test_float_and_cpu_variants_keep_their_matmuls(tmp_path):
    _, prepared = _prepared(tmp_path, "x86-cpu")  # the CPU's vector schedule reads [K, J] along J
    assert all(not along_k for _, along_k in fused_gemms(prepared.mod))


@needs_nvrtc
def test_fp16_dense_layers_along_k_compile_to_tensor_cores(tmp_path):
    from tests.helpers import schedule_and_compile

    _, prepared = _prepared(tmp_path, "h200")
    scripts = schedule_and_compile("h200", prepared.mod)
    gemms = [s for s in scripts if "NT_matmul" in s]
    assert len(gemms) == 2 and all('mma("m16n8k16"' in s and "ldmatrix" in s for s in gemms)
