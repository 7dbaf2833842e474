"""Quantize an imported model for ``quantize`` and ``build --precision int8|mixed``: load calibration
data, calibrate, choose per-layer precisions under an accuracy budget (a :class:`QuantPlan`), rewrite, and
describe what was quantized (the manifest's quantization report)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from inferx_edge.errors import BudgetError, UsageError
from inferx_edge.frontend import ImportedModel, import_model
from inferx_edge.quantize.calibration import OBSERVERS, check_calibration_batch
from inferx_edge.quantize.rewrite import calibrate, find_targets, quantize_imported

CALIB_CHUNK = 16
#: Default top-1 budget (points) of ``--precision mixed`` without ``--max-accuracy-drop``.
DEFAULT_MAX_DROP = 0.5


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


PLAN_SCHEMA = 1


@dataclass
class QuantPlan:
    """What ``quantize`` decides and ``build`` applies (a calibration cache with per-layer precisions):
    activation thresholds by layer, the layers kept in float, and the measurements behind them."""

    model_sha256: str
    calibration: str
    calibration_samples: int
    amax: dict[str, float]
    float_layers: list[str] = field(default_factory=list)
    layers: list[dict] = field(default_factory=list)
    accuracy: dict | None = None
    #: activations cross int8 layers as int8 (:func:`~inferx_edge.quantize.rewrite.int8_boundaries`)
    int8_between_layers: bool = True

    def to_json(self) -> str:
        return json.dumps({"schema": PLAN_SCHEMA, **asdict(self)}, indent=2) + "\n"

    @classmethod
    def load(cls, path: Path, model_sha256: str) -> QuantPlan:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise UsageError(f"cannot read quantization plan {path}: {exc}") from exc
        return cls.load_text(text, model_sha256, str(path))

    @classmethod
    def load_text(cls, text: str, model_sha256: str, path: str = "<plan>") -> QuantPlan:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise UsageError(f"cannot read quantization plan {path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("schema") != PLAN_SCHEMA:
            raise UsageError(f"{path} is not an inferx_edge quantization plan (schema {PLAN_SCHEMA})")
        if data.get("model_sha256") != model_sha256:
            raise UsageError(
                f"quantization plan {path} was made for another model (sha256 {str(data.get('model_sha256'))[:12]}, "
                f"this model {model_sha256[:12]}): run quantize again"
            )
        data.pop("schema")
        try:
            return cls(**data)
        except TypeError as exc:
            raise UsageError(f"quantization plan {path} is malformed: {exc}") from exc

    def report(self) -> dict:
        """The calibration part of the manifest's quantization report."""
        out = {
            "calibration": self.calibration,
            "calibration_samples": self.calibration_samples,
            "int8_between_layers": self.int8_between_layers,
        }
        return out | ({"accuracy": self.accuracy} if self.accuracy else {})


