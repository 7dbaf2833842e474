"""ONNX nodes TVM's frontend has no converter for, written as ones it has, before import (values as the
specification defines them, each matched against onnxruntime in ``tests/frontend/test_onnx_decompose.py``):

- ``Celu``: ``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``;
- ``LpNormalization``: ``x / ||x||_p`` along ``axis`` (p = 1 or 2);
- ``ReverseSequence`` with constant ``sequence_lens``: a ``GatherElements`` with the reversed positions;
- ``CenterCropPad`` with a constant ``shape``: a centred ``Slice`` and a centred zero ``Pad`` per axis;
- ``Det`` of 1x1 to 3x3 matrices: cofactor expansion;
- ``Col2Im`` (2-D, constant image and block shapes): per kernel offset, the column block spread to the
  stride, padded into place and summed;
- ``DFT`` with a static length: products with constant cosine / sine matrices (forward or inverse,
  real or complex input, one-sided output, ``dft_length`` padding / truncation);
- ``STFT`` with a constant frame step and window / frame length: gathered frames, windowed, the same
  products.

Shape-dependent ones need static shapes (ONNX shape inference on the pinned inputs); where a value they
need is not constant or a shape not known, the node is left and the import names it as unsupported.
Recurrent nodes are :mod:`~inferx_edge.frontend.onnx_rnn`'s."""

from __future__ import annotations

import numpy as np

from inferx_edge.frontend.onnx_pads import _attrs, _constants, _NodeBuilder, _pinned


def _celu(g, node, attrs, ctx) -> bool:
    alpha = float(attrs.get("alpha", 1.0))
    hint = _hint(node, "celu")
    a, zero, one = (g.const(f"{hint}_{k}", np.float32(v)) for k, v in (("alpha", alpha), ("zero", 0), ("one", 1)))
    x = node.input[0]
    expm1 = g.op("Sub", [g.op("Exp", [g.op("Div", [x, a], hint)], hint), one], hint)
    negative = g.op("Min", [g.op("Mul", [expm1, a], hint), zero], hint)
    g.op("Add", [g.op("Relu", [x], hint), negative], hint, output=node.output[0])
    return True


def _lp_normalization(g, node, attrs, ctx) -> bool:
    p, axis = int(attrs.get("p", 2)), int(attrs.get("axis", -1))
    if p not in (1, 2):
        return False
    hint = _hint(node, "lpnorm")
    axes = g.const(f"{hint}_axes", np.array([axis], np.int64))
    x = node.input[0]
    norm = g.op("ReduceL2" if p == 2 else "ReduceL1", [x, axes], hint, keepdims=1)
    g.op("Div", [x, norm], hint, output=node.output[0])
    return True


def _reverse_sequence(g, node, attrs, ctx) -> bool:
    known = ctx.shape_and_constant(node)
    if known is None:
        return False
    shape, lens = known
    b_axis, t_axis = int(attrs.get("batch_axis", 1)), int(attrs.get("time_axis", 0))
    lens = np.asarray(lens).reshape(-1).astype(np.int64)
    t = np.arange(shape[t_axis])[:, None]
    src = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)  # [time, batch]
    view = [1] * len(shape)
    view[t_axis], view[b_axis] = shape[t_axis], shape[b_axis]
    src = src if t_axis < b_axis else src.T  # in the axes' order
    index = np.broadcast_to(src.reshape(view), shape).astype(np.int64)
    hint = _hint(node, "reverse")
    g.op("GatherElements", [node.input[0], g.const(f"{hint}_idx", index)], hint, output=node.output[0], axis=t_axis)
    return True


