"""Load a running v2 server like MLPerf LoadGen: single-stream, server (Poisson) or offline; latency, throughput, J/inference.

Sends binary tensors shaped from the model's metadata; reads energy from the server's /metrics.
Prints a progress line each second and writes the full record as JSON with --output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferx_edge.errors import UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    from inferx_edge.serve.loadgen import SCENARIOS

    p.add_argument("url", help="server address, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", "-m", default=None, help="model name (see GET /v2/models/NAME); not needed with --llm")
    p.add_argument("--scenario", choices=SCENARIOS, default="server", help="MLPerf scenario (default server)")
    p.add_argument("--qps", type=float, default=10.0, help="server: Poisson arrival rate in requests/s (default 10)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds to run (default 10; a trace sets its own)")
    p.add_argument("--concurrency", type=int, default=16, help="client connections (default 16; single-stream: 1)")
    p.add_argument(
        "--trace", type=Path, default=None, help='server: JSON list of phases [{"seconds": S, "qps": Q}, ...]'
    )
    p.add_argument("--rows", type=int, default=1, help="rows (batch) per request (default 1)")
    p.add_argument(
        "--shape", action="append", default=[], metavar="NAME:D1xD2x...", help="shape for an input with dynamic dims"
    )
    p.add_argument("--auth-token-file", type=Path, default=None, help="bearer token for a server started with one")
    p.add_argument("--timeout-s", type=float, default=60.0, help="client timeout per request (default 60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the input data and the arrival process")
    p.add_argument(
        "--shared-memory",
        action="store_true",
        help="pass tensors in POSIX shared memory (server started with --shared-memory, same host)",
    )
    p.add_argument("--slo-ms", type=float, default=None, help="also count requests slower than this")
    p.add_argument("--output", "-o", type=Path, default=None, help="write the JSON record here")
    g = p.add_argument_group("LLM servers (--llm): streaming completions, TTFT/TPOT percentiles")
    g.add_argument("--llm", action="store_true", help="load an LLM server's /v1/completions with streams")
    g.add_argument("--requests", type=int, default=32, help="requests to send (default 32)")
    g.add_argument("--prompt-len", default="64:256", metavar="MIN:MAX", help="prompt tokens, uniform (default 64:256)")
    g.add_argument("--output-len", default="32:128", metavar="MIN:MAX", help="output tokens, uniform (default 32:128)")


def _range(flag: str, text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        lo_i, hi_i = int(lo), int(hi if sep else lo)
    except ValueError:
        raise UsageError(f"{flag} must be MIN:MAX (integers), got '{text}'") from None
    if not 1 <= lo_i <= hi_i:
        raise UsageError(f"{flag} must satisfy 1 <= MIN <= MAX, got '{text}'")
    return lo_i, hi_i


def _run_llm(args: argparse.Namespace) -> int:
    from inferx_edge.serve.llm_loadgen import LLMLoadOptions, run_llm_load

    if args.requests < 1 or args.concurrency < 1:
        raise UsageError("--requests and --concurrency must be at least 1")
    opts = LLMLoadOptions(
        url=args.url, requests=args.requests, concurrency=args.concurrency,
        prompt_len=_range("--prompt-len", args.prompt_len), output_len=_range("--output-len", args.output_len),
        token=args.auth_token_file.read_text().strip() if args.auth_token_file else None,
        timeout_s=args.timeout_s, seed=args.seed,
    )  # fmt: skip
    record = run_llm_load(opts, progress=lambda line: print(line, flush=True))
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.output}")
    return 0 if record["errors"] == 0 else 1


def run(args: argparse.Namespace) -> int:
    from inferx_edge.serve.loadgen import LoadgenOptions, print_summary, read_trace, run_loadgen

    if args.llm:
        return _run_llm(args)
    if not args.model:
        raise UsageError("--model is required (the served model's name), or --llm for an LLM server")
    if args.concurrency < 1 or args.rows < 1:
        raise UsageError("--concurrency and --rows must be at least 1")
    if args.duration <= 0 or args.qps <= 0:
        raise UsageError("--duration and --qps must be positive")
    if args.trace and args.scenario != "server":
        raise UsageError("--trace drives the server scenario (add --scenario server)")
    shapes = {}
    for s in args.shape:
        name, sep, dims = s.partition(":")
        try:
            shapes[name] = [int(d) for d in dims.split("x")]
        except ValueError:
            raise UsageError(f"--shape {s}: expected NAME:D1xD2x...") from None
        if not sep:
            raise UsageError(f"--shape {s}: expected NAME:D1xD2x...")
    token = args.auth_token_file.read_text().strip() if args.auth_token_file else None
    opts = LoadgenOptions(
        url=args.url,
        model=args.model,
        scenario=args.scenario,
        qps=args.qps,
        duration_s=args.duration,
        concurrency=args.concurrency,
        phases=read_trace(args.trace) if args.trace else None,
        rows=args.rows,
        token=token,
        timeout_s=args.timeout_s,
        seed=args.seed,
        shapes=shapes,
        slo_ms=args.slo_ms,
        shared_memory=args.shared_memory,
    )
    record = run_loadgen(opts, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print_summary(record)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.output}")
    return 0 if record["errors"] == 0 else 1
