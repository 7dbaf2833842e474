"""Serve artifacts over HTTP (KServe v2 / Open Inference Protocol): dynamic batching, the governor live, metrics.

Give one artifact, several artifacts of the same model (one per device: batches are routed between
them), a deployment directory written by ``deploy`` (hot-reloaded when its ``current`` moves), or a
directory of those (several models). Binds 127.0.0.1 unless told otherwise; SIGTERM drains and exits 0.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from inferx_edge.cli._common import add_trust_argument
from inferx_edge.errors import UsageError

POLICIES = ("max-throughput", "min-energy", "latency-slo")


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", type=Path, metavar="ARTIFACT_OR_DIR", help="artifacts and/or model directories")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; others need --auth-token-file or --insecure-bind)",
    )
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--auth-token-file", type=Path, default=None, help="file holding the bearer token clients must send")
    p.add_argument("--insecure-bind", action="store_true", help="allow a non-loopback bind without authentication")
    g = p.add_argument_group("governor")
    g.add_argument(
        "--policy",
        choices=POLICIES,
        default="max-throughput",
        help="what the governor optimises (default max-throughput)",
    )
    g.add_argument(
        "--power-cap",
        type=_positive(float),
        default=None,
        metavar="W",
        help="max-throughput: power cap in watts (default none)",
    )
    g.add_argument(
        "--fps-floor",
        type=_positive(float),
        default=None,
        metavar="F",
        help="min-energy: throughput to sustain (compared with live demand)",
    )
    g.add_argument(
        "--p99", type=_positive(float), default=None, metavar="MS", help="latency-slo: p99 request latency target in ms"
    )
    g.add_argument(
        "--variant", default=None, help="pin one operating point (a variant name); the governor then only measures"
    )
    g.add_argument(
        "--governor-window-s", type=_positive(float), default=1.0, help="seconds between decisions (default 1)"
    )
    g.add_argument(
        "--governor-dwell-s",
        type=float,
        default=5.0,
        help="minimum seconds on a point before a switch for gain (default 5)",
    )
    g.add_argument(
        "--reprobe-s",
        type=float,
        default=120.0,
        help="re-measure variants not running this often (default 120; 0: never)",
    )
    g.add_argument(
        "--telemetry",
        default="auto",
        help="power sensor: auto, none, nvml, rapl, jetson-sysfs, jtop, replay:FILE (default auto)",
    )
    g.add_argument("--decision-log", type=Path, default=None, help="append every governor decision here (JSON lines)")
    g.add_argument(
        "--allow-power-mode-change",
        action="store_true",
        help="let the governor switch Jetson power modes (root; not implemented in serve yet: refused)",
    )
    b = p.add_argument_group("batching and limits")
    b.add_argument(
        "--max-queue-delay-us",
        type=int,
        default=2000,
        help="longest the oldest request waits for a batch to fill (default 2000)",
    )
    b.add_argument(
        "--max-queue-size", type=int, default=256, help="requests queued before new ones get 503 (default 256)"
    )
    b.add_argument(
        "--request-timeout-s",
        type=_positive(float),
        default=30.0,
        help="a request not answered by then gets 504 (default 30)",
    )
    b.add_argument("--max-request-bytes", type=int, default=256 << 20, help="largest request body (default 256 MiB)")
    b.add_argument("--max-request-rows", type=int, default=4096, help="most rows one request may carry (default 4096)")
    b.add_argument(
        "--reload-interval-s",
        type=_positive(float),
        default=2.0,
        help="how often deployments' 'current' is checked (default 2)",
    )
    b.add_argument("--device-id", type=int, default=0, help="GPU index for CUDA artifacts")
    b.add_argument(
        "--shared-memory",
        action="store_true",
        help="enable Triton's system shared memory extension for clients on this host (tensors in /dev/shm "
        "instead of the HTTP body; off by default: the server then reads and writes shm objects clients name)",
    )
    add_trust_argument(p)
    p.add_argument(
        "--allow-nonfinite", action="store_true", help="accept NaN/Inf in float inputs (refused with 400 by default)"
    )
    g = p.add_argument_group("LLM artifacts (text generation)")
    g.add_argument("--max-sequences", type=int, default=8, help="sequences decoded together at most (default 8)")
    g.add_argument(
        "--kv-tokens",
        type=int,
        default=None,
        help="KV-cache capacity in tokens over all sequences (default: max-sequences x context / 4, at least one context)",
    )
    g.add_argument(
        "--prefill-chunk",
        type=int,
        default=256,
        help="most prompt tokens one step reads; longer prompts are read between decode steps (default 256)",
    )


def _require_serve_extra() -> None:
    import importlib.util

    missing = [m for m in ("starlette", "uvicorn", "prometheus_client") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"serve needs {', '.join(missing)}, from the serve extra: pip install 'inferx_edge[serve]'")


def _run_llm(args: argparse.Namespace) -> int:
    from inferx_edge.serve.llm_server import serve_llm
    from inferx_edge.serve.server import read_token

    if len(args.paths) != 1:
        raise UsageError("an LLM artifact is served alone: pass exactly one path")
    for flag, value in (("--max-sequences", args.max_sequences), ("--prefill-chunk", args.prefill_chunk)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    return serve_llm(
        args.paths[0], args.host, args.port, auth_token=read_token(args.auth_token_file) if args.auth_token_file else None,
        insecure_bind=args.insecure_bind, variant=args.variant, device_id=args.device_id, trust=args.trust,
        max_sequences=args.max_sequences, kv_tokens=args.kv_tokens, prefill_chunk=args.prefill_chunk,
        max_queue=args.max_queue_size,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    _require_serve_extra()
    from inferx_edge.runtime.llm import is_llm_artifact

    if any(is_llm_artifact(p) for p in args.paths):
        return _run_llm(args)
    from inferx_edge.serve.batcher import BatchOptions
    from inferx_edge.serve.live import GovernorOptions
    from inferx_edge.serve.repository import ServeOptions
    from inferx_edge.serve.server import Server, read_token

    if args.allow_power_mode_change:
        raise UsageError(
            "--allow-power-mode-change: serve does not switch Jetson power modes yet; use "
            "'profile --allow-power-mode-change' to measure modes and set one with nvpmodel before serving"
        )
    for flag, value, low in (
        ("--max-queue-delay-us", args.max_queue_delay_us, 0),
        ("--max-queue-size", args.max_queue_size, 1),
        ("--max-request-bytes", args.max_request_bytes, 1),
        ("--max-request-rows", args.max_request_rows, 1),
        ("--governor-dwell-s", args.governor_dwell_s, 0),
        ("--reprobe-s", args.reprobe_s, 0),
    ):
        if value < low:
            raise UsageError(f"{flag} must be at least {low}, got {value}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0..65535, got {args.port}")
    governor = GovernorOptions(
        policy=args.policy,
        power_cap_w=args.power_cap,
        fps_floor=args.fps_floor,
        p99_ms=args.p99,
        window_s=args.governor_window_s,
        dwell_s=args.governor_dwell_s,
        reprobe_s=args.reprobe_s,
        fixed=args.variant,
    )
    governor.limit()  # a policy without its limit is a usage error now, not after loading
    options = ServeOptions(
        batch=BatchOptions(
            max_queue_delay_s=args.max_queue_delay_us / 1e6,
            max_queue_size=args.max_queue_size,
            timeout_s=args.request_timeout_s,
            max_request_rows=args.max_request_rows,
            allow_nonfinite=args.allow_nonfinite,
        ),
        governor=governor,
        telemetry=args.telemetry,
        trust=args.trust,
        device_id=args.device_id,
    )
    token = read_token(args.auth_token_file) if args.auth_token_file else None
    server = Server(
        args.paths,
        options,
        host=args.host,
        port=args.port,
        auth_token=token,
        insecure_bind=args.insecure_bind,
        max_request_bytes=args.max_request_bytes,
        reload_interval_s=args.reload_interval_s,
        decision_log=args.decision_log,
        shared_memory=args.shared_memory,
    )
    print(
        f"serving on http://{args.host}:{server.port} (KServe v2; /metrics; Ctrl-C or SIGTERM drains and stops)",
        flush=True,
    )
    ok = server.run()
    print("stopped: every accepted request answered" if ok else "stopped: some requests were not answered", flush=True)
    return 0 if ok else 1
