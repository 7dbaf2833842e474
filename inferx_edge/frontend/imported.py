"""The imported-model record every later stage consumes, and the step every importer ends with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferx_edge.errors import ModelError
from inferx_edge.package import TensorSpec
from inferx_edge.package.bundle import sha256_file


@dataclass
class ImportedModel:
    """A model in Relax form with its weights detached.

    ``mod["main"]`` takes the inputs (``num_input`` of them) followed by the weights in ``params`` order.
    """

    name: str
    format: str
    source: Path
    sha256: str
    mod: Any  # tvm.IRModule
    param_names: list[str]
    params: list[np.ndarray]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    #: a QDQ model's own int8 weights and activation scales (:mod:`inferx_edge.frontend.qdq`)
    qdq: Any = None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "format": self.format, "source": self.source.name, "sha256": self.sha256}


def finish_import(
    name: str, fmt: str, path: Path, mod, input_names: list[str], output_names: list[str] | None
) -> ImportedModel:
    """Detach weights, read the signature off the Relax function, and check it is fully static."""
    from tvm.relax.frontend import detach_params

    from inferx_edge.frontend.broadcasts import drop_redundant_broadcasts
    from inferx_edge.frontend.row_permutes import hoist_row_permutes, sink_row_permutes

    mod = sink_row_permutes(hoist_row_permutes(drop_redundant_broadcasts(mod)))
    mod, params = detach_params(mod)
    func = mod["main"]
    num_input = int(func.attrs["num_input"])
    weights = [p.numpy() for p in params.get("main", [])]
    param_vars = list(func.params[num_input:])
    if len(param_vars) != len(weights):
        raise ModelError(f"importer returned {len(weights)} weights for {len(param_vars)} weight parameters")
    inputs = tuple(_spec(n, v.ty) for n, v in zip(input_names, func.params[:num_input]))
    ret = func.ret_ty
    fields = list(ret.fields) if hasattr(ret, "fields") else [ret]
    if not output_names or len(output_names) != len(fields):
        output_names = [f"output{i}" for i in range(len(fields))]
    outputs = tuple(_spec(n, t) for n, t in zip(output_names, fields))
    for spec in inputs:
        if any(d is None for d in spec.shape):
            raise ModelError(f"input {spec.describe()} is still dynamic after import; pin it with --input-shape")
    names = [f"p{i:04d}_{v.name}" for i, v in enumerate(param_vars)]
    return ImportedModel(name, fmt, path, sha256_file(path), mod, names, weights, inputs, outputs)


def _spec(name: str, ty) -> TensorSpec:
    if not hasattr(ty, "dtype") or getattr(ty, "shape", None) is None:
        raise ModelError(f"'{name}' is not a tensor of known rank ({ty}); only tensor inputs/outputs are supported")
    dims = []
    for d in ty.shape.values if hasattr(ty.shape, "values") else ty.shape:
        try:
            dims.append(int(d))
        except (TypeError, ValueError):
            dims.append(None)
    return TensorSpec(name=name, shape=tuple(dims), dtype=str(ty.dtype))
