"""ONNX nodes TVM's frontend has no converter for, written as ones it has, before import: ``Celu``
(``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``, the specification's definition). Recurrent nodes
are :mod:`~inferx_edge.frontend.onnx_rnn`'s."""

from __future__ import annotations

import numpy as np

from inferx_edge.frontend.onnx_pads import _attrs, _namer, _with_nodes


def decompose_unsupported(model):
    """``(model, count)``: every ``Celu`` node replaced by primitive ops (values as the specification's)."""
    if not any(n.op_type == "Celu" for n in model.graph.node):
        return model, 0
    from onnx import helper, numpy_helper

    fresh = _namer(model)
    nodes, inits, count = [], [], 0

    for node in model.graph.node:
        if node.op_type != "Celu":
            nodes.append(node)
            continue
        alpha = float(_attrs(node).get("alpha", 1.0))
        hint = (node.name or "celu").replace("/", "_")
        a, zero, one = (fresh(f"{hint}_{k}") for k in ("alpha", "zero", "one"))
        inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in ((a, alpha), (zero, 0.0), (one, 1.0))]
        x = node.input[0]
        steps = [("Div", [x, a]), ("Exp", None), ("Sub", [None, one]), ("Mul", [None, a]), ("Min", [None, zero])]
        prev = None
        for op, ins in steps:
            out = fresh(f"{hint}_{op.lower()}")
            nodes.append(
                helper.make_node(op, [prev] if ins is None else [prev if i is None else i for i in ins], [out])
            )
            prev = out
        positive = fresh(f"{hint}_relu")
        nodes.append(helper.make_node("Relu", [x], [positive]))
        nodes.append(helper.make_node("Add", [positive, prev], [node.output[0]]))
        count += 1
    return _with_nodes(model, nodes, inits), count
