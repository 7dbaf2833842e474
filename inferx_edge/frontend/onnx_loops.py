"""ONNX control flow made static: ``Loop`` nodes with a constant trip count unrolled into the graph (TVM
has no ``Loop`` converter), ``If`` nodes with a constant condition replaced by their branch.

The TorchScript-based exporter writes a Python loop over a list as a ``Loop`` even when its length is
fixed: MViTv2's pooling attention splits its tokens through one (trip count 1, a sequence of slices
carried through ``SequenceInsert``). With the input shapes pinned the trip count is a constant, and the
body can be copied once per iteration: the iteration number becomes a constant, the loop-carried values
are threaded from one copy to the next, and each scan output is the copies' values stacked along a new
first axis (ONNX's definition). Unrolled only when the loop provably runs all its iterations: the
condition input is absent or a constant true and the body's condition output is a constant true or the
incoming condition (through ``Identity``). Nested subgraphs in the body (an ``If`` or ``Loop`` inside)
and trip counts above :data:`MAX_TRIPS` are left alone: the frontend then names the ``Loop`` it cannot
import.

The sequences such loops build are then resolved (:func:`resolve_sequences`): a sequence whose
elements are known names (``SequenceEmpty`` / ``SequenceConstruct`` / ``SequenceInsert`` at a constant
position) is a list at import time, so ``SequenceAt`` at a constant index is that element,
``SequenceLength`` a constant and ``ConcatFromSequence`` a ``Concat``; the frontend's sequence values
carry no static shapes, which every ``Shape`` downstream needs.

An ``If`` whose condition folded to a constant (MViTv2's pooled skip connection squeezes an axis only
when it has size 1: known once shapes are pinned) is its chosen branch's nodes (:func:`inline_constant_ifs`):
left in, its outputs have no static shape and nothing downstream of it folds.
"""

from __future__ import annotations

import numpy as np

from inferx_edge.frontend.onnx_pads import _constants

#: The most iterations a loop is unrolled to (each copies the body into the graph).
MAX_TRIPS = 64


def graph_references(node) -> set[str]:
    """Every value name the subgraphs of ``node`` read (their own values included): what must stay
    defined in the enclosing graph while ``node`` is in it."""
    from onnx import AttributeProto

    names: set[str] = set()
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            graphs = [attr.g]
        elif attr.type == AttributeProto.GRAPHS:
            graphs = list(attr.graphs)
        else:
            continue
        for g in graphs:
            for inner in g.node:
                names.update(i for i in inner.input if i)
                names |= graph_references(inner)
            names.update(o.name for o in g.output)
    return names


def _always_true(body, constants: dict[str, np.ndarray]) -> bool:
    """Whether the body's condition output is true on every iteration."""
    from onnx import numpy_helper

    producers = {o: n for n in body.node for o in n.output}
    name = body.output[0].name
    cond_in = body.input[1].name if len(body.input) > 1 else None
    for _ in range(len(body.node) + 1):
        if name == cond_in:
            return True
        node = producers.get(name)
        if node is None:
            value = constants.get(name)
            return value is not None and value.size == 1 and bool(value.reshape(()))
        if node.op_type == "Identity":
            name = node.input[0]
        elif node.op_type == "Constant" and node.attribute[0].name == "value":
            value = numpy_helper.to_array(node.attribute[0].t)
            return value.size == 1 and bool(value.reshape(()))
        else:
            return False
    return False


def _unrollable(node, constants) -> tuple[int, object] | None:
    from onnx import AttributeProto, helper

    if node.domain not in ("", "ai.onnx") or not node.input or not node.input[0]:
        return None
    trips = constants.get(node.input[0])
    if trips is None or trips.size != 1 or not 1 <= int(trips.reshape(())) <= MAX_TRIPS:
        return None
    cond = node.input[1] if len(node.input) > 1 else ""
    if cond and (cond not in constants or not bool(constants[cond].reshape(()))):
        return None
    body = helper.get_attribute_value(next(a for a in node.attribute if a.name == "body"))
    nested = any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for n in body.node for a in n.attribute)
    if nested or not _always_true(body, constants):
        return None
    return int(trips.reshape(())), body


