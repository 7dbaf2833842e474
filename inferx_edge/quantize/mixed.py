"""Per-layer sensitivity and mixed int8/float precision under an accuracy budget.

One module is compiled for the host CPU in which every quantizable layer computes both ways and an
extra input picks, per layer, int8 or float (:func:`~inferx_edge.quantize.rewrite.quantize_imported`
with ``blend=True``). Any mix is then one run over the evaluation set, no recompilation:

1. float (all layers float): the reference; all layers int8;
2. each layer alone in int8: its sensitivity (top-1 drop in points, and the relative L2 error of the
   outputs against float, which orders layers whose drop rounds to the same number of samples);
3. greedy: starting from all int8, the most sensitive layer goes back to float until the drop fits
   the budget;
4. the chosen mix is compiled for real (int8 kernels) and measured; while it still misses the budget,
   the next layer goes back to float.

The metric (``--accuracy-metric``, in points = percent): ``top1`` — top-1 against labels when the
evaluation set has them, otherwise top-1 agreement with the float model (its complement bounds the
accuracy drop from above); ``cosine`` — the mean over samples of the cosine similarity between each
sample's output (flattened) and the float model's, times 100, so a 1-point budget asks for a mean cosine
of at least 0.99 (embeddings, feature maps, detection heads). ``auto`` takes top-1 with labels, top-1
agreement for a 2-D output of a model with float inputs (an image or feature classifier), and cosine
for everything else (token-id encoders, dense outputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferx_edge import models
from inferx_edge.data import load_arrays
from inferx_edge.errors import UsageError, check_choice

#: accuracy metrics of the budget (``--accuracy-metric``)
METRICS = ("auto", "top1", "cosine")


@dataclass
class EvalSet:
    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    description: str
    kind: str = "top1"  # "top1" or "cosine" (resolved, never "auto")

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    @property
    def metric(self) -> str:
        if self.kind == "cosine":
            return "mean cosine similarity to the float output (x100)"
        return "top-1 accuracy" if self.labels is not None else "top-1 agreement with the float model"


def resolve_metric(metric: str, labels, inputs, outputs) -> str:
    """``top1`` or ``cosine`` for ``metric`` (one of :data:`METRICS`) given the model's first output."""
    check_choice("accuracy metric", metric, METRICS)
    out = outputs[0] if outputs else None
    if metric == "auto":
        if labels is not None:
            return "top1"
        classifier = out is not None and len(out.shape) == 2 and all(s.dtype.startswith("float") for s in inputs)
        return "top1" if classifier else "cosine"
    if metric == "top1" and out is not None and len(out.shape) != 2:
        raise UsageError(
            f"--accuracy-metric top1 needs a classifier output (samples x classes); output '{out.name}' has "
            f"{len(out.shape)} dimensions. Use --accuracy-metric cosine (or auto)"
        )
    if metric == "cosine" and labels is not None:
        raise UsageError("--accuracy-metric cosine compares with the float output; the evaluation data has labels")
    return metric


def load_eval_set(
    path: Path | None, model: Path, inputs, calib: dict[str, np.ndarray] | None, outputs=(), metric: str = "auto"
) -> EvalSet:
    """The data that measures accuracy: ``path`` (.npz with one array per input name, or ``x``, plus
    optional integer ``labels``/``y``); else the embedded model's labelled holdout; else the calibration
    data without labels. ``metric`` (:data:`METRICS`) is resolved against the model's ``outputs``."""
    from inferx_edge.quantize.calibration import check_calibration_batch

    names = [s.name for s in inputs]
    if path is None:
        if models.is_default_model(model):
            x, y = models.holdout()
            return EvalSet({names[0]: x}, y, models.HOLDOUT_DESCRIPTION, resolve_metric(metric, y, inputs, outputs))
        if calib is None:
            raise UsageError("measuring an accuracy budget needs data: --eval-data FILE.npz (or --calib)")
        kind = resolve_metric(metric, None, inputs, outputs)
        return EvalSet(calib, None, "calibration data (no labels)", kind)
    arrays = load_arrays(path, "evaluation data")
    if not isinstance(arrays, dict):
        raise UsageError(
            f"evaluation data {path}: expected an .npz with one array per input (and 'labels'), got a .npy"
        )
    labels = arrays.pop("labels", arrays.pop("y", None))
    if len(names) == 1 and names[0] not in arrays and "x" in arrays:
        arrays[names[0]] = arrays.pop("x")
    missing = [n for n in names if n not in arrays]
    if missing:
        raise UsageError(f"evaluation data {path} lacks arrays for inputs {missing} (has {sorted(arrays)})")
    for spec in inputs:
        check_calibration_batch(arrays[spec.name], spec.name, (None, *spec.shape[1:]), spec.dtype)
    n = {len(arrays[n]) for n in names}
    if labels is not None:
        labels = np.asarray(labels).astype(np.int64).reshape(-1)
        n.add(len(labels))
    if len(n) != 1:
        raise UsageError(f"evaluation data {path}: inputs and labels differ in sample count ({sorted(n)})")
    kind = resolve_metric(metric, labels, inputs, outputs)
    return EvalSet({k: arrays[k] for k in names}, labels, str(path), kind)


