"""Per-kernel profiles (time, calls, FLOPs, bytes, SM clock) of the twin's reference variants on a GPU:
the input of the Jetson twin's latency model (``inferx_edge.twin.latency``).

    python -m benchmarks.twin_kernel_profiles --out DIR [--models resnet50,mobilenet_v2]
        [--precisions int8,fp16] [--batches 1,8,64] [--target h200]

torchvision architectures with seeded random weights (``benchmarks/_nets.py``), int8 calibrated
(entropy) on 16 random images; each profile is ``scripts/kernel_profile.py --json`` in this process
(TVM's tensor intrinsics are imported once), written as soon as it is done
(``DIR/kernel_profile_<target>_<model>_<precision>_b<batch>.json``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="resnet50,mobilenet_v2")
    ap.add_argument("--precisions", default="int8,fp16")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "scripts"))
    import kernel_profile

    from benchmarks._nets import export_onnx, make_net

    args.out.mkdir(parents=True, exist_ok=True)
    calib = args.out / "calib.npy"
    np.save(calib, np.random.default_rng(1).standard_normal((16, 3, 224, 224)).astype(np.float32))
    for model in args.models.split(","):
        onnx_path = export_onnx(make_net(model), args.out / f"{model}.onnx")
        for precision in args.precisions.split(","):
            for batch in args.batches.split(","):
                out = args.out / f"kernel_profile_{args.target}_{model}_{precision}_b{batch}.json"
                t0 = time.perf_counter()
                argv = ["-m", str(onnx_path), "-t", args.target, "--precision", precision, "--runs", str(args.runs)]
                argv += ["--input-shape", f"image:{batch}x3x224x224", "--json", str(out)]
                if precision in ("int8", "mixed"):
                    argv += ["--calib", str(calib)]
                kernel_profile.main(argv)
                print(f"== {out.name} in {time.perf_counter() - t0:.0f} s", flush=True)
        onnx_path.unlink()
    calib.unlink()


if __name__ == "__main__":
    main()
