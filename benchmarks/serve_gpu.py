"""``serve`` on one NVIDIA GPU: served throughput against the Engine's, p99 under Poisson load, the
governor live under a stepped load trace against static variants, GPU + CPU engines behind one model,
a soak and a SIGTERM under load. One process drives; each server is ``python -m inferx_edge serve``
in its own process, loaded by :mod:`inferx_edge.serve.loadgen` (binary tensors) from this one.

    python -m benchmarks.serve_gpu --out DIR --steps build,direct,offline,poisson,governor
    python -m benchmarks.serve_gpu --out DIR --steps multidevice,soak --soak-s 300

ResNet-50 is torchvision's architecture with seeded random weights (speed and energy only), int8 with
batch variants 1, 8 and 64. Energy is the GPU's NVML energy counter as the server exports it
(``inferx_energy_joules_total``), read by the load generator before and after each phase; clocks and
power limits are left as found. The record is rewritten after every step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

from benchmarks._record import versions, write_record

REPO = Path(__file__).resolve().parent.parent
STEPS = ("build", "direct", "offline", "poisson", "governor", "multidevice", "soak")


def build_resnet(out: Path, target: str, batches: tuple[int, ...]) -> Path:
    from benchmarks.gpu_vision import export, make_net, quantization_plan
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.quantize.driver import QuantOptions

    onnx_path = out / "resnet50.onnx"
    export(make_net("resnet50"), onnx_path)
    calib = out / "calib.npy"
    np.save(calib, np.random.default_rng(0).standard_normal((16, 3, 224, 224)).astype(np.float32))
    plan = quantization_plan(onnx_path, calib, out)
    art = out / "resnet50-int8.ixa"
    build_artifact(
        BuildOptions(
            model=onnx_path,
            target=target,
            output=art,
            input_shapes={"image": (1, 3, 224, 224)},
            precisions=("int8",),
            batch_sizes=batches,
            quant=QuantOptions(calib=calib, quant_plan=plan),
        ),
        log=lambda *a: print(*a, flush=True),
    )
    return art


def build_default(out: Path, target: str, batches: tuple[int, ...]) -> Path:
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.models import DEFAULT_MODEL

    art = out / f"fmnist-{target}.ixa"
    build_artifact(
        BuildOptions(model=DEFAULT_MODEL, target=target, output=art, batch_sizes=batches), log=lambda *a: None
    )
    return art


class ServerProcess:
    """``python -m inferx_edge serve ARTIFACTS --port P ARGS`` until :meth:`stop`."""

    def __init__(self, artifacts: list[Path], port: int, args: list[str], log: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "inferx_edge", "serve", *map(str, artifacts), "--port", str(port), *args]
        self.log = open(log, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        import urllib.request

        for _ in range(1200):
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}: {log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not become ready")

    def rss_mb(self) -> float:
        import psutil

        return psutil.Process(self.proc.pid).memory_info().rss / 2**20

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self, sig=signal.SIGTERM, timeout: float = 90) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.log.close()
        return rc


def metric_sum(text: str, name: str, **labels) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def load(url: str, model: str, scenario: str, **kw) -> dict:
    from inferx_edge.serve.loadgen import LoadgenOptions, run_loadgen

    return run_loadgen(LoadgenOptions(url, model, scenario, **kw), progress=None)


def variants(art: Path) -> tuple[str, list]:
    """The model's name and its variants, smallest batch first."""
    from inferx_edge.package import read_manifest

    m = read_manifest(art)
    return m.model["name"], sorted(m.variants, key=lambda v: v.batch)


def direct(art: Path, seconds: float) -> list[dict]:
    """The Engine's own throughput: numpy in and out per call (what a server must do), and with inputs
    already on the device (the kernel-only ceiling)."""
    from inferx_edge.runtime import Engine
    from inferx_edge.runtime.engine import time_calls

    rows = []
    with Engine(art, preload=True) as e:
        for v in variants(art)[1]:
            name, b, spec = v.name, v.batch, v.inputs[0]
            x = np.random.default_rng(0).standard_normal(spec.shape).astype(spec.dtype)
            e.select(name)
            host = time_calls(lambda x=x, name=name: e.run_arrays(name, [x]), e.device.sync, 5, 20, seconds)
            dev = e.benchmark(x, warmup=5, repeat=20, min_seconds=seconds)
            rows.append(
                {
                    "variant": name,
                    "batch": b,
                    "host_arrays_p50_ms": host.p50_ms,
                    "host_arrays_inf_s": b / (host.mean_ms / 1e3),
                    "device_resident_p50_ms": dev.p50_ms,
                    "device_resident_inf_s": b / (dev.mean_ms / 1e3),
                }
            )
    return rows


