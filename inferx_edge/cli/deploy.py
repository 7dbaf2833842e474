"""Install an artifact on a device (directory, ssh://, rpc://) atomically, self-test it, or roll back."""

from __future__ import annotations

import argparse
from pathlib import Path

from inferx_edge.cli._common import add_trust_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", type=Path, nargs="?", help="artifact to install (omit with --rollback)")
    p.add_argument(
        "--to",
        required=True,
        metavar="DEST",
        help="ssh://user@host[:port]/dir, rpc://tracker-host:port/key, or a local directory",
    )
    p.add_argument("--rollback", action="store_true", help="make the previous release current again")
    p.add_argument("--no-selftest", action="store_true", help="skip running the artifact after install")
    p.add_argument(
        "--remote-python",
        default="python3",
        help="Python with inferx_edge installed on the device, for the self-test (default python3)",
    )
    p.add_argument("--repeat", type=int, default=20, help="timed runs in the self-test (default 20)")
    p.add_argument(
        "--keep", type=int, default=3, help="releases kept on the device for rollback, current included (default 3)"
    )
    p.add_argument(
        "--cuda-runtime",
        type=Path,
        default=None,
        metavar="DIR",
        help="Jetson artifacts: where TVM's CUDA runtime built against CUDA 12 is (the --out of "
        "python -m inferx_edge cuda-runtime); by default it is built when the device needs it and none was",
    )
    p.add_argument(
        "--sign",
        type=Path,
        default=None,
        metavar="KEY",
        help="Ed25519 private key to sign the CUDA 12 runtime with when deploy builds it "
        "(devices with a trust store load only signed native code)",
    )
    add_trust_argument(p)
    p.add_argument(
        "--ssh-option",
        action="append",
        default=[],
        metavar="OPT",
        help="extra option for ssh/scp, e.g. --ssh-option=-i --ssh-option=~/.ssh/jetson (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    from inferx_edge.deploy import deploy, rollback
    from inferx_edge.errors import UsageError

    if args.repeat < 0:
        raise UsageError(f"--repeat must be 0 or more, got {args.repeat}")
    common = dict(
        selftest=not args.no_selftest, python=args.remote_python, repeat=args.repeat, ssh_options=args.ssh_option
    )
    if args.rollback:
        if args.artifact is not None:
            raise UsageError("--rollback takes no artifact")
        result = rollback(args.to, **common)
    else:
        if args.artifact is None:
            raise UsageError("deploy needs an artifact (or --rollback)")
        result = deploy(
            args.artifact,
            args.to,
            trust=args.trust,
            keep=args.keep,
            cuda_runtime=args.cuda_runtime,
            sign=args.sign,
            **common,
        )
        verb = "uploaded and loaded" if result.destination.startswith("rpc://") else "installed"
        print(
            f"{verb} {result.installed} at {result.destination}"
            + (f" (previous: {result.previous})" if result.previous else "")
        )
    for note in result.notes:
        print(f"note: {note}")
    if result.selftest:
        print("self-test:\n  " + "\n  ".join(result.selftest.strip().splitlines()))
    return 0
