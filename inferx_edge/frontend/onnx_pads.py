"""Explicit zero ``Pad`` nodes in front of convolutions become the convolutions' own padding.

Models converted from TensorFlow ("same" padding: EfficientNet-Lite, many TFLite-era networks) pad
every strided or asymmetric convolution with a separate ``Pad`` node. TVM's ONNX frontend imports that
as its own TIR function, which the layout conversion cannot see through: an NHWC build transposed
the activation to NCHW, padded it, and transposed it back before every such convolution (three
passes over the tensor), and the pad hid the clip in front of a depthwise convolution from the
passes that key on it. Folded into the ``Conv`` (asymmetric pads are allowed there), the padding is
part of the convolution's own window. A ``Pad`` by zero everywhere (Swin's pad of a feature map to
whole windows, when it already is whole) becomes an ``Identity``: as a TIR function it was a copy,
and it kept the fp16 conversion from running at all (TVM's ``ToMixedPrecision`` rejects ``call_tir``
arguments: "Expected TensorType, but got R.Callable").

``ConvTranspose`` nodes that give an ``output_shape`` get the explicit pads that shape implies
(:func:`explicit_conv_transpose_pads`): TVM's frontend ignored the attribute.
"""

from __future__ import annotations

import numpy as np


def _constants(model, max_elements: int | None = None) -> dict[str, np.ndarray]:
    """The model's initializers and ``Constant`` node values by name, as numpy arrays; with
    ``max_elements`` only those of at most that many elements (the rewrites that read indices, shapes
    and scales need not copy every weight)."""
    from onnx import numpy_helper

    def small(tensor) -> bool:
        return max_elements is None or int(np.prod(tensor.dims)) <= max_elements

    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if small(t)}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value" and small(attr.t):
                    out[node.output[0]] = numpy_helper.to_array(attr.t)
    return out


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _attrs(node) -> dict:
    """A node's attributes by name, as Python values."""
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


class _NodeBuilder:
    """The node list of a rewrite of ``model``: its nodes kept as they are (:meth:`keep`) or replaced by
    new ones (:meth:`op`, :meth:`const`) whose names no tensor of ``model`` has; :meth:`model` gives the
    rewritten model."""

    def __init__(self, model) -> None:
        self.nodes: list = []
        self.inits: list = []
        self.taken = {t for n in model.graph.node for t in (*n.input, *n.output)}
        self.taken |= {t.name for t in model.graph.initializer}

    def name(self, hint: str) -> str:
        """A name not used before, from ``hint``."""
        i = len(self.taken)
        while f"{hint}_{i}" in self.taken:
            i += 1
        self.taken.add(f"{hint}_{i}")
        return f"{hint}_{i}"

    def keep(self, node) -> None:
        self.nodes.append(node)

    def const(self, hint: str, value) -> str:
        """A new initializer holding ``value`` (0-d arrays stay scalars); its name."""
        from onnx import numpy_helper

        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.array(value, order="C"), name))
        return name

    def op(self, op_type: str, inputs: list[str], hint: str, output: str | None = None, **attrs) -> str:
        """A new ``op_type`` node; its output's name (``output``, else a new one)."""
        from onnx import helper

        out = output or self.name(hint)
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.name(f"{hint}_{op_type}"), **attrs))
        return out

    def add_all(self, terms: list[str], hint: str, output: str | None = None) -> str:
        """``terms`` summed left to right by ``Add`` nodes, the last one writing ``output`` (TVM imports
        a ``Sum`` node by stacking its inputs and reducing: a copy of every term); its output's name."""
        if len(terms) == 1 and output:
            return self.op("Identity", terms, hint, output=output)
        total = terms[0]
        for i, term in enumerate(terms[1:], 1):
            total = self.op("Add", [total, term], hint, output=output if i == len(terms) - 1 else None)
        return total

    def model(self, model):
        """A copy of ``model`` whose graph has the built nodes (in order) and the new initializers."""
        import onnx

        new = onnx.ModelProto()
        new.CopyFrom(model)
        del new.graph.node[:]
        new.graph.node.extend(self.nodes)
        new.graph.initializer.extend(self.inits)
        return new


def _pad_amounts(node, attrs: dict, constants: dict) -> list[int] | None:
    """A ``Pad`` node's amounts as ONNX lists them (all begins, then all ends): its ``pads`` attribute
    (opset < 11) or its constant ``pads`` input; None when not known."""
    if "pads" in attrs:
        return list(attrs["pads"])
    if len(node.input) > 1 and node.input[1] in constants:
        return [int(p) for p in constants[node.input[1]].reshape(-1)]
    return None


def _zero_pads(node, constants: dict) -> list[int] | None:
    """The pads of a ``Pad`` node that pads with zeros (constant mode), as ONNX lists them (all begins,
    then all ends), when every value is known; else None."""

    attrs = _attrs(node)
    if _text(attrs.get("mode", b"constant")) != "constant":
        return None
    pads = _pad_amounts(node, attrs, constants)
    if pads is None or (len(node.input) > 3 and node.input[3]):  # opset 18 axes: not folded
        return None
    value = attrs.get("value", 0.0)  # opset < 11
    if len(node.input) > 2 and node.input[2]:
        if node.input[2] not in constants:
            return None
        value = float(np.asarray(constants[node.input[2]]).reshape(-1)[0])
    return pads if value == 0.0 else None


