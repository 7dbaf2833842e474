"""Weight schemes for LLM artifacts: dense, int8 per output channel, int4 in groups of 32.

``q4`` is the scheme MLC-LLM calls ``q4f{16,32}_1``: symmetric int4, one scale per 32 consecutive
input weights of a row, eight values packed little-end first into a ``uint32``; the activations keep
the artifact's dtype (fp16 on GPUs, fp32 on CPUs). ``int8`` keeps one scale per output row. A matrix
whose input width is not a multiple of the group falls back to ``int8`` (recorded in the manifest).
Quantization happens here in numpy on the build host; dequantization is a TE expression the model
fuses into the kernel that reads the weight.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from tvm import te, tirx
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from inferx_edge.errors import UsageError

GROUP = 32


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
}


def get_scheme(name: str) -> Scheme:
    if name not in SCHEMES:
        raise UsageError(f"unknown LLM precision '{name}'; choose one of: {', '.join(SCHEMES)}")
    return SCHEMES[name]


def effective_kind(scheme: Scheme, in_features: int) -> str:
    if scheme.kind == "q4" and in_features % GROUP:
        return "int8"
    return scheme.kind


class WeightMatrix(nn.Module):
    """An ``[out, in]`` weight held in ``scheme``; :meth:`dequantize` yields it in ``dtype``."""

    def __init__(self, out_features: int, in_features: int, scheme: Scheme, dtype: str):
        self.out, self.inn, self.dtype = out_features, in_features, dtype
        self.kind = effective_kind(scheme, in_features)
        if self.kind == "dense":
            self.weight = nn.Parameter((out_features, in_features), dtype)
        elif self.kind == "int8":
            self.q = nn.Parameter((out_features, in_features), "int8")
            self.scale = nn.Parameter((out_features, 1), dtype)
        else:
            self.q = nn.Parameter((out_features, in_features // 8), "uint32")
            self.scale = nn.Parameter((out_features, in_features // GROUP), dtype)

    def params(self) -> list[nn.Parameter]:
        return [self.weight] if self.kind == "dense" else [self.q, self.scale]

    def element(self, params: list[te.Tensor]):
        """``(row, col) -> weight[row, col]`` in ``dtype`` as a TE expression over ``params``, so the
        dequantization is inlined into the kernel that reads the weight (one pass over the int4/int8
        data; a separate dequantize would write the whole float matrix every step)."""
        dtype = self.dtype
        if self.kind == "dense":
            (w,) = params
            return lambda i, j: w[i, j]
        q, scale = params
        if self.kind == "int8":
            return lambda i, j: q[i, j].astype(dtype) * scale[i, 0]

        def value(i, j):
            nib = tirx.bitwise_and(
                tirx.shift_right(q[i, j // 8], ((j % 8) * 4).astype("uint32")), tirx.const(15, "uint32")
            )
            return (nib.astype(dtype) - tirx.const(7, dtype)) * scale[i, j // GROUP]

        return value

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

            return te.compute((*lead, self.out), body, name=f"matmul_nt_{self.kind}")

        return op.tensor_expr_op(compute, f"matmul_nt_{self.kind}", [x, *self.params()])

    def take_rows(self, ids: nn.Tensor) -> nn.Tensor:
        """Rows ``ids`` (``[n]`` int32) of the weight, ``[n, in]`` in ``dtype`` (the embedding lookup)."""

        def compute(ids: te.Tensor, *params: te.Tensor) -> te.Tensor:
            el = self.element(list(params))
            return te.compute((ids.shape[0], self.inn), lambda i, j: el(ids[i], j), name=f"take_{self.kind}")

        return op.tensor_expr_op(compute, f"take_{self.kind}", [ids, *self.params()])


def quantize(w: np.ndarray, kind: str, dtype: str) -> dict[str, np.ndarray]:
    """The parameter arrays of one :class:`WeightMatrix` (keys: its parameter names)."""
    w = np.asarray(w, dtype=np.float32)
    if kind == "dense":
        return {"weight": w.astype(dtype)}
    if kind == "int8":
        scale = np.abs(w).max(axis=1, keepdims=True) / 127.0
        scale = np.where(scale == 0, 1.0, scale).astype(dtype)
        q = np.clip(np.rint(w / scale.astype(np.float32)), -127, 127).astype(np.int8)
        return {"q": q, "scale": scale}
    out, inn = w.shape
    g = w.reshape(out, inn // GROUP, GROUP)
    scale = np.abs(g).max(axis=2) / 7.0
    scale = np.where(scale == 0, 1.0, scale).astype(dtype)
    q = np.clip(np.rint(g / scale.astype(np.float32)[..., None]) + 7, 0, 14).astype(np.uint32)
    q = q.reshape(out, inn // 8, 8)
    packed = np.zeros((out, inn // 8), dtype=np.uint32)
    for k in range(8):
        packed |= q[..., k] << np.uint32(4 * k)
    return {"q": packed, "scale": scale}


def dequantize(params: dict[str, np.ndarray], kind: str) -> np.ndarray:
    """float32 weights back from :func:`quantize` (for error reports and sensitivity)."""
    if kind == "dense":
        return params["weight"].astype(np.float32)
    if kind == "int8":
        return params["q"].astype(np.float32) * params["scale"].astype(np.float32)
    packed = params["q"]
    nibbles = np.stack([(packed >> np.uint32(4 * k)) & np.uint32(15) for k in range(8)], axis=-1)
    q = nibbles.reshape(packed.shape[0], -1).astype(np.float32) - 7.0
    scale = np.repeat(params["scale"].astype(np.float32), GROUP, axis=1)
    return q * scale
