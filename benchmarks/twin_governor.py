"""The governor across Jetson power modes, on the twin: energy per inference and deadline misses of
``serve``'s LiveGovernor against always-MAXN-fastest, MAXN's best point, the best static point and the
oracle, on steady, diurnal, bursty and step traces. Everything here is PREDICTED ON A TWIN: no Jetson
was measured.

    python -m benchmarks.twin_governor [--models resnet50,mobilenet_v2]
        [--boards jetson-agx-orin-64gb,jetson-orin-nano-8gb] [--name twin_governor] [--quick]

Variants: int8 and fp16 at batch 1, 8 and 64, their latency per mode from the H200 kernel profiles in
``inferx_edge/twin/data/`` (``inferx_edge.twin.latency``). Rates are fractions of the model's capacity
in the board's fastest mode (the best img/s of any variant there); the p99 SLO is 3x the latency of
that capacity point in the fastest mode (at least 10 ms). Writes ``benchmarks/results/<name>.json`` and
one PNG per (model, board) under ``benchmarks/results/<name>/``. The governor's window is 0.25 s, its
dwell 5 s; the oracle's interval 60 s.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks._record import RESULTS, versions, write_record

#: the governor decides every 0.25 s (``serve --window 0.25``): a burst is seen within a quarter second
WINDOWS_PER_S = 4


def traces(cap: float, quick: bool):
    from inferx_edge.twin.simulate import bursty, diurnal, refine, steady, step

    k = 0.25 if quick else 1.0
    n = lambda s: max(60, int(s * k))  # noqa: E731
    return [
        refine(t, WINDOWS_PER_S)
        for t in (
            steady(0.10 * cap, n(300), "steady-10%"),
            steady(0.30 * cap, n(300), "steady-30%"),
            steady(0.60 * cap, n(300), "steady-60%"),
            diurnal(0.05 * cap, 0.70 * cap, n(900)),
            bursty(0.60 * cap, 0.02 * cap, 20, 40, n(600)),
            step([0.10 * cap, 0.50 * cap, 0.80 * cap, 0.20 * cap], n(100)),
        )
    ]


def plot(path: Path, title: str, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = [r["trace"] for r in rows]
    pols = ["maxn-fastest", "maxn-best", "best-static", "oracle", "governor"]
    width = 0.16
    for i, p in enumerate(pols):
        vals = []
        for r in rows:
            hit = next(v for k, v in r["policies"].items() if k.startswith(p))
            vals.append(hit["j_per_inference"] * 1e3)
        ax.bar(np.arange(len(names)) + (i - 2) * width, vals, width, label=p)
    ax.set_xticks(np.arange(len(names)), names, rotation=20)
    ax.set_ylabel("mJ per inference (predicted on a twin)")
    ax.legend(fontsize=8)
    ax.set_title("energy per inference by policy")
    diurnal = next((r for r in rows if r["trace"] == "diurnal"), None)
    if diurnal:
        tl = diurnal["timeline"]
        t = [x["t"] for x in tl]
        ax2.plot(t, [x["rate"] for x in tl], lw=0.8, label="arrivals/s")
        ax3 = ax2.twinx()
        ax3.plot(t, [x["watts"] for x in tl], lw=0.8, color="tab:red", label="module W")
        ax3.set_ylabel("module W (twin)")
        modes = sorted({x["point"].split("@")[1] for x in tl})
        for m in modes:
            xs = [x["t"] for x in tl if x["point"].endswith("@" + m)]
            ax2.scatter(xs, [0] * len(xs), s=4, label=f"mode {m}")
        ax2.set_xlabel("simulated s")
        ax2.set_ylabel("arrivals / s")
        ax2.legend(fontsize=7, loc="upper left")
        ax2.set_title("governor on the diurnal trace")
    fig.suptitle(f"{title} - predicted on a twin (no Jetson measured)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,mobilenet_v2")
    ap.add_argument("--boards", default="jetson-agx-orin-64gb,jetson-orin-nano-8gb")
    ap.add_argument("--name", default="twin_governor")
    ap.add_argument("--quick", action="store_true", help="traces at a quarter of their length")
    args = ap.parse_args()

    from inferx_edge.twin import power
    from inferx_edge.twin.boards import get_board
    from inferx_edge.twin.simulate import Simulation, compare
    from inferx_edge.twin.zoo import reference_variants

    out_dir = RESULTS / args.name
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for model in args.models.split(","):
        variants = reference_variants(model)
        for bname in args.boards.split(","):
            board = get_board(bname)
            t0 = time.perf_counter()
            probe = Simulation(board, variants, traces(1.0, True)[0], 10.0)
            fast = probe.fastest_point()
            fmode = board.mode(fast.mode)
            lat = probe.table.service_s(probe.table.variant_for(fast.precision, fast.batch).name, fmode)
            cap = fast.batch / lat
            slo_ms = max(3 * lat * 1e3, 10.0)
            rows = []
            for trace in traces(cap, args.quick):
                sim = Simulation(board, variants, trace, slo_ms)
                r = compare(sim)
                r["capacity_fps"] = cap
                rows.append(r)
                g = r["policies"]
                gov = next(v for k, v in g.items() if k.startswith("governor"))
                print(
                    f"{model} {bname} {trace.name}: governor {r['governor_vs_maxn_fastest']:+.1%} vs maxn-fastest, "
                    f"{r['governor_vs_maxn_best']:+.1%} vs maxn-best, {r['governor_vs_oracle']:+.1%} vs oracle, "
                    f"misses {gov['miss_rate']:.2%} in {gov['miss_bursts']} bursts",
                    flush=True,
                )
            png = out_dir / f"{model}_{bname}.png"
            plot(png, f"{model} on {bname}", rows)
            for r in rows:
                r["timeline"] = r["timeline"][:: max(1, len(r["timeline"]) // 100)]  # keep the record small
            results.append(
                {
                    "model": model,
                    "board": bname,
                    "capacity_fps": cap,
                    "capacity_point": fast.label(board),
                    "slo_ms": slo_ms,
                    "sim_seconds_wall": time.perf_counter() - t0,
                    "traces": rows,
                    "plot": str(png.relative_to(RESULTS)),
                }
            )
    path = write_record(
        args.name,
        {
            "predicted": True,
            "note": "PREDICTED ON A TWIN: board models calibrated on published figures; no Jetson was measured",
            "versions": versions("numpy", "inferx_edge"),
            "power_calibration": power.calibration_report(),
            "results": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
