"""ONNX ``Resize`` by scales with no whole output size, lowered to per-axis gathers before import.

The ONNX specification (and onnxruntime) map an output pixel back to the input with the scale itself;
TVM's frontend uses the ratio of the rounded sizes. Where size x scale is whole both agree; where it is
not (9 x 0.7, 5 x 1.5) TVM would sample other pixels. Such a resize with constant scales, ``nearest``,
``linear`` or ``cubic`` mode, a coordinate transformation other than ``tf_crop_and_resize`` and no
antialiased downscaling becomes, axis by axis, a ``Gather`` of the source rows the specification picks
(nearest) or two / four ``Gather``s weighted and summed (linear / cubic: separable, so N-D is the axes in
turn), with the indices and weights computed here in float32 as onnxruntime computes them. Other
resizes of that kind (cropping, antialiased downscaling) are left to
:func:`~inferx_edge.frontend.onnx_pads.refuse_fractional_resize_scales`, which names them.
"""

from __future__ import annotations

import numpy as np

from inferx_edge.frontend.onnx_pads import (
    _attrs,
    _constants,
    _NodeBuilder,
    _pinned,
    _same_nearest_pixels,
    _text,
)

_TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
               "half_pixel_symmetric")  # fmt: skip
_NEAREST = {
    "floor": np.floor,
    "ceil": np.ceil,
    "round_prefer_floor": lambda v: np.ceil(v - np.float32(0.5)),
    "round_prefer_ceil": lambda v: np.floor(v + np.float32(0.5)),
}


def source_coordinates(transform: str, size: int, out: int, scale: float) -> np.ndarray:
    """The input coordinate (float32) each of ``out`` output positions maps to along an axis of
    ``size``, per the specification's ``coordinate_transformation_mode``."""
    f32 = np.float32
    x, s = np.arange(out, dtype=f32), f32(scale)
    if transform == "align_corners":
        return np.zeros(out, f32) if out == 1 else x * f32(size - 1) / f32(out - 1)
    if transform == "asymmetric":
        return x / s
    if transform == "tf_half_pixel_for_nn":
        return (x + f32(0.5)) / s
    if transform == "pytorch_half_pixel" and out == 1:
        return np.zeros(out, f32)
    if transform == "half_pixel_symmetric":
        adjustment = f32(out) / (f32(size) * s)
        offset = f32(size) / f32(2) * (f32(1) - adjustment)
        return offset + (x + f32(0.5)) / s - f32(0.5)
    return (x + f32(0.5)) / s - f32(0.5)  # half_pixel, pytorch_half_pixel


def keys_near(d, a):
    """Keys' cubic convolution kernel (coefficient ``a``) for ``|d| <= 1``."""
    return ((a + 2) * d - (a + 3)) * d * d + 1


def keys_far(d, a):
    """Keys' cubic convolution kernel (coefficient ``a``) for ``1 < |d| < 2``."""
    return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a


