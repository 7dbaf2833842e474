"""ResNet-18 and MobileNetV2 on this CPU without a tuning database: inferx_edge's default CPU schedules
against onnxruntime and torch eager, same process, same inputs, same thread count.

    python -m benchmarks.cpu_vision [--models resnet18,mobilenet_v2] [--batches 1] [--seconds 5]

torchvision architectures with seeded random weights (``benchmarks/_nets.py``; speed does not depend on
the values), exported to ONNX (opset 17). inferx_edge builds fp32 for ``x86-cpu`` with ``--no-tuning``
(``compiler/cpu`` default schedules). Every system gets warm-up then timed synchronous runs for at least
``--seconds``; p50/p90 and the ratios of p50s measured in this run are recorded, with each output's
relative L2 error against torch fp32.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._record import versions, write_record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v2")
    ap.add_argument("--batches", default="1")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--name", default="cpu_vision_x86-cpu")
    args = ap.parse_args()

    import onnxruntime as ort
    import torch

    from benchmarks._nets import export_onnx, make_net
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.runtime import Engine
    from inferx_edge.runtime._tvm import cpu_thread_budget
    from inferx_edge.runtime.engine import time_calls

    threads = cpu_thread_budget()
    torch.set_num_threads(threads)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for model in args.models.split(","):
            net = make_net(model)
            onnx_path = export_onnx(net, tmp / f"{model}.onnx")
            batches = [int(b) for b in args.batches.split(",")]
            art = tmp / f"{model}.ixa"
            t0 = time.perf_counter()
            build_artifact(
                BuildOptions(model=onnx_path, target="x86-cpu", output=art, batch_sizes=tuple(batches), tuning=False),
                log=lambda m: None,
            )
            build_s = time.perf_counter() - t0
            engine = Engine(art, trust=False)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
            sess = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
            for i, batch in enumerate(batches):
                x = np.random.default_rng(i).standard_normal((batch, 3, 224, 224)).astype(np.float32)
                with torch.inference_mode():
                    ref = net(torch.from_numpy(x)).numpy().astype(np.float64)
                engine.select(f"fp32-b{batch}")
                got = engine.run(x)["logits"]
                ort_out = sess.run(None, {"image": x})[0]
                xt = torch.from_numpy(x)

                def torch_call(net=net, xt=xt):
                    with torch.inference_mode():
                        net(xt)

                systems = {
                    "inferx_edge_untuned": engine.benchmark(x, warmup=3, repeat=10, min_seconds=args.seconds),
                    "onnxruntime": time_calls(
                        lambda sess=sess, x=x: sess.run(None, {"image": x}), lambda: None, 3, 10, args.seconds
                    ),
                    "torch_eager": time_calls(torch_call, lambda: None, 3, 10, args.seconds),
                }

                def err(a, ref=ref):
                    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))

                row = {
                    "model": model,
                    "batch": batch,
                    "build_s": round(build_s, 1),
                    "rel_error_vs_torch_fp32": {"inferx_edge_untuned": err(got), "onnxruntime": err(ort_out)},
                    "p50_ms": {k: v.p50_ms for k, v in systems.items()},
                    "p90_ms": {k: v.p90_ms for k, v in systems.items()},
                    "runs": {k: v.count for k, v in systems.items()},
                }
                row["inferx_over_onnxruntime_p50"] = row["p50_ms"]["inferx_edge_untuned"] / row["p50_ms"]["onnxruntime"]
                row["inferx_over_torch_p50"] = row["p50_ms"]["inferx_edge_untuned"] / row["p50_ms"]["torch_eager"]
                results.append(row)
                print(
                    f"{model} b{batch}: inferx untuned {row['p50_ms']['inferx_edge_untuned']:.2f} ms, onnxruntime "
                    f"{row['p50_ms']['onnxruntime']:.2f} ms ({row['inferx_over_onnxruntime_p50']:.2f}x), torch "
                    f"{row['p50_ms']['torch_eager']:.2f} ms; build {build_s:.0f} s",
                    flush=True,
                )
            engine.close()
    path = write_record(
        args.name,
        {
            "threads": threads,
            "omp_env": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "TVM_NUM_THREADS"))},
            "versions": versions("apache-tvm", "onnxruntime", "torch", "numpy", "inferx_edge"),
            "models": "torchvision architectures (benchmarks/_nets.py), seeded random weights",
            "seconds": args.seconds,
            "results": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
