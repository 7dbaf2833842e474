"""One fused attention kernel for CUDA (sm_80+): ``softmax(Q K^T * scale + bias) V`` without the score
matrix ever reaching memory (the online-softmax formulation of FlashAttention-2).

A block of four warps owns 64 query rows of one (batch x head); it walks the key/value sequence in tiles
of 64 (32 when a head is wider than 64). Each warp keeps its 16 query rows' Q fragments in registers,
computes its 16 x tile scores with ``mma.sync.m16n8k16`` (fp16 operands, fp32 accumulation; K is read
from shared memory with ``ldmatrix``), rescales its running row maximum and sum, and multiplies the
exponentiated scores straight from the accumulator registers (they are already in the A-operand layout)
with V (``ldmatrix.trans``). Rows and keys past the sequence ends are zero-filled and masked; a row whose
every score is -inf yields 0 rather than NaN.

The additive bias (relative position bias, attention masks) is read from global memory where a score
is formed, broadcast over any of its axes: :class:`Bias` maps a (batch x head) index, a query row and a
key column to its element, so a [heads, S, T] table or a [batch, 1, 1, T] mask is never expanded.

Q, K and V are read through :class:`Operand` index maps, straight from the tensor a projection wrote
(a float32 one saturated to fp16 as it loads). The kernel is generated per shape (every extent is a
compile-time constant) and marked scheduled, so the schedule rules leave it as written.

Checked off the device (its warp program in numpy against PTX's ``ldmatrix``/``mma``, its computation as
:mod:`~inferx_edge.compiler.cuda.attention_reference`) and on an H100 against numpy float64
(``benchmarks/gpu_attention.py``); CUDA fp16/int8/mixed builds use it unless
``CudaOptions.fused_attention`` is off (env ``INFERX_FUSED_ATTENTION=0``). See docs/zoo.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

#: widest head the kernel takes (shared memory: Q, K and V tiles of 64 x (128 + 8) halves would not fit)
MAX_HEAD_DIM = 128
WARPS = 4
ROWS = 16 * WARPS
_LOG2E = 1.4426950408889634
FP16_MAX = 65504.0


@dataclass(frozen=True)
class Bias:
    """An additive score bias: ``shape`` is ``view + [S or 1, T or 1]`` where ``view`` factors the
    flat (batch x head) axis of the kernel (row-major) and each of the bias's leading extents is either
    the view's extent or 1 (broadcast)."""

    shape: tuple[int, ...]
    view: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.view) + 2:
            raise ValueError(f"bias shape {self.shape} does not match the batch view {self.view} + [S, T]")
        for b, v in zip(self.shape, self.view, strict=False):
            if b not in (1, v):
                raise ValueError(f"bias shape {self.shape} does not broadcast over the batch view {self.view}")

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def offset(self, n, row, col, s: int, t: int):
        """The flat element index for (batch x head) ``n``, query ``row`` and key ``col`` (TIR expressions
        or ints; rows and columns past the ends read the last element instead)."""
        from tvm import tirx

        def lesser(x, y):
            return min(x, y) if isinstance(x, int) else tirx.min(x, y)

        strides = [math.prod(self.shape[i + 1 :]) for i in range(len(self.shape))]
        off = 0
        inner = math.prod(self.view)
        for i, extent in enumerate(self.view):
            inner //= extent
            if self.shape[i] != 1:
                off = off + n // inner % extent * strides[i]
        if self.shape[-2] != 1:
            off = off + lesser(row, s - 1) * strides[-2]
        if self.shape[-1] != 1:
            off = off + lesser(col, t - 1)
        return off


@dataclass(frozen=True)
class Operand:
    """Where the kernel reads Q, K or V: element ``[n, row, col]`` of the [batch x heads, tokens, width]
    operand is ``base[index(n, row, col)]``, so a transpose, head split or Q/K/V slice between the
    projection and the attention costs no kernel of its own. A float32 base is saturated to fp16's
    range as it is read. ``vector``: elements per load along ``col`` (8 fp16 or 4 fp32 where the base
    is contiguous and aligned along it, else 1); ``index`` takes ints, numpy arrays or TIR expressions."""

    shape: tuple[int, ...]
    dtype: str
    index: Callable
    vector: int = 8

    def load(self, buf, n, row, col):
        """The element as fp16, from a TIR buffer (the kernel) or a TE tensor (its twin)."""
        from tvm import te, tirx

        idx = list(self.index(n, row, col))
        x = buf(*idx) if isinstance(buf, te.Tensor) else tirx.BufferLoad(buf, idx)
        if self.dtype == "float16":
            return x
        hi = tirx.const(FP16_MAX, self.dtype)
        return tirx.Cast("float16", tirx.max(tirx.min(x, hi), -hi))