def _center_crop_pad(g, node, attrs, ctx) -> bool:
    known = ctx.shape_and_constant(node)
    if known is None:
        return False
    shape, target = known
    target = [int(v) for v in np.asarray(target).reshape(-1)]
    axes = [int(a) % len(shape) for a in attrs.get("axes", range(len(shape)))]
    hint = _hint(node, "ccp")
    x = node.input[0]
    starts, ends, slice_axes = [], [], []
    pads = [0] * (2 * len(shape))
    for axis, want in zip(axes, target, strict=True):
        have = shape[axis]
        if want < have:
            start = (have - want) // 2
            starts, ends, slice_axes = [*starts, start], [*ends, start + want], [*slice_axes, axis]
        elif want > have:
            pads[axis] = (want - have) // 2
            pads[axis + len(shape)] = want - have - pads[axis]
    out = node.output[0]
    if slice_axes:
        arrays = (np.array(v, np.int64) for v in (starts, ends, slice_axes))
        inputs = [g.const(f"{hint}_{k}", a) for k, a in zip(("starts", "ends", "axes"), arrays, strict=True)]
        x = g.op("Slice", [x, *inputs], hint, output=None if any(pads) else out)
    if any(pads) or not slice_axes:
        g.op("Pad", [x, g.const(f"{hint}_pads", np.array(pads, np.int64))], hint, output=out)
    return True


def _dft(g, node, attrs, ctx) -> bool:
    shape = ctx.known.get(node.input[0])
    if shape is None or len(shape) < 3 or shape[-1] not in (1, 2):
        return False
    axis = attrs.get("axis", 1)
    if len(node.input) > 2 and node.input[2]:  # opset 20: the axis is an input
        given = ctx.constants.get(node.input[2])
        if given is None:
            return False
        axis = int(np.asarray(given).reshape(-1)[0])
    axis = int(axis) % len(shape)
    if axis == len(shape) - 1:
        return False
    n = shape[axis]
    if len(node.input) > 1 and node.input[1]:
        length = ctx.constants.get(node.input[1])
        if length is None:
            return False
        n = int(np.asarray(length).reshape(-1)[0])
    inverse, onesided = bool(attrs.get("inverse", 0)), bool(attrs.get("onesided", 0))
    have = shape[axis]
    hint = _hint(node, "dft")
    rank = len(shape)
    perm = [d for d in range(rank - 1) if d != axis] + [axis, rank - 1]  # the signal axis next to re/im
    x = g.op("Transpose", [node.input[0]], hint, perm=perm)
    if have > n:
        x = g.op(
            "Slice",
            [x, *(g.const(f"{hint}_{t}", np.array([v], np.int64)) for t, v in (("s", 0), ("e", n), ("a", rank - 2)))],
            hint,
        )
    pair = _dft_pairs(g, x, rank, shape[-1], n, min(n, have), inverse, onesided, hint)
    back = [perm.index(d) for d in range(rank)]
    g.op("Transpose", [pair], hint, output=node.output[0], perm=back)
    return True


def _dft_pairs(g, x, rank, channels, n, samples, inverse, onesided, hint, output=None):
    """The DFT of ``x`` (rank ``rank``: the signal along axis -2, ``samples`` of a length-``n``
    transform, zero-padded beyond; real or (re, im) along axis -1) as ``[..., bins, 2]``:
    ``Y[k] = sum_m x[m] exp(-+2 pi i k m / n)`` (``/ n`` when inverse), as products with constant
    cosine and sine matrices."""
    k = n // 2 + 1 if onesided else n
    m = np.arange(samples)[:, None]
    angle = 2 * np.pi * m * np.arange(k)[None, :] / n
    sign = 1.0 if inverse else -1.0
    scale = 1.0 / n if inverse else 1.0
    cos, sin = np.cos(angle) * scale, sign * np.sin(angle) * scale
    parts = []
    for c in range(channels):
        sel = g.const(f"{hint}_c{c}", np.array(c, np.int64))
        parts.append(g.op("Gather", [x, sel], hint, axis=rank - 1))  # [..., samples]
    c_cos, c_sin = (g.const(f"{hint}_{t}", v.astype(np.float32)) for t, v in (("cos", cos), ("sin", sin)))
    re = g.op("MatMul", [parts[0], c_cos], hint)
    im = g.op("MatMul", [parts[0], c_sin], hint)
    if len(parts) == 2:  # (a + ib)(cos + i sin) = (a cos - b sin) + i (a sin + b cos)
        re = g.op("Sub", [re, g.op("MatMul", [parts[1], c_sin], hint)], hint)
        im = g.op("Add", [im, g.op("MatMul", [parts[1], c_cos], hint)], hint)
    last = g.const(f"{hint}_last", np.array([-1], np.int64))
    halves = [g.op("Unsqueeze", [re, last], hint), g.op("Unsqueeze", [im, last], hint)]
    return g.op("Concat", halves, hint, output=output, axis=-1)