def governor_trace(
    art: Path, capacity: float, phase_s: float, slo_ms: float, out: Path, port: int, rows: int, telemetry: str
):
    fractions = (0.1, 0.5, 0.9, 0.1)
    from inferx_edge.serve.loadgen import Phase

    model, vs = variants(art)
    phases = [Phase(phase_s, f * capacity / rows) for f in fractions]
    configs = {"governor": ["--policy", "latency-slo", "--p99", str(slo_ms), "--governor-dwell-s", "2"]}
    largest = vs[-1].name
    for v in reversed(vs):
        configs[f"always-{v.name}"] = ["--variant", v.name]
    results = {}
    for name, args in configs.items():
        srv = ServerProcess(
            [art],
            port,
            [*args, "--telemetry", telemetry, "--decision-log", str(out / f"{name}.jsonl")],
            out / f"serve-{name}.log",
        )
        try:
            rec = load(srv.url, model, "server", phases=phases, concurrency=64, rows=rows, slo_ms=slo_ms)
            switches = metric_sum(srv.metrics(), "inferx_governor_switches_total")
        finally:
            rc = srv.stop()
        results[name] = {"phases": rec["phases"], "errors": rec["errors"], "switches": switches, "exit_code": rc}
        print(
            name,
            json.dumps([(p["offered_qps"], p["joules_per_inference"], p["latency_ms"]["p99"]) for p in rec["phases"]]),
            flush=True,
        )
    summary = []
    static = [n for n in configs if n != "governor"]
    for i, f in enumerate(fractions):
        row = {"load_fraction": f}
        for n in configs:
            p = results[n]["phases"][i]
            row[n] = {
                "j_per_inf": p["joules_per_inference"],
                "p99_ms": p["latency_ms"]["p99"],
                "slo_violation_share": p.get("slo_violation_share"),
            }
        ok = [n for n in static if row[n]["p99_ms"] is not None and row[n]["p99_ms"] <= slo_ms and row[n]["j_per_inf"]]
        row["oracle"] = min(ok, key=lambda n: row[n]["j_per_inf"]) if ok else None
        g, big = row["governor"]["j_per_inf"], row[f"always-{largest}"]["j_per_inf"]
        if g and big:
            row["governor_energy_saving_vs_always_largest"] = 1 - g / big
        if g and row["oracle"]:
            row["governor_energy_vs_oracle"] = g / row[row["oracle"]]["j_per_inf"]
        summary.append(row)
    total_viol = sum((p.get("slo_violations") or 0) for p in results["governor"]["phases"])
    total_ok = sum(p["ok"] for p in results["governor"]["phases"])
    return {
        "phases_offered_req_s": [p.qps for p in phases],
        "phase_s": phase_s,
        "slo_p99_ms": slo_ms,
        "rows_per_request": rows,
        "configs": results,
        "summary": summary,
        "governor_slo_violation_share": total_viol / total_ok if total_ok else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", default="build,direct,offline,poisson,governor")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--phase-s", type=float, default=8.0)
    ap.add_argument("--slo-ms", type=float, default=20.0)
    ap.add_argument("--soak-s", type=float, default=120.0)
    ap.add_argument("--rows", type=int, default=1, help="images per request in the Poisson and trace loads")
    ap.add_argument("--name", default=None)
    ap.add_argument("--artifact", type=Path, default=None, help="serve this artifact instead of building ResNet-50")
    ap.add_argument("--telemetry", default="nvml")
    ap.add_argument("--batches", default="1,8,64", help="ResNet-50 batch variants to build")
    ap.add_argument(
        "--capacity", type=float, default=None, help="single-image req/s the governor trace scales to (else: offline)"
    )
    args = ap.parse_args()
    steps = args.steps.split(",")
    bad = sorted(set(steps) - set(STEPS))
    if bad:
        raise SystemExit(f"unknown steps {bad}; valid: {', '.join(STEPS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    from inferx_edge.runtime.telemetry import probe

    nvml = probe(args.telemetry) if args.telemetry != "none" else None
    record: dict = {
        "device": "NVIDIA H200" if args.target == "h200" else args.target,
        "driver": getattr(nvml, "driver", None),
        "power_limit_w": getattr(nvml, "power_limit_w", None),
        "idle_w_at_start": nvml.read().power_w if nvml else None,
        "versions": versions(
            "apache-tvm", "torch", "torchvision", "nvidia-ml-py", "starlette", "uvicorn", "inferx_edge"
        ),
        "git_commit_run": os.environ.get("INFERX_GIT_COMMIT"),
        "model": "torchvision resnet50, random weights, int8 (batch variants 1, 8, 64)",
        "steps": {},
    }
    if args.capacity:
        record["capacity_inf_s"] = args.capacity
    name = args.name or f"serve_{args.target}"

    def save():
        rec = write_record(name, record)
        (args.out / rec.name).write_text(rec.read_text())

    art = args.artifact or args.out / "resnet50-int8.ixa"
    port = 8100
    tele = args.telemetry
    for step in steps:
        t0 = time.time()
        try:
            if step == "build":
                art = build_resnet(args.out, args.target, tuple(int(b) for b in args.batches.split(",")))
                result = {"artifact_mb": art.stat().st_size / 2**20}
            elif step == "direct":
                result = {"rows": direct(art, 3.0)}
            elif step == "offline":
                model, vs = variants(art)
                big = vs[-1]
                srv = ServerProcess(
                    [art], port, ["--variant", big.name, "--telemetry", tele], args.out / "serve-offline.log"
                )
                try:
                    b64 = load(srv.url, model, "offline", duration_s=8, concurrency=4, rows=big.batch)
                finally:
                    srv.stop()
                srv = ServerProcess(
                    [art],
                    port,
                    ["--variant", big.name, "--telemetry", tele, "--shared-memory"],
                    args.out / "serve-shm.log",
                )
                try:
                    shm = load(
                        srv.url, model, "offline", duration_s=8, concurrency=4, rows=big.batch, shared_memory=True
                    )
                finally:
                    srv.stop()
                srv = ServerProcess([art], port, ["--telemetry", tele], args.out / "serve-offline1.log")
                try:
                    one = load(srv.url, model, "offline", duration_s=8, concurrency=64, rows=args.rows)
                finally:
                    srv.stop()
                d = record["steps"].get("direct", {}).get("rows", [])
                direct64 = next((r for r in d if r["batch"] == big.batch), None)
                result = {
                    "largest_batch_requests": b64,
                    "largest_batch_shm_requests": shm,
                    "single_image_requests": one,
                }
                if direct64:
                    result["served_shm_vs_engine_host_arrays_largest_batch"] = (
                        shm["throughput_inf_s"] / direct64["host_arrays_inf_s"]
                    )
                    result["served_vs_engine_host_arrays_largest_batch"] = (
                        b64["throughput_inf_s"] / direct64["host_arrays_inf_s"]
                    )
                    result["served_vs_engine_device_resident_largest_batch"] = (
                        b64["throughput_inf_s"] / direct64["device_resident_inf_s"]
                    )
                record["capacity_inf_s"] = one["throughput_inf_s"]
            elif step == "poisson":
                cap = record["capacity_inf_s"]
                from inferx_edge.serve.loadgen import Phase

                srv = ServerProcess(
                    [art],
                    port,
                    ["--telemetry", tele, "--policy", "latency-slo", "--p99", str(args.slo_ms)],
                    args.out / "serve-poisson.log",
                )
                try:
                    phases = [Phase(args.phase_s, f * cap / args.rows) for f in (0.1, 0.5, 0.9)]
                    result = load(
                        srv.url,
                        variants(art)[0],
                        "server",
                        phases=phases,
                        concurrency=64,
                        rows=args.rows,
                        slo_ms=args.slo_ms,
                    )
                finally:
                    result["exit_code"] = srv.stop()
            elif step == "governor":
                result = governor_trace(
                    art, record["capacity_inf_s"], args.phase_s, args.slo_ms, args.out, port, args.rows, tele
                )
            elif step == "multidevice":
                result = multidevice(args.out, args.target, port)
            elif step == "soak":
                result = soak(args.out, args.target, port, args.soak_s)
            result["step_s"] = round(time.time() - t0, 1)
        except Exception as exc:  # record the failure and go on
            traceback.print_exc()
            result = {"error": f"{type(exc).__name__}: {exc}"[:3000], "step_s": round(time.time() - t0, 1)}
        record["steps"][step] = result
        print(step, json.dumps(result)[:1500], flush=True)
        save()


def multidevice(out: Path, target: str, port: int) -> dict:
    """The embedded model on the GPU and on this host's CPU behind one name: where batches went."""
    from inferx_edge.targets import host_target_name

    gpu = build_default(out, target, (1, 8, 64))
    cpu = build_default(out, host_target_name(), (1, 8, 64))
    res = {}
    for label, arts in (("gpu+cpu", [gpu, cpu]), ("gpu", [gpu]), ("cpu", [cpu])):
        srv = ServerProcess(arts, port, ["--telemetry", "auto"], out / f"serve-multi-{label}.log")
        try:
            rec = load(srv.url, "fmnist_cnn", "offline", duration_s=6, concurrency=32, rows=8)
            text = srv.metrics()
            batches = {d: metric_sum(text, "inferx_batch_rows_count", device=d) for d in ("cuda:0", "cpu")}
        finally:
            srv.stop()
        res[label] = {
            "throughput_inf_s": rec["throughput_inf_s"],
            "errors": rec["errors"],
            "batches_by_device": batches,
            "p99_ms": rec["phases"][0]["latency_ms"]["p99"],
        }
        print(label, res[label], flush=True)
    return res


def soak(out: Path, target: str, port: int, seconds: float) -> dict:
    """The embedded model at 90 % of its served capacity for ``seconds``: errors and server memory; then
    SIGTERM in the middle of load: what happened to every request sent."""
    from inferx_edge.serve.loadgen import Phase

    art = build_default(out, target, (1, 8, 64))
    srv = ServerProcess([art], port, ["--telemetry", "nvml"], out / "serve-soak.log")
    try:
        cap = load(srv.url, "fmnist_cnn", "offline", duration_s=5, concurrency=64)["throughput_inf_s"]
        rss = [srv.rss_mb()]
        samples = []
        stop = threading.Event()

        def watch():
            while not stop.wait(10):
                samples.append(srv.rss_mb())

        w = threading.Thread(target=watch, daemon=True)
        w.start()
        rec = load(srv.url, "fmnist_cnn", "server", phases=[Phase(seconds, 0.9 * cap)], concurrency=64)
        stop.set()
        rss.append(srv.rss_mb())
    finally:
        rc_soak = srv.stop()
    result = {
        "capacity_req_s": cap,
        "offered_req_s": 0.9 * cap,
        "soak_s": seconds,
        "requests": rec["requests"],
        "errors": rec["errors"],
        "latency_ms": rec["phases"][0]["latency_ms"],
        "rss_mb_start": rss[0],
        "rss_mb_end": rss[1],
        "rss_mb_samples": samples,
        "exit_code": rc_soak,
    }
    # SIGTERM under load
    srv = ServerProcess([art], port, ["--telemetry", "nvml"], out / "serve-sigterm.log")
    box = {}
    t = threading.Thread(
        target=lambda: box.setdefault(
            "rec", load(srv.url, "fmnist_cnn", "server", phases=[Phase(6, 0.5 * cap)], concurrency=64)
        )
    )
    t.start()
    time.sleep(3)
    metrics_before = srv.metrics()
    rc = srv.stop()
    t.join()
    r = box["rec"]["phases"][0]
    log = (out / "serve-sigterm.log").read_text()
    result["sigterm"] = {
        "exit_code": rc,
        "ok": r["ok"],
        "errors_by_kind": r["errors"],
        "server_says": [line for line in log.splitlines() if line.startswith("stopped")],
        "served_before_signal": metric_sum(metrics_before, "nv_inference_request_success"),
    }
    return result


if __name__ == "__main__":
    main()
