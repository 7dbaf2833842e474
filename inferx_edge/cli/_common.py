"""Arguments and defaults shared by several subcommands."""

from __future__ import annotations

import argparse
from pathlib import Path

from inferx_edge.models import DEFAULT_MODEL
from inferx_edge.quantize.calibration import DEFAULT_METHOD, OBSERVERS
from inferx_edge.quantize.mixed import METRICS
from inferx_edge.targets import host_target_name


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        "-m",
        type=Path,
        default=None,
        help=f"ONNX file or torch.export program (.pt2); default: the embedded {DEFAULT_MODEL.name}",
    )
    p.add_argument(
        "--target",
        "-t",
        default=None,
        help=f"target name (see 'targets'); default: this host's CPU ({host_target_name()})",
    )
    p.add_argument(
        "--input-shape",
        action="append",
        metavar="NAME:D1xD2x...",
        default=[],
        help="pin an input's shape (dynamic dims); repeat for several inputs",
    )


def add_quantization_arguments(p: argparse.ArgumentParser, plan: bool = True) -> None:
    """Calibration and accuracy-budget flags shared by quantize, build and evaluate."""
    p.add_argument(
        "--calib",
        type=Path,
        default=None,
        help="int8 calibration data: .npz keyed by input name, .npy, or a directory of them "
        "(default for the embedded model: its 128 calibration images)",
    )
    p.add_argument(
        "--calib-method",
        default=DEFAULT_METHOD,
        choices=list(OBSERVERS),
        help=f"int8 activation calibration (default {DEFAULT_METHOD})",
    )
    p.add_argument(
        "--max-accuracy-drop",
        type=float,
        default=None,
        metavar="POINTS",
        help="budget in points of --accuracy-metric against fp32: mixed keeps the most sensitive layers in fp32 "
        "until it holds (default 0.5 for mixed); int8 is checked against it",
    )
    p.add_argument(
        "--accuracy-metric",
        default="auto",
        choices=METRICS,
        help="what the budget measures: top1 (accuracy with labels, else agreement with fp32) or cosine (100 x the "
        "mean per-sample cosine similarity of the first output to fp32's: a 1-point budget means >= 0.99). auto: "
        "top1 for labelled data or a 2-D output of float inputs (a classifier), cosine otherwise",
    )
    p.add_argument(
        "--min-int8-share",
        type=float,
        default=0.5,
        metavar="FRACTION",
        help="mixed: the budget counts as unmet if fewer than this share of conv/matmul MACs stay int8 (default 0.5)",
    )
    p.add_argument(
        "--eval-data",
        type=Path,
        default=None,
        help="data the budget is measured on: .npz with one array per input (or 'x') and optional integer "
        "'labels'/'y' (default: the embedded model's holdout; else the calibration data, as agreement with fp32)",
    )
    p.add_argument(
        "--float-between-layers",
        action="store_true",
        help="keep activations float between int8 layers (default: an activation whose readers are all int8 "
        "layers is stored as int8, and residual adds/pools read it dequantized, as TensorRT does)",
    )
    p.add_argument(
        "--allow-over-budget",
        action="store_true",
        help="when the budget cannot be met, keep the best mix found (with a warning) instead of failing",
    )
    if plan:
        p.add_argument(
            "--quant-plan",
            type=Path,
            default=None,
            help="apply a plan written by 'quantize' (thresholds and per-layer precisions) instead of calibrating",
        )


#: QuantOptions fields set by :func:`add_quantization_arguments` (same names as the parsed arguments).
QUANTIZATION_OPTIONS = (
    "calib",
    "calib_method",
    "quant_plan",
    "max_accuracy_drop",
    "accuracy_metric",
    "min_int8_share",
    "eval_data",
    "allow_over_budget",
    "float_between_layers",
)


def quantization_options(args: argparse.Namespace, **overrides):
    """The quantization arguments as a :class:`~inferx_edge.quantize.driver.QuantOptions`."""
    from inferx_edge.quantize.driver import QuantOptions

    values = {name: getattr(args, name) for name in QUANTIZATION_OPTIONS if hasattr(args, name)}
    return QuantOptions(**(values | overrides))


def add_trust_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trust",
        type=Path,
        default=None,
        metavar="PUBKEY|DIR",
        help="accept only artifacts signed by this key (or any *.pub in DIR); default: $INFERX_TRUST_DIR or "
        "~/.config/inferx_edge/trusted/ when it exists, else unsigned artifacts are accepted",
    )
