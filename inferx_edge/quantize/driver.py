"""Quantize an imported model to int8 for ``build --precision int8``: load calibration data, calibrate,
rewrite, and describe what was quantized (the manifest's quantization report)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from inferx_edge.errors import UsageError
from inferx_edge.frontend import ImportedModel, import_model
from inferx_edge.quantize.calibration import OBSERVERS, check_calibration_batch
from inferx_edge.quantize.rewrite import calibrate, find_targets, quantize_imported

CALIB_CHUNK = 16


def load_calibration(path: Path | None, model: Path, inputs) -> dict[str, np.ndarray]:
    """Samples per input name: an .npz keyed by input name (or holding one array), an .npy (single-input
    models), or a directory of those (concatenated). Without a path, the embedded model's own set."""
    from inferx_edge.cli._common import DEFAULT_DATA, DEFAULT_MODEL

    names = [s.name for s in inputs]
    if path is None:
        if Path(model).resolve() != DEFAULT_MODEL.resolve():
            raise UsageError("--precision int8 needs calibration data: --calib FILE.npz|FILE.npy|DIR")
        with np.load(DEFAULT_DATA) as d:
            return {names[0]: d["calib_images"][:, None].astype(np.float32) / np.float32(255)}
    path = Path(path)
    if not path.exists():
        raise UsageError(f"calibration data not found: {path}")
    files = sorted(p for p in path.iterdir() if p.suffix in (".npy", ".npz")) if path.is_dir() else [path]
    if not files:
        raise UsageError(f"no .npy/.npz files in {path}")
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for f in files:
        try:
            data = np.load(f, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise UsageError(f"cannot read calibration file {f}: {exc}") from exc
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                keys = data.files
                if len(names) == 1 and len(keys) == 1:
                    parts[names[0]].append(data[keys[0]])
                else:
                    missing = [n for n in names if n not in keys]
                    if missing:
                        raise UsageError(f"{f} lacks calibration arrays for inputs {missing} (has {keys})")
                    for n in names:
                        parts[n].append(data[n])
        else:
            if len(names) != 1:
                raise UsageError(f"{f}: a .npy holds one input; this model has {names}: use .npz keyed by name")
            parts[names[0]].append(data)
    return {n: np.concatenate(v) for n, v in parts.items()}


def quantize_for_build(
    model: Path, input_shapes: dict, base: ImportedModel, calib: Path | None, method: str, log=print
) -> tuple[dict[str, float], dict]:
    """Calibrate once per model; returns per-target thresholds and the quantization report."""
    if method not in OBSERVERS:
        raise UsageError(f"unknown calibration method '{method}'; valid: {', '.join(OBSERVERS)}")
    data = load_calibration(calib, model, base.inputs)
    n = min(len(v) for v in data.values())
    for spec in base.inputs:
        check_calibration_batch(data[spec.name], spec.name, (None, *spec.shape[1:]), spec.dtype)
    chunk = min(CALIB_CHUNK, n)
    shapes = {**input_shapes, **{s.name: (chunk, *s.shape[1:]) for s in base.inputs}}
    probe_model = import_model(model, shapes)
    targets = find_targets(probe_model.mod["main"])
    if not targets:
        raise UsageError("the model has no conv2d/matmul with constant weights to quantize")
    batches = [{k: v[i : i + chunk] for k, v in data.items()} for i in range(0, n - chunk + 1, chunk)]
    log(f"      calibrating {len(targets)} layers on {len(batches) * chunk} samples ({method})")
    amax = calibrate(probe_model, targets, batches, method)
    return amax, {"calibration": method, "calibration_samples": len(batches) * chunk}


def apply_int8(imported: ImportedModel, amax: dict[str, float], report: dict) -> tuple[ImportedModel, dict]:
    targets = find_targets(imported.mod["main"])
    q = quantize_imported(imported, targets, amax)
    layers, total, int8 = [], 0, 0
    for t in targets:
        macs = _macs(imported, t)
        layers.append(
            {
                "layer": t.name,
                "op": t.op,
                "weight": t.weight.name,
                "precision": "int8",
                "macs": macs,
                "amax": amax[t.name],
            }
        )
        int8 += macs
    total = int8 + _other_macs(imported, {t.name for t in targets})
    return q, report | {"layers": layers, "int8_mac_share": int8 / total if total else 0.0}


def _shape(expr) -> list[int]:
    return [int(d) for d in expr.ty.shape.values]


def _op_macs(op: str, out: list[int], w: list[int], reduce_axis: int) -> int:
    """Multiply-accumulates of a conv2d (OIHW weight) or a matmul (reduction over ``w[reduce_axis]``)."""
    return int(np.prod(out)) * (int(np.prod(w[1:])) if op == "conv2d" else w[reduce_axis])


def _macs(imported: ImportedModel, t) -> int:
    bindings = {b.var.name: b for blk in imported.mod["main"].body.blocks for b in blk.bindings}
    return _op_macs(t.op, _shape(bindings[t.name].var), _shape(t.weight), 1 - t.channel_axis)


def _other_macs(imported: ImportedModel, done: set[str]) -> int:
    """conv2d/matmul MACs not quantized (e.g. grouped convs or activation x activation matmuls)."""
    from tvm import relax

    total = 0
    for blk in imported.mod["main"].body.blocks:
        for b in blk.bindings:
            v = b.value
            if b.var.name in done or not isinstance(v, relax.Call) or not hasattr(v.op, "name"):
                continue
            if v.op.name in ("relax.nn.conv2d", "relax.matmul"):
                op = "conv2d" if v.op.name == "relax.nn.conv2d" else "matmul"
                total += _op_macs(op, _shape(b.var), _shape(v.args[1]), -2)
    return total
