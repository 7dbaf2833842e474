"""The x86 integer int4 kernel against a numpy model of the same arithmetic (int8 activations per group
of 32, exact integer dot products, the group's scales in float), and against the float weights."""

from __future__ import annotations

import numpy as np
import pytest

from inferx_edge.llm import quant
from inferx_edge.llm.cpu_int_matmul import dot_lanes, q4_int_matmul

tvm = pytest.importorskip("tvm")


def _host_lanes() -> list[int]:
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    cpu = str(tvm.target.codegen.llvm_get_system_cpu())
    host = dot_lanes(tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": cpu}))
    return [lanes for lanes in (16, 8) if lanes <= host]


def _emulate(x, params, kind):
    """What the kernel computes, in float64: the activations rounded to int8 per group of 32."""
    m, k = x.shape
    g = x.reshape(m, k // 32, 32).astype(np.float32)
    amax = np.abs(g).max(axis=2)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    xq = np.rint(g * inv[..., None]).astype(np.float64)  # float32 product, ties to even: the kernel's rounding
    dx = amax.astype(np.float64) / 127.0
    xs = dx * xq.sum(axis=2)  # the rounded activations' sum (llama.cpp's Q8_1 "s")
    packed = params["q"]
    words = packed.transpose(0, 2, 1).reshape(-1, packed.shape[1])  # [out, in / 8]
    nib = np.stack([(words >> np.uint32(quant.kn_shift(j))) & np.uint32(15) for j in range(8)], axis=-1)
    q = nib.reshape(words.shape[0], k // 32, 32).astype(np.float64)  # [out, groups, 32]
    isum = np.einsum("mgr,ogr->mgo", xq, q)
    sc = params["scale"].astype(np.float64)  # [groups, out]
    if kind == "q4_1":
        return (isum * dx[..., None] * sc + xs[..., None] * params["minimum"]).sum(axis=1)
    return ((isum * dx[..., None] - 7 * xs[..., None]) * sc).sum(axis=1)


@pytest.mark.parametrize("kind", ["q4", "q4_1"])
@pytest.mark.parametrize("rows", [1, 3, 6])
@pytest.mark.parametrize("residual", [False, True])
def test_integer_kernel_matches_its_arithmetic(kind, rows, residual):
    lanes_list = _host_lanes()
    if not lanes_list:
        pytest.skip("this CPU has neither AVX2 nor AVX-512BW")
    rng = np.random.default_rng(rows)
    k, o = 96, 160  # 3 groups, 10 blocks of 16 outputs
    w = rng.standard_normal((o, k)).astype(np.float32)
    params = quant.quantize(w, kind, "float32", "kn")
    x = rng.standard_normal((rows, k)).astype(np.float32)
    x[0, :32] = 0  # an all-zero group: scale 0, no division by zero
    x[-1, 32:] = rng.integers(-100, 101, k - 32) * np.float32(0.37)  # int8-like rows: rounding ties
    res = rng.standard_normal((rows, o)).astype(np.float32)
    want = _emulate(x, params, kind) + (res if residual else 0)
    dense = x.astype(np.float64) @ quant.dequantize(params, kind, "kn").T + (res if residual else 0)
    for lanes in lanes_list:
        for decode in (True, False):
            func = q4_int_matmul(k, o, kind, lanes, decode, residual).with_attr("global_symbol", "main")
            mcpu = "x86-64-v4" if lanes == 16 else "x86-64-v3"
            lib = tvm.compile(func, target=tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
            dev = tvm.cpu()
            arrays = [x, params["q"], params["scale"]] + ([params["minimum"]] if kind == "q4_1" else [])
            arrays += [res] if residual else []
            args = [tvm.runtime.tensor(a, dev) for a in [*arrays, np.zeros((rows, o), np.float32)]]
            lib(*args)
            got = args[-1].numpy()
            np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max())
            # and within the int8 activation rounding of the float weights' product
            assert np.abs(got - dense).max() < 0.03 * np.abs(dense).max()


def test_kn_words_hold_four_consecutive_inputs_per_byte_mask():
    q = np.arange(16 * 8, dtype=np.uint32).reshape(16, 8) % 16  # 16 outputs x 8 inputs
    w = q.astype(np.float32)
    packed = quant.quantize(np.tile(w, (1, 4)), "q4_1", "float32", "kn")["q"]  # [1, 4, 16]
    word = int(packed[0, 0, 3])  # output 3, inputs 0..7
    low = [(word >> (8 * t)) & 15 for t in range(4)]
    high = [(word >> (8 * t + 4)) & 15 for t in range(4)]
    levels = np.rint((w[3] - w[3].min()) / ((w[3].max() - w[3].min()) / 15)).astype(int).tolist()
    assert low == levels[:4] and high == levels[4:]


def test_no_integer_path_off_x86():
    assert dot_lanes(tvm.target.Target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a78"})) == 0
    assert dot_lanes(tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64-v4"})) == 16
    assert dot_lanes(tvm.target.Target({"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "x86-64-v3"})) == 8
    with pytest.raises(ValueError, match="no integer int4 kernel"):
        q4_int_matmul(100, 160, "q4", 16, True, False)
