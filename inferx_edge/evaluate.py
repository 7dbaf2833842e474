"""The evaluate stage: build (or take) an artifact, run it with the on-device runtime on a labelled set,
and measure accuracy, latency and throughput, next to onnxruntime's accuracy on the same set."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from inferx_edge import models
from inferx_edge.data import load_arrays
from inferx_edge.errors import UsageError
from inferx_edge.quantize.driver import QuantOptions


@dataclass(frozen=True, kw_only=True)
class EvaluateOptions:
    """What to evaluate.

    Attributes
    ----------
    model : ONNX file or ``.pt2`` program (default: the embedded model).
    data : labelled ``.npz`` with ``x`` (model-ready inputs) and ``y`` (integer labels); default: the
        embedded model's holdout set (then ``model`` must be the embedded model).
    artifact : evaluate this existing artifact instead of building one.
    target : target to build for (ignored with ``artifact``).
    output : where to write the built artifact.
    input_shapes : pinned input shapes for the build.
    precision : precision of the variant built.
    quant : calibration and accuracy budget for int8/mixed.
    """

    model: Path | None = None
    data: Path | None = None
    artifact: Path | None = None
    target: str | None = None
    output: Path | None = None
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    precision: str = "fp32"
    quant: QuantOptions = field(default_factory=QuantOptions)

    def __post_init__(self) -> None:
        if self.model is not None and self.data is None and self.artifact is None:
            raise UsageError("--model given without --data: a labelled set is needed to measure accuracy")


def load_holdout(data: Path | None) -> tuple[np.ndarray, np.ndarray, str]:
    """Model-ready inputs, labels and a description of the labelled set."""
    if data is None:
        x, y = models.holdout()
        return x, y, models.HOLDOUT_DESCRIPTION
    arrays = load_arrays(data, "--data", hint=": expected an .npz with arrays 'x' and 'y'")
    if not isinstance(arrays, dict) or "x" not in arrays or "y" not in arrays:
        have = sorted(arrays) if isinstance(arrays, dict) else "one .npy array"
        raise UsageError(f"--data {data}: expected an .npz with arrays 'x' and 'y' (has {have})")
    return arrays["x"], arrays["y"].astype(np.int64), str(data)


def _batches(x: np.ndarray, batch: int):
    for start in range(0, len(x), batch):
        chunk = x[start : start + batch]
        n = len(chunk)
        if n < batch:  # pad the last batch; its padded rows are dropped again
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - n, axis=0)])
        yield chunk, n


def _onnxruntime_reference(model: Path, x: np.ndarray, input_name: str, batch: int):
    """onnxruntime's outputs on ``x`` and its latency at ``batch`` (timed like ``Engine.benchmark``), or
    None when onnxruntime or an ONNX model is not there."""
    if model.suffix.lower() != ".onnx":
        return None
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    from inferx_edge.runtime.engine import time_calls

    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    logits = np.concatenate([sess.run(None, {input_name: x[i : i + 64]})[0] for i in range(0, len(x), 64)])
    feed = {input_name: np.ascontiguousarray(x[:batch])}
    stats = time_calls(lambda: sess.run(None, feed), lambda: None, warmup=10, repeat=200)
    return logits, stats


def evaluate(opts: EvaluateOptions, log=print) -> dict:
    """Build (unless ``opts.artifact``), run on the labelled set, and return the report (JSON-ready)."""
    from inferx_edge.runtime import Engine

    model = opts.model or models.DEFAULT_MODEL
    x, y, data_desc = load_holdout(opts.data)
    artifact = opts.artifact
    if artifact is None:
        from inferx_edge.build import BuildOptions, build_artifact, default_output
        from inferx_edge.targets import get_target, host_target_name

        spec = get_target(opts.target or host_target_name())
        artifact = opts.output or default_output(model, spec.name, (opts.precision,))
        build_artifact(
            BuildOptions(
                model=model,
                target=spec.name,
                output=artifact,
                input_shapes=opts.input_shapes,
                precisions=(opts.precision,),
                quant=opts.quant,
            ),
            log=log,
        )
        log(f"wrote {artifact}")

    with Engine(artifact) as engine:
        spec = engine.variant.inputs[0]
        batch = spec.shape[0] or 1
        if tuple(x.shape[1:]) != tuple(spec.shape[1:]):
            raise UsageError(
                f"labelled inputs have shape {list(x.shape[1:])} per sample; model wants {spec.describe()}"
            )
        t0 = time.perf_counter()
        logits = np.concatenate(
            [engine.run(chunk)[engine.variant.outputs[0].name][:n] for chunk, n in _batches(x, batch)]
        )
        wall = time.perf_counter() - t0
        stats = engine.benchmark(x[:batch], warmup=10, repeat=200)
        pred = logits.argmax(axis=1)
        report = {
            "artifact": str(artifact),
            "model": engine.manifest.model["name"],
            "target": engine.manifest.target["name"],
            "variant": engine.variant.name,
            "data": data_desc,
            "samples": int(len(y)),
            "batch": int(batch),
            "top1": float((pred == y).mean()),
            "latency_ms": {"p50": stats.p50_ms, "p90": stats.p90_ms, "p99": stats.p99_ms, "runs": stats.count},
            "throughput_samples_s": float(len(y) / wall),
        }
        report["tuned"] = bool(engine.variant.tuned)
        report["tuning"] = engine.variant.extra.get("tuning")
        if not engine.variant.tuned:
            shape = "x".join(str(d) for d in spec.shape)
            report["note"] = (
                f"no tuning database applied to this build (default schedules); tune it for this machine with: "
                f"python -m inferx_edge tune --target {report['target']} --input-shape {spec.name}:{shape}"
                + ("" if opts.model is None else f" --model {model}")
            )
        ref = _onnxruntime_reference(model, x, spec.name, batch) if opts.artifact is None else None
        if ref is not None:
            ref, ort_stats = ref
            report["onnxruntime"] = {
                "top1": float((ref.argmax(axis=1) == y).mean()),
                "max_abs_diff": float(np.abs(ref - logits).max()),
                "top1_agreement": float((ref.argmax(axis=1) == pred).mean()),
                "latency_ms": {"p50": ort_stats.p50_ms, "p90": ort_stats.p90_ms, "p99": ort_stats.p99_ms},
            }
            report["speedup_vs_onnxruntime_p50"] = ort_stats.p50_ms / stats.p50_ms if stats.p50_ms else None
    return report
