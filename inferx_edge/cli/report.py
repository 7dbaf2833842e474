"""Render a profile as Pareto plots (PNG), a self-contained HTML page, Markdown and CSV, with policy picks."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("profile", type=Path, help="JSON written by 'profile'")
    p.add_argument("--output", "-o", type=Path, required=True, help="directory for report.html, pareto.png, ...")
    p.add_argument("--power-cap", type=float, default=None, help="W, for the max-throughput policy")
    p.add_argument("--fps-floor", type=float, default=None, help="frames/s, for the min-energy policy")
    p.add_argument("--p99", type=float, default=None, help="ms, for the latency-slo policy")


def run(args: argparse.Namespace) -> int:
    from inferx_edge.report.render import load_profile, render
    from inferx_edge.runtime.governor import LatencySLO, MaxThroughputUnderPowerCap, MinEnergyAboveFps

    profile = load_profile(args.profile)
    vs = [v for v in profile["variants"] if v["avg_w"] is not None]
    # Defaults: constraints in the middle of the measured range, so every policy has a real choice.
    mid = lambda key: sorted(v[key] for v in vs)[len(vs) // 2] if vs else 0.0  # noqa: E731
    policies = [
        MaxThroughputUnderPowerCap(args.power_cap if args.power_cap is not None else mid("avg_w")),
        MinEnergyAboveFps(args.fps_floor if args.fps_floor is not None else mid("fps")),
        LatencySLO(args.p99 if args.p99 is not None else mid("p99_ms")),
    ]
    for kind, path in render(args.profile, args.output, policies).items():
        print(f"wrote {path} ({kind})")
    return 0