def contiguous(nb: int, length: int, width: int, dtype: str = "float16") -> Operand:
    """A [nb, length, width] tensor read as it is."""
    return Operand((nb, length, width), dtype, lambda n, r, c: (n, r, c), 8 if dtype == "float16" else 4)


@dataclass(frozen=True)
class Store:
    """How the kernel writes its output. ``heads`` > 1: as ``[nb // heads, s, heads, dv]`` (a multi-head
    block's heads side by side, the layout its output projection reads) instead of ``[nb, s, dv]``.
    ``scale``: int8 quantized, ``min(max(round(x * scale), lo), hi)``, as the int8 rewrite quantizes."""

    heads: int = 1
    scale: float | None = None
    lo: float = -127.0
    hi: float = 127.0

    def shape(self, nb: int, s: int, dv: int) -> tuple[int, ...]:
        return (nb // self.heads, s, self.heads, dv) if self.heads > 1 else (nb, s, dv)

    def index(self, n, row, col) -> list:
        return [n // self.heads, row, n % self.heads, col] if self.heads > 1 else [n, row, col]

    def value(self, x, out_dtype: str):
        """The stored element for the float32 result ``x`` (a TIR expression)."""
        from tvm import tirx

        if self.scale is not None:
            f32 = lambda c: tirx.const(c, "float32")  # noqa: E731
            x = tirx.min(tirx.max(tirx.round(x * f32(self.scale)), f32(self.lo)), f32(self.hi))
        return tirx.Cast(out_dtype, x)


# Fragment layouts of mma.sync.m16n8k16 (.row.col, fp16 in, fp32 accumulate) as the kernel addresses
# them; ints or TIR expressions. tests/compiler/cuda/test_attention_fragments.py runs the kernel's warp
# program in numpy through these same functions against PTX's definitions of ldmatrix and mma.


def a_rows(w, lane, ks, stride: int):
    """``ldmatrix.x4`` row address (in halves) of ``lane`` for warp ``w``'s 16 x 16 A tile (Q rows
    ``w*16..``, columns ``ks*16..``)."""
    return (w * 16 + lane % 16) * stride + ks * 16 + lane // 16 * 8


def b_rows(nt, lane, ks, stride: int):
    """``ldmatrix.x4`` row address of ``lane`` for two 8-key B tiles (K rows ``nt*16..``, reduction
    columns ``ks*16..``): registers 0-1 are n-tile ``2nt``, 2-3 n-tile ``2nt+1``."""
    return (nt * 16 + lane // 16 * 8 + lane % 8) * stride + ks * 16 + lane // 8 % 2 * 8


def bt_rows(ks, nd, lane, stride: int):
    """``ldmatrix.x4.trans`` row address of ``lane`` for two 8-column B tiles read from a row-major
    [reduction, n] tile (V rows ``ks*16..``, columns ``nd*16..``)."""
    return (ks * 16 + lane // 8 % 2 * 8 + lane % 8) * stride + nd * 16 + lane // 16 * 8


def tiles(d: int, dv: int) -> tuple[int, int, int]:
    """(key tile, shared row stride of Q/K, of V) in halves: 16 bytes of padding per row put the eight
    rows one ``ldmatrix`` reads on distinct banks."""
    return (64 if max(d, dv) <= 64 else 32), d + 8, dv + 8


def c_row(lane, e):
    """Row (of 16) of accumulator element ``e`` (0-3) held by ``lane``."""
    return lane // 4 + e // 2 * 8


def c_col(lane, e):
    """Column (of 8) of accumulator element ``e`` held by ``lane``."""
    return lane % 4 * 2 + e % 2


def supports(s: int, t: int, d: int, dv: int) -> str | None:
    """Why the kernel cannot take these extents (None: it can)."""
    if min(s, t) < 1:
        return f"empty sequence ({s} queries, {t} keys)"
    for name, x in (("query/key head", d), ("value head", dv)):
        if x % 16 or x > MAX_HEAD_DIM:
            return f"{name} width {x} is not a multiple of 16 up to {MAX_HEAD_DIM}"
    return None


def attention_kernel(
    nb: int,
    s: int,
    t: int,
    d: int,
    dv: int,
    scale: float,
    out_dtype: str,
    bias: Bias | None,
    operands: tuple[Operand, Operand, Operand] | None = None,
    store: Store | None = None,
):
    """The PrimFunc ``attention(q, k, v, bias, out[nb, s, dv])``: ``softmax(q k^T * scale + bias) v``
    per (batch x head) ``nb`` on fp16 tensor cores, ``out_dtype`` output. ``operands`` say where Q
    [nb, s, d], K [nb, t, d] and V [nb, t, dv] are read (default: fp16 tensors of those shapes); without
    ``bias`` its parameter is a 1-element tensor that is never read. ``store``: how ``out`` is laid out
    and quantized (:class:`Store`; default ``[nb, s, dv]`` as computed)."""
    from tvm.script import tirx as T

    qo, ko, vo = operands or (contiguous(nb, s, d), contiguous(nb, t, d), contiguous(nb, t, dv))
    store = store or Store()

    why = supports(s, t, d, dv)
    if why:
        raise ValueError(f"fused attention: {why}")
    bc, sq, sv = tiles(d, dv)
    n_q, n_kv = -(-s // ROWS), -(-t // bc)
    last = -(-(t - (n_kv - 1) * bc) // 16) * 16  # keys the last tile computes (16-key steps)
    c = scale * _LOG2E  # scores in the exp2 domain
    threads = 32 * WARPS
    neg_inf = T.float32("-inf")
    has_bias = bias is not None
    bshape = (bias.size,) if has_bias else (1,)
    bdtype = bias.dtype if has_bias else "float32"

    def bias_at(n, row, col):
        return bias.offset(n, row, col, s, t)

    @T.macro
    def load_tile(dst, stride, op, src, n, tx, rows, width, first, length):
        # rows first.. of sequence n's [length, width] operand into shared memory (zeros past its end),
        # 8 halves per thread tx and step
        for i in range(-(-rows * width // 8 // threads)):
            if i * threads + tx < rows * width // 8:
                r = T.meta_var((i * threads + tx) // (width // 8))
                cc = T.meta_var((i * threads + tx) % (width // 8) * 8)
                if first + r < length:
                    for e0 in T.unroll(8 // op.vector):
                        for e in T.vectorized(op.vector):
                            dst[r * stride + cc + e0 * op.vector + e] = op.load(
                                src, n, first + r, cc + e0 * op.vector + e
                            )
                else:
                    for e in T.vectorized(8):
                        dst[r * stride + cc + e] = T.float16(0)

    @T.macro
    def b_pair_mma(trans, smem, addr, a, a_off, b, acc_, tile):
        # two 8-column B tiles (ldmatrix.x4 at this lane's row address addr) times one 16 x 16 A
        # fragment (a[a_off:]) into accumulator tiles tile, tile + 1 of acc_
        T.evaluate(T.ptx_legacy.ldmatrix(trans, 4, ".b16", b.data, 0, smem.access_ptr("r"), addr, dtype="float16"))
        for h in T.unroll(2):
            T.evaluate(
                T.ptx_legacy.mma(
                    "m16n8k16", "row", "col", "fp16", "fp16", "fp32",
                    a.data, a_off, b.data, h * 4, acc_.data, (tile + h) * 4, False, dtype="float32",
                )
            )  # fmt: skip

    @T.macro
    def kv_step(j, nk, k, v, b_, k_s, v_s, qa, kb, pa, acc, o, m, ls, mx, al, n, tx, row0, w, lane, live):
        # keys j*bc .. j*bc + nk (nk <= bc, a multiple of 16: the last tile computes only the 16-key
        # steps that hold a key) into the running max, sum and output of the warp's 16 query rows
        T.tvm_storage_sync("shared")
        load_tile(k_s, sq, ko, k, n, tx, nk, d, j * bc, t)
        load_tile(v_s, sv, vo, v, n, tx, nk, dv, j * bc, t)
        T.tvm_storage_sync("shared")
        if live:
            for i in T.unroll(nk // 2):
                acc[i] = T.float32(0)
            for nt in T.unroll(nk // 16):
                for ks in T.unroll(d // 16):
                    b_pair_mma(False, k_s, b_rows(nt, lane, ks, sq), qa, ks * 8, kb, acc, nt * 2)
            for nt in T.unroll(nk // 8):
                for e in T.unroll(4):
                    col = T.meta_var(j * bc + nt * 8 + c_col(lane, e))
                    row = T.meta_var(row0 + w * 16 + c_row(lane, e))
                    if has_bias:
                        acc[nt * 4 + e] = acc[nt * 4 + e] * T.float32(c) + T.Cast(
                            "float32", b_[bias_at(n, row, col)]
                        ) * T.float32(_LOG2E)
                    else:
                        acc[nt * 4 + e] = acc[nt * 4 + e] * T.float32(c)
                    if col >= t:
                        acc[nt * 4 + e] = neg_inf
            for i in T.unroll(2):
                mx[i] = m[i]
            for nt in T.unroll(nk // 8):
                for e in T.unroll(4):
                    mx[e // 2] = T.max(mx[e // 2], acc[nt * 4 + e])
            for i in T.unroll(2):
                for sh in T.unroll(2):
                    mx[i] = T.max(mx[i], T.tvm_warp_shuffle_xor(T.tvm_warp_activemask(), mx[i], 1 << sh, 32, 32))
                # a row every score of which is -inf so far: shift by 0, its exps are 0
                al[i] = T.exp2(m[i] - T.if_then_else(mx[i] == neg_inf, T.float32(0), mx[i]))
                m[i] = mx[i]
                mx[i] = T.if_then_else(mx[i] == neg_inf, T.float32(0), mx[i])
                ls[i] = ls[i] * al[i]
            for nt in T.unroll(nk // 8):
                for e in T.unroll(4):
                    acc[nt * 4 + e] = T.exp2(acc[nt * 4 + e] - mx[e // 2])
                    ls[e // 2] = ls[e // 2] + acc[nt * 4 + e]
            for nd in T.unroll(dv // 8):
                for e in T.unroll(4):
                    o[nd * 4 + e] = o[nd * 4 + e] * al[e // 2]
            for ks in T.unroll(nk // 16):
                for e in T.unroll(8):
                    pa[e] = T.Cast("float16", acc[ks * 8 + e])
                for nd in T.unroll(dv // 16):
                    b_pair_mma(True, v_s, bt_rows(ks, nd, lane, sv), pa, 0, kb, o, nd * 2)

    @T.prim_func(private=True)
    def attention(
        q: T.Buffer(qo.shape, qo.dtype),
        k: T.Buffer(ko.shape, ko.dtype),
        v: T.Buffer(vo.shape, vo.dtype),
        b_: T.Buffer(bshape, bdtype),
        out: T.Buffer(store.shape(nb, s, dv), out_dtype),
    ):
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        bx = T.launch_thread("blockIdx.x", nb * n_q)
        tx = T.launch_thread("threadIdx.x", threads)
        q_s = T.alloc_buffer((ROWS * sq,), "float16", scope="shared")
        k_s = T.alloc_buffer((bc * sq,), "float16", scope="shared")
        v_s = T.alloc_buffer((bc * sv,), "float16", scope="shared")
        qa = T.alloc_buffer((d // 2,), "float16", scope="local")  # A fragments, 8 halves per 16-wide step
        kb = T.alloc_buffer((8,), "float16", scope="local")
        pa = T.alloc_buffer((8,), "float16", scope="local")
        acc = T.alloc_buffer((bc // 2,), "float32", scope="local")  # scores: 4 per 8-key tile
        o = T.alloc_buffer((dv // 2,), "float32", scope="local")
        m = T.alloc_buffer((2,), "float32", scope="local")  # running max of the thread's two rows
        ls = T.alloc_buffer((2,), "float32", scope="local")  # running sum (this thread's columns)
        mx = T.alloc_buffer((2,), "float32", scope="local")
        al = T.alloc_buffer((2,), "float32", scope="local")
        n = T.meta_var(bx // n_q)
        row0 = T.meta_var(bx % n_q * ROWS)
        w = T.meta_var(tx // 32)
        lane = T.meta_var(tx % 32)
        live = T.meta_var(row0 + w * 16 < s)  # the warp has a query row (warp-uniform)
        load_tile(q_s, sq, qo, q, n, tx, ROWS, d, row0, s)
        for i in T.unroll(2):
            m[i] = neg_inf
            ls[i] = T.float32(0)
        for i in T.unroll(dv // 2):
            o[i] = T.float32(0)
        T.tvm_storage_sync("shared")
        if live:
            for ks in T.unroll(d // 16):
                T.evaluate(
                    T.ptx_legacy.ldmatrix(
                        False, 4, ".b16", qa.data, ks * 8, q_s.access_ptr("r"),
                        a_rows(w, lane, ks, sq), dtype="float16",
                    )
                )  # fmt: skip
        for j in range(n_kv - 1):
            kv_step(j, bc, k, v, b_, k_s, v_s, qa, kb, pa, acc, o, m, ls, mx, al, n, tx, row0, w, lane, live)
        kv_step(n_kv - 1, last, k, v, b_, k_s, v_s, qa, kb, pa, acc, o, m, ls, mx, al, n, tx, row0, w, lane, live)
        if live:
            for i in T.unroll(2):
                for sh in T.unroll(2):
                    ls[i] = ls[i] + T.tvm_warp_shuffle_xor(T.tvm_warp_activemask(), ls[i], 1 << sh, 32, 32)
                ls[i] = T.if_then_else(ls[i] > T.float32(0), T.float32(1) / ls[i], T.float32(0))
            for nd in T.unroll(dv // 8):
                for e in T.unroll(4):
                    if row0 + w * 16 + c_row(lane, e) < s:
                        T.buffer_store(
                            out,
                            store.value(o[nd * 4 + e] * ls[e // 2], out_dtype),
                            store.index(n, row0 + w * 16 + c_row(lane, e), nd * 8 + c_col(lane, e)),
                        )

    return attention
