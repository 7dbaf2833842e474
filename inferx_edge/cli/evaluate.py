"""Build a model, run it on a labelled holdout set with the runtime, and report accuracy and latency.

With no arguments: the embedded Fashion-MNIST CNN and its 500-image holdout set, on this host's CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from inferx_edge.cli._common import (
    DEFAULT_DATA,
    DEFAULT_MODEL,
    add_model_arguments,
    add_quantization_arguments,
    default_output,
    quantization_options,
)
from inferx_edge.errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    p.add_argument(
        "--data",
        type=Path,
        default=None,
        help="labelled .npz with 'x' (model-ready inputs) and 'y' (integer labels); "
        "default: the embedded model's holdout set",
    )
    p.add_argument(
        "--artifact", type=Path, default=None, help="evaluate this existing artifact instead of building one"
    )
    p.add_argument(
        "--output",
        "-o",
        type=Path,
        default=None,
        help="where to write the built artifact (default: build/<model>-<target>.ixa)",
    )
    p.add_argument("--report", type=Path, default=None, help="also write the report as JSON here")
    p.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "fp16", "int8", "mixed"],
        help="precision to build and evaluate (int8/mixed calibrate on the embedded calibration set or --calib)",
    )
    add_quantization_arguments(p)


def load_holdout(data: Path | None) -> tuple[np.ndarray, np.ndarray, str]:
    """Model-ready inputs, labels and a description of the labelled set."""
    if data is None:
        with np.load(DEFAULT_DATA, allow_pickle=False) as npz:
            x = npz["holdout_images"][:, None].astype(np.float32) / np.float32(255.0)
            return x, npz["holdout_labels"].astype(np.int64), "embedded Fashion-MNIST holdout (500 test images)"
    try:
        with np.load(data, allow_pickle=False) as npz:
            return npz["x"], npz["y"].astype(np.int64), str(data)
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"--data {data}: expected an .npz with arrays 'x' and 'y' ({exc})") from exc


def _batches(x: np.ndarray, batch: int):
    for start in range(0, len(x), batch):
        chunk = x[start : start + batch]
        n = len(chunk)
        if n < batch:  # pad the last batch; its padded rows are dropped again
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - n, axis=0)])
        yield chunk, n


def _onnxruntime_reference(model: Path, x: np.ndarray, input_name: str) -> np.ndarray | None:
    if model.suffix.lower() != ".onnx":
        return None
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, {input_name: x[i : i + 64]})[0] for i in range(0, len(x), 64)])


def run(args: argparse.Namespace) -> int:
    from inferx_edge.runtime import Engine

    model = args.model or DEFAULT_MODEL
    if args.model is not None and args.data is None and args.artifact is None:
        raise UsageError("--model given without --data: a labelled set is needed to measure accuracy")
    x, y, data_desc = load_holdout(args.data)

    artifact = args.artifact
    if artifact is None:
        from inferx_edge.compiler.build import BuildOptions, build_artifact
        from inferx_edge.frontend import parse_input_shapes
        from inferx_edge.targets import get_target, host_target_name

        spec = get_target(args.target or host_target_name())
        artifact = args.output or default_output(model, spec.name)
        build_artifact(
            BuildOptions(
                model,
                spec.name,
                artifact,
                parse_input_shapes(args.input_shape),
                precision=args.precision,
                **quantization_options(args),
            )
        )
        print(f"wrote {artifact}")

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
            "top1": float((pred == y).mean()),
            "latency_ms": {"p50": stats.p50_ms, "p90": stats.p90_ms, "p99": stats.p99_ms, "runs": stats.count},
            "throughput_samples_s": float(len(y) / wall),
        }
        ref = _onnxruntime_reference(model, x, spec.name) if args.artifact is None else None
        if ref is not None:
            report["onnxruntime"] = {
                "top1": float((ref.argmax(axis=1) == y).mean()),
                "max_abs_diff": float(np.abs(ref - logits).max()),
                "top1_agreement": float((ref.argmax(axis=1) == pred).mean()),
            }

    print(f"\n== {report['model']} on {report['target']} ({report['variant']}) ==")
    print(f"data        {data_desc}")
    print(f"top-1       {report['top1'] * 100:.2f} % of {report['samples']}")
    if "onnxruntime" in report:
        o = report["onnxruntime"]
        print(
            f"onnxruntime top-1 {o['top1'] * 100:.2f} %, agreement {o['top1_agreement'] * 100:.2f} %, "
            f"max |logit diff| {o['max_abs_diff']:.2e}"
        )
    print(f"latency     batch {batch}: p50 {stats.p50_ms:.3f} ms, p90 {stats.p90_ms:.3f} ms, p99 {stats.p99_ms:.3f} ms")
    print(
        f"throughput  {report['throughput_samples_s']:.0f} samples/s over the whole set (batch {batch}, incl. copies)"
    )
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.report}")
    return 0
