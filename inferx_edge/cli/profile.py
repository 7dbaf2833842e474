"""Sweep an artifact's variants on this device: FPS, latency, power, energy per frame (JSON)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", type=Path)
    p.add_argument("--output", "-o", type=Path, required=True, help="profile JSON to write")
    p.add_argument("--window", type=float, default=5.0, help="seconds per measurement window (default 5)")
    p.add_argument("--repeats", type=int, default=3, help="windows per variant (default 3)")
    p.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds per variant (default 2)")
    p.add_argument("--idle", type=float, default=5.0, help="seconds of idle power measured first (default 5)")
    p.add_argument("--variants", default=None, help="comma list of variants (default: all)")
    p.add_argument("--telemetry", default=None, help="nvml, jetson-sysfs, jtop or rapl (default: the first that works)")
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument(
        "--power-modes",
        default=None,
        metavar="ID,ID|all",
        help="Jetson: also sweep these nvpmodel modes (needs --allow-power-mode-change and root); with --twin "
        "the modes to predict (default all)",
    )
    p.add_argument(
        "--twin",
        default=None,
        metavar="BOARD",
        help="predict the profile on a twin of this Jetson board instead of measuring (nothing runs; the "
        "profile is marked predicted): jetson-agx-orin-64gb, jetson-agx-orin-32gb, jetson-orin-nx-16gb, "
        "jetson-orin-nano-8gb",
    )
    p.add_argument(
        "--kernel-profiles",
        type=Path,
        default=None,
        help="--twin: kernel profiles of this model's variants measured on a GPU host (scripts/kernel_profile.py "
        "--json); default: the twin's reference profiles when the model is one of them",
    )
    p.add_argument(
        "--allow-power-mode-change",
        action="store_true",
        help="opt in to switching power modes; the starting mode is restored afterwards",
    )


def run(args: argparse.Namespace) -> int:
    if args.twin:
        from inferx_edge.twin.profile import twin_profile

        modes = None if args.power_modes in (None, "all") else args.power_modes.split(",")
        twin_profile(args.artifact, args.output, args.twin, modes, args.kernel_profiles)
        print(f"wrote {args.output} (predicted on a twin of {args.twin}; nothing was measured)")
        return 0
    from inferx_edge.report.profile import profile_artifact

    profile_artifact(
        args.artifact,
        args.output,
        window_s=args.window,
        repeats=args.repeats,
        warmup_s=args.warmup,
        idle_s=args.idle,
        variants=args.variants.split(",") if args.variants else None,
        telemetry=args.telemetry,
        device_id=args.device_id,
        power_modes=[int(m) for m in args.power_modes.split(",")] if args.power_modes else None,
        allow_power_mode_change=args.allow_power_mode_change,
    )
    print(f"wrote {args.output}")
    return 0