def _stft(g, node, attrs, ctx) -> bool:
    """``STFT`` with a constant frame step and window / frame length: the frames gathered
    ([batch, frames, frame_length, re/im]), windowed, and transformed as :func:`_dft_pairs`."""
    shape = ctx.known.get(node.input[0])
    inputs = list(node.input) + [""] * (4 - len(node.input))
    step = ctx.constants.get(inputs[1])
    window = ctx.constants.get(inputs[2]) if inputs[2] else None
    length = ctx.constants.get(inputs[3]) if inputs[3] else None
    if shape is None or len(shape) != 3 or shape[-1] not in (1, 2) or step is None:
        return False
    if (inputs[2] and window is None) or (inputs[3] and length is None) or (window is None and length is None):
        return False
    frame = int(np.asarray(length).reshape(-1)[0]) if length is not None else int(np.asarray(window).size)
    step = int(np.asarray(step).reshape(-1)[0])
    frames = (shape[1] - frame) // step + 1
    if frames < 1:
        return False
    hint = _hint(node, "stft")
    index = np.arange(frames)[:, None] * step + np.arange(frame)[None, :]
    x = g.op("Gather", [node.input[0], g.const(f"{hint}_frames", index.astype(np.int64))], hint, axis=1)
    if window is not None:
        w = np.asarray(window, np.float32).reshape(1, 1, frame, 1)
        x = g.op("Mul", [x, g.const(f"{hint}_window", w)], hint)
    onesided = bool(attrs.get("onesided", 1))
    _dft_pairs(g, x, 4, shape[-1], frame, frame, False, onesided, hint, output=node.output[0])
    return True


def _col2im(g, node, attrs, ctx) -> bool:
    """2-D ``Col2Im``: each kernel offset's column block spread to its stride (zeros between), padded into
    place in the padded image and summed; the pads cropped at the end."""
    shape = ctx.known.get(node.input[0])
    image, block = (ctx.constants.get(name) for name in node.input[1:3])
    if shape is None or image is None or block is None or len(np.asarray(image).reshape(-1)) != 2:
        return False
    (h, w), (kh, kw) = (tuple(int(v) for v in np.asarray(a).reshape(-1)) for a in (image, block))
    dh, dw = (int(v) for v in attrs.get("dilations", (1, 1)))
    sh, sw = (int(v) for v in attrs.get("strides", (1, 1)))
    ph0, pw0, ph1, pw1 = (int(v) for v in attrs.get("pads", (0, 0, 0, 0)))
    hp, wp = h + ph0 + ph1, w + pw0 + pw1
    oh, ow = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
    n, c = shape[0], shape[1] // (kh * kw)
    if shape[1] != c * kh * kw or shape[2] != oh * ow:
        return False
    hint = _hint(node, "col2im")

    def i64(tag, values):
        return g.const(f"{hint}_{tag}", np.array(values, np.int64))

    cols = g.op("Reshape", [node.input[0], i64("view", [n, c, kh * kw, oh, ow])], hint)
    terms = []
    for ki in range(kh):
        for kj in range(kw):
            k = ki * kw + kj
            v = g.op("Slice", [cols, i64("k0", [k]), i64("k1", [k + 1]), i64("kax", [2])], hint)
            if sh > 1 or sw > 1:  # to [oh, sh, ow, sw] with zeros after each value, then flattened
                v = g.op("Reshape", [v, i64("v6", [n, c, oh, 1, ow, 1])], hint)
                v = g.op("Pad", [v, i64("spread", [0, 0, 0, 0, 0, 0, 0, 0, 0, sh - 1, 0, sw - 1])], hint)
                v = g.op("Reshape", [v, i64("v4", [n, c, oh * sh, ow * sw])], hint)
                v = g.op(
                    "Slice",
                    [v, i64("z", [0, 0]), i64("span", [(oh - 1) * sh + 1, (ow - 1) * sw + 1]), i64("hw", [2, 3])],
                    hint,
                )
            else:
                v = g.op("Reshape", [v, i64("v4", [n, c, oh, ow])], hint)
            top, left = ki * dh, kj * dw
            bottom, right = hp - top - ((oh - 1) * sh + 1), wp - left - ((ow - 1) * sw + 1)
            terms.append(g.op("Pad", [v, i64("at", [0, 0, top, left, 0, 0, bottom, right])], hint))
    total = g.add_all(terms, hint)
    g.op(
        "Slice",
        [total, i64("c0", [ph0, pw0]), i64("c1", [ph0 + h, pw0 + w]), i64("cax", [2, 3])],
        hint,
        output=node.output[0],
    )
    return True


