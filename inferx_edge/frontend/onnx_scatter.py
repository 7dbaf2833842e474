"""ONNX ``ScatterND`` into a box (a slice assignment) rewritten as slices and concatenations before import.

Exporters write ``x[:, :, 1:, 1:] = y`` and ``x[..., a:b] += y`` as a ``ScatterND`` whose indices are a
broadcast grid of ranges: ``Concat(Unsqueeze(Expand(range_j, shape)) ..., axis=-1)``. Once input shapes
are pinned those indices are constants, and folding them materializes an int64 tensor of
``prod(box) x rank`` elements (MViTv2's relative-position update: 630 MB per layer, 11.7 GB over the
network, before the build ran out of memory). Here the grid is evaluated lazily (each broadcast as its
small base array and a shape, never expanded), and where every index component runs over a contiguous
range along its own axis the scatter becomes ``Concat``s of the kept ``Slice``s of the data around the
updates (``reduction`` add / mul / max / min: the updates combined with the box's slice first): only
injective ops, which fuse with their neighbours, and the index subgraph, now unused, is dropped.
Scatters with other indices are left to the frontend as they are.
"""

from __future__ import annotations

import numpy as np

from inferx_edge.frontend.onnx_loops import graph_references
from inferx_edge.frontend.onnx_pads import _attrs, _constants, _NodeBuilder, _pinned, _text

#: largest base array (elements) the lazy evaluation keeps; index grids' bases are one range each
BASE_LIMIT = 1 << 20
#: ScatterND reductions and the elementwise op combining the box's slice with the updates
_REDUCE = {"add": "Add", "mul": "Mul", "max": "Max", "min": "Min"}
_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}


class _Lazy:
    """``np.broadcast_to(base, shape)`` without the copy: ``base`` has ``len(shape)`` axes, each of
    extent 1 or the shape's."""

    def __init__(self, base: np.ndarray, shape) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.base = base.reshape((1,) * (len(self.shape) - base.ndim) + base.shape)

    def flat(self) -> np.ndarray:
        """The values, broadcast and flattened (for small tensors: shapes, axes, one grid line)."""
        return np.broadcast_to(self.base, self.shape).reshape(-1)


#: producers followed back from a scatter's indices at most (an index grid is a few ops deep; this
#: stops the walk in a long chain of adds, a residual stream)
MAX_DEPTH = 32


def _lazy(name: str, producers: dict, constants: dict, memo: dict | None = None, depth: int = 0) -> _Lazy | None:
    """The value of ``name`` as a :class:`_Lazy`, when it is a constant or broadcasts / unsqueezes /
    casts / adds of constants; else None."""
    memo = {} if memo is None else memo
    if depth > MAX_DEPTH:
        return None
    if name not in memo:
        memo[name] = None  # a cycle (invalid graph) ends here
        memo[name] = _evaluate(name, producers, constants, memo, depth)
    return memo[name]


def _evaluate(name: str, producers: dict, constants: dict, memo: dict, depth: int) -> _Lazy | None:
    if name in constants:
        value = np.asarray(constants[name])
        return _Lazy(value, value.shape) if value.size <= BASE_LIMIT else None
    node = producers.get(name)
    if node is None or node.op_type not in ("Identity", "Cast", "Expand", "Unsqueeze", *_BINARY):
        return None
    args = [_lazy(i, producers, constants, memo, depth + 1) if i else None for i in node.input]
    op, attrs = node.op_type, _attrs(node)
    if not args or args[0] is None:
        return None
    x = args[0]
    if op == "Identity":
        return x
    if op == "Cast":
        from onnx import helper

        return _Lazy(x.base.astype(helper.tensor_dtype_to_np_dtype(attrs["to"])), x.shape)
    if op == "Expand" and len(args) == 2 and args[1] is not None:
        target = tuple(int(d) for d in args[1].flat())
        return _Lazy(x.base, np.broadcast_shapes(x.shape, target))
    if op == "Unsqueeze":
        axes = attrs.get("axes")
        if axes is None:
            if len(args) < 2 or args[1] is None:
                return None
            axes = args[1].flat().tolist()
        rank = len(x.shape) + len(axes)
        axes = sorted(int(a) % rank for a in axes)
        shape, base = list(x.shape), x.base
        for a in axes:
            shape.insert(a, 1)
            base = np.expand_dims(base, a)
        return _Lazy(base, shape)
    if op in _BINARY and len(args) == 2 and args[1] is not None:
        y = args[1]
        shape = np.broadcast_shapes(x.shape, y.shape)
        rank = len(shape)
        a = x.base.reshape((1,) * (rank - x.base.ndim) + x.base.shape)
        b = y.base.reshape((1,) * (rank - y.base.ndim) + y.base.shape)
        if int(np.prod(np.broadcast_shapes(a.shape, b.shape))) > BASE_LIMIT:
            return None
        return _Lazy(_BINARY[op](a, b), shape)
    return None