def _copies(node, trips: int, body, uid: str) -> tuple[list, dict[str, str]]:
    """The unrolled nodes, and ``{Loop output: the name now holding its value}``."""
    from onnx import helper, numpy_helper

    carried = list(node.input[2:])
    n_carried = len(carried)
    body_in = [i.name for i in body.input]
    body_out = [o.name for o in body.output]
    nodes, scans = [], [[] for _ in body_out[1 + n_carried :]]
    true = f"{uid}_true"
    nodes.append(helper.make_node("Constant", [], [true], value=numpy_helper.from_array(np.array(True), true)))
    for it in range(trips):
        rename = {}
        iteration = f"{uid}_it{it}"
        nodes.append(
            helper.make_node(
                "Constant", [], [iteration], value=numpy_helper.from_array(np.array(it, np.int64), iteration)
            )
        )
        rename[body_in[0]] = iteration
        if len(body_in) > 1:
            rename[body_in[1]] = true
        for name, value in zip(body_in[2:], carried, strict=True):
            rename[name] = value
        nodes += _copy_nodes(body.node, rename, f"{uid}_it{it}")
        carried = [rename.get(o, o) for o in body_out[1 : 1 + n_carried]]
        for parts, o in zip(scans, body_out[1 + n_carried :], strict=True):
            parts.append(rename.get(o, o))
    results = dict(zip(node.output[:n_carried], carried, strict=False))
    axis = f"{uid}_axis0"
    nodes.append(helper.make_node("Constant", [], [axis], value=numpy_helper.from_array(np.array([0], np.int64), axis)))
    for out, parts in zip(node.output[n_carried:], scans, strict=False):
        if not out:
            continue
        stacked = [f"{p}_{uid}_stacked" for p in parts]
        nodes += [helper.make_node("Unsqueeze", [p, axis], [s]) for p, s in zip(parts, stacked, strict=True)]
        nodes.append(helper.make_node("Concat", stacked, [out], axis=0))
    return nodes, {k: v for k, v in results.items() if k}


def _copy_nodes(graph_nodes, rename: dict[str, str], prefix: str) -> list:
    """Copies of ``graph_nodes`` reading through ``rename`` (names from outside stay), their outputs
    renamed ``<prefix>_<name>`` (recorded in ``rename``)."""
    from onnx import helper

    copies = []
    for b in graph_nodes:
        copy = helper.make_node(b.op_type, [rename.get(x, x) if x else "" for x in b.input], [], domain=b.domain)
        copy.attribute.extend(b.attribute)
        for o in b.output:
            rename[o] = f"{prefix}_{o}" if o else ""
        copy.output.extend(rename[o] for o in b.output)
        copy.name = f"{prefix}_{b.name}" if b.name else ""
        copies.append(copy)
    return copies


def _expand_nodes(model, op_type: str, expand):
    """``(model, count)``: each ``op_type`` node for which ``expand(index, node, constants)`` returns
    ``(nodes, {output: name now holding it})`` replaced by those nodes, its readers reading the new names
    (graph outputs through an ``Identity``); ``model`` changed in place. A model without ``op_type``
    nodes is returned as it is (this runs on every fold round of every import)."""
    from onnx import helper

    if not any(n.op_type == op_type for n in model.graph.node):
        return model, 0
    constants = _constants(model, max_elements=16)
    graph_outputs = {o.name for o in model.graph.output}
    nodes, replaced, count = [], {}, 0
    for i, node in enumerate(model.graph.node):
        if replaced:
            node.input[:] = [replaced.get(x, x) for x in node.input]
        found = expand(i, node, constants) if node.op_type == op_type else None
        if found is None:
            nodes.append(node)
            continue
        nodes += found[0]
        for out, value in found[1].items():
            if out in graph_outputs:
                nodes.append(helper.make_node("Identity", [value], [out]))
            else:
                replaced[out] = value
        count += 1
    if count:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return model, count


def unroll_loops(model):
    """``(model, count)``: every ``Loop`` the module docstring describes replaced by copies of its body
    (``model`` is changed in place and returned)."""

    def expand(i, node, constants):
        found = _unrollable(node, constants)
        return None if found is None else _copies(node, *found, uid=f"loop{i}")

    return _expand_nodes(model, "Loop", expand)


def _index(constants, name, default=None) -> int | None:
    if not name:
        return default
    value = constants.get(name)
    return None if value is None or value.size != 1 else int(value.reshape(()))


