"""The embedded default model: shipped files, provenance, and accuracy on real labelled data."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from inferx_edge.models import DEFAULT_DATA, DEFAULT_MODEL, MODELS_DIR

FMNIST = Path("/usr/share/datasets/fashion-mnist")


def test_embedded_files_are_small_and_described():
    total = sum(p.stat().st_size for p in MODELS_DIR.iterdir() if p.is_file())
    assert total < 500 * 1024
    info = json.loads((MODELS_DIR / "fmnist_cnn.json").read_text())
    assert info["test_top1_full_10k"] > 0.88
    with np.load(DEFAULT_DATA) as npz:
        assert npz["holdout_images"].shape == (500, 28, 28) and npz["holdout_images"].dtype == np.uint8
        assert np.bincount(npz["holdout_labels"]).tolist() == [50] * 10
        assert npz["calib_images"].shape == (128, 28, 28)


def _idx(path: Path) -> np.ndarray:
    data = gzip.open(path).read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)


@pytest.mark.skipif(not FMNIST.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_full_test_split_accuracy_through_the_runtime(tmp_path):
    """All 10,000 Fashion-MNIST test images through a batch-100 build of the embedded model."""
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.runtime import Engine
    from inferx_edge.targets import host_target_name

    out = tmp_path / "b100.ixa"
    build_artifact(
        BuildOptions(
            model=DEFAULT_MODEL, target=host_target_name(), output=out, input_shapes={"image": (100, 1, 28, 28)}
        ),
        log=lambda *a: None,
    )
    x = _idx(FMNIST / "t10k-images-idx3-ubyte.gz")[:, None].astype(np.float32) / np.float32(255)
    y = _idx(FMNIST / "t10k-labels-idx1-ubyte.gz")
    with Engine(out) as engine:
        pred = np.concatenate([engine.run(x[i : i + 100])["logits"].argmax(1) for i in range(0, 10000, 100)])
    top1 = float((pred == y).mean())
    info = json.loads((MODELS_DIR / "fmnist_cnn.json").read_text())
    assert abs(top1 - info["test_top1_full_10k"]) <= 0.002  # same network, compiled: same accuracy
