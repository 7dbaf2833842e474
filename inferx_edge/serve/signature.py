"""What every variant of one served model shares, and the check of a request against it (before the
request may join a batch: a bad request fails alone)."""

from __future__ import annotations

import numpy as np

from inferx_edge.package import TensorSpec, Variant
from inferx_edge.runtime.engine import check_finite
from inferx_edge.serve.protocol import datatype_name


class Signature:
    """What every variant of a served model shares: input/output names and dtypes, and the shape after
    the batch axis. ``batchable``: axis 0 is each variant's batch size (requests may carry any number of
    rows); else requests must match the one compiled shape."""

    def __init__(self, variants: list[Variant]) -> None:
        first = variants[0]
        self.inputs: tuple[TensorSpec, ...] = first.inputs
        self.outputs: tuple[TensorSpec, ...] = first.outputs
        self.batchable = all(all(s.shape and s.shape[0] == v.batch for s in (*v.inputs, *v.outputs)) for v in variants)
        for v in variants[1:]:
            for mine, theirs, kind in ((self.inputs, v.inputs, "inputs"), (self.outputs, v.outputs, "outputs")):
                same = [(s.name, s.dtype, s.shape[1:] if self.batchable else s.shape) for s in mine] == [
                    (s.name, s.dtype, s.shape[1:] if self.batchable else s.shape) for s in theirs
                ]
                if not same:
                    raise ValueError(
                        f"variant '{v.name}' has other {kind} than '{first.name}' "
                        f"({', '.join(s.describe() for s in theirs)} vs {', '.join(s.describe() for s in mine)}): "
                        "serve one model (same signature) per name"
                    )

    def check(
        self, arrays: dict[str, np.ndarray], allow_nonfinite: bool, max_rows: int
    ) -> tuple[list[np.ndarray], int]:
        """Inputs in order and the row count; raises ValueError naming the tensor and the problem."""
        unknown = sorted(set(arrays) - {s.name for s in self.inputs})
        missing = [s.name for s in self.inputs if s.name not in arrays]
        if unknown or missing:
            raise ValueError(
                f"inputs do not match the model: missing {missing}, unknown {unknown}; expected "
                + ", ".join(self.describe(s) for s in self.inputs)
            )
        ordered, rows = [], None
        for spec in self.inputs:
            a = arrays[spec.name]
            if str(a.dtype) != spec.dtype:
                raise ValueError(
                    f"input '{spec.name}' must be {datatype_name(spec.dtype)}, got {datatype_name(str(a.dtype))}"
                )
            fixed = spec.shape[1:] if self.batchable else spec.shape
            got = a.shape[1:] if self.batchable else a.shape
            ok = len(got) == len(fixed) and all(d is None or d == g for d, g in zip(fixed, got))
            if not ok or (self.batchable and a.ndim == 0):
                raise ValueError(f"input '{spec.name}' must have shape {self.describe(spec)}, got {list(a.shape)}")
            n = a.shape[0] if self.batchable else 1
            if rows is not None and n != rows:
                raise ValueError(
                    f"input '{spec.name}' has {n} rows, other inputs {rows}: all inputs need the same batch"
                )
            rows = n
            if not allow_nonfinite:
                check_finite(spec.name, a)
            ordered.append(a)
        if rows == 0:
            raise ValueError("request has 0 rows along the batch axis")
        if rows > max_rows:
            raise ValueError(f"request has {rows} rows; the limit is {max_rows} (--max-request-rows)")
        return ordered, rows

    def describe(self, spec: TensorSpec) -> str:
        dims = ["-1"] if self.batchable else []
        dims += [str(d) if d is not None else "-1" for d in (spec.shape[1:] if self.batchable else spec.shape)]
        return f"{spec.name}: {datatype_name(spec.dtype)}[{', '.join(dims)}]"
