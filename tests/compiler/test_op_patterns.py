"""A pad after a GEMM's epilogue is not fused into the GEMM's kernel (compiler/op_patterns.py): fused,
every schedule computed the epilogue per GEMM tile and left the padded border unwritten (Swin3D-T's
patch merging from ONNX, 8 % error on x86)."""

from __future__ import annotations

import numpy as np
import pytest


def _gemm_add_pad():
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 7, 7, 64), "float32"))
    w = relax.Var("w", relax.TensorType((64, 32), "float32"))
    r = relax.Var("r", relax.TensorType((1, 4, 7, 7, 32), "float32"))
    with bb.function("main", [x, w, r]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(relax.op.matmul(x, w), r))
            out = bb.emit_output(relax.op.nn.pad(y, [0, 0, 0, 0, 0, 1, 0, 1, 0, 0]))
        bb.emit_func_output(out)
    return bb.get()


def _kernels(mod) -> list[str]:
    import tvm

    return [gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]


@pytest.mark.parametrize("target", ["x86-cpu", "h200"])
def test_a_pad_after_a_gemm_epilogue_gets_its_own_kernel(target):
    import tvm

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cpu.default_schedule import cpu_pipeline
    from inferx_edge.compiler.cuda.pipeline import fusion_passes
    from inferx_edge.targets import get_target

    tgt = resolve_tvm_target(get_target(target))
    with tgt:
        if target == "h200":
            fused = tvm.transform.Sequential(fusion_passes())(_gemm_add_pad())
        else:
            fused = cpu_pipeline(tgt)(_gemm_add_pad())
    names = _kernels(fused)
    assert any("matmul" in n and "add" in n for n in names), names  # the residual add stays in the epilogue
    assert not any("matmul" in n and "pad" in n for n in names), names


def test_the_padded_output_is_exact_with_a_dirty_output_buffer():
    """The x86 build's kernels run one after the other on outputs pre-filled with NaN: the border the
    pad adds holds zeros, the rest the GEMM + residual."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cpu.default_schedule import cpu_pipeline
    from inferx_edge.targets import get_target

    tgt = resolve_tvm_target(get_target("x86-cpu"))
    mod = _gemm_add_pad()
    lib = relax.build(mod, tgt, relax_pipeline=cpu_pipeline(tgt))
    vm = relax.VirtualMachine(lib, tvm.cpu())
    rng = np.random.default_rng(0)
    x, w, r = (rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 7, 7, 64), (64, 32), (1, 4, 7, 7, 32)))
    want = np.pad(x @ w + r, [(0, 0), (0, 0), (0, 1), (0, 1), (0, 0)])
    for _ in range(3):  # freed storage is reused: a border left unwritten shows what the last call left
        got = vm["main"](*(tvm.runtime.tensor(a) for a in (x, w, r))).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        x = x * -1.0
        r = r * -1.0
        want = np.pad(x @ w + r, [(0, 0), (0, 0), (0, 1), (0, 1), (0, 0)])
