"""Embedded model, untuned TVM build vs onnxruntime on this CPU, same process, same inputs.

    python benchmarks/cpu_untuned.py [--seconds 3] [--batches 1,64]

Each system runs warm-up then timed synchronous runs for at least ``--seconds``; we report p50/p90 and
the ratio onnxruntime_p50 / tvm_p50 (> 1: inferx_edge faster). Untuned means TVM's default schedules:
the tuning engine's numbers are recorded by its own benchmark.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._record import versions, write_record
from inferx_edge.cli._common import DEFAULT_DATA, DEFAULT_MODEL
from inferx_edge.compiler import BuildOptions, build_artifact
from inferx_edge.runtime import Engine, LatencyStats
from inferx_edge.targets import host_target_name


def time_ort(sess, x: np.ndarray, seconds: float) -> LatencyStats:
    for _ in range(10):
        sess.run(None, {"image": x})
    samples, start = [], time.perf_counter()
    while len(samples) < 50 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        sess.run(None, {"image": x})
        samples.append(time.perf_counter() - t0)
    return LatencyStats.from_seconds(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--name", default=None, help="record name (default cpu_untuned_<target>)")
    args = ap.parse_args()
    import onnxruntime as ort

    target = host_target_name()
    with np.load(DEFAULT_DATA) as npz:
        images = npz["holdout_images"][:, None].astype(np.float32) / np.float32(255)
    sess = ort.InferenceSession(str(DEFAULT_MODEL), providers=["CPUExecutionProvider"])
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch in (int(b) for b in args.batches.split(",")):
            x = np.ascontiguousarray(images[:batch])
            art = Path(tmp) / f"b{batch}.ixa"
            build_artifact(BuildOptions(DEFAULT_MODEL, target, art, {"image": (batch, 1, 28, 28)}), log=lambda *a: None)
            with Engine(art) as engine:
                diff = float(np.abs(engine.run(x)["logits"] - sess.run(None, {"image": x})[0]).max())
                tvm_stats = engine.benchmark(x, warmup=10, repeat=50, min_seconds=args.seconds)
            ort_stats = time_ort(sess, x, args.seconds)
            for system, s in (
                ("inferx_edge untuned (TVM default schedules)", tvm_stats),
                ("onnxruntime CPU", ort_stats),
            ):
                results.append(
                    {
                        "system": system,
                        "model": "fmnist_cnn",
                        "precision": "fp32",
                        "batch": batch,
                        "p50_ms": s.p50_ms,
                        "p90_ms": s.p90_ms,
                        "mean_ms": s.mean_ms,
                        "runs": s.count,
                        "img_s": batch / (s.p50_ms / 1e3),
                    }
                )
            ratio = ort_stats.p50_ms / tvm_stats.p50_ms
            results[-2]["speedup_vs_onnxruntime_p50"] = ratio
            results[-2]["max_abs_diff_vs_onnxruntime"] = diff
            print(
                f"batch {batch}: inferx_edge p50 {tvm_stats.p50_ms:.3f} ms, onnxruntime p50 {ort_stats.p50_ms:.3f} ms "
                f"-> onnxruntime/inferx_edge = {ratio:.2f}x  (max |diff| {diff:.1e})"
            )
    path = write_record(
        args.name or f"cpu_untuned_{target}",
        {
            "device": f"CPU ({target})",
            "driver": None,
            "versions": versions("inferx_edge", "apache-tvm", "apache-tvm-ffi", "onnxruntime", "numpy"),
            "threads": {"tvm": "TVM_NUM_THREADS unset (all cores)", "onnxruntime": "default (all cores)"},
            "results": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