def _components(indices: str, producers: dict, constants: dict) -> list[_Lazy] | None:
    """The index components of a ScatterND's ``indices`` (one lazy grid per indexed axis), from the
    lazy value itself or from the pieces of a ``Concat`` along its last axis."""
    memo: dict = {}
    whole = _lazy(indices, producers, constants, memo)
    pieces = [whole] if whole is not None else None
    node = producers.get(indices)
    if pieces is None and node is not None and node.op_type == "Concat":
        pieces = [_lazy(i, producers, constants, memo) for i in node.input]
        rank = len(pieces[0].shape) if pieces and pieces[0] is not None else 0
        if (
            any(p is None or len(p.shape) != rank for p in pieces)
            or int(_attrs(node)["axis"]) % max(rank, 1) != rank - 1
        ):
            return None
    if not pieces:
        return None
    comps = []
    for p in pieces:
        for i in range(p.shape[-1]):
            comps.append(_Lazy(p.base[..., min(i, p.base.shape[-1] - 1)], p.shape[:-1]))
    return comps


def _box(comps: list[_Lazy], dims) -> list[tuple[int, int]] | None:
    """``[(start, extent)]`` per indexed axis when component ``j`` runs over ``start .. start+extent-1``
    along grid axis ``j`` and is constant along the others (a slice's index grid); else None."""
    if not comps or len(comps) > len(dims) or any(len(c.shape) != len(comps) for c in comps):
        return None
    box = []
    for j, c in enumerate(comps):
        base = c.base
        for a in range(len(comps)):
            if a != j and base.shape[a] != 1:  # a materialized grid (a folded constant): constant along a?
                first = base.take([0], axis=a)
                if not np.array_equal(base, np.broadcast_to(first, base.shape)):
                    return None
                base = first
        extent = c.shape[j]
        if extent == 0:
            return None
        values = _Lazy(base.reshape(-1), (extent,)).flat().astype(np.int64)
        values = np.where(values < 0, values + dims[j], values)
        start = int(values[0])
        if not np.array_equal(values, start + np.arange(extent)) or start < 0 or start + extent > dims[j]:
            return None
        box.append((start, extent))
    return box


def box_scatters(model, shapes: dict[str, tuple[int, ...]]):
    """``(model, count)``: ``model`` with each ScatterND into a box as slices and concatenations (see the
    module's docstring), and the nodes only its indices needed removed; ``model`` itself when none."""
    if not any(_is_scatter(n) for n in model.graph.node):
        return model, 0
    pinned = _pinned(model, shapes)
    if pinned is None:
        return model, 0
    known = pinned[1]
    constants = _constants(model, max_elements=BASE_LIMIT)  # larger values are never read
    producers = {o: n for n in model.graph.node for o in n.output}
    g = _NodeBuilder(model)
    count = 0
    for node in model.graph.node:
        dims = known.get(node.input[0]) if _is_scatter(node) else None
        reduction = _text(_attrs(node).get("reduction", b"none")) if dims else None
        comps = _components(node.input[1], producers, constants) if reduction in ("none", *_REDUCE) else None
        box = _box(comps, dims) if comps else None
        if box is None:
            g.keep(node)
            continue
        _write_box(g, node, dims, box, reduction)
        count += 1
    if not count:
        return model, 0
    return _drop_unused(g.model(model)), count


def _is_scatter(node) -> bool:
    return node.op_type == "ScatterND" and node.domain in ("", "ai.onnx")


def _write_box(g: _NodeBuilder, node, dims, box: list[tuple[int, int]], reduction: str) -> None:
    """The nodes computing ``node``'s output: the updates (combined with the box's slice of the data for
    a reduction), then along each indexed axis from the last, the data before and after the box
    concatenated around it."""
    data, updates, out = node.input[0], node.input[2], node.output[0]
    hint = (node.name or "scatter").replace("/", "_")

    def data_slice(starts: list[int], ends: list[int], tag: str) -> str:
        consts = [g.const(f"{hint}_{tag}{k}", np.array(v, np.int64)) for k, v in (("s", starts), ("e", ends))]
        axes = g.const(f"{hint}_{tag}a", np.arange(len(starts), dtype=np.int64))
        return g.op("Slice", [data, *consts, axes], f"{hint}_{tag}")

    starts = [s for s, _ in box]
    ends = [s + n for s, n in box]
    concat_axes = [j for j, (s, n) in enumerate(box) if s > 0 or s + n < dims[j]]
    cur = updates
    if reduction != "none":
        last = not concat_axes
        cur = g.op(_REDUCE[reduction], [data_slice(starts, ends, "box"), updates], hint, output=out if last else None)
    elif not concat_axes:
        g.op("Identity", [updates], hint, output=out)
    for j in reversed(concat_axes):
        s, n = box[j]
        parts = [cur]
        if s > 0:
            parts.insert(0, data_slice(starts[:j] + [0], ends[:j] + [s], f"before{j}_"))
        if s + n < dims[j]:
            parts.append(data_slice(starts[:j] + [s + n], ends[:j] + [dims[j]], f"after{j}_"))
        cur = g.op("Concat", parts, f"{hint}_axis{j}", output=out if j == concat_axes[0] else None, axis=j)


def _drop_unused(model):
    """``model`` without the nodes no graph output depends on (the rewritten scatters' index grids)."""
    needed = {o.name for o in model.graph.output}
    keep = []
    for node in reversed(model.graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
            needed |= graph_references(node)
    if len(keep) == len(model.graph.node):
        return model
    del model.graph.node[:]
    model.graph.node.extend(reversed(keep))
    return model