def fold_pads_into_convs(model):
    """A copy of ``model`` where each zero ``Pad`` whose only consumers are ``Conv`` nodes (reading it
    as their data input, without ``auto_pad``) and which pads only spatial axes by non-negative
    amounts is removed, its amounts added to each consumer's ``pads``, and each ``Pad`` whose amounts
    are all zero (any mode) is an ``Identity``. Returns ``(model, rewritten Pad count)``."""
    import onnx
    from onnx import helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    graph = m.graph
    constants = _constants(m)
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    removed, identities = [], 0
    for node in graph.node:
        if node.op_type == "Pad" and _no_op(node, constants):
            node.op_type = "Identity"
            del node.input[1:]
            del node.attribute[:]
            identities += 1
            continue
        if node.op_type != "Pad" or node.output[0] in outputs:
            continue
        pads = _zero_pads(node, constants)
        users = consumers.get(node.output[0], [])
        if pads is None or not users or len(pads) % 2 or min(pads) < 0:
            continue
        rank = len(pads) // 2
        if rank < 3 or any(pads[a] or pads[rank + a] for a in (0, 1)):  # batch and channels untouched
            continue
        ok = True
        for conv in users:
            attrs = _attrs(conv)
            if (
                conv.op_type != "Conv"
                or list(conv.input).count(node.output[0]) != 1
                or conv.input[0] != node.output[0]
                or _text(attrs.get("auto_pad", b"NOTSET")) != "NOTSET"
            ):
                ok = False
        if not ok:
            continue
        begin, end = pads[2:rank], pads[rank + 2 :]
        for conv in users:
            attrs = _attrs(conv)
            own = list(attrs.get("pads", [0] * (2 * (rank - 2))))
            new = [own[i] + begin[i] for i in range(rank - 2)] + [own[rank - 2 + i] + end[i] for i in range(rank - 2)]
            for a in list(conv.attribute):
                if a.name == "pads":
                    conv.attribute.remove(a)
            conv.attribute.append(helper.make_attribute("pads", new))
            conv.input[0] = node.input[0]
        removed.append(node)
    for node in removed:
        graph.node.remove(node)
    return m, len(removed) + identities


def _no_op(node, constants: dict) -> bool:
    """Whether a ``Pad`` node pads nothing (every amount zero, known)."""

    pads = _pad_amounts(node, _attrs(node), constants)
    return bool(pads) and not any(pads)


def explicit_conv_transpose_pads(model, shapes: dict[str, tuple[int, ...]]):
    """A copy of ``model`` where each ``ConvTranspose`` with an ``output_shape`` attribute gets the
    ``pads`` (and, where the shape needs more than padding removes, ``output_padding``) that give that
    shape, as the ONNX specification derives them: total = stride * (in - 1) + output_padding +
    (kernel - 1) * dilation + 1 - out, split with the extra pixel at the start (NOTSET, SAME_LOWER) or
    the end (SAME_UPPER). TVM's ONNX frontend ignored ``output_shape``: a 5x5 -> 10x10 stride-2
    transposed conv came out 11x11, no error. ``shapes``: the graph inputs' pinned shapes (static).
    Returns ``(model, rewritten node count)``."""
    from onnx import helper

    todo = [n for n in model.graph.node if n.op_type == "ConvTranspose" and "output_shape" in _attrs(n)]
    if not todo:
        return model, 0
    pinned = _pinned(model, shapes)
    if pinned is None:  # a model shape inference rejects: left to the frontend as it was
        return model, 0
    m, known = pinned
    weights = {t.name: list(t.dims) for t in m.graph.initializer}
    rewritten = 0
    for node in (n for n in m.graph.node if n.op_type == "ConvTranspose"):
        attrs = _attrs(node)
        if "output_shape" not in attrs or node.input[0] not in known:
            continue
        spatial = known[node.input[0]][2:]
        rank = len(spatial)
        kernel = list(attrs.get("kernel_shape") or weights.get(node.input[1], [])[2:])
        out = list(attrs["output_shape"])[-rank:]
        if len(kernel) != rank or len(out) != rank:
            continue
        strides = list(attrs.get("strides", [1] * rank))
        dilations = list(attrs.get("dilations", [1] * rank))
        extra = list(attrs.get("output_padding", [0] * rank))
        upper = _text(attrs.get("auto_pad", b"NOTSET")) == "SAME_UPPER"
        begin, end = [], []
        for i in range(rank):
            total = strides[i] * (spatial[i] - 1) + extra[i] + (kernel[i] - 1) * dilations[i] + 1 - out[i]
            if total < 0:  # more than the natural size: the rest is output padding
                extra[i] -= total
                total = 0
            small, large = total // 2, total - total // 2
            begin.append(small if upper else large)
            end.append(large if upper else small)
        for a in list(node.attribute):
            if a.name in ("output_shape", "auto_pad", "pads", "output_padding"):
                node.attribute.remove(a)
        node.attribute.extend(
            [helper.make_attribute("pads", begin + end), helper.make_attribute("output_padding", extra)]
        )
        rewritten += 1
    return m, rewritten