def _det(g, node, attrs, ctx) -> bool:
    """``Det`` of 1x1, 2x2 and 3x3 matrices by cofactor expansion (larger ones need pivoting: left)."""
    shape = ctx.known.get(node.input[0])
    if shape is None or len(shape) < 2 or shape[-1] != shape[-2] or shape[-1] > 3:
        return False
    n, hint = shape[-1], _hint(node, "det")
    rank = len(shape)

    def at(i, j):
        row = g.op("Gather", [node.input[0], g.const(f"{hint}_r{i}", np.array(i, np.int64))], hint, axis=rank - 2)
        return g.op("Gather", [row, g.const(f"{hint}_c{j}", np.array(j, np.int64))], hint, axis=rank - 2)

    e = [[at(i, j) for j in range(n)] for i in range(n)]

    def mul(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = g.op("Mul", [out, x], hint)
        return out

    out = node.output[0]
    if n == 1:
        g.op("Identity", [e[0][0]], hint, output=out)
    elif n == 2:
        g.op("Sub", [mul(e[0][0], e[1][1]), mul(e[0][1], e[1][0])], hint, output=out)
    else:
        terms = []
        for j in range(3):
            minor = g.op(
                "Sub", [mul(e[1][(j + 1) % 3], e[2][(j + 2) % 3]), mul(e[1][(j + 2) % 3], e[2][(j + 1) % 3])], hint
            )
            terms.append(mul(e[0][j], minor))
        g.add_all(terms, hint, output=out)
    return True


_DECOMPOSITIONS = {
    "Det": _det,
    "Col2Im": _col2im,
    "Celu": _celu,
    "LpNormalization": _lp_normalization,
    "ReverseSequence": _reverse_sequence,
    "CenterCropPad": _center_crop_pad,
    "DFT": _dft,
    "STFT": _stft,
}


class _Context:
    def __init__(self, model, shapes) -> None:
        self.constants = _constants(model)
        pinned = _pinned(model, shapes or {})
        self.known = pinned[1] if pinned else {}

    def shape_and_constant(self, node):
        """``(static shape of the node's first input, constant value of its second)``, or None."""
        shape = self.known.get(node.input[0])
        value = self.constants.get(node.input[1]) if len(node.input) > 1 else None
        return None if shape is None or value is None else (shape, value)


def _hint(node, default: str) -> str:
    return (node.name or default).replace("/", "_")


def decompose_unsupported(model, shapes: dict[str, tuple[int, ...]] | None = None):
    """``(model, count)``: every node of the ops above that can be written with supported ops replaced."""
    if not any(n.op_type in _DECOMPOSITIONS for n in model.graph.node):
        return model, 0
    ctx = _Context(model, shapes)
    g = _NodeBuilder(model)
    count = 0
    for node in model.graph.node:
        rewrite = _DECOMPOSITIONS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if rewrite is not None and rewrite(g, node, _attrs(node), ctx):
            count += 1
        else:
            g.keep(node)
    return g.model(model), count
