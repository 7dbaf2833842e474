"""Train the embedded default model (a small Fashion-MNIST CNN) and write its holdout set.

Produces, inside the package so that every command works offline:

- ``inferx_edge/models/fmnist_cnn.onnx``  FP32 ONNX, opset 13, input ``image`` float32 [N,1,28,28]
  holding pixels scaled to [0, 1] (normalisation is part of the graph), output ``logits`` [N,10].
- ``inferx_edge/models/fmnist_data.npz``  ``holdout_images``/``holdout_labels``: 500 images of the
  official test split (50 per class), never seen in training; ``calib_images``: 128 images of the
  training split, for INT8 calibration; ``class_names``.
- ``inferx_edge/models/fmnist_cnn.json``  provenance: seed, epochs, accuracy on the full test split.

Needs torch and Debian's ``dataset-fashion-mnist`` (``apt-get install dataset-fashion-mnist``).
Deterministic for a given torch build: ``python scripts/make_default_model.py``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

DATASET_DIR = Path("/usr/share/datasets/fashion-mnist")
OUT_DIR = Path(__file__).resolve().parent.parent / "inferx_edge" / "models"
CLASS_NAMES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
MEAN, STD = 0.2860, 0.3530


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST container format): magic, dims, then raw uint8 data."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


class FashionCNN(nn.Module):
    """Three stride-2 convolutions with batch norm, global average pool, one linear layer."""

    def __init__(self) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(cout),
                nn.ReLU(inplace=True),
            )

        self.features = nn.Sequential(block(1, 24), block(24, 48), block(48, 64))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, 10)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = (image - MEAN) / STD
        x = self.pool(self.features(x)).flatten(1)
        return self.fc(x)


def evaluate(model: nn.Module, images: np.ndarray, labels: np.ndarray) -> float:
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(images[:, None].astype(np.float32) / 255.0)
        pred = torch.cat([model(xb).argmax(1) for xb in x.split(1000)]).numpy()
    return float((pred == labels).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT_DIR)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    torch.set_num_threads(2)
    xtr = read_idx(DATASET_DIR / "train-images-idx3-ubyte.gz")
    ytr = read_idx(DATASET_DIR / "train-labels-idx1-ubyte.gz")
    xte = read_idx(DATASET_DIR / "t10k-images-idx3-ubyte.gz")
    yte = read_idx(DATASET_DIR / "t10k-labels-idx1-ubyte.gz")

    model = FashionCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    steps = args.epochs * (len(xtr) // 128)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=steps)
    xt = torch.from_numpy(xtr[:, None].astype(np.float32) / 255.0)
    yt = torch.from_numpy(ytr.astype(np.int64))
    t0 = time.time()
    for epoch in range(args.epochs):
        model.train()
        perm = torch.from_numpy(rng.permutation(len(xtr)))
        for i in range(len(xtr) // 128):
            idx = perm[i * 128 : (i + 1) * 128]
            loss = nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        acc = evaluate(model, xte, yte)
        print(
            f"epoch {epoch + 1}/{args.epochs}: loss {loss.item():.3f}  test top-1 {acc:.4f}  ({time.time() - t0:.0f} s)"
        )

    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    onnx_path = args.out / "fmnist_cnn.onnx"
    torch.onnx.export(
        model,
        (torch.zeros(1, 1, 28, 28),),
        str(onnx_path),
        dynamo=False,
        opset_version=13,
        input_names=["image"],
        output_names=["logits"],
        dynamic_axes={"image": {0: "N"}, "logits": {0: "N"}},
    )

    holdout = np.concatenate([rng.choice(np.flatnonzero(yte == c), 50, replace=False) for c in range(10)])
    holdout.sort()
    calib = np.sort(rng.choice(len(xtr), 128, replace=False))
    np.savez_compressed(
        args.out / "fmnist_data.npz",
        holdout_images=xte[holdout],
        holdout_labels=yte[holdout],
        calib_images=xtr[calib],
        class_names=np.array(CLASS_NAMES),
    )
    info = {
        "name": "fmnist_cnn",
        "dataset": "Fashion-MNIST (Debian dataset-fashion-mnist)",
        "architecture": "3x [conv3x3 stride 2, BN, ReLU] (24/48/64 ch), global avg pool, linear 64->10",
        "parameters": sum(p.numel() for p in model.parameters()),
        "input": {"name": "image", "shape": ["N", 1, 28, 28], "dtype": "float32", "scale": "pixel / 255"},
        "epochs": args.epochs,
        "seed": args.seed,
        "torch": torch.__version__,
        "test_top1_full_10k": evaluate(model, xte, yte),
        "holdout_top1_torch": evaluate(model, xte[holdout], yte[holdout]),
        "holdout": "50 images per class from the t10k split",
        "calib": "128 images of the train split",
    }
    (args.out / "fmnist_cnn.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
