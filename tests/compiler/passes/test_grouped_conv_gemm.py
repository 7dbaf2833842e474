"""Grouped convolutions of CUDA fp16/int8 variants as batched fp16 GEMMs: same results, which convs."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize(
    "groups,cin,cout,taps,want",
    [
        (32, 4, 4, 9, None),  # ResNeXt's first stage: four groups per GEMM measured slower than the window kernel
        (32, 8, 8, 9, 2),
        (49, 16, 16, 9, 1),  # RegNet's group width
        (8, 8, 8, 1, 2),  # 1x1 grouped conv
        (3, 4, 4, 9, None),  # no divisor of 3 up to MAX_MERGE reaches 16 channels
        (64, 1, 1, 9, None),  # depthwise
        (32, 1, 2, 9, None),  # depthwise with a channel multiplier
        (16, 2, 2, 9, None),  # would need 8 groups merged
    ],
)
def test_merge_factor(groups, cin, cout, taps, want):
    from inferx_edge.compiler.passes.grouped_conv_gemm import merge_factor

    assert merge_factor(groups, cin, cout, taps) == want


def _conv_module(n, hw, cin, cout, groups, k, stride, padding, dilation, dtype, layout="NHWC"):
    from tvm import relax

    bb = relax.BlockBuilder()
    shape = [n, hw, hw, cin] if layout == "NHWC" else [n, cin, hw, hw]
    x = relax.Var("x", relax.TensorType(shape, dtype))
    wshape = [cout, k, k, cin // groups] if layout == "NHWC" else [cout, cin // groups, k, k]
    w = relax.Var("w", relax.TensorType(wshape, dtype))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(
                x, w, strides=stride, padding=padding, dilation=dilation, groups=groups, data_layout=layout,
                kernel_layout="OHWI" if layout == "NHWC" else "OIHW",
            )  # fmt: skip
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, args):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _kernels(mod) -> list[str]:
    import tvm

    return sorted(gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


CASES = [
    # n, hw, cin, cout, groups, k, stride, padding, dilation
    (2, 9, 32, 32, 2, 3, 1, 1, 1),  # groups of 16: one per GEMM batch entry
    (2, 10, 32, 32, 4, 3, 2, 1, 1),  # groups of 8, merged 2 to a GEMM, stride 2
    (1, 11, 24, 48, 3, 3, 1, (0, 1, 2, 1), 2),  # 8 in / 16 out per group, asymmetric pads, dilation 2
    (2, 6, 32, 32, 4, 1, 1, 0, 1),  # 1x1 grouped conv (groups of 8, merged 2)
]


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_int8_variant_grouped_conv_is_one_gemm_with_the_same_result(case):
    """float32 grouped convs (int8 variants keep them float) read fp16 operands, accumulate in fp32:
    within fp16 rounding of the unrewritten module, one GEMM kernel per conv."""
    from inferx_edge.compiler.passes import grouped_conv_gemm

    n, hw, cin, cout, groups, k, stride, padding, dilation = case
    mod = _conv_module(n, hw, cin, cout, groups, k, stride, padding, dilation, "float32")
    rewritten = grouped_conv_gemm(mod, saturate=True)
    assert _kernels(rewritten) == ["group_conv_gemm"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, hw, hw, cin)).astype(np.float32)
    w = (rng.standard_normal((cout, k, k, cin // groups)) / np.sqrt(k * k * cin / groups)).astype(np.float32)
    ref = _run(mod, [x, w])
    got = _run(rewritten, [x, w])
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=3e-3, atol=3e-3 * np.abs(ref).max())


def test_int8_variant_operands_saturate_to_fp16_range():
    """An activation beyond fp16's range is clamped to it, never inf."""
    from inferx_edge.compiler.passes import grouped_conv_gemm

    mod = _conv_module(1, 4, 32, 32, 2, 1, 1, 0, 1, "float32")
    x = np.zeros((1, 4, 4, 32), np.float32)
    x[0, 0, 0, 0] = 1e6
    w = np.zeros((32, 1, 1, 16), np.float32)
    w[0, 0, 0, 0] = 1.0
    got = _run(grouped_conv_gemm(mod, saturate=True), [x, w])
    assert np.isfinite(got).all() and got[0, 0, 0, 0] == pytest.approx(65504.0)


def test_fp16_variant_grouped_conv_keeps_its_dtype():
    from inferx_edge.compiler.passes import grouped_conv_gemm

    mod = _conv_module(2, 8, 32, 64, 4, 3, 1, 1, 1, "float16")
    rewritten = grouped_conv_gemm(mod, saturate=False)
    assert _kernels(rewritten) == ["group_conv_gemm"]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 8, 8, 32)).astype(np.float16)
    w = (rng.standard_normal((64, 3, 3, 8)) / 8).astype(np.float16)
    ref = _run(_conv_module(2, 8, 32, 64, 4, 3, 1, 1, 1, "float32"), [x.astype(np.float32), w.astype(np.float32)])
    got = _run(rewritten, [x, w])
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())


@pytest.mark.parametrize(
    "dtype,saturate,layout,groups,cin",
    [
        ("float32", True, "NHWC", 32, 32),  # depthwise: its own kernels
        ("float32", True, "NCHW", 2, 32),  # not a CUDA variant's layout
        ("float32", False, "NHWC", 2, 32),  # an fp16 variant's conv reads fp16; a float32 one is left alone
        ("float32", True, "NHWC", 1, 32),  # not grouped
    ],
)
def test_left_alone(dtype, saturate, layout, groups, cin):
    import tvm

    from inferx_edge.compiler.passes import grouped_conv_gemm

    mod = _conv_module(1, 6, cin, 32, groups, 3, 1, 1, 1, dtype, layout)
    tvm.ir.assert_structural_equal(grouped_conv_gemm(mod, saturate=saturate), mod)