class Evaluator:
    """Runs a compiled (host CPU) module over an evaluation set in fixed-size chunks."""

    def __init__(self, imported, eval_set: EvalSet, chunk: int):
        import tvm
        from tvm import relax

        from inferx_edge.compiler.tvm_ops import tvm_op_fixes
        from inferx_edge.quantize.rewrite import host_executable

        tvm_op_fixes()  # compiled as build compiles int8 kernels
        self.tvm = tvm
        self.eval_set = eval_set
        self.chunk = chunk
        self.names = [s.name for s in imported.inputs]
        exe = host_executable(imported.mod)
        self.vm = relax.VirtualMachine(exe, tvm.cpu())
        self.params = [tvm.runtime.tensor(p) for p in imported.params]

    def logits(self, *extra: np.ndarray) -> np.ndarray:
        tvm, n, out = self.tvm, len(self.eval_set), []
        extra_t = [tvm.runtime.tensor(e) for e in extra]
        for start in range(0, n, self.chunk):
            feeds = []
            for name in self.names:
                x = self.eval_set.inputs[name][start : start + self.chunk]
                rows = len(x)
                if rows < self.chunk:  # pad the last chunk; padded rows are dropped
                    x = np.concatenate([x, np.repeat(x[-1:], self.chunk - rows, axis=0)])
                feeds.append(tvm.runtime.tensor(np.ascontiguousarray(x)))
            res = self.vm["main"](*feeds, *extra_t, *self.params)
            if not isinstance(res, tvm.runtime.Tensor):  # several outputs: the first one scores
                res = res[0]
            out.append(res.numpy()[:rows])
        logits = np.concatenate(out)
        if self.eval_set.kind == "top1" and logits.ndim != 2:
            raise UsageError(
                f"accuracy budgets need a classifier output (samples x classes); the first output has shape "
                f"{list(logits.shape)}; use --accuracy-metric cosine"
            )
        return logits


