"""Arguments and defaults shared by several subcommands."""

from __future__ import annotations

import argparse
from pathlib import Path

from inferx_edge.targets import host_target_name

MODELS_DIR = Path(__file__).resolve().parent.parent / "models"
#: The embedded default model (a Fashion-MNIST CNN) and its labelled holdout set.
DEFAULT_MODEL = MODELS_DIR / "fmnist_cnn.onnx"
DEFAULT_DATA = MODELS_DIR / "fmnist_data.npz"


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


def default_output(model: Path, target: str) -> Path:
    return Path("build") / f"{model.stem}-{target}.ixa"
