"""torch.export (``.pt2``, from ``torch.export.save``) -> Relax, with dynamic dims pinned."""

from __future__ import annotations

from pathlib import Path

from inferx_edge.errors import ModelError
from inferx_edge.frontend.imported import ImportedModel, finish_import
from inferx_edge.frontend.shapes import resolve_shapes
from inferx_edge.frontend.torch_converters import CONVERTERS
from inferx_edge.frontend.torch_extra_ops import EXTRA_OPS
from inferx_edge.frontend.torch_math_ops import MATH_OPS
from inferx_edge.frontend.torch_window_ops import WINDOW_OPS


def _cast_int_operands_of_float_arith(ep) -> int:
    """Insert an explicit cast where an elementwise op has a float result but an integer tensor operand
    (``torch.arange(h) + 0.5``: torch promotes to float). TVM's translator keeps the integer dtype and
    drops the fraction (YOLOv8n's anchor grid lost its 0.5 offset: boxes off by half a stride), or
    refuses the mixed operands (``where`` in torch's decomposition of ``heaviside``). Runs on the
    decomposed program.
    Returns the number of casts inserted."""
    import torch

    aten = torch.ops.aten
    ops = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.rsub.Scalar, aten.where.self}
    graph, inserted = ep.graph, 0
    for node in list(graph.nodes):
        out = node.meta.get("val") if node.op == "call_function" and node.target in ops else None
        if not isinstance(out, torch.Tensor) or not out.dtype.is_floating_point:
            continue
        args = list(node.args)
        for i, a in enumerate(args):
            val = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
            if isinstance(val, torch.Tensor) and not val.dtype.is_floating_point and val.dtype != torch.bool:
                with graph.inserting_before(node):
                    cast = graph.call_function(aten._to_copy.default, (a,), {"dtype": out.dtype})
                cast.meta["val"] = torch.empty_like(val, dtype=out.dtype, device="meta")
                args[i] = cast
                inserted += 1
        node.args = tuple(args)
    return inserted


def _bool_arith_as_logic(ep) -> int:
    """Products and sums of boolean tensors (``torch.isclose``'s decomposition multiplies two masks) as
    ``bitwise_and`` / ``bitwise_or``: TVM lowered a boolean multiply that failed to compile. Returns the
    number of nodes changed."""
    import torch

    aten = torch.ops.aten
    swap = {aten.mul.Tensor: aten.bitwise_and.Tensor, aten.add.Tensor: aten.bitwise_or.Tensor}
    changed = 0
    for node in ep.graph.nodes:
        out = node.meta.get("val") if node.op == "call_function" and node.target in swap else None
        operands = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)] if out is not None else []
        if len(operands) == 2 and all(isinstance(v, torch.Tensor) and v.dtype == torch.bool for v in [out, *operands]):
            node.target = swap[node.target]
            changed += 1
    return changed


def import_exported_program(path: Path, overrides: dict[str, tuple[int, ...]]) -> ImportedModel:
    try:
        import torch
    except ImportError as exc:
        raise ModelError(
            f"{path.name} is a torch.export program; install the torch extra (pip install 'inferx_edge[torch]')"
        ) from exc
    try:
        ep = torch.export.load(str(path))
    except Exception as exc:  # a bad zip, a pickle error, a version mismatch...
        raise ModelError(f"{path} is not a loadable torch.export program ({type(exc).__name__}: {exc})") from exc

    user_inputs = list(ep.graph_signature.user_inputs)
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    declared = []
    for name in user_inputs:
        val = placeholders[name].meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise ModelError(f"input '{name}' is not a tensor; only tensor inputs are supported")
        declared.append((name, [int(d) if isinstance(d, int) else str(d) for d in val.shape]))
    shapes = resolve_shapes(declared, overrides)

    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    try:
        ep = ep.run_decompositions()  # what the translator would run first (core ATen ops)
        _cast_int_operands_of_float_arith(ep)
        _bool_arith_as_logic(ep)
        mod = from_exported_program(
            ep,
            keep_params_as_input=True,
            custom_convert_map={**CONVERTERS, **EXTRA_OPS, **MATH_OPS, **WINDOW_OPS},
            run_ep_decomposition=False,
        )
    except Exception as exc:  # unsupported aten ops raise ValueError/AssertionError/KeyError...
        raise ModelError(f"TVM could not import {path.name}: {type(exc).__name__}: {exc}") from exc

    # Bind each symbolic dim (e.g. s17 for the batch) to the value the pinned shapes give it.
    func = mod["main"]
    bindings = {}
    for param, (name, _) in zip(func.params, declared):
        for dim, value in zip(param.ty.shape.values, shapes[name]):
            if not isinstance(dim, int) and not hasattr(dim, "value"):
                if bindings.get(dim.name, value) != value:
                    raise ModelError(
                        f"inputs share the dynamic dimension {dim.name} but were given "
                        f"different sizes ({bindings[dim.name]} and {value})"
                    )
                bindings[dim.name] = value
    if bindings:
        mod = relax.transform.BindSymbolicVars(bindings)(mod)
        mod = relax.transform.Normalize()(mod)
    outputs = [str(o) for o in ep.graph_signature.user_outputs]
    return finish_import(path.stem, "torch.export", path, mod, user_inputs, outputs)
