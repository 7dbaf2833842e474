"""The CUDA 12 build of TVM's CUDA runtime against the apache-tvm wheel's (CUDA 13), on the same
artifacts, GPU and run: outputs must be equal and throughput the same.

    # on the build host (NVRTC 12 from the cuda12 extra; torch for the ONNX export):
    python -m inferx_edge cuda-runtime --arch x86_64 --out build/cuda12-runtime
    python -m benchmarks.cuda12_runtime prepare .c12 [--models resnet50,mobilenet_v2,embedded]
    # on the GPU host (runtime only: no compiler, no torch needed):
    python -m benchmarks.cuda12_runtime check .c12 --plugin build/cuda12-runtime/x86_64/libtvm_runtime_cuda.so

``prepare`` builds ResNet-50 int8 and MobileNetV2 int8 (seeded random weights of torchvision's
architectures, ``benchmarks/_nets.py``; entropy calibration on random images) and the embedded model
fp32 + int8 for ``--target`` (default h200), each at batch 1 and 64, with the NVRTC 12 the build host
has. Inputs are seeded random arrays made in each process (the same bytes for both runtimes). ``check`` runs every variant once per runtime per round in
a fresh process (a process loads one ``libtvm_runtime_cuda.so``; rounds alternate which goes first),
records which libraries the process actually mapped (``/proc/self/maps``: ``libcudart.so.12`` and no
``libcudart.so.13`` for the plugin), compares outputs (int8 bit-exact, fp32 within 1e-5 relative) and
reports img/s over ``--seconds`` per round and the plugin/wheel ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
MODELS = ("resnet50", "mobilenet_v2", "embedded")
BATCHES = (1, 64)


def _input_for(spec_shape: list[int], dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.standard_normal(spec_shape).astype(dtype)


def prepare(args) -> None:
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.models import DEFAULT_MODEL
    from inferx_edge.quantize.driver import QuantOptions

    out = args.dir
    out.mkdir(parents=True, exist_ok=True)
    plans = []
    for model in args.models.split(","):
        if model not in MODELS:
            raise SystemExit(f"unknown model {model!r}; valid: {', '.join(MODELS)}")
        if model == "embedded":
            plans.append((model, DEFAULT_MODEL, "fp32,int8", None, None))
            continue
        from benchmarks._nets import export_onnx, make_net

        onnx_path = export_onnx(make_net(model), out / f"{model}.onnx")
        calib = out / f"{model}.calib.npy"
        np.save(calib, np.random.default_rng(1).standard_normal((16, 3, 224, 224)).astype(np.float32))
        plans.append((model, onnx_path, "int8", calib, {"image": (-1, 3, 224, 224)}))
    for model, path, precisions, calib, _ in plans:
        art = out / f"{model}-{args.target}.ixa"
        t0 = time.perf_counter()
        build_artifact(
            BuildOptions(
                model=path,
                target=args.target,
                output=art,
                precisions=tuple(precisions.split(",")),
                batch_sizes=BATCHES,
                quant=QuantOptions(calib=calib) if calib else QuantOptions(),
                force=True,
            ),
            log=lambda m, model=model: print(f"  [{model}] {m}", flush=True),
        )
        print(f"{art.name}: {art.stat().st_size / 2**20:.1f} MiB in {time.perf_counter() - t0:.0f} s", flush=True)
    for leftover in [*out.glob("*.onnx"), *out.glob("*.calib.npy")]:
        leftover.unlink()  # the artifacts and inputs are what travels to the GPU host


def _mapped_libraries() -> list[str]:
    libs = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        if any(k in path for k in ("libcudart", "libtvm_runtime_cuda", "libcuda.so")):
            libs.add(path)
    return sorted(libs)


def one(args) -> None:
    """Child process: run every variant of one artifact with the runtime ``INFERX_CUDA_RUNTIME`` names."""
    from inferx_edge.runtime import Engine

    engine = Engine(args.artifact, trust=False)
    result = {"runtime_lines": engine.runtime_lines(), "mapped": _mapped_libraries(), "variants": {}}
    for i, v in enumerate(engine.manifest.variants):
        engine.select(v.name)
        spec = v.inputs[0]
        x = _input_for(list(spec.shape), spec.dtype, 100 + i)  # the same seeded input in every process
        outputs = engine.run(x)
        np.save(args.save_dir / f"{v.name}.npy", outputs[v.outputs[0].name])
        stats = engine.benchmark(x, warmup=20, repeat=50, min_seconds=args.seconds)
        batch = x.shape[0]
        result["variants"][v.name] = {
            "batch": batch,
            "precision": v.precision,
            "p50_ms": stats.p50_ms,
            "mean_ms": stats.mean_ms,
            "calls": stats.count,
            "img_per_s": batch * 1000.0 / stats.mean_ms,
        }
    print("RESULT " + json.dumps(result), flush=True)


def _child(artifact: Path, runtime: str, save_dir: Path, seconds: float) -> dict:
    save_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, INFERX_CUDA_RUNTIME=runtime)
    cmd = [sys.executable, "-m", "benchmarks.cuda12_runtime", "_one", str(artifact), str(save_dir), str(seconds)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(
        f"{artifact.name} with {runtime}: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}"
    )


def _compare(a: np.ndarray, b: np.ndarray, precision: str) -> dict:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    diff = float(np.max(np.abs(a64 - b64))) if a.size else 0.0
    rel = float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-30))
    exact = bool(np.array_equal(a, b))
    ok = exact if precision == "int8" else rel <= 1e-5
    return {"bit_exact": exact, "max_abs_diff": diff, "rel_l2": rel, "equal_within_goal": ok}


def check(args) -> None:
    from benchmarks._record import gpu_driver, versions, write_record

    plugin = args.plugin.resolve()
    if not plugin.is_file():
        raise SystemExit(f"--plugin {plugin}: no such file (python -m inferx_edge cuda-runtime builds it)")
    build_json = plugin.parent / "build.json"
    arts = sorted(args.dir.glob("*.ixa"))
    if not arts:
        raise SystemExit(f"no artifacts in {args.dir} (run 'prepare' first)")
    work = args.out / "outputs"
    rows, processes = [], []
    for art in arts:
        runs = {"wheel": [], "plugin": []}
        for r in range(args.rounds):
            order = ("wheel", "plugin") if r % 2 == 0 else ("plugin", "wheel")
            for which in order:
                res = _child(
                    art, "wheel" if which == "wheel" else str(plugin), work / art.stem / f"{which}{r}", args.seconds
                )
                runs[which].append(res)
                processes.append(
                    {
                        "artifact": art.name,
                        "runtime": which,
                        "round": r,
                        "runtime_lines": res["runtime_lines"],
                        "mapped": res["mapped"],
                    }
                )
                print(
                    f"{art.name} round {r} {which}: "
                    + ", ".join(f"{n} {v['img_per_s']:.0f} img/s" for n, v in res["variants"].items()),
                    flush=True,
                )
        for name, first in runs["wheel"][0]["variants"].items():
            precision = first["precision"]
            cmp_rounds = []
            base = np.load(work / art.stem / "wheel0" / f"{name}.npy")
            for r in range(args.rounds):
                for which in ("wheel", "plugin"):
                    got = np.load(work / art.stem / f"{which}{r}" / f"{name}.npy")
                    cmp_rounds.append({"round": r, "runtime": which, **_compare(got, base, precision)})
            wheel_ips = [x["variants"][name]["img_per_s"] for x in runs["wheel"]]
            plugin_ips = [x["variants"][name]["img_per_s"] for x in runs["plugin"]]
            ratio = statistics.median(plugin_ips) / statistics.median(wheel_ips)
            row = {
                "artifact": art.name,
                "variant": name,
                "batch": first["batch"],
                "precision": precision,
                "outputs_vs_wheel_round0": cmp_rounds,
                "outputs_equal": all(c["equal_within_goal"] for c in cmp_rounds),
                "wheel_img_per_s": wheel_ips,
                "plugin_img_per_s": plugin_ips,
                "wheel_p50_ms": [x["variants"][name]["p50_ms"] for x in runs["wheel"]],
                "plugin_p50_ms": [x["variants"][name]["p50_ms"] for x in runs["plugin"]],
                "plugin_over_wheel_throughput": ratio,
                "within_3_percent": abs(ratio - 1.0) <= 0.03,
            }
            rows.append(row)
            print(f"  {name}: outputs equal {row['outputs_equal']}, plugin/wheel {ratio:.4f}", flush=True)
    record = {
        "git_commit_run": os.environ.get("INFERX_GIT_COMMIT"),
        "device": _gpu_name(),
        "driver": gpu_driver(),
        "versions": versions("apache-tvm", "apache-tvm-ffi", "numpy", "inferx_edge"),
        "plugin": {"path": str(plugin), "build": json.loads(build_json.read_text()) if build_json.exists() else None},
        "seconds_per_round": args.seconds,
        "rounds": args.rounds,
        "artifacts": {a.name: json.loads(_manifest_summary(a)) for a in arts},
        "processes": processes,
        "results": rows,
        "all_outputs_equal": all(r["outputs_equal"] for r in rows),
        "all_within_3_percent": all(r["within_3_percent"] for r in rows),
    }
    path = write_record(args.name, record)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / path.name).write_text(path.read_text())
    print(f"wrote {path}")


def _gpu_name() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        return name.decode() if isinstance(name, bytes) else name
    except Exception as exc:  # noqa: BLE001 - the record says why
        return f"unknown ({exc})"


def _manifest_summary(art: Path) -> str:
    from inferx_edge.package.bundle import read_manifest

    m = read_manifest(art)
    return json.dumps(
        {
            "target": m.target.get("name"),
            "variants": [v.name for v in m.variants],
            "cuda": {k: v for k, v in m.target.items() if "cuda" in k},
            "built_by": getattr(m, "build", None),
            "bytes": art.stat().st_size,
        },
        default=str,
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_one":
        ns = argparse.Namespace(artifact=Path(sys.argv[2]), save_dir=Path(sys.argv[3]), seconds=float(sys.argv[4]))
        return one(ns)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="build the artifacts and inputs (build host)")
    p.add_argument("dir", type=Path)
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--target", default="h200")
    c = sub.add_parser("check", help="run them with both runtimes (GPU host)")
    c.add_argument("dir", type=Path)
    c.add_argument("--plugin", type=Path, required=True)
    c.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "build/cuda12-check")))
    c.add_argument("--seconds", type=float, default=3.0)
    c.add_argument("--rounds", type=int, default=2)
    c.add_argument("--name", default="cuda12_runtime_h200")
    args = ap.parse_args()
    prepare(args) if args.cmd == "prepare" else check(args)


if __name__ == "__main__":
    main()
