"""ResNet-50 and MobileNetV2 on one NVIDIA GPU, every system in one process and one run: inferx_edge
INT8 and FP16 (with the tuning database of the target when one is committed), torch eager fp16
channels_last, torch.compile (inductor, CUDA graphs) fp16, and TVM's untuned default pipeline fp16.

    python -m benchmarks.gpu_vision --out DIR [--models resnet50,mobilenet_v2] [--batches 1,64]
        [--systems inferx-int8,inferx-fp16,torch-eager,torch-compile,tvm-default] [--window 3]

torchvision architectures with random weights (speed and energy only). Per (model, batch, system):
p50/p90 latency of synchronous calls with inputs already on the GPU, img/s, and mJ/img from the NVML
energy counter over the same window (read-only NVML; clocks and power limits are left as found).
Outputs are compared with torch fp32 eager on the same input (relative L2 error). The record is
rewritten after every system, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import numpy as np

from benchmarks._record import versions, write_record

SYSTEMS = ("inferx-int8", "inferx-fp16", "torch-eager", "torch-compile", "tvm-default")


class Timed:
    """Adapter giving a callable the ``benchmark`` method :func:`measure_window` expects."""

    def __init__(self, fn, sync):
        self.fn, self.sync = fn, sync

    def benchmark(self, _x, warmup: int = 5, repeat: int = 50, min_seconds: float = 0.0):
        from inferx_edge.runtime.engine import time_calls

        return time_calls(self.fn, self.sync, warmup, repeat, min_seconds)


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    got = np.asarray(got, np.float64).reshape(ref.shape)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def make_net(model: str):
    """The torchvision architecture with seeded random weights: every system runs the same network."""
    import torch
    import torchvision

    torch.manual_seed(0)
    return getattr(torchvision.models, model)(weights=None).eval()


def export(net, path: Path) -> None:
    from benchmarks._nets import export_onnx

    export_onnx(net, path)


def torch_system(name: str, model: str, batch: int, x: np.ndarray):
    import torch

    net = make_net(model).cuda().half().to(memory_format=torch.channels_last)
    xt = torch.from_numpy(x).cuda().half().contiguous(memory_format=torch.channels_last)
    if name == "torch-compile":
        net = torch.compile(net, mode="reduce-overhead")
    with torch.inference_mode():
        for _ in range(3):  # compiles (inductor) / captures the CUDA graph
            out = net(xt)
        torch.cuda.synchronize()
        out = net(xt).float().cpu().numpy()

    def call():
        with torch.inference_mode():
            net(xt)

    return Timed(call, torch.cuda.synchronize), out, {"precision": "fp16"}


def tvm_default_system(onnx_path: Path, batch: int, x: np.ndarray):
    """TVM's own path: import, fp16 by ToMixedPrecision, ``tvm.compile`` with the default CUDA pipeline."""
    import tvm
    from tvm import relax

    from inferx_edge.frontend import import_model
    from inferx_edge.targets import get_target

    im = import_model(onnx_path, {"image": (batch, 3, 224, 224)})
    mod = relax.transform.ToMixedPrecision(out_dtype="float16")(im.mod)
    target = tvm.target.Target(get_target("h200").tvm_target)
    ex = tvm.compile(mod, target)
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    params = [tvm.runtime.tensor(p, dev) for p in im.params]
    xt = tvm.runtime.tensor(x, dev)
    out = vm["main"](xt, *params)
    out = (out if isinstance(out, tvm.runtime.Tensor) else out[0]).numpy()
    return Timed(lambda: vm["main"](xt, *params), dev.sync), out, {"precision": "fp16"}


def quantization_plan(onnx_path: Path, calib: Path, out: Path) -> Path:
    """The model's int8 plan (entropy calibration on ``calib``), computed once and shared by every batch
    size: thresholds are per layer, independent of the batch."""
    from inferx_edge.frontend import import_model
    from inferx_edge.package.atomic import atomic_write
    from inferx_edge.quantize.driver import QuantOptions, make_plan

    path = out / f"{onnx_path.stem}.quant.json"
    if not path.exists():
        shapes = {"image": (1, 3, 224, 224)}
        plan = make_plan(
            onnx_path, shapes, import_model(onnx_path, shapes), "int8", QuantOptions(calib=calib), log=lambda *a: None
        )
        with atomic_write(path, "w") as f:
            f.write(plan.to_json())
    return path


