"""The fused attention kernel's warp program run in numpy: the kernel's own fragment addressing
(``a_rows``, ``b_rows``, ``bt_rows``, ``c_row``/``c_col``, ``tiles``) fed to ``ldmatrix`` and
``mma.sync.m16n8k16`` as the PTX ISA defines them, the online softmax as the kernel does it, against
numpy float64 attention. What this cannot see (the CUDA TVM prints, shared-memory reuse, barriers) is
the GPU test's part (``tests/compiler/cuda/test_attention.py -m gpu``)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.gpu_attention import reference
from inferx_edge.compiler.cuda.attention import WARPS, a_rows, b_rows, bt_rows, c_col, c_row, tiles

LANES = np.arange(32)


def ldmatrix_x4(smem: np.ndarray, addrs, trans: bool) -> np.ndarray:
    """PTX ``ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16``: lanes 8i..8i+7 give the row addresses of
    matrix i; lane t gets register i = M_i[t/4][2(t%4) .. +1] (``.trans``: M_i[2(t%4) .. +1][t/4])."""
    regs = np.zeros((32, 8), np.float16)
    for i in range(4):
        m = np.stack([smem[addrs[8 * i + r] : addrs[8 * i + r] + 8] for r in range(8)])
        for t in range(32):
            c = 2 * (t % 4)
            regs[t, 2 * i : 2 * i + 2] = m[c : c + 2, t // 4] if trans else m[t // 4, c : c + 2]
    return regs


def mma_m16n8k16(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """PTX ``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``: lane t (g = t/4, q = t%4) holds
    A[g|g+8][2q|2q+8 ..+1] in a0..a7, B[2q|2q+8 ..+1][g] in b0..b3, C[g|g+8][2q ..+1] in c0..c3."""
    A, B = np.zeros((16, 16), np.float32), np.zeros((16, 8), np.float32)
    for t in range(32):
        g, q = t // 4, 2 * (t % 4)
        A[g, q : q + 2], A[g + 8, q : q + 2], A[g, q + 8 : q + 10], A[g + 8, q + 8 : q + 10] = a[t].reshape(4, 2)
        B[q : q + 2, g], B[q + 8 : q + 10, g] = b[t].reshape(2, 2)
    C = A @ B
    out = c.copy()
    for t in range(32):
        g, q = t // 4, 2 * (t % 4)
        out[t, 0:2] += C[g, q : q + 2]
        out[t, 2:4] += C[g + 8, q : q + 2]
    return out


def _tile(x: np.ndarray, start: int, rows: int, stride: int) -> np.ndarray:
    """Shared memory as the kernel fills it: ``rows`` rows from ``start`` (zeros past the end), padded."""
    smem = np.zeros(rows * stride, np.float16)
    for r in range(min(rows, len(x) - start)):
        smem[r * stride : r * stride + x.shape[1]] = x[start + r]
    return smem


def _quad(x: np.ndarray, op) -> np.ndarray:
    """The kernel's two xor-shuffles (1, 2): every lane ends with ``op`` over its four-lane quad."""
    return op(x.reshape(8, 4, *x.shape[1:]), axis=1).repeat(4, axis=0)


