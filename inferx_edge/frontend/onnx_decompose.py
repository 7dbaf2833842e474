"""ONNX nodes TVM's frontend has no converter for, written as ones it has, before import: ``Celu``
(``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``, the specification's definition). Recurrent nodes
are :mod:`~inferx_edge.frontend.onnx_rnn`'s."""

from __future__ import annotations

import numpy as np

from inferx_edge.frontend.onnx_pads import _attrs, _NodeBuilder


def decompose_unsupported(model):
    """``(model, count)``: every ``Celu`` node replaced by primitive ops (values as the specification's)."""
    if not any(n.op_type == "Celu" for n in model.graph.node):
        return model, 0
    g = _NodeBuilder(model)
    count = 0
    for node in model.graph.node:
        if node.op_type != "Celu":
            g.keep(node)
            continue
        alpha = float(_attrs(node).get("alpha", 1.0))
        hint = (node.name or "celu").replace("/", "_")
        a, zero, one = (g.const(f"{hint}_{k}", np.float32(v)) for k, v in (("alpha", alpha), ("zero", 0), ("one", 1)))
        x = node.input[0]
        expm1 = g.op("Sub", [g.op("Exp", [g.op("Div", [x, a], hint)], hint), one], hint)
        negative = g.op("Min", [g.op("Mul", [expm1, a], hint), zero], hint)
        g.op("Add", [g.op("Relu", [x], hint), negative], hint, output=node.output[0])
        count += 1
    return g.model(model), count
