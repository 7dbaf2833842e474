"""Quantize an imported model for ``quantize`` and ``build --precision int8|mixed``: load calibration
data, calibrate, choose per-layer precisions under an accuracy budget (a :class:`QuantPlan`), rewrite, and
describe what was quantized (the manifest's quantization report)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from inferx_edge import models
from inferx_edge.data import load_arrays
from inferx_edge.errors import BudgetError, InputError, UsageError, check_choice
from inferx_edge.frontend import ImportedModel, import_model
from inferx_edge.quantize.calibration import DEFAULT_METHOD, OBSERVERS, check_calibration_batch
from inferx_edge.quantize.mixed import METRICS
from inferx_edge.quantize.rewrite import calibrate, find_targets, qdq_weights, quantize_imported

CALIB_CHUNK = 16
#: Default top-1 budget (points) of ``--precision mixed`` without ``--max-accuracy-drop``.
DEFAULT_MAX_DROP = 0.5


def load_calibration(path: Path | None, model: Path, inputs) -> dict[str, np.ndarray]:
    """Samples per input name: an .npz keyed by input name (or holding one array), an .npy (single-input
    models), or a directory of those (concatenated). Without a path, the embedded model's own set."""
    names = [s.name for s in inputs]
    if path is None:
        if not models.is_default_model(model):
            raise UsageError("--precision int8 needs calibration data: --calib FILE.npz|FILE.npy|DIR")
        return {names[0]: models.calibration_images()}
    path = Path(path)
    if not path.exists():
        raise UsageError(f"calibration data not found: {path}")
    files = sorted(p for p in path.iterdir() if p.suffix in (".npy", ".npz")) if path.is_dir() else [path]
    if not files:
        raise UsageError(f"no .npy/.npz files in {path}")
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for f in files:
        data = load_arrays(f, "calibration file", error=InputError)
        if isinstance(data, dict):
            keys = list(data)
            if not keys:
                raise InputError(f"calibration file {f} is an .npz with no arrays")
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
    out = {}
    for n, arrays in parts.items():
        for a, f in zip(arrays, files):
            if np.ndim(a) == 0:
                raise InputError(f"calibration data for '{n}' in {f} is a single number (0-d array); expected samples")
        shapes = sorted({tuple(a.shape[1:]) for a in arrays})
        if len(shapes) > 1:
            listing = ", ".join(f"{f.name}: {'x'.join(map(str, a.shape))}" for a, f in zip(arrays, files))
            raise InputError(f"calibration files for '{n}' disagree on the sample shape ({listing})")
        out[n] = np.concatenate(arrays)
    return out


