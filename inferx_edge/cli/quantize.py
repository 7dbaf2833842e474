"""Calibrate a model for int8, measure each layer's sensitivity and choose per-layer precisions under an
accuracy budget; write the plan that ``build --quant-plan`` applies (no recalibration there).

Prints the per-layer table (layer, op, precision, MACs, top-1 drop when only that layer is int8,
relative output error). A budget that cannot be met writes nothing and exits with code 10, unless
``--allow-over-budget``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from inferx_edge.cli._common import add_model_arguments, add_quantization_arguments, quantization_options
from inferx_edge.compiler.variant import QUANTIZED
from inferx_edge.models import DEFAULT_MODEL


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arguments(p)
    add_quantization_arguments(p, plan=False)
    p.add_argument(
        "--precision",
        choices=QUANTIZED,
        default="mixed",
        help="mixed: int8 with fp32 layers where the budget needs them (default); int8: all layers, budget checked",
    )
    p.add_argument("--output", "-o", type=Path, default=None, help="plan to write (default: build/<model>.quant.json)")


def run(args: argparse.Namespace) -> int:
    from inferx_edge.frontend import import_model, parse_input_shapes
    from inferx_edge.package.atomic import atomic_write
    from inferx_edge.quantize.driver import make_plan
    from inferx_edge.quantize.mixed import format_table

    model = args.model or DEFAULT_MODEL
    shapes = parse_input_shapes(args.input_shape)
    print(f"importing {model}")
    base = import_model(model, shapes)
    max_drop = args.max_accuracy_drop
    if max_drop is None and args.precision == "int8":
        max_drop = 100.0  # measure and report; any drop is accepted
    plan = make_plan(model, shapes, base, args.precision, quantization_options(args, max_accuracy_drop=max_drop))
    if plan.accuracy is None:
        print(format_table(plan.layers))
    output = args.output or Path("build") / f"{model.stem}.quant.json"
    with atomic_write(output, "w") as f:
        f.write(plan.to_json())
    n8 = sum(1 for r in plan.layers if r["precision"] == "int8")
    print(
        f"wrote {output} ({n8} of {len(plan.layers)} layers int8; build with --precision {args.precision} --quant-plan {output})"
    )
    return 0
