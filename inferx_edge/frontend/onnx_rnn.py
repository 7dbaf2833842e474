"""ONNX ``LSTM``, ``GRU`` and ``RNN`` nodes unrolled into primitive ONNX ops before import.

TVM's ONNX frontend has no converter for the recurrent nodes, which keyword-spotting, speech and
sequence models exported from PyTorch or Keras carry. With a static sequence length (the model's, or
the one ``--input-shape`` pins), each node becomes: one ``MatMul`` of the whole input sequence with
the input weights (plus their bias), then per time step a ``MatMul`` of the previous hidden state with
the recurrent weights and the gate arithmetic of the ONNX specification, and finally the per-step
states concatenated into ``Y`` and the last ones into ``Y_h`` (``Y_c``). Both directions, ``layout`` 0
and 1, initial states, LSTM peepholes, GRU's ``linear_before_reset`` and each op's default
activations are supported; anything else (other activations, ``clip``, ``input_forget``, per-sequence
lengths, weights that are not constants) is a :class:`~inferx_edge.errors.ModelError` naming the node
and the attribute. The dense layers become ordinary ``MatMul`` nodes, so they quantize like any other.
"""

from __future__ import annotations

import numpy as np

from inferx_edge.errors import ModelError
from inferx_edge.frontend.onnx_pads import _attrs, _constants, _NodeBuilder, _pinned, _text

#: gates per op, in the order of the ONNX weight layout, and each op's default activations
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}


def _columns(g: _NodeBuilder, x: str, start: int, stop: int, hint: str) -> str:
    """``x[:, start:stop]`` of a 2-D tensor."""
    starts, ends, axes = (
        g.const(f"{hint}_{k}", np.array([v], np.int64)) for k, v in (("s", start), ("e", stop), ("a", 1))
    )
    return g.op("Slice", [x, starts, ends, axes], hint)


def unroll_recurrent(model, shapes: dict[str, tuple[int, ...]]):
    """``(model, count)``: ``model`` with every LSTM / GRU / RNN node replaced by primitive ops."""
    if not any(n.op_type in _GATES for n in model.graph.node):
        return model, 0
    pinned = _pinned(model, shapes)
    known = pinned[1] if pinned else {}
    constants = _constants(model)
    g = _NodeBuilder(model)
    count = 0
    for node in model.graph.node:
        if node.op_type not in _GATES:
            g.keep(node)
            continue
        _unroll(node, known, constants, g)
        count += 1
    return g.model(model), count


def _refuse(node, why: str) -> ModelError:
    return ModelError(f"{node.op_type} node '{node.name or '<unnamed>'}': {why}; it cannot be unrolled for import")


