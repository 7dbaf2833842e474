"""Weight schemes for LLM artifacts: dense, int8 per output channel, int4 in groups of 32.

``q4`` is the scheme MLC-LLM calls ``q4f{16,32}_1``: symmetric int4, one scale per 32 consecutive
input weights of an output row, eight 4-bit values packed little-end first into a ``uint32``; the
activations keep the artifact's dtype (fp16 on GPUs, fp32 on CPUs). ``q4_1`` adds a minimum per group
(``w = q * scale + min``, q in 0..15): llama.cpp's Q4_1, so a Q4_1 GGUF's blocks (32 inputs wide)
are reproduced exactly instead of being quantized a second time. ``int8`` keeps one scale per output
row. A matrix whose input width is not a multiple of the group falls back to ``int8``.

Two storage layouts of the same numbers: ``nt`` (``[out, in]``: GPU kernels reduce along contiguous
memory) and ``kn`` (``[in, out]``: CPU kernels keep vectors of outputs and read each weight row
contiguously). int4 words always pack eight consecutive *inputs* of one output (``nt``: ``[out, in/8]``,
``kn``: ``[in/8, out]``), so a CPU vector of outputs is one contiguous load shifted by one amount for all
lanes; packed along the outputs, every vector was a gather (two words spread over sixteen lanes, a
shift per lane), which made the int4 matrix-vector products compute-bound. Quantization happens here in numpy on the
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
    if scheme.kind in ("q4", "q4_1") and in_features % GROUP:
        return "int8"
    return scheme.kind


def _shapes(kind: str, out: int, inn: int, layout: str) -> dict[str, tuple[tuple[int, ...], str | None]]:
    """Parameter name -> (shape, dtype; None: the activation dtype)."""
    if kind == "dense":
        return {"weight": ((out, inn) if layout == "nt" else (inn, out), None)}
    if kind == "int8":
        return {
            "q": ((out, inn) if layout == "nt" else (inn, out), "int8"),
            "scale": ((out, 1) if layout == "nt" else (1, out), None),
        }
    if layout == "nt":
        shapes = {"q": ((out, inn // 8), "uint32"), "scale": ((out, inn // GROUP), None)}
    else:
        shapes = {"q": ((inn // 8, out), "uint32"), "scale": ((inn // GROUP, out), None)}
    if kind == "q4_1":
        shapes["minimum"] = (shapes["scale"][0], None)
    return shapes


class WeightMatrix(nn.Module):
    """An ``[out, in]`` weight held in ``scheme`` and ``layout``, read as ``dtype``."""

    def __init__(self, out_features: int, in_features: int, scheme: Scheme, dtype: str, layout: str = "nt"):
        if layout not in LAYOUTS:
            raise UsageError(f"unknown weight layout '{layout}'; valid: {', '.join(LAYOUTS)}")
        self.out, self.inn, self.dtype, self.layout = out_features, in_features, dtype, layout
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
            return lambda o, i: q[i, o].astype(dtype) * scale[0, o]

        def nibble(word, lane):
            return tirx.bitwise_and(tirx.shift_right(word, (lane * 4).astype("uint32")), tirx.const(15, "uint32"))

        if self.kind == "q4_1":
            mn = params[2]
            if nt:
                return lambda o, i: nibble(q[o, i // 8], i % 8).astype(dtype) * scale[o, i // GROUP] + mn[o, i // GROUP]
            return lambda o, i: nibble(q[i // 8, o], i % 8).astype(dtype) * scale[i // GROUP, o] + mn[i // GROUP, o]
        seven = tirx.const(7, dtype)
        if nt:
            return lambda o, i: (nibble(q[o, i // 8], i % 8).astype(dtype) - seven) * scale[o, i // GROUP]
        return lambda o, i: (nibble(q[i // 8, o], i % 8).astype(dtype) - seven) * scale[i // GROUP, o]

    def matmul_nt(self, x: nn.Tensor, out_dtype: str | None = None) -> nn.Tensor:
        """``x @ weight.T`` (``x``: ``[..., in]``), the weight dequantized inside the reduction."""
        out_dtype = out_dtype or self.dtype

        def compute(x: te.Tensor, *params: te.Tensor) -> te.Tensor:
            el = self.element(list(params))
            k = te.reduce_axis((0, self.inn), name="k")
            lead = list(x.shape[:-1])

            def body(*idx):
                prod = x[(*idx[:-1], k)] * el(idx[-1], k)
                return te.sum(prod.astype(out_dtype) if out_dtype != self.dtype else prod, axis=k)

            return te.compute((*lead, self.out), body, name=f"matmul_{self.layout}_{self.kind}")

        return op.tensor_expr_op(compute, f"matmul_{self.layout}_{self.kind}", [x, *self.params()])

    def take_rows(self, ids: nn.Tensor) -> nn.Tensor:
        """Rows ``ids`` (``[n]`` int32) of the weight, ``[n, in]`` in ``dtype`` (the embedding lookup)."""

        def compute(ids: te.Tensor, *params: te.Tensor) -> te.Tensor:
            el = self.element(list(params))
            return te.compute((ids.shape[0], self.inn), lambda n, i: el(ids[n], i), name=f"take_{self.kind}")

        return op.tensor_expr_op(compute, f"take_{self.kind}", [ids, *self.params()])


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
        return {"q": q, "scale": scale} if layout == "nt" else {"q": np.ascontiguousarray(q.T), "scale": scale.T.copy()}
    g = w.reshape(out, inn // GROUP, GROUP)
    extra = {}
    if kind == "q4_1":
        lo, hi = g.min(axis=2), g.max(axis=2)
        scale = np.where(hi > lo, (hi - lo) / 15.0, 1.0).astype(dtype)
        minimum = lo.astype(dtype)
        q = np.rint((g - minimum.astype(np.float32)[..., None]) / scale.astype(np.float32)[..., None])
        q = np.clip(q, 0, 15).astype(np.uint32).reshape(out, inn)
        extra["minimum"] = minimum if layout == "nt" else np.ascontiguousarray(minimum.T)
    else:
        scale = np.abs(g).max(axis=2) / 7.0
        scale = np.where(scale == 0, 1.0, scale).astype(dtype)
        q = np.clip(np.rint(g / scale.astype(np.float32)[..., None]) + 7, 0, 14).astype(np.uint32).reshape(out, inn)
    q = q.reshape(out, inn // 8, 8)  # eight consecutive inputs of one output per word, first in the low bits
    packed = np.zeros((out, inn // 8), dtype=np.uint32)
    for k in range(8):
        packed |= q[..., k] << np.uint32(4 * k)
    if layout == "kn":
        packed, scale = np.ascontiguousarray(packed.T), np.ascontiguousarray(scale.T)
    return {"q": packed, "scale": scale, **extra}


def dequantize(params: dict[str, np.ndarray], kind: str, layout: str = "nt") -> np.ndarray:
    """The float32 ``[out, in]`` matrix back from :func:`quantize` (error reports, sensitivity)."""
    if kind == "dense":
        w = params["weight"].astype(np.float32)
    elif kind == "int8":
        w = params["q"].astype(np.float32) * params["scale"].astype(np.float32)
    else:
        packed = params["q"] if layout == "nt" else params["q"].T  # [out, in / 8]
        nibbles = np.stack([(packed >> np.uint32(4 * k)) & np.uint32(15) for k in range(8)], axis=-1)
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