@dataclass(frozen=True, kw_only=True)
class QuantOptions:
    """How int8/mixed variants are calibrated and what accuracy they must keep (shared by ``quantize``,
    ``build``, ``tune`` and ``evaluate``).

    Attributes
    ----------
    calib : calibration data: ``.npz`` keyed by input name, ``.npy``, or a directory of them (default
        for the embedded model: its calibration images).
    calib_method : activation calibration, one of :data:`~inferx_edge.quantize.calibration.OBSERVERS`.
    quant_plan : a plan written by ``quantize``: applied as is, nothing recalibrated.
    max_accuracy_drop : budget in points of ``accuracy_metric`` against fp32 (mixed default:
        :data:`DEFAULT_MAX_DROP`; int8: checked against it when given).
    accuracy_metric : ``auto``, ``top1`` or ``cosine`` (:func:`~inferx_edge.quantize.mixed.resolve_metric`;
        cosine in points of 100 x mean cosine similarity, so 1.0 asks for >= 0.99).
    min_int8_share : mixed: the budget counts as unmet below this share of conv/matmul MACs in int8.
    eval_data : data the budget is measured on (default: the embedded holdout, else the calibration data).
    allow_over_budget : keep the best mix found (with a warning) when the budget cannot be met.
    float_between_layers : activations stay float between int8 layers (default: int8 where every reader
        is an int8 layer).
    """

    calib: Path | None = None
    calib_method: str = DEFAULT_METHOD
    quant_plan: Path | None = None
    max_accuracy_drop: float | None = None
    accuracy_metric: str = "auto"
    min_int8_share: float = 0.5
    eval_data: Path | None = None
    allow_over_budget: bool = False
    float_between_layers: bool = False

    def __post_init__(self) -> None:
        check_choice("calibration method", self.calib_method, OBSERVERS)
        check_choice("accuracy metric", self.accuracy_metric, METRICS)
        if self.max_accuracy_drop is not None and self.max_accuracy_drop < 0:
            raise UsageError(f"--max-accuracy-drop must be >= 0 points, got {self.max_accuracy_drop}")
        if not 0 <= self.min_int8_share <= 1:
            raise UsageError(f"--min-int8-share must be within 0..1, got {self.min_int8_share}")


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
    precision: str = "int8",
    opts: QuantOptions | None = None,
    *,
    log=print,
) -> QuantPlan:
    """Calibrate ``model``; for ``mixed`` (or an ``int8`` with a budget) measure per-layer sensitivity
    and keep the most sensitive layers in float until the top-1 drop is within ``max_drop`` points.

    A budget that cannot be met raises :class:`BudgetError`, unless ``allow_over_budget`` (then the
    best mix found is returned, with a warning).
    """
    opts = opts or QuantOptions()
    check_choice("quantization precision", precision, ("int8", "mixed"))
    calib, method, min_int8_share = opts.calib, opts.calib_method, opts.min_int8_share
    max_drop = opts.max_accuracy_drop
    if precision == "mixed" and max_drop is None:
        max_drop = DEFAULT_MAX_DROP
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
        chunk, probe_model = _calibration_model(model, input_shapes, base, n)
        targets = find_targets(probe_model.mod["main"])
        if not targets:
            raise UsageError("the model has no conv2d/matmul with constant weights to quantize")
        batches = [{k: v[i : i + chunk] for k, v in data.items()} for i in range(0, n - chunk + 1, chunk)]
        log(f"      calibrating {len(targets)} layers on {len(batches) * chunk} samples ({method})")
        amax = calibrate(probe_model, targets, batches, method)
        plan = QuantPlan(base.sha256, method, len(batches) * chunk, amax)
    plan.int8_between_layers = not opts.float_between_layers
    macs = {t.key: _macs(base, t) for t in base_targets}
    total = sum(macs.values()) + _other_macs(base, {t.name for t in base_targets})
    if max_drop is None:
        plan.layers = [
            {"layer": t.key, "op": t.op, "precision": "int8" if t.key in amax else "fp32", "macs": macs[t.key]}
            for t in targets
        ]
        return plan
    from inferx_edge.quantize.mixed import choose_mix, format_table, load_eval_set

    eval_set = load_eval_set(opts.eval_data, model, base.inputs, data, base.outputs, opts.accuracy_metric)
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
    unit = "" if eval_set.kind == "cosine" else " %"
    summary = (
        f"{a['metric']}: fp32 {a['fp32']:.2f}{unit}, all-int8 {a['int8']:.2f}{unit}, {precision} {a['mixed']:.2f}{unit} "
        f"(drop {a['drop']:.2f} points, budget {max_drop}); int8 share of MACs {a['int8_mac_share'] * 100:.1f} %"
    )
    if not mix.met:
        why = (
            f"int8 share {a['int8_mac_share'] * 100:.1f} % < --min-int8-share {min_int8_share * 100:.0f} %"
            if a["drop"] <= max_drop
            else f"drop {a['drop']:.2f} points > {max_drop}"
        )
        if not opts.allow_over_budget:
            raise BudgetError(
                f"accuracy budget not met ({why}); {summary}. Nothing written. Raise "
                f"--max-accuracy-drop, lower --min-int8-share, or pass --allow-over-budget to keep "
                f"the best mix found"
            )
        log(f"warning: accuracy budget not met ({why}); keeping the best mix found (--allow-over-budget)")
    log(f"      {summary}")
    return plan


def _calibration_model(model: Path, input_shapes: dict, base: ImportedModel, n: int) -> tuple[int, ImportedModel]:
    """The batch calibration runs in and the model imported at it: up to :data:`CALIB_CHUNK` samples at
    a time when the batch dimension is dynamic; the model's own batch when it is fixed (a set of N
    samples is then split into model-sized batches)."""
    chunk = min(CALIB_CHUNK, n)
    shapes = {**input_shapes, **{s.name: (chunk, *s.shape[1:]) for s in base.inputs}}
    try:
        return chunk, import_model(model, shapes)
    except UsageError:
        fixed = base.inputs[0].shape[0] if base.inputs and base.inputs[0].shape else 1
        if fixed == chunk or not fixed:
            raise
        if n < fixed:
            raise InputError(
                f"the model's batch dimension is fixed to {fixed}; calibration needs at least {fixed} samples, got {n}"
            ) from None
        return fixed, base


def resolve_plan(
    model: Path, input_shapes: dict, base: ImportedModel, precision: str, opts: QuantOptions | None = None, *, log=print
) -> QuantPlan:
    """The plan ``build`` and ``tune`` quantize ``precision`` by: ``opts.quant_plan`` when given, else a new one."""
    opts = opts or QuantOptions()
    if opts.quant_plan is not None:
        log(f"      {precision}: quantization plan {opts.quant_plan}")
        return QuantPlan.load(opts.quant_plan, base.sha256)
    return make_plan(model, input_shapes, base, precision, opts, log=log)


def quantizer(plan: QuantPlan, precision: str):
    """``plan`` as the ``quantize`` callable of :func:`~inferx_edge.compiler.variant.prepare_variant`."""

    def quantize(imported: ImportedModel, kernel_layout: str) -> tuple[ImportedModel, dict]:
        return apply_plan(imported, plan, precision, kernel_layout)

    return quantize


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
