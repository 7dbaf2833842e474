"""x86 int4 matmul with int8 activations: integer dot products instead of dequantize-then-FMA.

The float kernel (:meth:`~inferx_edge.llm.quant.WeightMatrix._grouped_kn` under
:class:`~inferx_edge.llm.cpu_schedule.LLMMatmulCPU`) spends four vector instructions on every 16
weights (shift, mask, convert, FMA): on SmolLM2-135M it ran at ~9 GMAC/s per core, compute-bound far
below the memory's speed. This kernel does what llama.cpp does on x86: each row's activations are
quantized per group of 32 to int8 with one scale (plus the rounded group's sum), and a 16-output x 8-input
word of nibbles is multiplied with two ``pmaddubsw`` (u8 weights x s8 activations -> pairs summed
to int16), eight of which (a group) add up in int16 without overflow (8 x 2 x 15 x 127 = 30,480)
before one ``pmaddwd`` widens them to int32; the group's scale (times the activation scale) and
minimum (times the activation sum) are applied once per group in float:

    out[m, o] = sum_g  sc[g, o] * dx[m, g] * isum[m, g, o]  +  mn[g, o] * xs[m, g]        (q4_1)
    out[m, o] = sum_g  sc[g, o] * (dx[m, g] * isum[m, g, o] - 7 * xs[m, g])                (q4)

The weights are the ``kn`` words of :mod:`inferx_edge.llm.quant`, whose byte ``t`` holds inputs
``t`` (low nibble) and ``t + 4`` (high nibble): one mask gives four consecutive inputs per 32-bit lane,
a shift and the same mask the next four, as ``pmaddubsw`` pairs them with a broadcast word of four
int8 activations. ``xs`` is the sum of the *rounded* activations (``dx * sum(xq)``, llama.cpp's Q8_1
``s``), so the whole product is exactly ``sum(w * x_rounded)``: with the exact float sum instead, the
minimum term carried the rounding error without the nibble term's cancelling it (q in 0..15 is not
centred) and SmolLM2's perplexity rose 1.5 % (19.57); with the rounded sum the activation rounding
costs nothing measurable (see docs/llm.md).

One PrimFunc per weight shape: a parallel loop quantizes the rows, a second one runs tiles of
``rows x blocks`` (16 outputs per block) with the accumulators in registers; a row past the end of
the input (prefill tiles of four rows) computes on the last row and is not stored. AVX-512BW targets
use 512-bit vectors, AVX2 targets 256-bit; other CPUs keep the float kernel (:func:`dot_lanes` is 0).
"""

from __future__ import annotations

from tvm.script import tirx as T

