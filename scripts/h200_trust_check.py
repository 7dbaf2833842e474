"""On a GPU host: the default CUDA toolkit discovery (no environment variables), a GPU build of the
embedded model, run through the runtime and compared with the CPU build; prints a JSON record."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    out_dir = Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    from inferx_edge import models
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.compiler.cuda.toolkit import discover_nvrtc
    from inferx_edge.package import read_manifest
    from inferx_edge.runtime import Engine

    record = {"discovery": {}}
    for major in (None, 12, 13):
        d = discover_nvrtc(major)
        record["discovery"][str(major)] = {
            "usable": [f"NVRTC {n.version_str} {n.library}" for n in d.usable],
            "rejected": [list(r) for r in d.rejected],
        }
    x, _ = models.holdout()
    x = x[:16]
    outs = {}
    for target in ("h200", "x86-cpu"):
        for precision in ("fp32", "int8"):
            art = out_dir / f"{target}-{precision}.ixa"
            t0 = time.time()
            build_artifact(
                BuildOptions(model=models.DEFAULT_MODEL, target=target, output=art,
                             input_shapes={"image": (16, 1, 28, 28)}, precisions=(precision,), tuning=False),
                log=lambda *a: None,
            )  # fmt: skip
            m = read_manifest(art)
            with Engine(art) as engine:
                y = engine.run(x)["logits"]
                stats = engine.benchmark(x, repeat=50)
            outs[(target, precision)] = y
            record[f"{target}-{precision}"] = {
                "build_s": round(time.time() - t0, 1),
                "cuda_toolkit": m.target.get("cuda_toolkit"),
                "cuda_code_arch": m.target.get("cuda_code_arch"),
                "p50_ms": stats.p50_ms,
            }
    for precision in ("fp32", "int8"):
        gpu, cpu = outs[("h200", precision)], outs[("x86-cpu", precision)]
        record[f"compare-{precision}"] = {
            "max_abs_diff": float(np.abs(gpu - cpu).max()),
            "top1_agreement": float((gpu.argmax(1) == cpu.argmax(1)).mean()),
        }
    print(json.dumps(record, indent=1))
    (out_dir / "h200_trust_check.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
