"""Build a model, run it on a labelled holdout set with the runtime, and report accuracy and latency.

With no arguments: the embedded Fashion-MNIST CNN and its 500-image holdout set, on this host's CPU.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from inferx_edge.cli._common import add_model_arguments, add_quantization_arguments, quantization_options
from inferx_edge.compiler.variant import PRECISIONS


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
        choices=PRECISIONS,
        help="precision to build and evaluate (int8/mixed calibrate on the embedded calibration set or --calib)",
    )
    add_quantization_arguments(p)


def run(args: argparse.Namespace) -> int:
    from inferx_edge.evaluate import EvaluateOptions, evaluate
    from inferx_edge.frontend import parse_input_shapes

    report = evaluate(
        EvaluateOptions(
            model=args.model,
            data=args.data,
            artifact=args.artifact,
            target=args.target,
            output=args.output,
            input_shapes=parse_input_shapes(args.input_shape),
            precision=args.precision,
            quant=quantization_options(args),
        )
    )
    print(f"\n== {report['model']} on {report['target']} ({report['variant']}) ==")
    print(f"data        {report['data']}")
    print(f"top-1       {report['top1'] * 100:.2f} % of {report['samples']}")
    if "onnxruntime" in report:
        o = report["onnxruntime"]
        print(
            f"onnxruntime top-1 {o['top1'] * 100:.2f} %, agreement {o['top1_agreement'] * 100:.2f} %, "
            f"max |logit diff| {o['max_abs_diff']:.2e}"
        )
    lat, batch = report["latency_ms"], report["batch"]
    print(f"latency     batch {batch}: p50 {lat['p50']:.3f} ms, p90 {lat['p90']:.3f} ms, p99 {lat['p99']:.3f} ms")
    if "onnxruntime" in report:
        o = report["onnxruntime"]["latency_ms"]
        ratio = report["speedup_vs_onnxruntime_p50"]
        verdict = f"{ratio:.2f}x onnxruntime's speed" if ratio else ""
        print(f"onnxruntime batch {batch}: p50 {o['p50']:.3f} ms, p99 {o['p99']:.3f} ms  (inferx_edge: {verdict})")
    print(
        f"throughput  {report['throughput_samples_s']:.0f} samples/s over the whole set (batch {batch}, incl. copies)"
    )
    if report.get("note"):
        print(f"note: {report['note']}")
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.report}")
    return 0
