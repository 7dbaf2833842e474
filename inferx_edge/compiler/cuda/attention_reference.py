"""The fused attention kernel's computation as a plain TE PrimFunc, which any target compiles."""

from __future__ import annotations

from inferx_edge.compiler.cuda.attention import Bias, Operand, Store, contiguous


def attention_reference(
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
    """:func:`attention_kernel`'s computation as a plain TE PrimFunc (same parameters, any target): fp16
    Q/K/V (saturated), fp32 scores, exponentials rounded to fp16 where they meet V, fp32 sums; a row
    whose scores are all -inf gives 0. What a CPU build of a CUDA variant runs in its place (the CUDA
    variants' numerics measured on real data without a GPU) and the check of the index maps."""
    from tvm import te, tirx

    qo, ko, vo = operands or (contiguous(nb, s, d), contiguous(nb, t, d), contiguous(nb, t, dv))
    q, k, v = (te.placeholder(o.shape, o.dtype, name) for o, name in ((qo, "q"), (ko, "k"), (vo, "v")))
    b_ = te.placeholder((bias.size,) if bias else (1,), "float32", "bias")

    def get(op, buf, n, r, c):
        return op.load(buf, n, r, c).astype("float32")

    rd = te.reduce_axis((0, d), "rd")
    qk = te.compute((nb, s, t), lambda n, i, j: te.sum(get(qo, q, n, i, rd) * get(ko, k, n, j, rd), axis=rd), name="qk")
    score = te.compute(
        (nb, s, t),
        lambda n, i, j: (
            qk[n, i, j] * tirx.const(scale, "float32")
            + (b_[bias.offset(n, i, j, s, t)] if bias else tirx.const(0, "float32"))
        ),
        name="score",
    )
    rj = te.reduce_axis((0, t), "rj")
    top = te.compute((nb, s), lambda n, i: te.max(score[n, i, rj], axis=rj), name="top")
    neg_inf = tirx.const(float("-inf"), "float32")
    shift = te.compute((nb, s), lambda n, i: tirx.if_then_else(top[n, i] == neg_inf, 0.0, top[n, i]), name="shift")
    p = te.compute((nb, s, t), lambda n, i, j: te.exp(score[n, i, j] - shift[n, i]), name="p")
    rs = te.reduce_axis((0, t), "rs")
    total = te.compute((nb, s), lambda n, i: te.sum(p[n, i, rs], axis=rs), name="total")
    ro = te.reduce_axis((0, t), "ro")
    o = te.compute(
        (nb, s, dv),
        lambda n, i, e: te.sum(p[n, i, ro].astype("float16").astype("float32") * get(vo, v, n, ro, e), axis=ro),
        name="o",
    )
    store = store or Store()

    def result(n, i, e):
        return store.value(tirx.if_then_else(total[n, i] > 0, o[n, i, e] / total[n, i], 0.0), out_dtype)

    if store.heads > 1:
        out = te.compute(store.shape(nb, s, dv), lambda b, i, h, e: result(b * store.heads + h, i, e), name="out")
    else:
        out = te.compute((nb, s, dv), result, name="out")
    return te.create_prim_func([q, k, v, b_, out]).without_attr("global_symbol")