def simulate(q, k, v, scale: float, bias=None) -> np.ndarray:
    """One (batch x head) sequence through the kernel's program: every block of 64 query rows, every warp."""
    s, d = q.shape
    t, dv = v.shape
    bc, sq, sv = tiles(d, dv)
    c2 = np.float32(scale * np.log2(np.e))
    out = np.zeros((s, dv), np.float32)
    for row0 in range(0, s, 16 * WARPS):
        q_s = _tile(q, row0, 16 * WARPS, sq)
        for w in range(WARPS):
            if row0 + w * 16 >= s:
                continue
            qa = np.concatenate([ldmatrix_x4(q_s, a_rows(w, LANES, ks, sq), False) for ks in range(d // 16)], 1)
            m, ls = np.full((32, 2), -np.inf, np.float32), np.zeros((32, 2), np.float32)
            o = np.zeros((32, dv // 2), np.float32)
            for j in range(-(-t // bc)):
                k_s, v_s = _tile(k, j * bc, bc, sq), _tile(v, j * bc, bc, sv)
                acc = np.zeros((32, bc // 2), np.float32)
                for nt in range(bc // 16):
                    for ks in range(d // 16):
                        kb = ldmatrix_x4(k_s, b_rows(nt, LANES, ks, sq), False)
                        for h in range(2):
                            sl = slice((nt * 2 + h) * 4, (nt * 2 + h) * 4 + 4)
                            acc[:, sl] = mma_m16n8k16(qa[:, ks * 8 : ks * 8 + 8], kb[:, h * 4 : h * 4 + 4], acc[:, sl])
                for nt in range(bc // 8):
                    for e in range(4):
                        col, row = j * bc + nt * 8 + c_col(LANES, e), row0 + w * 16 + c_row(LANES, e)
                        x = acc[:, nt * 4 + e] * c2
                        if bias is not None:
                            x = x + bias[np.minimum(row, s - 1), np.minimum(col, t - 1)].astype(
                                np.float32
                            ) * np.float32(np.log2(np.e))
                        acc[:, nt * 4 + e] = np.where(col >= t, -np.inf, x)
                mx = np.maximum(m, np.stack([acc[:, e::4].max(1) for e in (0, 2)], 1))
                mx = np.maximum(mx, np.stack([acc[:, e::4].max(1) for e in (1, 3)], 1))
                mx = _quad(mx, np.max)
                shift = np.where(mx == -np.inf, 0, mx)
                with np.errstate(invalid="ignore"):
                    al = np.exp2(m - shift)
                m, ls = mx, ls * al
                for nt in range(bc // 8):
                    for e in range(4):
                        acc[:, nt * 4 + e] = np.exp2(acc[:, nt * 4 + e] - shift[:, e // 2])
                        ls[:, e // 2] += acc[:, nt * 4 + e]
                for e in range(4):
                    o[:, e::4] *= al[:, e // 2 : e // 2 + 1]
                for ks in range(bc // 16):
                    pa = acc[:, ks * 8 : ks * 8 + 8].astype(np.float16)
                    for nd in range(dv // 16):
                        vb = ldmatrix_x4(v_s, bt_rows(ks, nd, LANES, sv), True)
                        for h in range(2):
                            sl = slice((nd * 2 + h) * 4, (nd * 2 + h) * 4 + 4)
                            o[:, sl] = mma_m16n8k16(pa, vb[:, h * 4 : h * 4 + 4], o[:, sl])
            ls = _quad(ls, np.sum)
            inv = np.where(ls > 0, 1 / np.where(ls > 0, ls, 1), 0)
            for nd in range(dv // 8):
                for e in range(4):
                    rows = row0 + w * 16 + c_row(LANES, e)
                    ok = rows < s
                    out[rows[ok], nd * 8 + c_col(LANES, e)[ok]] = (o[:, nd * 4 + e] * inv[:, e // 2])[ok]
    return out


@pytest.mark.parametrize(
    "s,t,d,dv", [(37, 70, 32, 48), (16, 16, 16, 16), (70, 33, 64, 64), (20, 40, 128, 128)], ids=str
)
def test_the_kernels_warp_program_computes_attention(s, t, d, dv):
    rng = np.random.default_rng(s + t)
    q, k, v = (rng.standard_normal(shape).astype(np.float16) for shape in ((s, d), (t, d), (t, dv)))
    bias = rng.standard_normal((s, t)) * 2
    got = simulate(q, k, v, d**-0.5, bias)
    want = reference(q[None], k[None], v[None], d**-0.5, bias[None])[0]
    assert np.abs(got - want).max() <= 2e-3 * max(1.0, np.abs(want).max())


def test_a_row_masked_everywhere_gives_zeros_in_the_warp_program():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((20, 16)).astype(np.float16) for _ in range(3))
    bias = np.zeros((20, 20))
    bias[5] = -np.inf
    got = simulate(q, k, v, 0.25, bias)
    assert np.all(got[5] == 0) and np.isfinite(got).all()
