"""The embedded default model (a Fashion-MNIST CNN) and the labelled data shipped with it.

Its input is ``image``: float32 ``N x 1 x 28 x 28``, pixels scaled to [0, 1] (uint8 / 255).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

MODELS_DIR = Path(__file__).resolve().parent
DEFAULT_MODEL = MODELS_DIR / "fmnist_cnn.onnx"
DEFAULT_DATA = MODELS_DIR / "fmnist_data.npz"
#: how many holdout images the embedded data holds (the description names it)
HOLDOUT_DESCRIPTION = "embedded Fashion-MNIST holdout (500 test images)"


def is_default_model(model: Path | str | None) -> bool:
    """Whether ``model`` is the embedded model (None counts: it is every command's default)."""
    return model is None or Path(model).resolve() == DEFAULT_MODEL.resolve()


def _images(key: str) -> np.ndarray:
    with np.load(DEFAULT_DATA, allow_pickle=False) as npz:
        return npz[key][:, None].astype(np.float32) / np.float32(255.0)


def holdout() -> tuple[np.ndarray, np.ndarray]:
    """The embedded model's labelled holdout set: model-ready images (N x 1 x 28 x 28) and int64 labels."""
    with np.load(DEFAULT_DATA, allow_pickle=False) as npz:
        labels = npz["holdout_labels"].astype(np.int64)
    return _images("holdout_images"), labels


def calibration_images() -> np.ndarray:
    """The embedded model's 128 int8 calibration images, model-ready (N x 1 x 28 x 28)."""
    return _images("calib_images")