def _unroll(node, known: dict, constants: dict, g: _NodeBuilder) -> None:
    op, attrs = node.op_type, _attrs(node)
    inputs = list(node.input) + [""] * (8 - len(node.input))
    x, w, r, b, seq_lens, init_h = inputs[:6]
    init_c, peep = (inputs[6], inputs[7]) if op == "LSTM" else ("", "")
    acts = [_text(a) for a in attrs.get("activations", [])]
    direction = _text(attrs.get("direction", "forward"))
    dirs = {"forward": [False], "reverse": [True], "bidirectional": [False, True]}.get(direction)
    if dirs is None:
        raise _refuse(node, f"direction '{direction}' is not forward, reverse or bidirectional")
    default = _DEFAULT_ACTIVATIONS[op]
    if acts and [a.lower() for a in acts] != [a.lower() for a in default * len(dirs)]:
        raise _refuse(node, f"activations {acts} (only the defaults {default} per direction are supported)")
    for name in ("clip", "input_forget", "activation_alpha", "activation_beta"):
        if attrs.get(name):
            raise _refuse(node, f"attribute '{name}' is not supported")
    if seq_lens and seq_lens not in constants:
        raise _refuse(node, "per-batch sequence_lens given at run time are not supported (pad the batch instead)")
    layout = int(attrs.get("layout", 0))
    for tensor, what in ((w, "W"), (r, "R"), (b, "B"), (peep, "P")):
        if tensor and tensor not in constants:
            raise _refuse(node, f"its {what} input '{tensor}' is not a constant (initializer)")
    shape = known.get(x)
    if shape is None or len(shape) != 3:
        raise _refuse(node, f"input '{x}' has no static [sequence, batch, features] shape (pin it with --input-shape)")
    steps, batch = (shape[1], shape[0]) if layout else (shape[0], shape[1])
    if seq_lens and not np.all(constants[seq_lens] == steps):
        raise _refuse(node, f"sequence_lens {constants[seq_lens].tolist()} differ from the sequence length {steps}")
    gates = _GATES[op]
    if constants[w].dtype != np.float32:
        raise _refuse(node, f"its weights are {constants[w].dtype}; float32 recurrent layers are unrolled")
    wv, rv = constants[w].astype(np.float32), constants[r].astype(np.float32)
    hidden = int(attrs.get("hidden_size", rv.shape[-1]))
    bv = constants[b].astype(np.float32) if b else np.zeros((len(dirs), 2 * gates * hidden), np.float32)
    hint = (node.name or op).replace("/", "_")
    seq = g.op("Transpose", [x], f"{hint}_x", perm=[1, 0, 2]) if layout else x  # [steps, batch, features]
    states = {}
    for state, given in (("h", init_h), ("c", init_c if op == "LSTM" else "")):
        if given and layout:
            given = g.op("Transpose", [given], f"{hint}_{state}0", perm=[1, 0, 2])
        states[state] = given
    ys, hs, cs = [], [], []
    for d, backwards in enumerate(dirs):
        # the whole sequence through the input weights at once: [steps, batch, gates * hidden]
        xw = g.op("MatMul", [seq, g.const(f"{hint}_W{d}", wv[d].T)], f"{hint}_xw{d}")
        wb = bv[d, : gates * hidden] + (bv[d, gates * hidden :] if op != "GRU" else 0)
        if op == "GRU":  # the recurrent bias of the new gate stays inside the reset product
            wb = wb + np.concatenate([bv[d, gates * hidden : (gates - 1) * hidden + gates * hidden], np.zeros(hidden)])
        xw = g.op("Add", [xw, g.const(f"{hint}_b{d}", wb.astype(np.float32))], f"{hint}_xwb{d}")
        h = _initial(states["h"], d, batch, hidden, f"{hint}_h{d}", g)
        c = _initial(states["c"], d, batch, hidden, f"{hint}_c{d}", g) if op == "LSTM" else None
        rt = g.const(f"{hint}_R{d}", rv[d].T)
        rbh = bv[d, gates * hidden + 2 * hidden :] if op == "GRU" else None
        pv = constants[peep].astype(np.float32)[d] if peep else None
        out = [None] * steps
        for t in reversed(range(steps)) if backwards else range(steps):
            xt = g.op("Gather", [xw, g.const(f"{hint}_t", np.array(t, np.int64))], f"{hint}_x{d}_{t}", axis=0)
            tag = f"{hint}_{d}_{t}"
            if op == "LSTM":
                h, c = _lstm_step(xt, h, c, rt, pv, hidden, tag, g)
            elif op == "GRU":
                h = _gru_step(xt, h, rt, rbh, hidden, int(attrs.get("linear_before_reset", 0)), tag, g)
            else:
                h = g.op("Tanh", [g.op("Add", [xt, g.op("MatMul", [h, rt], f"{tag}_hr")], f"{tag}_a")], f"{tag}_h")
            out[t] = h
        shape4 = g.const(f"{hint}_y_shape", np.array([1, 1, batch, hidden], np.int64))
        ys.append(g.op("Concat", [g.op("Reshape", [o, shape4], f"{hint}_y{d}") for o in out], f"{hint}_Y{d}", axis=0))
        shape3 = g.const(f"{hint}_s_shape", np.array([1, batch, hidden], np.int64))
        hs.append(g.op("Reshape", [h, shape3], f"{hint}_yh{d}"))
        if c is not None:
            cs.append(g.op("Reshape", [c, shape3], f"{hint}_yc{d}"))
    outputs = list(node.output) + [""] * (3 - len(node.output))
    for name, parts, axis, perm in (
        (outputs[0], ys, 1, [2, 0, 1, 3]),
        (outputs[1], hs, 0, [1, 0, 2]),
        (outputs[2] if op == "LSTM" else "", cs, 0, [1, 0, 2]),
    ):
        if not name:
            continue
        if layout:
            joined = g.op("Concat", parts, f"{hint}_join", axis=axis) if len(parts) > 1 else parts[0]
            g.op("Transpose", [joined], f"{hint}_out", output=name, perm=perm)
        elif len(parts) > 1:
            g.op("Concat", parts, f"{hint}_out", output=name, axis=axis)
        else:
            g.op("Identity", parts, f"{hint}_out", output=name)


