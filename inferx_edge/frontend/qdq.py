"""QDQ ONNX models (onnxruntime ``quantize_static``, PyTorch PT2E export): read the model's own
quantization and give TVM the float graph.

TVM imports a QDQ model as dequantize -> float op (it computes in float32). Instead:

- every ``DequantizeLinear`` of an int8 weight initializer becomes a float initializer (the dequantized
  weight), and the int8 values, per-channel scales and axis are kept (:attr:`QDQInfo.weights`);
- every activation ``QuantizeLinear -> DequantizeLinear`` pair is removed (its consumers read the float
  tensor); the scale and zero point seen at the input of each Conv / Gemm / MatMul with a quantized
  weight are kept (:attr:`QDQInfo.activations`, by the weight's name).

``build --precision int8`` then rewrites exactly those ops to int8 x int8 -> int32 with the model's own
weights and scales (no calibration). Other QDQ pairs (around Add, pooling, outputs) are dropped: those
ops compute in float, as they do in our own int8 variants. Activations quantized asymmetrically
(uint8, or a nonzero zero point) are re-expressed as symmetric int8 over the same range, and said so
in :attr:`QDQInfo.notes`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from inferx_edge.errors import ModelError

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
_MATMUL_OPS = ("Conv", "Gemm", "MatMul")


@dataclass
class QDQInfo:
    #: float weight name -> (int8 values, scales (scalar or per channel), channel axis)
    weights: dict[str, tuple[np.ndarray, np.ndarray, int]] = field(default_factory=dict)
    #: weight name of a Conv/Gemm/MatMul -> symmetric int8 threshold (amax) of its input activation
    activations: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def is_qdq(model) -> bool:
    return any(n.op_type in QDQ_OPS and n.domain in ("", "ai.onnx") for n in model.graph.node)


def _const(name: str, inits: dict[str, np.ndarray], consts: dict[str, np.ndarray]) -> np.ndarray | None:
    return inits.get(name, consts.get(name))


def _range_amax(scale: float, zero_point: int, dtype) -> tuple[float, bool]:
    """Symmetric threshold covering a (scale, zero point) range; whether that changed the grid."""
    info = np.iinfo(dtype)
    if dtype == np.int8 and zero_point == 0:
        return 127.0 * scale, False
    lo, hi = (info.min - zero_point) * scale, (info.max - zero_point) * scale
    return float(max(abs(lo), abs(hi))), True


def strip_qdq(model):
    """Return (float ONNX model, :class:`QDQInfo`) for a QDQ model. ``model`` is not modified."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    consts = {}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    producer = {o: n for n in graph.node for o in n.output}
    info = QDQInfo()
    drop, new_inits, rename = set(), {}, {}

    def qparams(node):
        scale = _const(node.input[1], inits, consts)
        zp = _const(node.input[2], inits, consts) if len(node.input) > 2 and node.input[2] else None
        if scale is None:
            raise ModelError(f"{node.op_type} '{node.name}': scale '{node.input[1]}' is not a constant")
        return scale, zp

    for n in graph.node:
        if n.op_type != "DequantizeLinear":
            continue
        src = n.input[0]
        scale, zp = qparams(n)
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        if src in inits:  # a quantized constant (weight or bias): store it dequantized
            q = inits[src]
            zpa = np.zeros_like(q) if zp is None else zp
            shape = [1] * q.ndim
            if np.ndim(scale) == 1 and q.ndim > 0:
                shape[axis] = -1
            deq = (q.astype(np.float64) - np.reshape(zpa, shape if np.ndim(zpa) == 1 else ())).astype(np.float64)
            deq = (deq * np.reshape(scale.astype(np.float64), shape if np.ndim(scale) == 1 else ())).astype(np.float32)
            # a plain identifier, so the importer keeps it as the Relax parameter's name
            name = re.sub(r"\W+", "_", n.output[0]).strip("_")
            if name != n.output[0]:
                rename[n.output[0]] = name
            new_inits[name] = deq
            if q.dtype == np.int8 and not np.any(zpa):
                info.weights[name] = (q, np.asarray(scale, np.float32), axis)
            drop.add(id(n))
            continue
        q_node = producer.get(src)
        if q_node is None or q_node.op_type != "QuantizeLinear":
            raise ModelError(f"DequantizeLinear '{n.name}' reads '{src}', which no QuantizeLinear produces")
        rename[n.output[0]] = q_node.input[0]
        drop.add(id(n))
        drop.add(id(q_node))
        qscale, qzp = qparams(q_node)
        if np.ndim(qscale) != 0:
            raise ModelError(f"QuantizeLinear '{q_node.name}': per-channel activation scales are not supported")

    # the activation thresholds at the inputs of the ops whose weights are quantized
    for n in graph.node:
        weight = rename.get(n.input[1], n.input[1]) if len(n.input) > 1 else None
        if n.op_type not in _MATMUL_OPS or weight not in info.weights:
            continue
        dq = producer.get(n.input[0])
        if dq is None or dq.op_type != "DequantizeLinear" or n.input[0] not in rename:
            continue
        scale, zp = qparams(dq)
        dtype = (zp.dtype if zp is not None else np.dtype(np.uint8)).type
        amax, changed = _range_amax(float(scale), int(zp) if zp is not None else 0, dtype)
        info.activations[weight] = amax
        if changed:
            info.notes.append(
                f"{n.op_type} '{n.name or n.output[0]}': input quantized as {np.dtype(dtype).name} with zero point "
                f"{0 if zp is None else int(zp)}; computed as symmetric int8 over the same range (amax {amax:.4g})"
            )

    def resolve(name: str) -> str:
        seen = set()
        while name in rename and name not in seen:
            seen.add(name)
            name = rename[name]
        return name

    kept = [n for n in graph.node if id(n) not in drop]
    for n in kept:
        for i, name in enumerate(n.input):
            n.input[i] = resolve(name)
    outputs = {o.name for o in graph.output}
    for out in outputs & set(rename):  # a graph output that was a DequantizeLinear: keep its name
        kept.append(helper.make_node("Identity", [resolve(out)], [out], name=f"{out}_qdq_identity"))
    del graph.node[:]
    graph.node.extend(kept)
    used = {i for n in graph.node for i in n.input}
    remaining = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(remaining)
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in new_inits.items())
    unmatched = sorted(set(info.weights) - set(info.activations))
    for w in unmatched:  # an int8 weight whose op input is not quantized: the op stays float
        del info.weights[w]
        info.notes.append(f"weight '{w}' is int8 but its op's input is not quantized: that op computes in float")
    return model, info
