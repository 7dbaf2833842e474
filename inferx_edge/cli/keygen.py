"""Make an Ed25519 key pair for signing artifacts (build --sign) and trusting them (--trust, trust dir)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", "-o", type=Path, required=True, help="directory for inferx_signing.key (0600) and inferx_signing.pub"
    )


def run(args: argparse.Namespace) -> int:
    from inferx_edge.package.signing import default_trust_dir, generate_keypair

    private, public, fp = generate_keypair(args.out)
    print(f"wrote {private} (private, mode 0600: keep it off devices) and {public}")
    print(f"fingerprint {fp}")
    print(f"sign:  python -m inferx_edge build ... --sign {private}")
    print(f"trust: copy {public.name} into {default_trust_dir()}/ on each device (or pass --trust {public})")
    return 0
