"""Weight schemes for LLM artifacts: dense, int8 per output channel, int4 in groups of 32.

``q4`` is the scheme MLC-LLM calls ``q4f{16,32}_1``: symmetric int4, one scale per 32 consecutive
input weights of an output row, eight 4-bit values packed little-end first into a ``uint32``; the
activations keep the artifact's dtype (fp16 on GPUs, fp32 on CPUs). ``q4_1`` adds a minimum per group
(``w = q * scale + min``, q in 0..15): llama.cpp's Q4_1, so a Q4_1 GGUF's blocks (32 inputs wide)
are reproduced exactly instead of being quantized a second time. ``int8`` keeps one scale per output
row. A matrix whose input width is not a multiple of the group falls back to ``int8``.

Two storage layouts of the same numbers: ``nt`` (``[out, in]``: GPU kernels reduce along contiguous
memory) and ``kn`` (``[in, out]``: CPU kernels keep vectors of outputs and read each weight row
contiguously). int4 words pack eight consecutive *inputs* of one output: ``nt`` ``[out, in/8]``, input
``k`` at bits ``4k``; ``kn`` in blocks of :data:`KN_BLOCK` outputs, ``[out/16, in/8, 16]``, input ``k``
at bits :func:`kn_shift` (byte ``t`` holds inputs ``t`` and ``t + 4``: one mask gives four consecutive
inputs as bytes, what :mod:`inferx_edge.llm.cpu_int_matmul`'s integer dot products read), so a CPU vector of outputs is one
contiguous load shifted by one amount for every lane, and the weights one output tile reads over the
whole reduction are a few contiguous streams (packed ``[in, out/8]`` every vector was a gather; packed
``[in/8, out]`` every tile walked the whole matrix in 384-byte pieces a row apart).
Quantization happens here in numpy on the
build host; dequantization is a TE expression inlined into the kernel that reads the weight.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from inferx_edge.errors import UsageError

GROUP = 32
LAYOUTS = ("nt", "kn")
#: outputs per contiguous block of CPU (``kn``) int4 weights: one AVX-512 vector, two AVX2 vectors
KN_BLOCK = 16
#: dtype of the ``kn`` int4 group scales and minima (GGUF's Q4_0/Q4_1 keep them in float16 too)
KN_SCALE = "float16"


@dataclasses.dataclass(frozen=True)
class Scheme:
    name: str
    kind: str  # dense | int8 | q4
    why: str


SCHEMES = {
    "fp32": Scheme("fp32", "dense", "reference: float32 weights and activations"),
    "fp16": Scheme("fp16", "dense", "float16 weights and activations: half the memory traffic"),
    "int8": Scheme("int8", "int8", "int8 weights, one scale per output channel: a quarter of fp32"),
    "q4": Scheme("q4", "q4", "int4 weights in groups of 32 with a scale each: about 1/7 of fp32"),
    "q4_1": Scheme("q4_1", "q4_1", "int4 in groups of 32 with a scale and a minimum each: Q4_1 GGUFs exactly"),
}


def get_scheme(name: str) -> Scheme:
    if name not in SCHEMES:
        raise UsageError(f"unknown LLM precision '{name}'; choose one of: {', '.join(SCHEMES)}")
    return SCHEMES[name]


def embedding_scheme(scheme: Scheme) -> Scheme:
    """The embedding table (and the tied vocabulary projection) of int4 artifacts is int8: it is the
    matrix the whole vocabulary's logits come from, and GGUFs keep it at 8 bits too (SmolLM2 Q4_1:
    Q8_0). In q4_1 it cost +3.3 % perplexity in int4 (19.28 -> 19.91 on a licence text)."""
    return SCHEMES["int8"] if scheme.kind in ("q4", "q4_1") else scheme


def effective_kind(scheme: Scheme, in_features: int, out_features: int | None = None, layout: str = "nt") -> str:
    blocks = layout == "kn" and (out_features or 0) % KN_BLOCK
    if scheme.kind in ("q4", "q4_1") and (in_features % GROUP or blocks):
        return "int8"
    return scheme.kind


def _shapes(kind: str, out: int, inn: int, layout: str) -> dict[str, tuple[tuple[int, ...], str | None]]:
    """Parameter name -> (shape, dtype; None: the activation dtype)."""
    if kind == "dense":
        return {"weight": ((out, inn) if layout == "nt" else (inn, out), None)}
    if kind == "int8":
        if layout == "nt":
            return {"q": ((out, inn), "int8"), "scale": ((out, 1), None)}
        blocked = (out // KN_BLOCK, inn, KN_BLOCK) if out % KN_BLOCK == 0 else (inn, out)
        return {"q": (blocked, "int8"), "scale": ((1, out), None)}
    if layout == "nt":
        shapes = {"q": ((out, inn // 8), "uint32"), "scale": ((out, inn // GROUP), None)}
    else:  # group scales (and minima) in float16 whatever the activations: a fifth of the bytes read
        shapes = {"q": ((out // KN_BLOCK, inn // 8, KN_BLOCK), "uint32"), "scale": ((inn // GROUP, out), KN_SCALE)}
    if kind == "q4_1":
        shapes["minimum"] = shapes["scale"]
    return shapes


def kn_int8(q, i, o):
    """The ``kn`` int8 weight of input ``i``, output ``o`` (blocked ``[out/16, in, 16]``, or ``[in, out]``
    when the outputs do not fill blocks)."""
    return q[o // KN_BLOCK, i, o % KN_BLOCK] if len(q.shape) == 3 else q[i, o]


def kn_shift(k):
    """The bit offset of input ``k`` (0..7, an int or a TIR expression) in a ``kn`` int4 word."""
    return (k % 4) * 8 + (k // 4) * 4


def kn_word(q, word: int, o):
    """The ``kn`` int4 word holding input ``8 * word``.. of output ``o``."""
    return q[o // KN_BLOCK, word, o % KN_BLOCK]


class WeightMatrix(nn.Module):
    """An ``[out, in]`` weight held in ``scheme`` and ``layout``, read as ``dtype``."""

    def __init__(self, out_features: int, in_features: int, scheme: Scheme, dtype: str, layout: str = "nt"):
        if layout not in LAYOUTS:
            raise UsageError(f"unknown weight layout '{layout}'; valid: {', '.join(LAYOUTS)}")
        self.out, self.inn, self.dtype, self.layout = out_features, in_features, dtype, layout
        #: int32 lanes of the x86 integer int4 kernel (:mod:`inferx_edge.llm.cpu_int_matmul`); 0: float kernels
        self.dot_lanes = 0
        self.kind = effective_kind(scheme, in_features, out_features, layout)
        for name, (shape, dt) in _shapes(self.kind, out_features, in_features, layout).items():
            setattr(self, name, nn.Parameter(shape, dt or dtype))

    def params(self) -> list[nn.Parameter]:
        if self.kind == "dense":
            return [self.weight]
        return [self.q, self.scale, self.minimum] if self.kind == "q4_1" else [self.q, self.scale]

    def element(self, params: list[te.Tensor]):
        """``(o, i) -> weight[o, i]`` in ``dtype`` as a TE expression over ``params``, so the
        dequantization is inlined into the kernel that reads the weight (one pass over the int4/int8
        data; a separate dequantize would write the whole float matrix every step)."""
        dtype, nt = self.dtype, self.layout == "nt"
        if self.kind == "dense":
            (w,) = params
            return (lambda o, i: w[o, i]) if nt else (lambda o, i: w[i, o])
        q, scale = params[:2]
        if self.kind == "int8":
            if nt:
                return lambda o, i: q[o, i].astype(dtype) * scale[o, 0]
            return lambda o, i: kn_int8(q, i, o).astype(dtype) * scale[0, o]

        def nibble(word, lane):
            shift = lane * 4 if nt else kn_shift(lane)
            return tirx.bitwise_and(tirx.shift_right(word, shift.astype("uint32")), tirx.const(15, "uint32"))

        if self.kind == "q4_1":
            mn = params[2]
            if nt:
                return lambda o, i: nibble(q[o, i // 8], i % 8).astype(dtype) * scale[o, i // GROUP] + mn[o, i // GROUP]
            return lambda o, i: (
                nibble(kn_word(q, i // 8, o), i % 8).astype(dtype) * scale[i // GROUP, o].astype(dtype)
                + mn[i // GROUP, o].astype(dtype)
            )
        seven = tirx.const(7, dtype)
        if nt:
            return lambda o, i: (nibble(q[o, i // 8], i % 8).astype(dtype) - seven) * scale[o, i // GROUP]
        return lambda o, i: (
            (nibble(kn_word(q, i // 8, o), i % 8).astype(dtype) - seven) * scale[i // GROUP, o].astype(dtype)
        )

    @property
    def integer_kernel(self) -> bool:
        """Whether :meth:`matmul_nt` takes the x86 integer int4 kernel (activations rounded to int8)."""
        return bool(self.dot_lanes) and self.layout == "kn" and self.kind in ("q4", "q4_1") and self.dtype == "float32"

    def matmul_nt(self, x: nn.Tensor, out_dtype: str | None = None, residual: nn.Tensor | None = None) -> nn.Tensor:
        """``x @ weight.T`` (``x``: ``[..., in]``), the weight dequantized inside the reduction
        (``+ residual``, same shape as the result, when given)."""
        out_dtype = out_dtype or self.dtype
        if self.integer_kernel and out_dtype == self.dtype:
            return self._int_dot(x, residual)
        out = self._matmul(x, out_dtype)
        return out if residual is None else out + residual

    def _int_dot(self, x: nn.Tensor, residual: nn.Tensor | None) -> nn.Tensor:
        from inferx_edge.llm.cpu_int_matmul import q4_int_matmul

        lead = list(x.shape[:-1])
        rows = lead[0]
        for d in lead[1:]:
            rows = rows * d
        decode = len(lead) >= 2 and isinstance(lead[-1], int) and lead[-1] == 1  # [batch, 1, in]: one token each
        func = q4_int_matmul(self.inn, self.out, self.kind, self.dot_lanes, decode, residual is not None, KN_SCALE)
        args = [op.reshape(x, (rows, self.inn)), *self.params()]
        if residual is not None:
            args.append(op.reshape(residual, (rows, self.out)))
        out = op.tensor_ir_op(
            func, f"matmul_kn_{self.kind}_int", args, nn.Tensor.placeholder((rows, self.out), self.dtype)
        )
        return op.reshape(out, (*lead, self.out))

    def _matmul(self, x: nn.Tensor, out_dtype: str) -> nn.Tensor:
        if self.layout == "kn" and self.kind in ("q4", "q4_1") and out_dtype == self.dtype:
            return op.tensor_expr_op(self._grouped_kn, f"matmul_kn_{self.kind}", [x, *self.params()])
        if self.layout == "kn" and self.kind == "int8":

            def scaled(x: te.Tensor, q: te.Tensor, scale: te.Tensor) -> te.Tensor:
                # the row scale once per output, after the reduction (not once per weight)
                k = te.reduce_axis((0, self.inn), name="k")
                acc = te.compute(
                    (*x.shape[:-1], self.out),
                    lambda *i: te.sum(x[(*i[:-1], k)] * kn_int8(q, k, i[-1]).astype(self.dtype), axis=k),
                    name="matmul_kn_int8",
                )
                return te.compute(acc.shape, lambda *i: (acc[i] * scale[0, i[-1]]).astype(out_dtype), name="row_scale")

            return op.tensor_expr_op(scaled, "matmul_kn_int8", [x, *self.params()])

        def compute(x: te.Tensor, *params: te.Tensor) -> te.Tensor:
            el = self.element(list(params))
            if self.layout == "nt" and self.kind != "dense":
                # GPUs: the dequantization as its own block, which dlight's GEMV / matmul rules inline
                # into theirs (dequantized inside the reduction expression, no rule matched: every
                # unfused int4 matmul ran the one-thread-per-output fallback, 36 us for SmolLM2's qkv)
                w = te.compute((self.out, self.inn), el, name="dequantize")
                el = lambda o, i: w[o, i]  # noqa: E731
            k = te.reduce_axis((0, self.inn), name="k")
            lead = list(x.shape[:-1])

            def body(*idx):
                prod = x[(*idx[:-1], k)] * el(idx[-1], k)
                return te.sum(prod.astype(out_dtype) if out_dtype != self.dtype else prod, axis=k)

            return te.compute((*lead, self.out), body, name=f"matmul_{self.layout}_{self.kind}")

        return op.tensor_expr_op(compute, f"matmul_{self.layout}_{self.kind}", [x, *self.params()])

    def _grouped_kn(self, x: te.Tensor, q: te.Tensor, scale: te.Tensor, mn: te.Tensor | None = None) -> te.Tensor:
        """CPU int4: per group of 32 inputs, the raw nibbles times the activations, then the group's scale
        (and minimum, times the group's activation sum) once per group:
        ``sum_g scale[g] * sum_r x[32g+r] * q[32g+r] (+ min[g] * sum_r x[32g+r])``, the same number as the
        element-wise form, with a vector of four instructions per 16 weights in the inner loop instead of
        six (:class:`~inferx_edge.llm.cpu_schedule.LLMMatmulCPU` keeps a tile's group sums in registers)."""
        dtype, lead, groups = self.dtype, list(x.shape[:-1]), self.inn // GROUP

        def nibble(word, lane):
            return tirx.bitwise_and(tirx.shift_right(word, kn_shift(lane).astype("uint32")), tirx.const(15, "uint32"))

        r = te.reduce_axis((0, GROUP), name="r")
        xsum = te.compute((*lead, groups), lambda *i: te.sum(x[(*i[:-1], i[-1] * GROUP + r)], axis=r), name="group_sum")
        r2 = te.reduce_axis((0, GROUP), name="r")
        part = te.compute(
            (*lead, groups, self.out),
            lambda *i: te.sum(
                x[(*i[:-2], i[-2] * GROUP + r2)]
                * nibble(kn_word(q, i[-2] * (GROUP // 8) + r2 // 8, i[-1]), r2 % 8).astype(dtype),
                axis=r2,
            ),
            name=f"matmul_kn_{self.kind}_groups",
        )
        g = te.reduce_axis((0, groups), name="g")
        seven = tirx.const(7, dtype)

        def term(*i):
            acc, xs = part[(*i[:-1], g, i[-1])], xsum[(*i[:-1], g)]
            sc = scale[g, i[-1]].astype(dtype)
            if mn is not None:
                return acc * sc + xs * mn[g, i[-1]].astype(dtype)
            return (acc - seven * xs) * sc

        return te.compute((*lead, self.out), lambda *i: te.sum(term(*i), axis=g), name=f"matmul_kn_{self.kind}")

    def take_rows(self, ids: nn.Tensor) -> nn.Tensor:
        """Rows ``ids`` (``[n]`` int32) of the weight, ``[n, in]`` in ``dtype`` (the embedding lookup)."""

        def compute(ids: te.Tensor, *params: te.Tensor) -> te.Tensor:
            el = self.element(list(params))
            return te.compute((ids.shape[0], self.inn), lambda n, i: el(ids[n], i), name=f"take_{self.kind}")

        return op.tensor_expr_op(compute, f"take_{self.kind}", [ids, *self.params()])


def _group_scale(scale: np.ndarray, dtype: str) -> np.ndarray:
    """Group scales in ``dtype``: 1 where a group is constant or its step underflows (its values are
    then its minimum / zero to within that step); an error where one overflows (float16: |w| > ~4e5)."""
    with np.errstate(over="ignore"):
        out = np.where(scale == 0, 1.0, scale).astype(dtype)
    if not np.isfinite(out).all():
        raise UsageError(
            f"int4 weights: a group's scale does not fit {dtype} (weights too large): use --precision int8"
        )
    return np.where(out == 0, np.array(1, dtype), out)


def quantize(w: np.ndarray, kind: str, dtype: str, layout: str = "nt") -> dict[str, np.ndarray]:
    """The parameter arrays of one :class:`WeightMatrix` (keys: its parameter names) for the
    float32 ``[out, in]`` matrix ``w``."""
    w = np.asarray(w, dtype=np.float32)
    out, inn = w.shape
    if kind == "dense":
        return {"weight": (w if layout == "nt" else w.T).astype(dtype)}
    if kind == "int8":
        scale = np.abs(w).max(axis=1, keepdims=True) / 127.0
        scale = np.where(scale == 0, 1.0, scale).astype(dtype)
        q = np.clip(np.rint(w / scale.astype(np.float32)), -127, 127).astype(np.int8)
        if layout == "nt":
            return {"q": q, "scale": scale}
        if out % KN_BLOCK == 0:  # [out/16, in, 16]
            return {
                "q": np.ascontiguousarray(q.reshape(out // KN_BLOCK, KN_BLOCK, inn).transpose(0, 2, 1)),
                "scale": scale.T.copy(),
            }
        return {"q": np.ascontiguousarray(q.T), "scale": scale.T.copy()}
    g = w.reshape(out, inn // GROUP, GROUP)
    extra = {}
    dtype = KN_SCALE if layout == "kn" else dtype  # the scales' dtype; the nibbles follow the rounded scales
    if kind == "q4_1":
        lo, hi = g.min(axis=2), g.max(axis=2)
        scale = _group_scale(np.where(hi > lo, (hi - lo) / 15.0, 1.0), dtype)
        minimum = lo.astype(dtype)
        if not np.isfinite(minimum).all():
            raise UsageError(f"int4 weights: a group minimum does not fit {dtype}: use --precision int8")
        q = np.rint((g - minimum.astype(np.float32)[..., None]) / scale.astype(np.float32)[..., None])
        q = np.clip(q, 0, 15).astype(np.uint32).reshape(out, inn)
        extra["minimum"] = minimum if layout == "nt" else np.ascontiguousarray(minimum.T)
    else:
        scale = _group_scale(np.abs(g).max(axis=2) / 7.0, dtype)
        q = np.clip(np.rint(g / scale.astype(np.float32)[..., None]) + 7, 0, 14).astype(np.uint32).reshape(out, inn)
    q = q.reshape(out, inn // 8, 8)  # eight consecutive inputs of one output per word (bits: above)
    packed = np.zeros((out, inn // 8), dtype=np.uint32)
    for k in range(8):
        packed |= q[..., k] << np.uint32(4 * k if layout == "nt" else kn_shift(k))
    if layout == "kn":  # [out/16, in/8, 16]
        blocks = packed.reshape(out // KN_BLOCK, KN_BLOCK, inn // 8).transpose(0, 2, 1)
        packed, scale = np.ascontiguousarray(blocks), np.ascontiguousarray(scale.T)
    return {"q": packed, "scale": scale, **extra}


def dequantize(params: dict[str, np.ndarray], kind: str, layout: str = "nt") -> np.ndarray:
    """The float32 ``[out, in]`` matrix back from :func:`quantize` (error reports, sensitivity)."""
    if kind == "dense":
        w = params["weight"].astype(np.float32)
    elif kind == "int8":
        q, scale = params["q"].astype(np.float32), params["scale"].astype(np.float32)
        if layout == "kn" and q.ndim == 3:  # blocked [out/16, in, 16]
            return q.transpose(0, 2, 1).reshape(-1, q.shape[1]) * scale.T
        w = q * scale
    else:
        q = params["q"]
        packed = q if layout == "nt" else q.transpose(0, 2, 1).reshape(-1, q.shape[1])  # [out, in / 8]
        shifts = [4 * k if layout == "nt" else kn_shift(k) for k in range(8)]
        nibbles = np.stack([(packed >> np.uint32(b)) & np.uint32(15) for b in shifts], axis=-1)
        q = nibbles.reshape(packed.shape[0], -1).astype(np.float32)
        scale = params["scale"] if layout == "nt" else params["scale"].T  # [out, in / GROUP]
        s = np.repeat(scale.astype(np.float32), GROUP, axis=1)
        if kind == "q4_1":
            minimum = params["minimum"] if layout == "nt" else params["minimum"].T
            w = q * s + np.repeat(minimum.astype(np.float32), GROUP, axis=1)
        else:
            w = (q - 7.0) * s
        return w
    return w if layout == "nt" else w.T