def resolve_sequences(model):
    """``(model, count)``: the sequence ops the module docstring describes replaced by what they
    select (``model`` changed in place); sequences with an unknown element or position stay."""
    from onnx import helper, numpy_helper

    if not any(n.op_type in ("SequenceEmpty", "SequenceConstruct") for n in model.graph.node):
        return model, 0
    constants = _constants(model, max_elements=16)
    seqs: dict[str, list[str]] = {}
    alias: dict[str, str] = {}
    nodes, count = [], 0
    for node in model.graph.node:
        node.input[:] = [alias.get(x, x) for x in node.input]
        op, ins = node.op_type, list(node.input)
        new: list | None = None
        if op == "SequenceEmpty":
            seqs[node.output[0]], new = [], []
        elif op == "SequenceConstruct":
            seqs[node.output[0]], new = list(ins), []
        elif op == "SequenceInsert" and ins[0] in seqs:
            items = list(seqs[ins[0]])
            pos = _index(constants, ins[2] if len(ins) > 2 else "", len(items))
            if pos is not None and -len(items) <= pos <= len(items):
                items.insert(pos if pos >= 0 else pos + len(items), ins[1])
                seqs[node.output[0]], new = items, []
        elif op == "SequenceAt" and ins[0] in seqs:
            items, pos = seqs[ins[0]], _index(constants, ins[1])
            if pos is not None and -len(items) <= pos < len(items):
                alias[node.output[0]], new = items[pos], []
        elif op == "SequenceLength" and ins[0] in seqs:
            value = numpy_helper.from_array(np.array(len(seqs[ins[0]]), np.int64), node.output[0])
            new = [helper.make_node("Constant", [], [node.output[0]], value=value)]
        elif op == "ConcatFromSequence" and ins[0] in seqs and seqs[ins[0]]:
            attrs = {a.name: a.i for a in node.attribute}
            axis, items = attrs.get("axis", 0), seqs[ins[0]]
            if attrs.get("new_axis", 0):
                at = f"{node.output[0]}_axis"
                value = numpy_helper.from_array(np.array([axis], np.int64), at)
                new = [helper.make_node("Constant", [], [at], value=value)]
                new += [helper.make_node("Unsqueeze", [t, at], [f"{t}_{at}"]) for t in items]
                items = [f"{t}_{at}" for t in items]
            new = (new or []) + [helper.make_node("Concat", items, [node.output[0]], axis=axis)]
        if new is None:
            nodes.append(node)
        else:
            nodes += new
            count += 1
    live = {i for n in nodes for i in n.input} | {o.name for o in model.graph.output}
    live |= {r for n in nodes for r in graph_references(n)}
    if any(name in live for name in seqs):  # a sequence still read as a sequence: every sequence op stays
        return model, 0  # (readers of a resolved SequenceAt read its element directly: the same value)
    if count:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return model, count


def inline_constant_ifs(model):
    """``(model, count)``: every ``If`` with a constant condition replaced by its chosen branch's nodes
    (renamed apart; ``model`` changed in place). Branches with subgraphs of their own stay."""
    from onnx import AttributeProto, helper

    def expand(i, node, constants):
        cond = constants.get(node.input[0]) if node.input else None
        if cond is None or cond.size != 1 or node.domain not in ("", "ai.onnx"):
            return None
        branch_name = "then_branch" if bool(cond.reshape(())) else "else_branch"
        branch = helper.get_attribute_value(next(a for a in node.attribute if a.name == branch_name))
        if any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for n in branch.node for a in n.attribute):
            return None
        rename: dict[str, str] = {}
        copies = _copy_nodes(branch.node, rename, f"if{i}")
        return copies, dict(zip(node.output, (rename.get(o.name, o.name) for o in branch.output), strict=True))

    return _expand_nodes(model, "If", expand)


def static_control_flow(model):
    """``(model, count)``: :func:`unroll_loops`, then :func:`resolve_sequences`, then
    :func:`inline_constant_ifs` (``model`` changed in place); ``count`` is what they rewrote."""
    model, unrolled = unroll_loops(model)
    model, resolved = resolve_sequences(model)
    model, inlined = inline_constant_ifs(model)
    return model, unrolled + resolved + inlined