def score(eval_set: EvalSet, logits: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    """The metric's value in percent (``top1``: top-1; ``cosine``: 100 x the mean per-sample cosine
    similarity to ``reference``, with its minimum in ``cosine_min``) and the relative L2 error against the
    float ``reference``."""
    rel = float(np.linalg.norm(logits - reference) / max(np.linalg.norm(reference), 1e-30))
    if eval_set.kind == "cosine":
        cos = cosine_per_sample(logits, reference)
        cos[~np.isfinite(cos)] = -1.0  # a NaN/inf output counts as the worst possible sample
        return {"value": float(cos.mean() * 100), "cosine_min": float(cos.min()), "rel_error": rel}
    pred = logits.argmax(axis=1)
    truth = eval_set.labels if eval_set.labels is not None else reference.argmax(axis=1)
    return {"value": float((pred == truth).mean() * 100), "rel_error": rel}


def show(eval_set: EvalSet, s: dict) -> str:
    """A score for the log: ``97.50 %`` (top-1) or ``cosine 0.9934 (min 0.9712)``."""
    if eval_set.kind == "cosine":
        return f"cosine {s['value'] / 100:.4f} (min {s['cosine_min']:.4f})"
    return f"{s['value']:.2f} %"


def cosine_per_sample(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each sample's flattened output in ``a`` and ``b`` (float64). Two all-zero
    samples count as identical (1); one all-zero against a non-zero one as 0; NaN anywhere gives NaN."""
    a = a.reshape(len(a), -1).astype(np.float64)
    b = b.reshape(len(b), -1).astype(np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    dot = np.sum(a * b, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where((na == 0) & (nb == 0), 1.0, dot / np.maximum(na * nb, 1e-300))
    return np.clip(cos, -1.0, 1.0)


@dataclass
class MixResult:
    float_layers: list[str]  # layer keys kept in float
    layers: list[dict]  # per-layer table rows
    accuracy: dict  # fp32 / int8 / mixed (predicted and measured), metric, data
    met: bool


def choose_mix(
    model: Path,
    input_shapes: dict,
    base,
    amax: dict[str, float],
    eval_set: EvalSet,
    max_drop: float,
    min_int8_share: float,
    macs: dict[str, int],
    total_macs: int,
    chunk: int = 16,
    log=print,
    int8_between_layers: bool = True,
) -> MixResult:
    """Sensitivity of every layer, then the largest int8 set whose measured drop fits ``max_drop``.

    Sensitivities come from the layer-switchable model (float activations between layers); the all-int8
    accuracy and every chosen mix are measured on real int8 compiles, as ``build`` makes them
    (``int8_between_layers`` included)."""
    from inferx_edge.frontend import import_model
    from inferx_edge.quantize.rewrite import find_targets, qdq_weights, quantize_imported

    shapes = {**input_shapes, **{s.name: (chunk, *s.shape[1:]) for s in base.inputs}}
    imported = import_model(model, shapes)
    targets = [t for t in find_targets(imported.mod["main"]) if t.key in amax]
    fixed = qdq_weights(imported, targets)
    keys = [t.key for t in targets]
    log(f"      sensitivity: compiling the layer-switchable model ({len(targets)} layers) for the host CPU")
    probe = Evaluator(quantize_imported(imported, targets, amax, blend=True, fixed_weights=fixed), eval_set, chunk)

    def run(mask: np.ndarray, ref=None) -> tuple[np.ndarray, dict]:
        lg = probe.logits(mask.astype(np.float32))
        return lg, score(eval_set, lg, lg if ref is None else ref)

    if eval_set.kind == "top1" and 0 < max_drop < 100 / len(eval_set):
        log(
            f"      note: one changed prediction is {100 / len(eval_set):.2f} points on {len(eval_set)} samples, more "
            f"than the {max_drop}-point budget: it allows none (more --eval-data samples give it room)"
        )
    ref, fp = run(np.zeros(len(keys)))
    _, all8 = run(np.ones(len(keys)), ref)
    log(
        f"      {eval_set.metric} on {eval_set.description}: float {show(eval_set, fp)}, "
        f"all int8 (switchable model) {show(eval_set, all8)}"
    )
    rows = []
    for i, k in enumerate(keys):
        _, s = run(np.eye(len(keys))[i], ref)
        rows.append({"layer": k, "op": targets[i].op, "macs": macs[k], "drop": fp["value"] - s["value"], **s})
    order = sorted(range(len(keys)), key=lambda i: (rows[i]["drop"], rows[i]["rel_error"]), reverse=True)

    def share(mask):
        return sum(macs[k] for k, m in zip(keys, mask) if m) / total_macs if total_macs else 0.0

    mask = np.ones(len(keys))
    predicted = all8
    queue = list(order)
    while fp["value"] - predicted["value"] > max_drop and queue:
        mask[queue.pop(0)] = 0
        _, predicted = run(mask, ref)

    measured_by_mask: dict[tuple, dict] = {}

    def measure(mask) -> dict:
        key = tuple(bool(m) for m in mask)
        if key not in measured_by_mask:
            chosen = [t for t, m in zip(targets, mask) if m]
            q = quantize_imported(imported, chosen, amax, fixed_weights=fixed, int8_between_layers=int8_between_layers)
            measured_by_mask[key] = score(eval_set, Evaluator(q, eval_set, chunk).logits(), ref)
        return measured_by_mask[key]

    real8 = measure(np.ones(len(keys)))
    log(f"      all int8, compiled: {show(eval_set, real8)} (relative output error {real8['rel_error']:.4f})")
    measured = measure(mask)
    while fp["value"] - measured["value"] > max_drop and queue:
        i = queue.pop(0)
        mask[i] = 0
        log(f"      measured drop {fp['value'] - measured['value']:.2f} points is over budget: {keys[i]} back to float")
        measured = measure(mask)
    met = fp["value"] - measured["value"] <= max_drop and share(mask) >= min_int8_share
    for i, r in enumerate(rows):
        r["precision"] = "int8" if mask[i] else "fp32"
    return MixResult(
        float_layers=[k for k, m in zip(keys, mask) if not m],
        layers=rows,
        accuracy={
            "metric": eval_set.metric,
            "metric_kind": eval_set.kind,
            "data": eval_set.description,
            "samples": len(eval_set),
            "fp32": fp["value"],
            "int8": real8["value"],
            "int8_rel_error": real8["rel_error"],
            "mixed": measured["value"],
            "mixed_rel_error": measured["rel_error"],
            "max_drop": max_drop,
            "drop": fp["value"] - measured["value"],
            "int8_mac_share": share(mask),
            "min_int8_share": min_int8_share,
            **(
                {"int8_cosine_min": real8["cosine_min"], "mixed_cosine_min": measured["cosine_min"]}
                if "cosine_min" in real8
                else {}
            ),
        },
        met=met,
    )


def format_table(layers: list[dict]) -> str:
    """The per-layer table printed by ``quantize`` and ``build``: layer, op, precision, MACs, sensitivity."""
    head = f"{'layer':<28} {'op':<7} {'precision':<9} {'MMACs':>9} {'drop pts':>9} {'rel err':>9}"
    lines = [head, "-" * len(head)]
    for r in layers:
        drop = "" if r.get("drop") is None else f"{r['drop']:9.2f}"
        rel = "" if r.get("rel_error") is None else f"{r['rel_error']:9.4f}"
        lines.append(
            f"{r['layer'][:28]:<28} {r['op']:<7} {r['precision']:<9} {r['macs'] / 1e6:9.3f} {drop:>9} {rel:>9}"
        )
    return "\n".join(lines)
