"""INT8 on the embedded model and its real labelled holdout set, next to onnxruntime's quantize_static,
same calibration images, same run, this CPU.

    python -m benchmarks.int8_cpu [--seconds 3] [--batch 1]

Systems: inferx_edge fp32 / int8 (entropy calibration) / mixed (budget 0.5 points) / int8 from
onnxruntime's QDQ model (its own scales, no calibration of ours); onnxruntime fp32 and its
quantize_static QDQ model (per-channel int8 weights, int8 activations, entropy and min-max calibration,
symmetric activations). Per system: top-1 on the 500 holdout images, weight bytes (int8 vs fp32 arrays;
onnxruntime: the .onnx file), int8 share of conv/matmul MACs, and batch latency p50/p90 (synchronous,
inputs resident). Ratios are read from numbers measured in this run only.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._record import versions, write_record
from benchmarks.cpu_latency import time_ort
from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.models import DEFAULT_DATA, DEFAULT_MODEL
from inferx_edge.package import open_artifact
from inferx_edge.quantize.driver import QuantOptions
from inferx_edge.runtime import Engine
from inferx_edge.targets import host_target_name


def ort_quantize(out: Path, calib: np.ndarray, method: str) -> Path:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"image": calib[i : i + 1]} for i in range(len(calib)))

        def get_next(self):
            return next(self.it, None)

    quantize_static(
        str(DEFAULT_MODEL),
        str(out),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        calibrate_method={"entropy": CalibrationMethod.Entropy, "minmax": CalibrationMethod.MinMax}[method],
        extra_options={"ActivationSymmetric": True},
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--name", default=None, help="record name (default int8_cpu_<target>)")
    args = ap.parse_args()
    import onnxruntime as ort

    target = host_target_name()
    with np.load(DEFAULT_DATA) as npz:
        x = npz["holdout_images"][:, None].astype(np.float32) / np.float32(255)
        y = npz["holdout_labels"].astype(np.int64)
        calib = npz["calib_images"][:, None].astype(np.float32) / np.float32(255)
    b = args.batch
    n = len(x) // b * b
    results = []

    def top1(logits):
        return float((logits.argmax(1) == y[: len(logits)]).mean() * 100)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        qdq = {m: ort_quantize(tmp / f"ort_qdq_{m}.onnx", calib, m) for m in ("entropy", "minmax")}
        builds = [
            ("inferx_edge fp32", DEFAULT_MODEL, "fp32", {}),
            ("inferx_edge int8 (entropy)", DEFAULT_MODEL, "int8", {}),
            ("inferx_edge mixed (budget 0.5)", DEFAULT_MODEL, "mixed", {"max_accuracy_drop": 0.5}),
            ("inferx_edge int8 from onnxruntime QDQ (entropy)", qdq["entropy"], "int8", {}),
        ]
        for name, model, precision, extra in builds:
            art = tmp / f"{len(results)}.ixa"
            t0 = time.perf_counter()
            opts = BuildOptions(
                model=model,
                target=target,
                output=art,
                input_shapes={"image": (b, 1, 28, 28)},
                precisions=(precision,),
                quant=QuantOptions(**extra),
            )
            build_artifact(opts, log=lambda *a: None)
            build_s = time.perf_counter() - t0
            with open_artifact(art) as a:
                v = a.manifest.variants[0]
                with np.load(a.member(v.weights)) as w:
                    weight_bytes = int(sum(w[k].nbytes for k in w.files))
                q = v.extra.get("quantization")
            with Engine(art) as e:
                out = e.variant.outputs[0].name
                logits = np.concatenate([e.run(x[i : i + b])[out] for i in range(0, n, b)])
                s = e.benchmark(x[:b], warmup=20, repeat=50, min_seconds=args.seconds)
            results.append(
                {
                    "system": name,
                    "precision": precision,
                    "top1": top1(logits),
                    "weight_bytes": weight_bytes,
                    "int8_mac_share": q["int8_mac_share"] if q else 0.0,
                    "layers_int8": sum(r["precision"] == "int8" for r in q["layers"]) if q else 0,
                    "calibration": q["calibration"] if q else None,
                    "p50_ms": s.p50_ms,
                    "p90_ms": s.p90_ms,
                    "build_s": round(build_s, 1),
                }
            )
            print(results[-1], flush=True)
        for name, path in [
            ("onnxruntime fp32", DEFAULT_MODEL),
            ("onnxruntime quantize_static QDQ (entropy)", qdq["entropy"]),
            ("onnxruntime quantize_static QDQ (minmax)", qdq["minmax"]),
        ]:
            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            logits = np.concatenate([sess.run(None, {"image": x[i : i + b]})[0] for i in range(0, n, b)])
            s = time_ort(sess, x[:b], args.seconds)
            results.append(
                {
                    "system": name,
                    "precision": "int8" if "QDQ" in name else "fp32",
                    "top1": top1(logits),
                    "model_file_bytes": path.stat().st_size,
                    "p50_ms": s.p50_ms,
                    "p90_ms": s.p90_ms,
                }
            )
            print(results[-1], flush=True)
    by = {r["system"]: r for r in results}
    fp32, int8 = by["inferx_edge fp32"], by["inferx_edge int8 (entropy)"]
    ort_fp32, ort_q = by["onnxruntime fp32"], by["onnxruntime quantize_static QDQ (entropy)"]
    summary = {
        "int8_top1_drop_points": fp32["top1"] - int8["top1"],
        "int8_mac_share": int8["int8_mac_share"],
        "int8_weight_bytes_over_fp32": int8["weight_bytes"] / fp32["weight_bytes"],
        "target_met": fp32["top1"] - int8["top1"] <= 0.5 and int8["int8_mac_share"] >= 0.9,
        "inferx_int8_top1_minus_onnxruntime_int8_top1": int8["top1"] - ort_q["top1"],
        "inferx_int8_p50_over_inferx_fp32_p50": int8["p50_ms"] / fp32["p50_ms"],
        "inferx_int8_p50_over_onnxruntime_int8_p50": int8["p50_ms"] / ort_q["p50_ms"],
        "onnxruntime_int8_p50_over_onnxruntime_fp32_p50": ort_q["p50_ms"] / ort_fp32["p50_ms"],
    }
    print(summary)
    rec = write_record(
        args.name or f"int8_cpu_{target}",
        {
            "device": "CPU (see host)",
            "model": "embedded Fashion-MNIST CNN",
            "data": "500 labelled holdout images; calibration: the 128 embedded calibration images (both tools)",
            "batch": b,
            "versions": versions("apache-tvm", "onnxruntime", "numpy", "inferx_edge"),
            "results": results,
            "summary": summary,
        },
    )
    print(f"wrote {rec}")


if __name__ == "__main__":
    main()