def inferx_system(onnx_path: Path, batch: int, x: np.ndarray, precision: str, target: str, calib: Path, tmp: Path):
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.quantize.driver import QuantOptions
    from inferx_edge.runtime import Engine

    art = tmp / f"{onnx_path.stem}-{precision}-b{batch}.ixa"
    plan = quantization_plan(onnx_path, calib, tmp) if precision in ("int8", "mixed") else None
    shapes = {"image": (batch, 3, 224, 224)}
    manifest = build_artifact(
        BuildOptions(
            model=onnx_path,
            target=target,
            output=art,
            input_shapes=shapes,
            precisions=(precision,),
            quant=QuantOptions(calib=calib, quant_plan=plan),
        ),
        log=lambda *a: None,
    )
    engine = Engine(art)
    out = engine.run(x)[engine.variant.outputs[0].name]
    v = manifest.variants[0]
    info = {"precision": precision, "tuned": v.tuned, "tuning": v.extra.get("tuning")}
    if "quantization" in v.extra:
        info["int8_mac_share"] = v.extra["quantization"]["int8_mac_share"]
    return engine, out, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="resnet50,mobilenet_v2")
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--target", default="h200")
    ap.add_argument("--window", type=float, default=3.0)
    ap.add_argument("--calib-samples", type=int, default=16)
    ap.add_argument("--name", default=None, help="record name (default gpu_vision_<target>)")
    args = ap.parse_args()
    import torch

    from inferx_edge.report.profile import measure_window
    from inferx_edge.runtime.telemetry import probe

    args.out.mkdir(parents=True, exist_ok=True)
    systems = args.systems.split(",")
    bad = sorted(set(systems) - set(SYSTEMS))
    if bad:
        raise SystemExit(f"unknown systems {bad}; valid: {', '.join(SYSTEMS)}")
    backend = probe("nvml")
    idle = backend.read().power_w
    rng = np.random.default_rng(0)
    calib = args.out / "calib.npy"
    np.save(calib, rng.standard_normal((args.calib_samples, 3, 224, 224)).astype(np.float32))
    results, record_name = [], args.name or f"gpu_vision_{args.target}"

    def save():
        rec = write_record(
            record_name,
            {
                "device": torch.cuda.get_device_name(0),
                "driver": getattr(backend, "driver", None),
                "power_limit_w": getattr(backend, "power_limit_w", None),
                "idle_w_at_start": idle,
                "versions": versions("apache-tvm", "torch", "torchvision", "nvidia-ml-py", "inferx_edge"),
                "models": "torchvision architectures, random weights",
                "window_s": args.window,
                "results": results,
            },
        )
        (args.out / rec.name).write_text(rec.read_text())

    for model in args.models.split(","):
        onnx_path = args.out / f"{model}.onnx"
        export(make_net(model), onnx_path)
        ref_net = make_net(model).cuda()
        for batch in (int(b) for b in args.batches.split(",")):
            x = rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)
            with torch.inference_mode():
                ref = ref_net(torch.from_numpy(x).cuda()).double().cpu().numpy()
            for system in systems:
                row = {"system": system, "model": model, "batch": batch}
                t0 = time.time()
                try:
                    if system.startswith("torch"):
                        runner, out, info = torch_system(system, model, batch, x)
                    elif system == "tvm-default":
                        runner, out, info = tvm_default_system(onnx_path, batch, x)
                    else:
                        precision = system.split("-")[1]
                        runner, out, info = inferx_system(onnx_path, batch, x, precision, args.target, calib, args.out)
                    row |= info | {"setup_s": round(time.time() - t0, 1), "rel_error_vs_fp32": rel_error(out, ref)}
                    runner.benchmark(x, warmup=10, repeat=10, min_seconds=1.0)
                    w = measure_window(runner, x, batch, backend, args.window)
                    row |= {
                        "p50_ms": w["p50_ms"],
                        "p90_ms": w["p90_ms"],
                        "img_s": w["fps"],
                        "mJ_img": w["j_per_frame"] * 1e3 if w["j_per_frame"] is not None else None,
                        "avg_w": w["avg_w"],
                        "energy_method": w["method"],
                    }
                    if hasattr(runner, "close"):
                        runner.close()
                except Exception as exc:  # record the failure and go on with the next system
                    row |= {"error": f"{type(exc).__name__}: {exc}"[:2000], "setup_s": round(time.time() - t0, 1)}
                    traceback.print_exc()
                results.append(row)
                print(json.dumps(row), flush=True)
                save()
                torch.cuda.empty_cache()
        del ref_net
    backend.close()
    print(f"wrote {record_name}.json")


if __name__ == "__main__":
    main()
