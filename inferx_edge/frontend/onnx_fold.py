"""Shape-subgraph folding for ONNX models whose input shapes are pinned.

Exporters write dynamic-batch graphs that compute reshape targets at run time (``Shape -> Gather ->
Concat -> Reshape`` in channel shuffles, detection heads, attention masks). With the input shapes fixed
those values are constants, but TVM's ONNX frontend imports ``Shape`` of a static tensor as a Relax shape
value and then fails on ``Gather``/``ConstantOfShape`` over it. This pass pins the input dims, infers
shapes, replaces ``Shape``/``Size`` of statically shaped tensors by constants and evaluates every node
whose inputs are all small constants with ONNX's reference implementation, so the frontend sees plain
constants; ``Loop`` and ``If`` nodes whose trip count or condition became a constant are made static
(:mod:`~inferx_edge.frontend.onnx_loops`). Weights (large initializers) are never folded or copied.
"""

from __future__ import annotations

import numpy as np

from inferx_edge.frontend.onnx_loops import graph_references, static_control_flow

#: Largest tensor (elements) a folded node may produce or read; shape arithmetic is far below this.
FOLD_LIMIT = 1 << 16
#: Ops whose output is not a function of their inputs alone.
_NONDETERMINISTIC = {
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
}


def _static_shapes(model) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    g = model.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if not vi.type.HasField("tensor_type") or not t.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        if all(d is not None for d in dims):
            shapes[vi.name] = tuple(int(d) for d in dims)
    return shapes


def _evaluate(node, values: dict[str, np.ndarray], opset) -> list[np.ndarray] | None:
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    inputs = [i for i in node.input if i]
    if node.op_type == "GatherElements":  # onnx.reference's version mis-shapes a broadcast-free gather
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        return [np.take_along_axis(values[inputs[0]], values[inputs[1]].astype(np.int64), axis=axis)]
    graph = helper.make_graph(
        [node],
        "fold",
        [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(values[n].dtype), values[n].shape)
            for n in inputs
        ],
        [helper.make_value_info(o, helper.TypeProto()) for o in node.output if o],
    )
    try:
        ref = ReferenceEvaluator(helper.make_model(graph, opset_imports=opset))
        return [np.asarray(v) for v in ref.run(None, {n: values[n] for n in inputs})]
    except Exception:  # an op the reference cannot run: leave the node to the frontend
        return None


def _pin_inputs(model, shapes: dict[str, tuple[int, ...]]) -> None:
    for inp in model.graph.input:
        if inp.name in shapes and inp.type.HasField("tensor_type"):
            dims = inp.type.tensor_type.shape.dim
            if len(dims) == len(shapes[inp.name]):
                for d, v in zip(dims, shapes[inp.name], strict=True):
                    d.Clear()
                    d.dim_value = int(v)


def fold_shape_subgraphs(model, shapes: dict[str, tuple[int, ...]], max_rounds: int = 16):
    """A copy of ``model`` with its inputs pinned to ``shapes`` and its shape computations folded.

    Folding and shape inference alternate until nothing more folds: a reshape whose target became a
    constant gives its output a static shape, which lets the next ``Shape`` downstream fold.
    Returns ``(model, folded_count)``; the original is left unchanged. A model whose shapes cannot be
    inferred is returned pinned but unfolded (the frontend then reports what it cannot import).
    """
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    _pin_inputs(m, shapes)
    total = 0
    for _ in range(max_rounds):
        m, rewritten = static_control_flow(m)  # loops / ifs the last round gave constant counts / conditions
        m, n = _fold_round(m)
        total += n + rewritten
        if not n and not rewritten:
            break
    return m, total


def _fold_round(m):
    import onnx
    from onnx import helper, numpy_helper

    del m.graph.value_info[:]
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:
        return m, 0
    static = _static_shapes(m)
    values: dict[str, np.ndarray] = {}
    for init in m.graph.initializer:
        if np.prod(init.dims, dtype=np.int64) <= FOLD_LIMIT:
            values[init.name] = numpy_helper.to_array(init)
    opset = list(m.opset_import)
    keep, folded = [], 0
    for node in m.graph.node:
        out = None
        if node.domain not in ("", "ai.onnx") or node.op_type in _NONDETERMINISTIC:
            pass
        elif any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            pass
        elif node.op_type == "Shape" and node.input[0] in static:
            dims = np.array(static[node.input[0]], np.int64)
            attrs = {a.name: a.i for a in node.attribute}
            out = [dims[attrs.get("start", 0) : attrs.get("end", len(dims))]]
        elif node.op_type == "Size" and node.input[0] in static:
            out = [np.array(int(np.prod(static[node.input[0]], dtype=np.int64)), np.int64)]
        elif node.op_type == "Constant":
            out = _evaluate(node, values, opset)
        elif node.input and all((not i) or i in values for i in node.input):
            out = _evaluate(node, values, opset)
        if (
            out is not None
            and len(out) == len([o for o in node.output if o])
            and all(v.size <= FOLD_LIMIT for v in out)
        ):
            for name, v in zip([o for o in node.output if o], out, strict=True):
                values[name] = v
            folded += node.op_type != "Constant"
            continue
        keep.append(node)
    if not folded and not any(
        values.get(i.name) is not None and values[i.name].dtype.kind in "iu" for i in m.graph.initializer
    ):
        return m, 0
    # folded values become Constant nodes, not initializers: the frontend turns initializers into
    # function parameters, and several of its converters (Expand, Tile, ...) need the value itself.
    # Small integer initializers (shapes, axes, indices; never weights) move to Constant nodes too.
    vectors = _vector_slice_bounds(keep, values)
    needed = {i for n in keep for i in n.input} | {o.name for o in m.graph.output}
    needed |= {r for n in keep for r in graph_references(n)}  # what Loop / If bodies read from outside
    shape_like = [
        init
        for init in m.graph.initializer
        if init.name in needed and init.name in values and values[init.name].dtype.kind in "iu"
    ]
    for init in shape_like:
        m.graph.initializer.remove(init)
    names = {init.name for init in shape_like}
    for inp in [i for i in m.graph.input if i.name in names]:  # initializers listed as inputs (opset < 9 style)
        m.graph.input.remove(inp)
    produced = {o for n in m.graph.node for o in n.output} | names | vectors
    constants = [
        helper.make_node("Constant", [], [name], value=numpy_helper.from_array(values[name], name))
        for name in sorted((needed & produced) - {o for n in keep for o in n.output})
        if name in values
    ]
    del m.graph.node[:]
    m.graph.node.extend(constants + [n for n in keep if n.op_type != "Constant" or n.output[0] in needed])
    return m, folded


def _vector_slice_bounds(nodes, values: dict[str, np.ndarray]) -> set[str]:
    """Constant ``Slice`` starts / ends / axes / steps that are 0-d (a loop body's ``Gather`` of its
    iteration number writes them so) read through a 1-D copy, whose names are returned: the frontend
    takes only lists there."""
    made = set()
    for node in nodes:
        if node.op_type != "Slice":
            continue
        for k in range(1, min(len(node.input), 5)):
            name = node.input[k]
            if name and name in values and values[name].ndim == 0:
                vector = f"{name}_as_1d"
                values[vector] = values[name].reshape(1)
                node.input[k] = vector
                made.add(vector)
    return made