def refuse_fractional_resize_scales(model, shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise a :class:`~inferx_edge.errors.ModelError` for a ``Resize`` given constant ``scales`` where a
    spatial size times its scale is not a whole number (5 pixels x 1.5, 9 x 0.7) that
    :func:`~inferx_edge.frontend.onnx_resize.lower_fractional_resizes` left (cropping, antialiased downscaling). The ONNX specification
    (and onnxruntime) map output pixels back with the scale itself; TVM's frontend uses the ratio of
    the rounded sizes, so such a resize imported with other values, silently (a bilinear 5 -> 7 resize
    50 % off). Scales whose products are whole agree either way and pass."""

    from inferx_edge.errors import ModelError

    resizes = [n for n in model.graph.node if n.op_type == "Resize" and len(n.input) > 2 and n.input[2]]
    if not resizes:
        return
    constants = _constants(model)
    pinned = _pinned(model, shapes)
    if pinned is None:  # shapes unknown: nothing to check against
        return
    known = pinned[1]
    for node in resizes:
        scales = constants.get(node.input[2])
        factors = [] if scales is None else [float(f) for f in np.asarray(scales).reshape(-1)]
        if not factors or node.input[0] not in known:
            continue
        sizes = known[node.input[0]]
        products = [s * f for s, f in zip(sizes, factors, strict=False)]
        if all(abs(p - round(p)) < 1e-6 for p in products) or _same_nearest_pixels(node, sizes, factors):
            continue
        attrs = _attrs(node)
        kind = "/".join(
            _text(attrs.get(k, d)) for k, d in (("mode", b"nearest"), ("coordinate_transformation_mode", b"half_pixel"))
        )
        raise ModelError(
            f"Resize {node.name or node.output[0]!r} ({kind}) scales {sizes} by {factors}: "
            f"not whole output sizes ({[round(p, 3) for p in products]}). ONNX samples such a resize with the "
            "scale itself and TVM's importer with the ratio of the rounded sizes, so it would compute other "
            "values; nearest and linear ones are lowered at import, this kind is not. Re-export it with output "
            "sizes instead of scales (torch: F.interpolate(size=...) or recompute_scale_factor=True), or from "
            "torch.export, whose import follows torch"
        )


def _same_nearest_pixels(node, sizes: list[int], factors: list[float]) -> bool:
    """Whether a nearest ``Resize`` picks the same source pixels mapped with its scales (the
    specification) as with the ratio of the rounded sizes (TVM): a 5 -> 7 upsample by 1.5 does, a
    9 -> 6 downsample by 0.7 does not. False for other modes and attribute values."""

    attrs = _attrs(node)
    mode = _text(attrs.get("mode", b"nearest"))
    transform = _text(attrs.get("coordinate_transformation_mode", b"half_pixel"))
    rounding = _text(attrs.get("nearest_mode", b"round_prefer_floor"))
    if mode != "nearest" or transform not in ("asymmetric", "half_pixel", "pytorch_half_pixel"):
        return False
    pick = {
        "floor": np.floor,
        "ceil": np.ceil,
        "round_prefer_floor": lambda v: np.ceil(v - 0.5),
        "round_prefer_ceil": lambda v: np.floor(v + 0.5),
    }.get(rounding)
    if pick is None:
        return False
    for size, factor in zip(sizes, factors, strict=False):
        out = int(np.floor(size * factor))
        dst = np.arange(out, dtype=np.float64)
        maps = []
        for step in (1.0 / factor, size / max(out, 1)):
            src = dst * step if transform == "asymmetric" else (dst + 0.5) * step - 0.5
            if transform == "pytorch_half_pixel" and out == 1:
                src = np.zeros_like(dst)
            maps.append(np.clip(pick(src), 0, size - 1))
        if not np.array_equal(*maps):
            return False
    return True


def _pinned(model, shapes: dict[str, tuple[int, ...]]):
    """``(a copy of model with its inputs pinned to shapes, {tensor: its static shape})`` from ONNX shape
    inference, for every tensor whose dims it knows; None where inference rejects the model."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for inp in m.graph.input:
        if inp.name in shapes:
            for dim, size in zip(inp.type.tensor_type.shape.dim, shapes[inp.name], strict=False):
                dim.Clear()
                dim.dim_value = int(size)
    try:
        inferred = onnx.shape_inference.infer_shapes(m)
    except Exception:  # noqa: BLE001 - the caller leaves the model to the frontend as it is
        return None
    known = {}
    for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims and all(d.HasField("dim_value") for d in dims):
            known[vi.name] = [d.dim_value for d in dims]
    return m, known
