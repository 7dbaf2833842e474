"""Build TVM's CUDA runtime library against CUDA 12 (JetPack 6 on Jetson Orin), once per build host."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    here = os.uname().machine
    p.add_argument(
        "--arch",
        choices=["aarch64", "x86_64"],
        default="aarch64",
        help=f"CPU of the device (default aarch64: Jetson; this host is {here})",
    )
    p.add_argument(
        "--out",
        "-o",
        type=Path,
        default=None,
        help="output directory; <out>/<arch>/ gets the library and build.json "
        "(default ~/.local/share/inferx_edge/cuda12-runtime, where deploy and the runtime look)",
    )
    p.add_argument("--sign", type=Path, default=None, metavar="KEY", help="Ed25519 private key: sign build.json")
    p.add_argument(
        "--cuda-home",
        type=Path,
        default=None,
        help="a CUDA 12 toolkit instead of PyPI's (on a Jetson: /usr/local/cuda)",
    )
    p.add_argument("--jobs", type=int, default=None, help="parallel compiles (default: every core)")


def run(args: argparse.Namespace) -> int:
    from inferx_edge.deploy.cuda12_runtime import build

    build(args.arch, args.out, cuda_home=args.cuda_home, sign=args.sign, jobs=args.jobs)
    return 0
