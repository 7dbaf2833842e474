"""ONNX -> Relax: validation with clear errors, shape pinning, then TVM's ONNX frontend."""

from __future__ import annotations

from pathlib import Path

from inferx_edge.errors import ModelError
from inferx_edge.frontend.imported import ImportedModel, finish_import
from inferx_edge.frontend.onnx_decompose import decompose_unsupported
from inferx_edge.frontend.onnx_fold import fold_shape_subgraphs
from inferx_edge.frontend.onnx_pads import (
    explicit_conv_transpose_pads,
    fold_pads_into_convs,
    refuse_fractional_resize_scales,
)
from inferx_edge.frontend.onnx_resize import lower_fractional_resizes
from inferx_edge.frontend.onnx_rnn import unroll_recurrent
from inferx_edge.frontend.onnx_scatter import box_scatters
from inferx_edge.frontend.qdq import is_qdq, strip_qdq
from inferx_edge.frontend.shapes import resolve_shapes


def load_onnx(path: Path):
    """Read and check an ONNX file; anything unreadable or invalid becomes a :class:`ModelError`."""
    import onnx

    try:
        model = onnx.load(str(path))
    except Exception as exc:  # protobuf raises DecodeError, RuntimeWarning-derived errors, ValueError...
        raise ModelError(f"{path} is not a valid ONNX model (cannot parse it: {exc})") from exc
    if not model.graph.node and not model.graph.output:
        raise ModelError(f"{path} is not a valid ONNX model (no graph found in the file)")
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        raise ModelError(f"{path} failed ONNX validation: {first}") from exc
    return model


def _unsupported_ops(model) -> dict[str, list[str]]:
    """Ops (and the nodes using them) that TVM's ONNX frontend has no converter for."""
    try:  # private in TVM: if it moves, TVM's own OpNotImplemented (caught in import_onnx) still names ops
        from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map
    except ImportError:
        return {}

    known = set(_get_convert_map()) | {"Constant", "If"}
    missing: dict[str, list[str]] = {}
    for node in model.graph.node:
        if node.op_type not in known:
            missing.setdefault(node.op_type, []).append(node.name or "<unnamed>")
    return missing


def import_onnx(path: Path, overrides: dict[str, tuple[int, ...]]) -> ImportedModel:
    from onnx import helper

    model = load_onnx(path)
    qdq = None
    if is_qdq(model):
        model, qdq = strip_qdq(model)
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    declared, dtypes = [], {}
    for inp in graph_inputs:
        ttype = inp.type.tensor_type
        if not inp.type.HasField("tensor_type") or not ttype.HasField("shape"):
            raise ModelError(f"input '{inp.name}' has no tensor shape in the model; only tensor inputs are supported")
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in ttype.shape.dim]
        declared.append((inp.name, dims))
        dtypes[inp.name] = str(helper.tensor_dtype_to_np_dtype(ttype.elem_type))
    shapes = resolve_shapes(declared, overrides)
    if all(isinstance(d, int) for dims in shapes.values() for d in dims):
        model, _ = fold_shape_subgraphs(model, shapes)
        model, _ = box_scatters(model, shapes)  # slice assignments: index grids never materialized
    model, _ = fold_pads_into_convs(model)  # after folding: "same" pads computed from shapes are constants now
    model, _ = explicit_conv_transpose_pads(model, shapes)
    model, _ = lower_fractional_resizes(model, shapes)  # sampled as ONNX does (TVM: by the size ratio)
    refuse_fractional_resize_scales(model, shapes)  # those left: cropping, antialiased downscaling
    model, _ = unroll_recurrent(model, shapes)  # LSTM / GRU / RNN: TVM has no converter
    model, _ = decompose_unsupported(model, shapes)  # Celu, LpNormalization, DFT...: nor for these
    missing = _unsupported_ops(model)
    if missing:
        detail = "; ".join(
            f"{op} (nodes: {', '.join(nodes[:3])}{', ...' if len(nodes) > 3 else ''})"
            for op, nodes in sorted(missing.items())
        )
        raise ModelError(f"{path.name} uses ONNX operators TVM cannot import: {detail}")

    from tvm.relax.frontend.onnx import from_onnx

    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=None)
    try:
        mod = from_onnx(
            model,
            shape_dict={k: list(v) for k, v in shapes.items()},
            dtype_dict=dtypes,
            opset=opset,
            keep_params_in_input=True,
        )
    except Exception as exc:  # the frontend raises TVMError, ValueError, NotImplementedError, ...
        raise ModelError(f"TVM could not import {path.name}: {type(exc).__name__}: {exc}") from exc
    imported = finish_import(
        path.stem, "onnx", path, mod, [n for n, _ in declared], [o.name for o in model.graph.output]
    )
    imported.qdq = qdq
    return imported
