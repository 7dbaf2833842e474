"""Format dispatch by file type: ONNX or a torch.export program to an :class:`ImportedModel`."""

from __future__ import annotations

import zipfile
from pathlib import Path

from inferx_edge.errors import UsageError
from inferx_edge.frontend.imported import ImportedModel, finish_import  # noqa: F401  (re-exported)

FORMATS = {".onnx": "onnx", ".pt2": "torch.export"}


def import_model(path: str | Path, input_shapes: dict[str, tuple[int, ...]] | None = None) -> ImportedModel:
    """Import an ONNX file or a saved torch.export program, pinning dynamic dims from ``input_shapes``."""
    path = Path(path)
    if not path.exists():
        raise UsageError(f"model file not found: {path}")
    if not path.is_file():
        raise UsageError(f"model path is not a file: {path}")
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        fmt = "torch.export" if zipfile.is_zipfile(path) else "onnx"
    if fmt == "onnx":
        from inferx_edge.frontend.onnx_import import import_onnx

        return import_onnx(path, input_shapes or {})
    from inferx_edge.frontend.torch_import import import_exported_program

    return import_exported_program(path, input_shapes or {})