def _taps(mode: str, attrs: dict, src: np.ndarray, size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(indices, weights)]`` along one axis whose weighted sum is the interpolation at ``src``:
    onnxruntime's linear (clamped coordinate, two neighbours, half and half on the edge) or the
    specification's cubic (Keys' kernel with ``cubic_coeff_a``, four neighbours, indices clamped to the
    edge; with ``exclude_outside`` the weights of outside neighbours are zeroed and the rest rescaled)."""
    f32 = np.float32
    if mode == "linear":
        src = np.clip(src, 0, size - 1)
        lo = np.minimum(src.astype(np.int64), size - 1)
        hi = np.minimum(lo + 1, size - 1)
        w_hi = np.where(lo == hi, f32(0.5), np.abs(src - lo.astype(f32)))
        w_lo = np.where(lo == hi, f32(0.5), np.abs(src - hi.astype(f32)))
        return [(lo, w_lo), (hi, w_hi)]
    a = f32(attrs.get("cubic_coeff_a", -0.75))
    base = np.floor(src)
    t = (src - base).astype(f32)

    weights = [keys_far(t + f32(1), a), keys_near(t, a), keys_near(f32(1) - t, a), keys_far(f32(2) - t, a)]
    indices = [base.astype(np.int64) + k for k in (-1, 0, 1, 2)]
    if attrs.get("exclude_outside"):
        weights = [np.where((i >= 0) & (i < size), w, f32(0)) for i, w in zip(indices, weights, strict=True)]
        total = sum(weights)
        weights = [w / total for w in weights]
    return [(np.clip(i, 0, size - 1), w.astype(f32)) for i, w in zip(indices, weights, strict=True)]


def _lowerable(attrs: dict, factors: list[float]) -> bool:
    mode = _text(attrs.get("mode", b"nearest"))
    transform = _text(attrs.get("coordinate_transformation_mode", b"half_pixel"))
    if mode not in ("nearest", "linear", "cubic") or transform not in _TRANSFORMS:
        return False
    if mode == "nearest" and _text(attrs.get("nearest_mode", b"round_prefer_floor")) not in _NEAREST:
        return False
    if mode == "nearest" and transform == "half_pixel_symmetric":
        return False  # onnxruntime's float rounding of this transform picks other pixels at ties
    if attrs.get("axes") or _text(attrs.get("keep_aspect_ratio_policy", b"stretch")) != "stretch":
        return False
    return not (attrs.get("antialias") and mode != "nearest" and any(f < 1 for f in factors))


def lower_fractional_resizes(model, shapes: dict[str, tuple[int, ...]]):
    """``(model, count)``: every ``Resize`` with constant scales that TVM would sample differently
    (size x scale not whole, and not a nearest resize that happens to pick the same pixels) and that
    this module can lower, replaced by gathers."""
    resizes = [n for n in model.graph.node if n.op_type == "Resize" and len(n.input) > 2 and n.input[2]]
    if not resizes:
        return model, 0
    constants = _constants(model)
    pinned = _pinned(model, shapes)
    if pinned is None:
        return model, 0
    known = pinned[1]
    g = _NodeBuilder(model)
    count = 0
    for node in model.graph.node:
        scales = constants.get(node.input[2]) if node in resizes else None
        factors = [] if scales is None else [float(f) for f in np.asarray(scales, np.float32).reshape(-1)]
        sizes = known.get(node.input[0]) if factors else None
        attrs = _attrs(node)
        whole = sizes is not None and all(
            abs(s * f - round(s * f)) < 1e-6 for s, f in zip(sizes, factors, strict=False)
        )
        if (
            sizes is None
            or len(sizes) != len(factors)
            or whole
            or _same_nearest_pixels(node, sizes, factors)
            or not _lowerable(attrs, factors)
        ):
            g.keep(node)
            continue
        mode = _text(attrs.get("mode", b"nearest"))
        transform = _text(attrs.get("coordinate_transformation_mode", b"half_pixel"))
        pick = _NEAREST.get(_text(attrs.get("nearest_mode", b"round_prefer_floor")))
        hint = (node.name or "resize").replace("/", "_")
        x = node.input[0]
        axes = [a for a, f in enumerate(factors) if f != 1.0]
        for k, axis in enumerate(axes):
            size = sizes[axis]
            out = int(np.floor(np.float32(size) * np.float32(factors[axis])))
            src = source_coordinates(transform, size, out, factors[axis])
            target = node.output[0] if k == len(axes) - 1 else None  # the last axis writes the Resize's output
            if mode == "nearest":
                idx = np.clip(pick(src), 0, size - 1).astype(np.int64)
                x = g.op("Gather", [x, g.const(f"{hint}_i", idx)], f"{hint}_axis{axis}", output=target, axis=axis)
            else:
                bshape = [out] + [1] * (len(sizes) - 1 - axis)
                terms = [
                    g.op(
                        "Mul",
                        [
                            g.op("Gather", [x, g.const(f"{hint}_t{t}_i", idx)], f"{hint}_t{t}", axis=axis),
                            g.const(f"{hint}_t{t}_wc", w.astype(np.float32).reshape(bshape)),
                        ],
                        f"{hint}_t{t}_w",
                    )
                    for t, (idx, w) in enumerate(_taps(mode, attrs, src, size))
                ]
                x = g.add_all(terms, f"{hint}_axis{axis}", output=target)
        count += 1
    if not count:
        return model, 0
    return g.model(model), count