def _initial(given: str, d: int, batch: int, hidden: int, hint: str, g: _NodeBuilder) -> str:
    """Direction ``d``'s [batch, hidden] initial state: from ``given`` [directions, batch, hidden], else zeros."""
    if not given:
        return g.const(hint, np.zeros((batch, hidden), np.float32))
    return g.op("Gather", [given, g.const(f"{hint}_d", np.array(d, np.int64))], hint, axis=0)


def _lstm_step(xt, h, c, rt, pv, hidden, tag, g):
    """One LSTM step (gates i, o, f, c in the ONNX order): the new (H, C)."""
    a = g.op("Add", [xt, g.op("MatMul", [h, rt], f"{tag}_hr")], f"{tag}_a")
    i, o, f, z = (_columns(g, a, k * hidden, (k + 1) * hidden, f"{tag}_g{k}") for k in range(4))
    if pv is not None:  # peepholes: i and f see C(t-1), o sees C(t)
        i = g.op("Add", [i, g.op("Mul", [c, g.const(f"{tag}_pi", pv[:hidden])], f"{tag}_pci")], f"{tag}_ip")
        f = g.op("Add", [f, g.op("Mul", [c, g.const(f"{tag}_pf", pv[2 * hidden :])], f"{tag}_pcf")], f"{tag}_fp")
    i, f, z = g.op("Sigmoid", [i], f"{tag}_i"), g.op("Sigmoid", [f], f"{tag}_f"), g.op("Tanh", [z], f"{tag}_z")
    c = g.op("Add", [g.op("Mul", [f, c], f"{tag}_fc"), g.op("Mul", [i, z], f"{tag}_iz")], f"{tag}_c")
    if pv is not None:
        o = g.op("Add", [o, g.op("Mul", [c, g.const(f"{tag}_po", pv[hidden : 2 * hidden])], f"{tag}_pco")], f"{tag}_op")
    o = g.op("Sigmoid", [o], f"{tag}_o")
    return g.op("Mul", [o, g.op("Tanh", [c], f"{tag}_tc")], f"{tag}_h"), c


def _gru_step(xt, h, rt, rbh, hidden, linear_before_reset, tag, g):
    """One GRU step (gates z, r, h in the ONNX order): the new H. ``xt`` carries both biases of z and r
    and the input bias of h; ``rbh`` is the recurrent bias of h."""
    hr = g.op("MatMul", [h, rt], f"{tag}_hr")  # [batch, 3 * hidden]
    xz, xr, xh = (_columns(g, xt, k * hidden, (k + 1) * hidden, f"{tag}_x{k}") for k in range(3))
    hz, hrr = (_columns(g, hr, k * hidden, (k + 1) * hidden, f"{tag}_h{k}") for k in range(2))
    z = g.op("Sigmoid", [g.op("Add", [xz, hz], f"{tag}_zs")], f"{tag}_z")
    r = g.op("Sigmoid", [g.op("Add", [xr, hrr], f"{tag}_rs")], f"{tag}_r")
    if linear_before_reset:
        hh = _columns(g, hr, 2 * hidden, 3 * hidden, f"{tag}_h2")
        hh = g.op("Add", [hh, g.const(f"{tag}_rbh", rbh.astype(np.float32))], f"{tag}_hb")
        n = g.op("Add", [xh, g.op("Mul", [r, hh], f"{tag}_rh")], f"{tag}_ns")
    else:
        rh = g.op(
            "MatMul",
            [g.op("Mul", [r, h], f"{tag}_rh"), _columns(g, rt, 2 * hidden, 3 * hidden, f"{tag}_rt")],
            f"{tag}_rhr",
        )
        n = g.op(
            "Add", [g.op("Add", [xh, rh], f"{tag}_ns0"), g.const(f"{tag}_rbh", rbh.astype(np.float32))], f"{tag}_ns"
        )
    n = g.op("Tanh", [n], f"{tag}_n")
    # H = (1 - z) * n + z * H(t-1) = n + z * (H(t-1) - n)
    return g.op("Add", [n, g.op("Mul", [z, g.op("Sub", [h, n], f"{tag}_d")], f"{tag}_zd")], f"{tag}_h")
