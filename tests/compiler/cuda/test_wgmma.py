"""The wgmma int8 dense-layer rewrite (compiler/cuda/wgmma_epilogue.py, rules/wgmma_matmul.py): which
kernels it takes, that the fused epilogue it evaluates on the accumulator computes what the kernel
computed (a plain-loop body in place of the wgmma main loop, run on this CPU against the fused kernel
as FuseOps made it), and that sm_90a builds compile it. The wgmma main loop itself only runs on an
sm_90 GPU (benchmarks/gpu_wgmma_gemm.py checks it exactly against cuBLASLt there)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import needs_nvrtc

D, H, ROWS = 128, 256, (2, 24)  # 48 rows: fewer than one 128-row tile


def _mlp(tmp_path):
    """LayerNorm -> dense + GELU -> dense + residual, as an ONNX file, and its input shape."""
    rng = np.random.default_rng(3)

    def w(name, *shape, scale=0.2):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["n"], axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["n", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h"]),
        helper.make_node("Erf", ["h"], ["he"]),
        helper.make_node("Mul", ["h", "he"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "w2"], ["o"]),
        helper.make_node("Add", ["o", "x"], ["y"]),
    ]
    inits = [w("g", D, scale=1.0), w("b", D), w("w1", D, H), w("b1", H), w("w2", H, D)]
    shape = (*ROWS, D)
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "mlp.onnx"
    path.write_bytes(model.SerializeToString())
    return path, shape


def _int8_module(tmp_path, target="h200"):
    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target
    from tests.compiler.test_zoo_blocks import block_quantizer

    path, shape = _mlp(tmp_path)
    imported = import_model(path, {})
    quantize = block_quantizer(tmp_path, path, imported, shape)
    spec = get_target(target)
    tvm_target = resolve_tvm_target(spec)
    mod = prepare_variant(imported, variant_layout(spec, "int8"), quantize=quantize, target=tvm_target).mod
    return spec, tvm_target, mod


def _dense_kernels(mod):
    import tvm

    from inferx_edge.compiler.cuda.pipeline import fusion_passes

    fused = tvm.transform.Sequential(fusion_passes())(mod)
    return {
        gv.name_hint: f
        for gv, f in fused.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc) and "NT_matmul" in gv.name_hint
    }


def test_the_rewritten_epilogue_computes_what_the_fused_kernel_computed(tmp_path):
    """Both dense kernels of an int8 MLP (requantize + bias + erf GELU + requantize to int8; requantize
    + bias + residual to float32) are taken; with a plain-loop GEMM in place of wgmma's the rewritten
    kernel's outputs equal the original kernel's, on seeded random inputs."""
    import tvm

    from inferx_edge.compiler.cuda.wgmma_epilogue import loop_body, wgmma_kernel_for

    _, _, mod = _int8_module(tmp_path)
    kernels = _dense_kernels(mod)
    assert len(kernels) == 2, sorted(kernels)
    rng = np.random.default_rng(0)
    for name, func in kernels.items():
        rewritten, why = wgmma_kernel_for(func, body=loop_body)
        assert rewritten is not None, (name, why)
        args = []
        for p in func.params:
            shape = [int(d) for d in p.shape]
            dtype = str(p.dtype)
            if dtype == "int8":
                args.append(rng.integers(-127, 128, shape).astype(np.int8))
            else:
                args.append(rng.standard_normal(shape).astype(dtype))
        outs = []
        for f in (func, rewritten.without_attr("tirx.is_scheduled")):
            lib = tvm.compile(tvm.IRModule({"main": f.with_attr("global_symbol", "main")}), target="llvm")
            tensors = [tvm.runtime.tensor(x) for x in args]
            lib["main"](*tensors)
            outs.append(tensors[-1].numpy())
        assert outs[0].dtype == outs[1].dtype
        np.testing.assert_array_equal(outs[1], outs[0], err_msg=name)


def test_pipeline_and_layout_options_compile_and_are_checked():
    """One group in flight needs a stage more; a swizzle must be as wide as a stage's rows; tile specs
    parse and print back; every valid combination generates a kernel for sm_90a (compiled in the sm_90a
    build test's pipeline)."""
    from inferx_edge.compiler.cuda.wgmma import GemmShape, gemm_kernel, parse_tile, tile_label

    with pytest.raises(ValueError, match="need at least 3 stages"):
        GemmShape(256, 256, 128, stages=2, inflight=1)
    with pytest.raises(ValueError, match="valid are 0 and the stage depth 64"):
        GemmShape(256, 256, 128, swizzle=128)
    with pytest.raises(ValueError, match="valid are 64, 128"):
        GemmShape(256, 256, 128, bk=32)
    with pytest.raises(ValueError, match="K=192 is not a multiple of the stage depth 128"):
        GemmShape(256, 256, 192, bk=128)
    with pytest.raises(ValueError, match="unknown flag 'sw32'"):
        parse_tile("128:4:sw32")
    with pytest.raises(ValueError, match="expected BN:STAGES"):
        parse_tile("128")
    for spec in ("128:4:k64", "256:3:i1:k128:sw128", "128:5:i1:k64:sw64:nf:ds"):
        assert tile_label(GemmShape(256, 256, 256, **parse_tile(spec))) == spec
    fenced, unfenced = (gemm_kernel(GemmShape(256, 256, 256, **parse_tile(t))).script() for t in ("128:4", "128:4:nf"))
    assert '"proxy", "async"' in fenced and '"proxy", "async"' not in unfenced
    for bk, swizzles in ((64, (0, 64)), (128, (0, 128))):
        for inflight in (0, 1):
            for swizzle in swizzles:
                for stage_out in (True, False):
                    shape = GemmShape(
                        200, 256, 256, bn=256, stages=3, inflight=inflight, swizzle=swizzle, bk=bk, stage_out=stage_out
                    )
                    script = gemm_kernel(shape).script()
                    assert '"wait_group", "sync", "aligned"' in script and "wgmma" in script
                    assert ("staged" in script) == stage_out


def test_kernels_it_does_not_take_say_why(tmp_path):
    """A GEMM whose N is no multiple of the 128-wide tile, and a kernel with no int8 GEMM, are refused
    with the reason."""
    from tvm import te

    from inferx_edge.compiler.cuda.wgmma_epilogue import wgmma_kernel_for

    a = te.placeholder((64, 128), "int8", name="a")
    b = te.placeholder((96, 128), "int8", name="b")
    k = te.reduce_axis((0, 128), name="k")
    c = te.compute((64, 96), lambda i, j: te.sum(a[i, k].astype("int32") * b[j, k].astype("int32"), axis=k))
    kernel, why = wgmma_kernel_for(te.create_prim_func([a, b, c]))
    assert kernel is None and "N=96" in why
    x = te.placeholder((64, 128), "float32", name="x")
    y = te.compute((64, 128), lambda i, j: x[i, j] * 2)
    kernel, why = wgmma_kernel_for(te.create_prim_func([x, y]))
    assert kernel is None and why
    bt = te.placeholder((128, 128), "int8", name="bt")  # [K, N]: not K-major
    c = te.compute((64, 128), lambda i, j: te.sum(a[i, k].astype("int32") * bt[k, j].astype("int32"), axis=k))
    kernel, why = wgmma_kernel_for(te.create_prim_func([a, bt, c]))
    assert kernel is None and why


@needs_nvrtc
@pytest.mark.parametrize("on", [True, False])
def test_sm90a_builds_run_int8_dense_layers_on_wgmma_when_on(tmp_path, monkeypatch, on):
    """An int8 build for the H200 compiles with the dense layers on wgmma (their epilogue in the same
    kernel) when CudaOptions.wgmma is on and the GEMMs have an output tile per SM (a one-SM spec here:
    the test's GEMMs are small); on mma.sync when off or with the H200's 132 SMs (two tiles would
    leave 130 idle); other archs never get it."""
    import dataclasses

    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import pass_config, relax_pipeline
    from inferx_edge.compiler.cuda import device_compiler
    from inferx_edge.compiler.guarded_schedule import SCHEDULE_RULE_ATTR

    monkeypatch.setenv("INFERX_WGMMA", "1" if on else "0")
    cases = [("h200", 1), ("h200", None), ("a100", 1)] if on else [("h200", 1)]
    for target, sms in cases:
        spec, tvm_target, mod = _int8_module(tmp_path, target)
        spec = dataclasses.replace(spec, sm_count=sms or spec.sm_count)
        with device_compiler(spec, "cubin") as record, tvm_target, pass_config(async_copy=True):
            scheduled = relax_pipeline(spec, tvm_target)(mod)
            relax.build(mod, tvm_target, relax_pipeline=relax_pipeline(spec, tvm_target))
        assert record["kernels_modules"]
        rules = {
            gv.name_hint: f.attrs[SCHEDULE_RULE_ATTR]
            for gv, f in scheduled.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and "NT_matmul" in gv.name_hint
        }
        assert len(rules) == 2
        want = "WgmmaInt8Matmul" if on and target == "h200" and sms == 1 else "Int8SafeMatmul"
        assert set(rules.values()) == {want}, (target, sms, rules)


def _smem_operand(smem, start, rows, sbo, swizzle):
    """The ``rows x 32``-byte K-major operand of one wgmma instruction as PTX reads it from shared
    memory through a descriptor. No swizzle: element (r, b) at start + (r // 8) SBO + (b // 16) LBO +
    (r % 8) 16 + b % 16, LBO = one core matrix (128 bytes). Swizzled (S = 64 or 128 bytes): at start +
    (r // 8) SBO + (r % 8) S + b, with address bits 7-8 (S = 64) or 7-9 (S = 128) XORed into bits 4-5 or
    4-6 (the atom 8 S-byte aligned)."""
    from inferx_edge.compiler.cuda.wgmma import CORE

    r, b = np.meshgrid(np.arange(rows), np.arange(32), indexing="ij")
    if swizzle:
        addr = start + r // 8 * sbo + r % 8 * swizzle + b
        mask = swizzle // 16 - 1
        return smem[addr ^ ((addr >> 7) & mask) << 4]
    return smem[start + r // 8 * sbo + b // 16 * CORE + r % 8 * 16 + b % 16]


@pytest.mark.parametrize(
    "bn, bk, swizzle", [(128, 64, 0), (256, 64, 0), (128, 64, 64), (256, 64, 64), (128, 128, 0), (256, 128, 128)]
)
def test_the_warp_program_computes_one_tile(bn, bk, swizzle):
    """One block's stage, emulated in numpy: the kernel's cp.async placement of each 16-byte chunk
    (core_offset), the descriptor start of each instruction (operand_start), wgmma's read of K-major
    operands (as the PTX ISA describes it, with and without the 64- and 128-byte swizzles) and its accumulator
    fragment (acc_row / acc_col) put back the tile of A @ B^T. (No swizzle was also checked exactly on
    an H100 with 64-byte stages: gpu_wgmma_gemm_s72.)"""
    from inferx_edge.compiler.cuda import wgmma as W

    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (W.BM, bk)).astype(np.int64)
    b = rng.integers(-128, 128, (bn, bk)).astype(np.int64)
    chunks = bk // 16
    sbo = chunks * W.CORE
    smem = np.zeros((W.BM + bn) * bk, np.int64)
    for tile, base, rows in ((a, 0, W.BM), (b, W.BM * bk, bn)):
        for chunk in range(rows * chunks):  # every thread's chunks, in any order
            r, c = divmod(chunk, chunks)
            off = base + W.core_offset(r, c, sbo, swizzle)
            smem[off : off + 16] = tile[r, c * 16 : c * 16 + 16]
    regs = W.INSTR_N // 2
    acc = np.zeros((W.THREADS, bn // W.INSTR_N * regs), np.int64)
    for wg in range(W.WARPGROUPS):
        for kk in range(bk // 32):
            op_a = _smem_operand(smem, W.operand_start(wg, kk, sbo, swizzle), 64, sbo, swizzle)
            for j in range(bn // W.INSTR_N):
                start = W.BM * bk + W.operand_start(j * 2, kk, sbo, swizzle)
                op_b = _smem_operand(smem, start, W.INSTR_N, sbo, swizzle)
                d = op_a @ op_b.T  # the instruction's 64 x 128 product
                for t in range(128):
                    w, lane = divmod(t, 32)
                    for i in range(regs):
                        acc[wg * 128 + t, j * regs + i] += d[W.acc_row(w, lane, i), W.acc_col(lane, i)]
    got = np.full((W.BM, bn), -1 << 40, np.int64)
    for tx in range(W.THREADS):
        wg, w, lane = tx // 128, tx % 128 // 32, tx % 32
        for j in range(bn // W.INSTR_N):
            for i in range(regs):
                got[wg * 64 + W.acc_row(w, lane, i), j * W.INSTR_N + W.acc_col(lane, i)] = acc[tx, j * regs + i]
    np.testing.assert_array_equal(got, a @ b.T)
    # the staged epilogue: fragments into padded shared rows, read back by consecutive threads along N
    ld = bn + W.PAD
    staged = np.full(W.BM * ld, -1 << 40, np.int64)
    for tx in range(W.THREADS):
        wg, w, lane = tx // 128, tx % 128 // 32, tx % 32
        for j in range(bn // W.INSTR_N):
            for i in range(regs):
                staged[(wg * 64 + W.acc_row(w, lane, i)) * ld + j * W.INSTR_N + W.acc_col(lane, i)] = acc[
                    tx, j * regs + i
                ]
    flat = np.arange(W.BM * bn)
    np.testing.assert_array_equal(staged[flat // bn * ld + flat % bn].reshape(W.BM, bn), a @ b.T)


def test_the_tile_search_leaves_kernels_wgmma_takes(tmp_path, monkeypatch):
    """With wgmma on for sm_90a, both dense kernels are the rule's (a searched tile would be ignored);
    off, for another arch or on a GPU with more SMs than they have output tiles, they are the tile
    search's."""
    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda.rules.wgmma_matmul import wgmma_takes
    from inferx_edge.targets import get_target

    _, _, mod = _int8_module(tmp_path)
    kernels = _dense_kernels(mod)
    h200, a100 = (resolve_tvm_target(get_target(t)) for t in ("h200", "a100"))
    monkeypatch.setenv("INFERX_WGMMA", "1")
    assert all(wgmma_takes(f, h200) for f in kernels.values())
    assert not any(wgmma_takes(f, h200, sm_count=132) for f in kernels.values())  # 1-2 tiles, 132 SMs
    assert not any(wgmma_takes(f, a100) for f in kernels.values())
    monkeypatch.setenv("INFERX_WGMMA", "0")
    assert not any(wgmma_takes(f, h200) for f in kernels.values())


def test_the_wgmma_tile_comes_from_the_environment(tmp_path, monkeypatch):
    """INFERX_WGMMA_TILE replaces the rule's tile (one wgmma group left in flight gives another kernel
    than the default tile, which waits for all); a malformed spelling is a BuildError naming the variable and the valid flags."""
    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda.device_compiler import CudaOptions
    from inferx_edge.compiler.cuda.rules.wgmma_matmul import TILE, wgmma_kernel
    from inferx_edge.errors import BuildError
    from inferx_edge.targets import get_target

    _, _, mod = _int8_module(tmp_path)
    func = next(iter(_dense_kernels(mod).values()))
    h200 = resolve_tvm_target(get_target("h200"))
    monkeypatch.setenv("INFERX_WGMMA", "1")
    default = wgmma_kernel(func, h200).script()
    monkeypatch.setenv("INFERX_WGMMA_TILE", TILE)
    assert wgmma_kernel(func, h200).script() == default
    monkeypatch.setenv("INFERX_WGMMA_TILE", "128:3:i1:k128:sw128")
    assert wgmma_kernel(func, h200).script() != default
    with pytest.raises(BuildError, match=r"INFERX_WGMMA_TILE.*valid: i1, k64"):
        CudaOptions.from_env({"INFERX_WGMMA_TILE": "128:3:bogus"})


def test_the_epilogue_check_runs_every_kernel_the_rewrite_takes(tmp_path):
    """schedule_check.check_wgmma_epilogues (kernel_profile --check-schedules for sm_90a): both dense
    kernels of the int8 MLP checked against their fused form on this CPU, equal; a kernel over the
    size limit is named and skipped."""
    import tvm

    from inferx_edge.compiler.cuda.pipeline import fusion_passes
    from inferx_edge.compiler.schedule_check import check_wgmma_epilogues

    _, _, mod = _int8_module(tmp_path)
    fused = tvm.transform.Sequential(fusion_passes())(mod)
    rows = list(check_wgmma_epilogues(fused))
    assert len(rows) == 2 and all(diff == 0.0 and why is None for _, diff, why in rows), rows
    assert all(diff is None and "over" in why for _, diff, why in check_wgmma_epilogues(fused, max_macs=1000))
