"""``python -m inferx_edge``: the root parser. Each subcommand lives in ``inferx_edge/cli/<name>.py``.

Subcommand modules import only argparse-level code at the top; the compiler and runtime are imported
when a command runs, so ``--help`` and ``targets`` answer instantly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading

from inferx_edge import __version__
from inferx_edge.errors import InferxError

#: Subcommand name -> help; the module under inferx_edge.cli is the name with '-' as '_' (each defines
#: ``add_arguments`` and ``run``).
COMMANDS = {
    "evaluate": "build the model, run it on its labelled holdout set, report accuracy and latency",
    "targets": "list the targets inferx_edge builds for",
    "tune": "tune a model's kernels with MetaSchedule (tuning_logs/), locally or on a device over RPC",
    "quantize": "calibrate for int8, measure per-layer sensitivity, choose mixed precision under an accuracy budget",
    "build": "compile a model ahead of time into an artifact for a target",
    "run": "run an artifact on input tensors (.npy/.npz) with the on-device runtime",
    "generate": "generate text with an LLM artifact on this device (streamed), with TTFT/TPOT",
    "inspect": "verify an artifact and print its manifest",
    "profile": "sweep an artifact's variants on this device: FPS, latency, power, J/frame",
    "report": "render a profile: Pareto PNG, HTML page, Markdown/CSV tables, policy picks",
    "deploy": "install an artifact on a device atomically (dir, ssh://, rpc://), self-test, roll back",
    "keygen": "make an Ed25519 key pair to sign artifacts and to trust them on devices",
    "cuda-runtime": "build TVM's CUDA runtime against CUDA 12 for Jetson (JetPack 6); deploy does it when needed",
    "serve": "serve artifacts over HTTP (KServe v2): dynamic batching, the governor live, Prometheus metrics",
    "loadgen": "load a running server like MLPerf LoadGen (single-stream, server, offline): latency, throughput, J/inference",
}


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m inferx_edge",
        description="Deploy neural networks to Jetson Orin and datacenter GPUs with Apache TVM.",
    )
    parser.add_argument("--version", action="version", version=f"inferx_edge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in COMMANDS.items():
        module = importlib.import_module(f"inferx_edge.cli.{name.replace('-', '_')}")
        p = sub.add_parser(name, help=help_text, description=module.__doc__.strip().splitlines()[0])
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


_signalled: list[int] = []


def _terminate(signum, _frame):
    # SIGTERM unwinds like Ctrl-C: cleanup (temporary files, child processes, locks) runs on the way out.
    # Raised inside a TVM callback it comes back as a RuntimeError: main() knows by _signalled.
    _signalled.append(signum)
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    from inferx_edge.runtime._tvm import set_default_cpu_threads

    set_default_cpu_threads()  # before any TVM CPU work of any command (its pool reads it once)
    try:
        return int(args._run(args) or 0)
    except InferxError as exc:
        if _signalled:  # a stage wrapped the interruption in its own error
            print(f"inferx_edge {args.command}: interrupted (signal {_signalled[0]})", file=sys.stderr)
            return 128 + _signalled[0]
        print(f"inferx_edge {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # output piped into head, less...: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"inferx_edge {args.command}: interrupted", file=sys.stderr)
        return 128 + _signalled[0] if _signalled else 130
    except Exception:
        if not _signalled:
            raise
        print(f"inferx_edge {args.command}: interrupted (signal {_signalled[0]})", file=sys.stderr)
        return 128 + _signalled[0]


if __name__ == "__main__":
    try:
        code = main()
    except KeyboardInterrupt:  # a signal that arrived after the command's own handlers had returned
        print("inferx_edge: interrupted", file=sys.stderr)
        code = 128 + _signalled[0] if _signalled else 130
    sys.exit(code)