def make_plan(
    model: Path,
    input_shapes: dict,
    base: ImportedModel,
    calib: Path | None,
    method: str,
    precision: str = "int8",
    max_drop: float | None = None,
    min_int8_share: float = 0.5,
    eval_data: Path | None = None,
    allow_over_budget: bool = False,
    log=print,
    float_between_layers: bool = False,
) -> QuantPlan:
    """Calibrate ``model``; for ``mixed`` (or an ``int8`` with a budget) measure per-layer sensitivity
    and keep the most sensitive layers in float until the top-1 drop is within ``max_drop`` points.

    A budget that cannot be met raises :class:`BudgetError`, unless ``allow_over_budget`` (then the
    best mix found is returned, with a warning).
    """
    if method not in OBSERVERS:
        raise UsageError(f"unknown calibration method '{method}'; valid: {', '.join(OBSERVERS)}")
    if precision not in ("int8", "mixed"):
        raise UsageError(f"quantization plans are for int8 or mixed precision, not '{precision}'")
    if precision == "mixed" and max_drop is None:
        max_drop = DEFAULT_MAX_DROP
    if max_drop is not None and max_drop < 0:
        raise UsageError(f"--max-accuracy-drop must be >= 0 points, got {max_drop}")
    if not 0 <= min_int8_share <= 1:
        raise UsageError(f"--min-int8-share must be within 0..1, got {min_int8_share}")
    qdq = base.qdq if base.qdq is not None and base.qdq.activations else None
    data = None
    if qdq is None or calib is not None:
        data = load_calibration(calib, model, base.inputs)
        for spec in base.inputs:
            check_calibration_batch(data[spec.name], spec.name, (None, *spec.shape[1:]), spec.dtype)
    base_targets = find_targets(base.mod["main"])
    if qdq is not None:
        targets = base_targets
        amax = {t.key: qdq.activations[t.key] for t in targets if t.key in qdq.activations}
        log(f"      QDQ model: {len(amax)} of {len(targets)} layers int8 with the model's own scales (no calibration)")
        for note in qdq.notes:
            log(f"      note: {note}")
        plan = QuantPlan(base.sha256, "qdq", 0, amax)
        chunk = CALIB_CHUNK
    else:
        n = min(len(v) for v in data.values())
        chunk = min(CALIB_CHUNK, n)
        shapes = {**input_shapes, **{s.name: (chunk, *s.shape[1:]) for s in base.inputs}}
        probe_model = import_model(model, shapes)
        targets = find_targets(probe_model.mod["main"])
        if not targets:
            raise UsageError("the model has no conv2d/matmul with constant weights to quantize")
        batches = [{k: v[i : i + chunk] for k, v in data.items()} for i in range(0, n - chunk + 1, chunk)]
        log(f"      calibrating {len(targets)} layers on {len(batches) * chunk} samples ({method})")
        amax = calibrate(probe_model, targets, batches, method)
        plan = QuantPlan(base.sha256, method, len(batches) * chunk, amax)
    plan.int8_between_layers = not float_between_layers
    macs = {t.key: _macs(base, t) for t in base_targets}
    total = sum(macs.values()) + _other_macs(base, {t.name for t in base_targets})
    if max_drop is None:
        plan.layers = [
            {"layer": t.key, "op": t.op, "precision": "int8" if t.key in amax else "fp32", "macs": macs[t.key]}
            for t in targets
        ]
        return plan
    from inferx_edge.quantize.mixed import choose_mix, format_table, load_eval_set

    eval_set = load_eval_set(eval_data, model, base.inputs, data)
    if precision == "int8":  # no float fallback allowed: only check the budget
        min_int8_share = 1.0
    mix = choose_mix(
        model, input_shapes, base, amax, eval_set, max_drop, min_int8_share, macs, total, chunk, log,
        plan.int8_between_layers,
    )  # fmt: skip
    if precision == "int8":
        mix.float_layers = []
        for r in mix.layers:
            r["precision"] = "int8"
        mix.accuracy["mixed"] = mix.accuracy["int8"]
        mix.accuracy["drop"] = mix.accuracy["fp32"] - mix.accuracy["int8"]
        mix.accuracy["int8_mac_share"] = sum(macs.values()) / total
        mix.met = mix.accuracy["drop"] <= max_drop
    plan.float_layers, plan.layers, plan.accuracy = mix.float_layers, mix.layers, mix.accuracy
    log(format_table(plan.layers))
    a = mix.accuracy
    summary = (
        f"{a['metric']}: fp32 {a['fp32']:.2f} %, all-int8 {a['int8']:.2f} %, {precision} {a['mixed']:.2f} % "
        f"(drop {a['drop']:.2f} points, budget {max_drop}); int8 share of MACs {a['int8_mac_share'] * 100:.1f} %"
    )
    if not mix.met:
        why = (
            f"int8 share {a['int8_mac_share'] * 100:.1f} % < --min-int8-share {min_int8_share * 100:.0f} %"
            if a["drop"] <= max_drop
            else f"drop {a['drop']:.2f} points > {max_drop}"
        )
        if not allow_over_budget:
            raise BudgetError(
                f"accuracy budget not met ({why}); {summary}. Nothing written. Raise "
                f"--max-accuracy-drop, lower --min-int8-share, or pass --allow-over-budget to keep "
                f"the best mix found"
            )
        log(f"warning: accuracy budget not met ({why}); keeping the best mix found (--allow-over-budget)")
    log(f"      {summary}")
    return plan


