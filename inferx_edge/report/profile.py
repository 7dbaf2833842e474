"""``profile``: sweep an artifact's variants on the device and measure FPS, latency, power and energy.

Per variant: warm-up, then ``repeats`` windows of at least ``window_s`` seconds of back-to-back
synchronous inference; energy from the hardware counter where there is one (NVML), else power samples
integrated over the window. Idle power is measured first (no inference) and subtracted to give the
energy the inference itself costs (``dynamic_j_per_frame``) next to the total. Runs on the device
with the runtime only (no compiler).
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np

from inferx_edge.errors import UsageError
from inferx_edge.package.atomic import atomic_write
from inferx_edge.runtime import Engine
from inferx_edge.runtime.telemetry import EnergyMeter, probe

SCHEMA = "inferx_edge.profile/1"


def _inputs(variant) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {s.name: rng.standard_normal(s.shape).astype(s.dtype) for s in variant.inputs}


def measure_idle(backend, seconds: float) -> float | None:
    meter = EnergyMeter(backend)
    meter.start()
    time.sleep(seconds)
    w = meter.stop()
    return w["avg_w"]


def measure_window(engine: Engine, x, batch: int, backend, seconds: float) -> dict:
    """Back-to-back synchronous runs of the current variant for ``seconds``: throughput, latency
    percentiles, energy (None without telemetry) per frame, and the device's clock / temperature /
    throttle reasons as the window ended (``state``, empty without telemetry)."""
    meter = EnergyMeter(backend) if backend else None
    if meter:
        meter.start()
    stats = engine.benchmark(x, warmup=0, repeat=1, min_seconds=seconds)
    energy = meter.stop() if meter else {"energy_j": None, "avg_w": None, "method": None, "state": {}}
    frames = stats.count * batch
    elapsed = stats.mean_ms * stats.count / 1e3
    return {
        "frames": frames,
        "seconds": elapsed,
        "fps": frames / elapsed,
        "p50_ms": stats.p50_ms,
        "p90_ms": stats.p90_ms,
        "p99_ms": stats.p99_ms,
        "energy_j": energy["energy_j"],
        "avg_w": energy["avg_w"],
        "method": energy["method"],
        "j_per_frame": energy["energy_j"] / frames if energy["energy_j"] is not None else None,
        "state": energy["state"],
    }


def profile_artifact(
    artifact: Path,
    output: Path,
    *,
    window_s: float = 5.0,
    repeats: int = 3,
    warmup_s: float = 2.0,
    idle_s: float = 5.0,
    variants: list[str] | None = None,
    telemetry: str | None = None,
    device_id: int = 0,
    backend=None,
    power_modes: list[int] | None = None,
    allow_power_mode_change: bool = False,
    nvpmodel: str | None = None,
    log=print,
) -> dict:
    """Profile every variant (x every power mode in ``power_modes``, which needs the explicit
    ``allow_power_mode_change`` opt-in and restores the starting mode afterwards)."""
    if power_modes:
        from inferx_edge.runtime.control import PowerModeSweep

        merged = None
        with PowerModeSweep(allowed=allow_power_mode_change, nvpmodel=nvpmodel) as set_mode:
            for mode in power_modes:
                set_mode(mode)
                log(f"power mode {mode}")
                part = _profile(
                    artifact, output, window_s, repeats, warmup_s, idle_s, variants, telemetry, device_id, backend, log
                )
                for row in part["variants"]:
                    row["power_mode"] = mode
                    row["name"] = f"{row['name']}@pm{mode}"
                if merged is None:
                    merged = part
                else:
                    merged["variants"] += part["variants"]
        _write(output, merged)
        return merged
    return _profile(artifact, output, window_s, repeats, warmup_s, idle_s, variants, telemetry, device_id, backend, log)


def _profile(
    artifact, output, window_s, repeats, warmup_s, idle_s, variants, telemetry, device_id, backend, log
) -> dict:
    if window_s <= 0 or repeats <= 0:
        raise UsageError("--window and --repeats must be positive")
    backend = backend or (probe(telemetry) if telemetry else probe())
    if backend is None:
        log(
            "warning: no power telemetry here (no NVML, no Jetson INA3221, no jtop): recording FPS and "
            "latency only; energy fields are null"
        )
    with Engine(artifact, device_id=device_id, preload=True) as engine:
        m = engine.manifest
        names = variants or [v.name for v in m.variants]
        idle_w = measure_idle(backend, idle_s) if backend else None
        if backend and idle_w is not None:
            log(f"idle power {idle_w:.1f} W over {idle_s:g} s ({backend.name})")
        elif backend:
            log(f"idle power: not measured ({backend.name} gave no valid readings over {idle_s:g} s)")
        rows = []
        for name in names:
            v = engine.select(name)
            x = _inputs(v)
            t_switch = time.perf_counter()
            engine.select(name)
            switch_us = (time.perf_counter() - t_switch) * 1e6
            engine.benchmark(x, warmup=3, repeat=1, min_seconds=warmup_s)
            windows = [measure_window(engine, x, v.batch, backend, window_s) for _ in range(repeats)]
            row = _summarise(name, v, windows, idle_w)
            row["select_switch_us"] = switch_us
            rows.append(row)
            log(
                f"{name:12s} {row['fps']:10.1f} fps  p99 {row['p99_ms']:7.3f} ms  "
                + (f"{row['avg_w']:6.1f} W  {row['j_per_frame'] * 1e3:8.3f} mJ/frame" if row["avg_w"] else "no power")
            )
        device = (
            engine.device.device_name if m.target["device"] == "cuda" else platform.processor() or platform.machine()
        )
    report = {
        "schema": SCHEMA,
        "artifact": str(artifact),
        "model": m.model["name"],
        "target": m.target["name"],
        "device": device,
        "driver": getattr(backend, "driver", None),
        "telemetry": backend.name if backend else None,
        "power_limit_w": getattr(backend, "power_limit_w", None),
        "idle_w": idle_w,
        "window_s": window_s,
        "repeats": repeats,
        "host": platform.node(),
        "variants": rows,
    }
    if backend:
        backend.close()
    _write(output, report)
    return report


def _write(output: Path, report: dict) -> None:
    with atomic_write(output, "w") as f:
        json.dump(report, f, indent=2)


def _summarise(name, v, windows, idle_w) -> dict:
    def mean(key):
        vals = [w[key] for w in windows if w[key] is not None]
        return float(np.mean(vals)) if vals else None

    row = {
        "name": name,
        "precision": v.precision,
        "batch": v.batch,
        "fps": mean("fps"),
        "p50_ms": mean("p50_ms"),
        "p90_ms": mean("p90_ms"),
        "p99_ms": max(w["p99_ms"] for w in windows),
        "avg_w": mean("avg_w"),
        "j_per_frame": mean("j_per_frame"),
        "windows": windows,
    }
    if row["avg_w"] is not None and idle_w is not None:
        row["dynamic_w"] = row["avg_w"] - idle_w
        row["dynamic_j_per_frame"] = row["dynamic_w"] / row["fps"]
    else:
        row["dynamic_w"] = row["dynamic_j_per_frame"] = None
    return row
