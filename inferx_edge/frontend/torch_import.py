"""torch.export (``.pt2``, from ``torch.export.save``) -> Relax, with dynamic dims pinned."""

from __future__ import annotations

from pathlib import Path

from inferx_edge.errors import ModelError
from inferx_edge.frontend.imported import ImportedModel, finish_import
from inferx_edge.frontend.shapes import resolve_shapes


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
        mod = from_exported_program(ep, keep_params_as_input=True)
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
