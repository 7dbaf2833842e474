"""Embedded model on this CPU: inferx_edge tuned vs untuned vs onnxruntime, same process, same inputs.

    python -m benchmarks.cpu_latency [--seconds 3] [--batches 1,64]

"tuned" applies the committed database in tuning_logs/x86-cpu/ (made with ``python -m inferx_edge tune
--target x86-cpu --input-shape image:Bx1x28x28 --trials N --minutes 10-14`` in resumed chunks, then
``--prune``: 546 trials at batch 1, 1,574 at batch 64; xgboost, two threads); "untuned" is the default
schedules (inferx_edge.compiler.cpu: parallel + vector loops). Both run the convolutions in NHWC with HWIO weights (``compiler.variant.variant_layout``). Each
system runs warm-up then timed synchronous runs for at least ``--seconds``; we report p50/p90 and
ratios of p50s measured in this run.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from benchmarks._record import versions, write_record
from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.models import DEFAULT_DATA, DEFAULT_MODEL
from inferx_edge.runtime import Engine, LatencyStats
from inferx_edge.runtime.engine import time_calls
from inferx_edge.targets import host_target_name


def time_ort(sess, x: np.ndarray, seconds: float) -> LatencyStats:
    return time_calls(lambda: sess.run(None, {"image": x}), lambda: None, 10, 50, seconds)


def _llvm_cpu() -> str:
    import tvm

    return str(tvm.target.codegen.llvm_get_system_cpu())


def _built_for() -> str:
    from inferx_edge.compiler.compile import host_mcpu

    return host_mcpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--name", default=None, help="record name (default cpu_latency_<target>)")
    args = ap.parse_args()
    import onnxruntime as ort

    from inferx_edge.runtime._tvm import set_default_cpu_threads

    threads = set_default_cpu_threads()  # as the CLI and the runtime do
    target = host_target_name()
    with np.load(DEFAULT_DATA) as npz:
        images = npz["holdout_images"][:, None].astype(np.float32) / np.float32(255)
    sess = ort.InferenceSession(str(DEFAULT_MODEL), providers=["CPUExecutionProvider"])
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch in (int(b) for b in args.batches.split(",")):
            x = np.ascontiguousarray(images[:batch])
            stats, extra = {}, {}
            for tuned in (False, True):
                art = Path(tmp) / f"b{batch}-{tuned}.ixa"
                opts = BuildOptions(
                    model=DEFAULT_MODEL,
                    target=target,
                    output=art,
                    input_shapes={"image": (batch, 1, 28, 28)},
                    tuning=tuned,
                )
                build_log: list[str] = []
                build_artifact(opts, log=build_log.append)
                with Engine(art) as engine:
                    name = "inferx_edge tuned" if tuned else "inferx_edge untuned (default schedules, compiler/cpu)"
                    if tuned and not engine.variant.tuned:
                        print(f"batch {batch}: no tuning database in tuning_logs/; skipping the tuned system")
                        continue
                    diff = float(np.abs(engine.run(x)["logits"] - sess.run(None, {"image": x})[0]).max())
                    stats[name] = engine.benchmark(x, warmup=10, repeat=50, min_seconds=args.seconds)
                    extra[name] = {"max_abs_diff_vs_onnxruntime": diff}
                    if tuned:
                        extra[name] |= {k: engine.variant.extra["tuning"][k] for k in ("kernels_tuned", "kernels")}
                        extra[name]["database"] = Path(engine.variant.extra["tuning"]["database"]).name
                        extra[name]["database_note"] = next(
                            (line.strip().removeprefix("note: ") for line in build_log if "tuned on" in line), None
                        )
            stats["onnxruntime CPU"] = time_ort(sess, x, args.seconds)
            ort_p50 = stats["onnxruntime CPU"].p50_ms
            untuned_p50 = stats["inferx_edge untuned (default schedules, compiler/cpu)"].p50_ms
            for system, s in stats.items():
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
                        "onnxruntime_p50_over_this_p50": ort_p50 / s.p50_ms,
                        "untuned_p50_over_this_p50": untuned_p50 / s.p50_ms,
                        **extra.get(system, {}),
                    }
                )
                print(
                    f"batch {batch:3d}  {system:45s} p50 {s.p50_ms:8.3f} ms  "
                    f"x{untuned_p50 / s.p50_ms:6.2f} vs untuned  x{ort_p50 / s.p50_ms:5.2f} vs onnxruntime"
                )
    path = write_record(
        args.name or f"cpu_latency_{target}",
        {
            "device": f"CPU ({target})",
            "driver": None,
            "versions": versions("inferx_edge", "apache-tvm", "apache-tvm-ffi", "onnxruntime", "numpy"),
            "threads": {"tvm": threads, "onnxruntime": "default (intra-op pool: one thread per core)"},
            "cpu": {"llvm_name": _llvm_cpu(), "built_for": _built_for()},
            "results": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
