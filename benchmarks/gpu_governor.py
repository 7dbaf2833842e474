"""Profile a real network's variants on one NVIDIA GPU (NVML, read-only), render the report, and check
the governor: for FPS floors, is its pick within 5 % of the best measured J/frame, and what does it
save against always running the fastest variant?

    python -m benchmarks.gpu_governor --out DIR [--model resnet18] [--batches 1,8,64]

Builds torchvision's architecture (random weights: speed and power only) as fp32 and fp16 variants at
each batch size for the local GPU's target, profiles them (``profile``), renders ``report``, then runs
the governor online for each floor: it starts on the fastest variant, measures windows with the energy
counter, and settles; the J/frame it measures on its pick is compared with the profile's best feasible.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks._record import versions, write_record
from benchmarks.gpu_vision import export, make_net


def online(engine, backend, governor, windows: int, window_s: float) -> list[dict]:
    from inferx_edge.report.profile import measure_window
    from inferx_edge.runtime.governor import VariantStats

    rng = np.random.default_rng(0)
    log = []
    for i in range(windows):
        v = engine.select(governor.current)
        x = rng.standard_normal(v.inputs[0].shape).astype("float32")
        engine.benchmark(x, warmup=3, repeat=1, min_seconds=0.5)
        w = measure_window(engine, x, v.batch, backend, window_s)
        s = VariantStats(v.name, w["fps"], w["avg_w"], w["j_per_frame"], w["p99_ms"], v.batch, v.precision)
        governor.observe(s)
        nxt = governor.decide(time.monotonic(), telemetry_ok=w["energy_j"] is not None)
        log.append({"window": i, "ran": v.name, "fps": s.fps, "w": s.watts, "j_per_frame": s.j_per_frame, "next": nxt})
    return log


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--window", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.report.pareto import stats_from_profile
    from inferx_edge.report.profile import profile_artifact
    from inferx_edge.report.render import render
    from inferx_edge.runtime import Engine
    from inferx_edge.runtime.governor import Governor, LatencySLO, MaxThroughputUnderPowerCap, MinEnergyAboveFps, choose
    from inferx_edge.runtime.telemetry import probe

    args.out.mkdir(parents=True, exist_ok=True)
    onnx_path = Path("/tmp") / f"{args.model}.onnx"
    t0 = time.time()
    export(make_net(args.model), onnx_path)
    art = Path("/tmp") / f"{args.model}-{args.target}.ixa"
    batches = tuple(int(b) for b in args.batches.split(","))
    build_artifact(
        BuildOptions(model=onnx_path, target=args.target, output=art, precisions=("fp32", "fp16"), batch_sizes=batches)
    )
    build_s = time.time() - t0
    prof_path = args.out / "profile.json"
    profile = profile_artifact(art, prof_path, window_s=args.window, repeats=args.repeats, idle_s=5.0)
    table = stats_from_profile(profile)
    fastest = max(table.values(), key=lambda s: s.fps)
    floors = sorted({round(f * fastest.fps, -1) for f in (0.1, 0.3, 0.6)})
    watts = sorted(s.watts for s in table.values())
    policies = [
        MaxThroughputUnderPowerCap(watts[len(watts) // 2]),
        MinEnergyAboveFps(floors[1]),
        LatencySLO(sorted(s.p99_ms for s in table.values())[len(table) // 2]),
    ]
    render(prof_path, args.out / "report", policies)

    backend = probe("nvml")
    checks = []
    with Engine(art, preload=True) as engine:
        for floor in floors:
            policy = MinEnergyAboveFps(floor)
            best_name, ok = choose(policy, table)
            gov = Governor(policy, table, start=fastest.name, hysteresis=0.05, min_dwell_s=0.0)
            windows = online(engine, backend, gov, windows=4, window_s=3.0)
            settled = [w for w in windows if w["ran"] == gov.current][-2:]
            measured = float(np.mean([w["j_per_frame"] for w in settled])) if settled else None
            checks.append(
                {
                    "fps_floor": floor,
                    "governor_pick": gov.current,
                    "profile_best_feasible": best_name,
                    "feasible": ok,
                    "pick_j_per_frame_online": measured,
                    "best_j_per_frame_profile": table[best_name].j_per_frame,
                    "pick_within_pct_of_best": (measured / table[best_name].j_per_frame - 1) * 100
                    if measured
                    else None,
                    "fastest": fastest.name,
                    "fastest_j_per_frame_profile": fastest.j_per_frame,
                    "energy_saved_vs_fastest_pct": (1 - measured / fastest.j_per_frame) * 100 if measured else None,
                    "windows": windows,
                    "decisions": gov.decisions[-4:],
                }
            )
            print(json.dumps({k: v for k, v in checks[-1].items() if k not in ("windows", "decisions")}))
    backend.close()
    rec = write_record(
        f"gpu_governor_{args.target}",
        {
            "device": profile["device"],
            "driver": profile["driver"],
            "telemetry": profile["telemetry"],
            "versions": versions("apache-tvm", "torch", "torchvision", "nvidia-ml-py", "inferx_edge"),
            "model": f"torchvision {args.model} (random weights)",
            "build_s": build_s,
            "profile": {k: v for k, v in profile.items() if k != "variants"},
            "results": [{k: v for k, v in row.items() if k != "windows"} for row in profile["variants"]],
            "governor_checks": checks,
        },
    )
    (args.out / rec.name).write_text(rec.read_text())
    print(f"wrote {rec}")


if __name__ == "__main__":
    main()
