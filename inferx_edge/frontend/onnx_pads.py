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
"""

from __future__ import annotations

import numpy as np


def _constants(model) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    out[node.output[0]] = numpy_helper.to_array(attr.t)
    return out


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


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
    from onnx import helper

    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
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
            attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
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
            attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
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
    from onnx import helper

    pads = _pad_amounts(node, {a.name: helper.get_attribute_value(a) for a in node.attribute}, constants)
    return bool(pads) and not any(pads)