def resolve_plan(
    model: Path,
    input_shapes: dict,
    base: ImportedModel,
    precision: str,
    quant_plan: Path | None = None,
    calib: Path | None = None,
    calib_method: str = "entropy",
    max_drop: float | None = None,
    min_int8_share: float = 0.5,
    eval_data: Path | None = None,
    allow_over_budget: bool = False,
    log=print,
    float_between_layers: bool = False,
) -> QuantPlan:
    """The plan ``build`` and ``tune`` quantize ``precision`` by: ``quant_plan`` when given, else a new one."""
    if quant_plan is not None:
        log(f"      {precision}: quantization plan {quant_plan}")
        return QuantPlan.load(quant_plan, base.sha256)
    return make_plan(
        model, input_shapes, base, calib, calib_method, precision, max_drop, min_int8_share, eval_data,
        allow_over_budget, log, float_between_layers,
    )  # fmt: skip


def apply_plan(
    imported: ImportedModel, plan: QuantPlan, precision: str, kernel_layout: str = "OIHW"
) -> tuple[ImportedModel, dict]:
    """Rewrite ``imported`` by ``plan``: every quantizable layer int8 except the plan's float layers
    (``mixed``; ``int8`` ignores them). ``kernel_layout``: how int8 conv weights are stored (OHWI for
    targets that run convolutions in NHWC). Returns the model and the manifest's quantization report."""
    targets = find_targets(imported.mod["main"])
    unknown = set(plan.amax) - {t.key for t in targets}
    if unknown:
        raise UsageError(f"the quantization plan does not match this model's layers ({sorted(unknown)[:5]})")
    # layers without a threshold (float in a QDQ model) stay float in every precision
    keep = {t.key for t in targets if t.key not in plan.amax}
    keep |= set(plan.float_layers) if precision == "mixed" else set()
    chosen = [t for t in targets if t.key not in keep]
    q = quantize_imported(
        imported,
        chosen,
        plan.amax,
        fixed_weights=qdq_weights(imported, chosen),
        kernel_layout=kernel_layout,
        int8_between_layers=plan.int8_between_layers,
    )
    info = {r["layer"]: r for r in plan.layers}
    layers, int8 = [], 0
    for t in targets:
        macs = _macs(imported, t)
        row = {"layer": t.key, "op": t.op, "weight": t.weight.name, "precision": "fp32" if t.key in keep else "int8"}
        row |= {"macs": macs, "amax": plan.amax[t.key]}
        row |= {k: info[t.key][k] for k in ("drop", "rel_error") if k in info.get(t.key, {})}
        layers.append(row)
        int8 += macs if t.key not in keep else 0
    total = sum(r["macs"] for r in layers) + _other_macs(imported, {t.name for t in targets})
    return q, plan.report() | {"layers": layers, "int8_mac_share": int8 / total if total else 0.0}


def qdq_weights(imported: ImportedModel, targets) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """A QDQ model's own int8 weights and per-output-channel scales for ``targets`` (by key)."""
    if imported.qdq is None:
        return None
    fixed = {}
    for t in targets:
        if t.weight.name not in imported.qdq.weights:
            continue
        q, scale, axis = imported.qdq.weights[t.weight.name]
        channels = q.shape[t.channel_axis]
        if np.ndim(scale) == 0:
            fixed[t.key] = (q, np.full(channels, float(scale), np.float32))
        elif axis % q.ndim == t.channel_axis and len(scale) == channels:
            fixed[t.key] = (q, scale.astype(np.float32))
        # scales along another axis: requantized per output channel from the dequantized weight
    return fixed


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