GROUP = 32
BLOCK = 16  # outputs per kn block (quant.KN_BLOCK)
_MASK = 0x0F0F0F0F
#: (name of the 16-bit multiply-add, name of the 32-bit widening add) per vector width in int32 lanes
_INTRINSICS = {
    16: ("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
    8: ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
}


def dot_lanes(target) -> int:
    """int32 lanes of the integer dot product ``target`` compiles to: 16 (AVX-512BW), 8 (AVX2), or 0
    (no integer path: Arm, older x86)."""
    from tvm.target import codegen

    host = target.host or target
    if host.kind.name != "llvm" or not str(host.attrs.get("mtriple", "x86_64")).startswith(("x86_64", "i686")):
        return 0
    feats = {str(f) for f in codegen.llvm_get_cpu_features(host)}
    return 16 if {"avx512bw", "avx512f"} <= feats else 8 if "avx2" in feats else 0


def tile_shape(out_features: int, decode: bool) -> tuple[int, int]:
    """(rows, 16-output blocks) per tile: one row in decode (one token per sequence), four in prefill so a
    weight word read once serves four rows; as many blocks as divide the outputs and still leave at
    least eight tiles to share between threads (6 x 16 outputs measured fastest for a decode GEMV)."""
    blocks = out_features // BLOCK
    rows = 1 if decode else 4
    options = (6, 4, 3, 2, 1) if decode else (2, 1)
    return rows, next(v for v in options if blocks % v == 0 and (blocks // v >= 8 or v == 1))


def q4_int_matmul(
    in_features: int,
    out_features: int,
    kind: str,
    lanes: int,
    decode: bool,
    residual: bool,
    scale_dtype: str = "float16",
):
    """The PrimFunc ``(x [M, K] f32, q [O/16, K/8, 16] u32, scale [K/32, O], (minimum [K/32, O]) in ``scale_dtype``,
    (residual [M, O]), out [M, O] f32)`` for ``kind`` ``q4`` or ``q4_1``."""
    K, O = in_features, out_features  # noqa: E741 - the kernels' usual names
    if K % GROUP or O % BLOCK or kind not in ("q4", "q4_1") or lanes not in _INTRINSICS:
        raise ValueError(f"no integer int4 kernel for {K}x{O} {kind} with {lanes} lanes")
    G, W, NB = K // GROUP, K // 8, O // BLOCK
    R, VB = tile_shape(O, decode)
    NV = BLOCK // lanes  # vectors per block
    NACC = R * VB * NV
    BPT = NB // VB
    L16 = lanes * 2
    U8, I8, I16, I32, F32 = f"uint8x{lanes * 4}", f"int8x{lanes * 4}", f"int16x{L16}", f"int32x{lanes}", f"float32x{lanes}"  # fmt: skip
    MADDUBS, MADDWD = _INTRINSICS[lanes]
    q4_1 = kind == "q4_1"
    SC = scale_dtype

    @T.macro
    def body(x, w, sc, mn, res, out, M):
        with T.sblock("root"):
            xq = T.sblock_alloc_buffer((M, K // 4), "int32")
            dx = T.sblock_alloc_buffer((M, G), "float32")
            xs = T.sblock_alloc_buffer((M, G), "float32")
            for mg in T.parallel(M * G):
                with T.sblock("quantize"):
                    m: T.let[T.int64] = mg // G
                    g: T.let[T.int64] = mg % G
                    st = T.sblock_alloc_buffer((3,), "float32")  # max |x|, sum of the rounded x, 127 / max
                    q8 = T.sblock_alloc_buffer((GROUP,), "int8")
                    st[0] = T.float32(0)
                    for r in T.serial(GROUP):
                        st[0] = T.max(st[0], T.fabs(x[m, g * GROUP + r]))
                    st[2] = T.if_then_else(st[0] > T.float32(0), T.float32(127) / st[0], T.float32(0))
                    dx[m, g] = st[0] / T.float32(127)
                    for r in T.vectorized(GROUP):  # ties to even, as numpy and torch
                        q8[r] = T.Cast("int8", T.nearbyint(x[m, g * GROUP + r] * st[2]))
                    st[1] = T.float32(0)
                    for r in T.serial(GROUP):
                        st[1] = st[1] + T.Cast("float32", q8[r])
                    xs[m, g] = st[1] * dx[m, g]
                    xq[m, T.ramp(g * 8, 1, 8)] = T.reinterpret("int32x8", q8[T.ramp(0, 1, GROUP)])
            for t in T.parallel((M + R - 1) // R * BPT):
                with T.sblock("tile"):
                    m0: T.let[T.int64] = t // BPT * R
                    o0: T.let[T.int64] = t % BPT * (VB * BLOCK)
                    facc = T.sblock_alloc_buffer((NACC * lanes,), "float32")
                    iacc = T.sblock_alloc_buffer((NACC * L16,), "int16")
                    for i in T.unroll(NACC):
                        facc[T.ramp(i * lanes, 1, lanes)] = T.broadcast(T.float32(0), lanes)
                    for g in T.serial(G):
                        for i in T.unroll(NACC):
                            iacc[T.ramp(i * L16, 1, L16)] = T.broadcast(T.int16(0), L16)
                        for wi in T.unroll(GROUP // 8):
                            for v in T.unroll(VB * NV):
                                for r in T.unroll(R):
                                    iacc[T.ramp((r * VB * NV + v) * L16, 1, L16)] = (
                                        iacc[T.ramp((r * VB * NV + v) * L16, 1, L16)]
                                        + T.call_llvm_pure_intrin(
                                            I16,
                                            MADDUBS,
                                            T.reinterpret(
                                                U8,
                                                T.bitwise_and(
                                                    w[o0 // BLOCK + v // NV, g * 4 + wi, T.ramp(v % NV * lanes, 1, lanes)],
                                                    T.broadcast(T.uint32(_MASK), lanes),
                                                ),
                                            ),
                                            T.reinterpret(I8, T.broadcast(xq[T.min(m0 + r, M - 1), (g * 4 + wi) * 2], lanes)),
                                        )
                                        + T.call_llvm_pure_intrin(
                                            I16,
                                            MADDUBS,
                                            T.reinterpret(
                                                U8,
                                                T.bitwise_and(
                                                    T.shift_right(
                                                        w[o0 // BLOCK + v // NV, g * 4 + wi, T.ramp(v % NV * lanes, 1, lanes)],
                                                        T.broadcast(T.uint32(4), lanes),
                                                    ),
                                                    T.broadcast(T.uint32(_MASK), lanes),
                                                ),
                                            ),
                                            T.reinterpret(
                                                I8, T.broadcast(xq[T.min(m0 + r, M - 1), (g * 4 + wi) * 2 + 1], lanes)
                                            ),
                                        )
                                    )  # fmt: skip
                        for v in T.unroll(VB * NV):
                            for r in T.unroll(R):
                                if q4_1:
                                    facc[T.ramp((r * VB * NV + v) * lanes, 1, lanes)] = (
                                        facc[T.ramp((r * VB * NV + v) * lanes, 1, lanes)]
                                        + T.Cast(F32, T.call_llvm_pure_intrin(I32, MADDWD, iacc[T.ramp((r * VB * NV + v) * L16, 1, L16)], T.broadcast(T.int16(1), L16)))
                                        * (T.Cast(F32, sc[g, T.ramp(o0 + v * lanes, 1, lanes)]) * T.broadcast(dx[T.min(m0 + r, M - 1), g], lanes))
                                        + T.Cast(F32, mn[g, T.ramp(o0 + v * lanes, 1, lanes)]) * T.broadcast(xs[T.min(m0 + r, M - 1), g], lanes)
                                    )  # fmt: skip
                                else:
                                    facc[T.ramp((r * VB * NV + v) * lanes, 1, lanes)] = (
                                        facc[T.ramp((r * VB * NV + v) * lanes, 1, lanes)]
                                        + (
                                            T.Cast(F32, T.call_llvm_pure_intrin(I32, MADDWD, iacc[T.ramp((r * VB * NV + v) * L16, 1, L16)], T.broadcast(T.int16(1), L16)))
                                            * T.broadcast(dx[T.min(m0 + r, M - 1), g], lanes)
                                            - T.broadcast(xs[T.min(m0 + r, M - 1), g] * T.float32(7), lanes)
                                        )
                                        * T.Cast(F32, sc[g, T.ramp(o0 + v * lanes, 1, lanes)])
                                    )  # fmt: skip
                    for v in T.unroll(VB * NV):
                        for r in T.unroll(R):
                            if m0 + r < M:
                                if residual:
                                    out[m0 + r, T.ramp(o0 + v * lanes, 1, lanes)] = (
                                        facc[T.ramp((r * VB * NV + v) * lanes, 1, lanes)]
                                        + res[m0 + r, T.ramp(o0 + v * lanes, 1, lanes)]
                                    )
                                else:
                                    out[m0 + r, T.ramp(o0 + v * lanes, 1, lanes)] = facc[
                                        T.ramp((r * VB * NV + v) * lanes, 1, lanes)
                                    ]

    attrs = {"tirx.is_scheduled": True, "tirx.noalias": True}
    # one signature per (minimum?, residual?): TVMScript needs the parameters spelled out
    if q4_1 and residual:

        @T.prim_func(s_tir=True)
        def f(x_h: T.handle, w_h: T.handle, sc_h: T.handle, mn_h: T.handle, res_h: T.handle, out_h: T.handle):
            T.func_attr(attrs)
            M = T.int64()
            x, w = T.match_buffer(x_h, (M, K), "float32"), T.match_buffer(w_h, (NB, W, BLOCK), "uint32")
            sc, mn = T.match_buffer(sc_h, (G, O), SC), T.match_buffer(mn_h, (G, O), SC)
            res, out = T.match_buffer(res_h, (M, O), "float32"), T.match_buffer(out_h, (M, O), "float32")
            body(x, w, sc, mn, res, out, M)

    elif q4_1:

        @T.prim_func(s_tir=True)
        def f(x_h: T.handle, w_h: T.handle, sc_h: T.handle, mn_h: T.handle, out_h: T.handle):
            T.func_attr(attrs)
            M = T.int64()
            x, w = T.match_buffer(x_h, (M, K), "float32"), T.match_buffer(w_h, (NB, W, BLOCK), "uint32")
            sc, mn = T.match_buffer(sc_h, (G, O), SC), T.match_buffer(mn_h, (G, O), SC)
            out = T.match_buffer(out_h, (M, O), "float32")
            body(x, w, sc, mn, None, out, M)

    elif residual:

        @T.prim_func(s_tir=True)
        def f(x_h: T.handle, w_h: T.handle, sc_h: T.handle, res_h: T.handle, out_h: T.handle):
            T.func_attr(attrs)
            M = T.int64()
            x, w = T.match_buffer(x_h, (M, K), "float32"), T.match_buffer(w_h, (NB, W, BLOCK), "uint32")
            sc = T.match_buffer(sc_h, (G, O), SC)
            res, out = T.match_buffer(res_h, (M, O), "float32"), T.match_buffer(out_h, (M, O), "float32")
            body(x, w, sc, None, res, out, M)

    else:

        @T.prim_func(s_tir=True)
        def f(x_h: T.handle, w_h: T.handle, sc_h: T.handle, out_h: T.handle):
            T.func_attr(attrs)
            M = T.int64()
            x, w = T.match_buffer(x_h, (M, K), "float32"), T.match_buffer(w_h, (NB, W, BLOCK), "uint32")
            sc = T.match_buffer(sc_h, (G, O), SC)
            out = T.match_buffer(out_h, (M, O), "float32")
            body(x, w, sc, None, None, out, M)

    return f.without_attr("global_symbol")  # named by the module it joins (one per call site)
