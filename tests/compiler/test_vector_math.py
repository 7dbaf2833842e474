"""CPU builds compute float32 exp and erf in vector registers (no scalar libm call per lane)."""

from __future__ import annotations

import numpy as np


def _exp_kernel(shape=(4, 1000), dtype="float32"):
    """exp(x), x * sigmoid(x) (SiLU) and erf(x), compiled with the CPU pipeline for this host."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cpu import cpu_pipeline
    from inferx_edge.targets import get_target

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            silu = relax.op.multiply(x, relax.op.sigmoid(x))
            out = bb.emit_output(relax.Tuple([relax.op.exp(x), silu, relax.op.erf(x)]))
        bb.emit_func_output(out)
    target = resolve_tvm_target(get_target("x86-cpu"))
    ex = relax.build(bb.get(), target, relax_pipeline=cpu_pipeline(target))
    return ex, relax.VirtualMachine(ex, tvm.cpu())


def test_exp_matches_float64_across_its_range_with_ieee_edges():
    import tvm

    x = np.random.default_rng(0).uniform(-87.0, 88.5, (4, 1000)).astype(np.float32)
    x[0, :9] = [0.0, 1e-8, -1e-8, 88.7, 88.8, 1000.0, -200.0, np.nan, -np.inf]
    _, vm = _exp_kernel()
    e, silu, _ = (o.numpy() for o in vm["main"](tvm.runtime.tensor(x)))
    ref = np.exp(x[1:].astype(np.float64))
    assert np.max(np.abs(e[1:] - ref) / ref) < 1e-6
    assert e[0, 0] == 1.0 and np.isfinite(e[0, 3]) and np.isinf(e[0, 4]) and np.isinf(e[0, 5])
    assert e[0, 6] == 0.0 and np.isnan(e[0, 7]) and e[0, 8] == 0.0
    x64 = x[1:].astype(np.float64)
    np.testing.assert_allclose(silu[1:], x64 / (1 + np.exp(-x64)), rtol=1e-6, atol=1e-30)


def test_exp_of_float16_and_float64_compiles_and_is_exact_to_their_precision():
    """fp16 goes through the float32 vector exp, fp64 keeps LLVM's exp (a CPU fp16 LLM build failed
    with 'unknown intrinsic tirx.exp' when the float32 rule was the only one)."""
    import tvm

    x = np.random.default_rng(2).uniform(-10, 10, (4, 1000))
    for dtype, rtol in (("float16", 1e-3), ("float64", 1e-12)):
        _, vm = _exp_kernel(dtype=dtype)
        e, silu, _ = (o.numpy() for o in vm["main"](tvm.runtime.tensor(x.astype(dtype))))
        ref = np.exp(x.astype(dtype).astype(np.float64))
        np.testing.assert_allclose(e.astype(np.float64), ref, rtol=rtol)
        assert e.dtype == np.dtype(dtype)


def test_erf_matches_float64_and_keeps_nan_and_infinities():
    import math

    import tvm

    x = (np.random.default_rng(1).standard_normal((4, 1000)) * 3).astype(np.float32)
    x[0, :6] = [0.0, 1e-8, -1e-8, np.inf, -np.inf, np.nan]
    _, vm = _exp_kernel()
    erf = vm["main"](tvm.runtime.tensor(x))[2].numpy()
    ref = np.vectorize(math.erf)(x[1:].astype(np.float64))
    assert np.abs(erf[1:] - ref).max() < 1e-6
    assert list(erf[0, :5]) == [0.0, np.float32(1.1283791e-08), np.float32(-1.1283791e-08), 1.0, -1.0]
    assert np.isnan(erf[0, 5])


def test_exp_and_erf_compile_without_a_libm_call_in_vector_loops():
    ex, _ = _exp_kernel()
    ll = "".join(m.inspect_source("ll") for m in ex.mod.imports if m.kind == "llvm")
    assert ll and "@expf" not in ll and "llvm.exp." not in ll and "@erff" not in ll
    assert " x float>" in ll
