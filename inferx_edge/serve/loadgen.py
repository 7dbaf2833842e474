"""A load generator for a running v2 server, after MLPerf LoadGen's scenarios.

- ``single-stream``: one request at a time, the next when the last returns (latency);
- ``server``: Poisson arrivals at ``qps`` (or a trace of phases); latency counts from the *scheduled*
  arrival, so a client that falls behind shows it (as LoadGen does);
- ``offline``: ``concurrency`` clients back to back (throughput).

Requests carry binary tensors (random, seeded, the model's input shapes from its metadata). Energy per
inference comes from the server's own metrics (``inferx_energy_joules_total`` over
``nv_inference_count``) read before and after each phase. Standard library HTTP only: the load
generator runs wherever Python does.
"""

from __future__ import annotations

import json
import math
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import numpy as np

from inferx_edge.errors import UsageError
from inferx_edge.serve.client import Client, ShmRequests, scrape
from inferx_edge.serve.protocol import DATATYPES, HEADER_LENGTH, encode_binary_request

SCENARIOS = ("single-stream", "server", "offline")


@dataclass(frozen=True)
class Phase:
    seconds: float
    qps: float | None = None  # server scenario


@dataclass
class LoadgenOptions:
    url: str
    model: str
    scenario: str = "server"
    qps: float = 10.0
    duration_s: float = 10.0
    concurrency: int = 16
    phases: list[Phase] | None = None  # from --trace
    rows: int = 1  # rows per request
    token: str | None = None
    timeout_s: float = 60.0
    seed: int = 0
    shapes: dict[str, list[int]] = field(default_factory=dict)
    slo_ms: float | None = None  # count requests slower than this
    shared_memory: bool = False  # tensors in POSIX shm regions (the server's --shared-memory)


def read_trace(path) -> list[Phase]:
    """A trace: a JSON list of ``{"seconds": S, "qps": Q}`` phases (or JSON lines of them)."""
    try:
        text = open(path).read()
    except OSError as exc:
        raise UsageError(f"cannot read --trace {path}: {exc.strerror}") from exc
    try:
        items = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else [json.loads(x) for x in text.splitlines() if x.strip()]
        )
        phases = [Phase(float(i["seconds"]), float(i["qps"])) for i in items]
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f'--trace {path}: expected a JSON list of {{"seconds": S, "qps": Q}} ({exc})') from exc
    if not phases or any(p.seconds <= 0 or p.qps <= 0 or not math.isfinite(p.qps) for p in phases):
        raise UsageError(f"--trace {path}: every phase needs positive seconds and qps")
    return phases


class _Stats:
    def __init__(self, slo_ms: float | None = None) -> None:
        self.slo_s = slo_ms / 1e3 if slo_ms else None
        self.retries = 0
        self.lock = threading.Lock()
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}
        self.sent = 0
        self.rows_ok = 0

    def add(self, status: int | str, latency: float, rows: int) -> None:
        with self.lock:
            self.sent += 1
            if status == 200:
                self.latencies.append(latency)
                self.rows_ok += rows
            else:
                self.errors[str(status)] = self.errors.get(str(status), 0) + 1

    def summary(self, seconds: float) -> dict:
        with self.lock:
            lat = np.asarray(self.latencies) * 1e3
            pct = np.percentile(lat, [50, 90, 99, 99.9]) if lat.size else [None] * 4
            slow = int((lat > self.slo_s * 1e3).sum()) if self.slo_s is not None and lat.size else None
            return {
                "seconds": seconds,
                "requests": self.sent,
                "retried": self.retries,
                "slo_violations": slow,
                "slo_violation_share": slow / lat.size if slow is not None else None,
                "ok": len(self.latencies),
                "errors": dict(self.errors),
                "error_count": sum(self.errors.values()),
                "throughput_inf_s": self.rows_ok / seconds if seconds > 0 else None,
                "requests_s": len(self.latencies) / seconds if seconds > 0 else None,
                "latency_ms": {
                    "p50": _f(pct[0]),
                    "p90": _f(pct[1]),
                    "p99": _f(pct[2]),
                    "p99.9": _f(pct[3]),
                    "mean": float(lat.mean()) if lat.size else None,
                    "max": float(lat.max()) if lat.size else None,
                },
            }


def _f(v):
    return None if v is None else float(v)


def _inputs(meta: dict, opts: LoadgenOptions) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(opts.seed)
    out = {}
    for t in meta["inputs"]:
        shape = list(opts.shapes.get(t["name"], t["shape"]))
        if shape and shape[0] == -1:
            shape[0] = opts.rows
        if any(d < 0 for d in shape):
            raise UsageError(f"input '{t['name']}' has dynamic dims {t['shape']}: give --shape {t['name']}:D1xD2...")
        dtype = DATATYPES.get(t["datatype"])
        if dtype is None:
            raise UsageError(f"input '{t['name']}' has datatype {t['datatype']}, which loadgen cannot generate")
        if dtype.kind == "f":
            out[t["name"]] = rng.standard_normal(shape).astype(dtype)
        else:
            out[t["name"]] = rng.integers(0, 2, shape).astype(dtype)
    return out


def run_loadgen(opts: LoadgenOptions, progress=None) -> dict:
    """Run the scenario; returns the record (per phase and overall)."""
    if opts.scenario not in SCENARIOS:
        raise UsageError(f"unknown scenario '{opts.scenario}'; valid: {', '.join(SCENARIOS)}")
    u = urlparse(opts.url if "://" in opts.url else f"http://{opts.url}")
    if u.scheme != "http" or not u.hostname:
        raise UsageError(f"--url must be http://HOST:PORT, got {opts.url!r}")
    host, port = u.hostname, u.port or 80
    probe = Client(host, port, opts.token, opts.timeout_s)
    try:
        status, data, _ = probe.request("GET", f"/v2/models/{opts.model}")
    except OSError as exc:
        raise UsageError(f"cannot reach {opts.url}: {exc}") from exc
    if status != 200:
        raise UsageError(f"{opts.url}: model '{opts.model}' answered {status}: {data[:300].decode(errors='replace')}")
    meta = json.loads(data)
    inputs = _inputs(meta, opts)
    if opts.shared_memory:
        body = headers = None
        shm = ShmRequests(probe, meta, inputs, opts.rows)
    else:
        body, hl = encode_binary_request(inputs)
        headers = {HEADER_LENGTH: str(hl), "Content-Type": "application/octet-stream"}
        shm = None
    path = f"/v2/models/{opts.model}/infer"
    phases = opts.phases or [Phase(opts.duration_s, opts.qps if opts.scenario == "server" else None)]
    results = []
    for i, phase in enumerate(phases):
        before = scrape(probe, opts.model)
        stats = _Stats(opts.slo_ms)
        t0 = time.monotonic()
        try:
            _run_phase(
                opts, phase, host, port, path, body, headers, stats, progress, f"phase {i + 1}/{len(phases)}", shm
            )
        except BaseException:
            if shm:
                shm.close()
            raise
        seconds = time.monotonic() - t0
        after = scrape(probe, opts.model)
        s = stats.summary(seconds)
        s["offered_qps"] = phase.qps
        e0, e1, c0, c1 = before["energy_j"], after["energy_j"], before["count"], after["count"]
        s["energy_j"] = e1 - e0 if e0 is not None and e1 is not None else None
        s["joules_per_inference"] = s["energy_j"] / (c1 - c0) if s["energy_j"] is not None and c1 and c1 > c0 else None
        results.append(s)
    if shm:
        shm.close()
    total_s = sum(r["seconds"] for r in results)
    return {
        "shared_memory": opts.shared_memory,
        "url": opts.url,
        "model": opts.model,
        "scenario": opts.scenario,
        "rows_per_request": opts.rows,
        "concurrency": opts.concurrency,
        "phases": results,
        "requests": sum(r["requests"] for r in results),
        "errors": sum(r["error_count"] for r in results),
        "throughput_inf_s": sum((r["throughput_inf_s"] or 0) * r["seconds"] for r in results) / total_s,
    }


def _run_phase(opts, phase, host, port, path, body, headers, stats: _Stats, progress, label, shm=None) -> None:
    end = time.monotonic() + phase.seconds
    workers = 1 if opts.scenario == "single-stream" else opts.concurrency
    arrivals: queue.Queue = queue.Queue()
    stop = threading.Event()

    local = threading.local()

    def send(client: Client, scheduled: float) -> None:
        b, h = body, headers
        if shm is not None:
            if not hasattr(local, "req"):
                local.req = shm.make(client)
            b, h = local.req
        try:
            status, _, _ = client.request("POST", path, b, h)
        except OSError as exc:
            status = type(exc).__name__
        stats.add(status, time.monotonic() - scheduled, opts.rows)

    def closed_loop():
        client = Client(host, port, opts.token, opts.timeout_s)
        while time.monotonic() < end and not stop.is_set():
            send(client, time.monotonic())
        with stats.lock:
            stats.retries += client.retries

    def open_loop():
        client = Client(host, port, opts.token, opts.timeout_s)
        while True:
            t = arrivals.get()
            if t is None:
                break
            delay = t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            send(client, t)
        with stats.lock:
            stats.retries += client.retries

    def schedule():
        rng = np.random.default_rng(opts.seed + 1)
        t = time.monotonic()
        while not stop.is_set():
            t += rng.exponential(1.0 / phase.qps)
            if t >= end:
                break
            while arrivals.qsize() > 4 * workers and not stop.is_set():  # keep memory bounded
                time.sleep(0.001)
            arrivals.put(t)
        for _ in range(workers):
            arrivals.put(None)

    target = open_loop if opts.scenario == "server" else closed_loop
    threads = [threading.Thread(target=target, daemon=True) for _ in range(workers)]
    if opts.scenario == "server":
        threads.append(threading.Thread(target=schedule, daemon=True))
    for t in threads:
        t.start()
    t_start = time.monotonic()
    try:
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(1.0)
                break
            if progress:
                s = stats.summary(max(time.monotonic() - t_start, 1e-9))
                p99 = s["latency_ms"]["p99"]
                progress(
                    f"[loadgen] {label} {time.monotonic() - t_start:5.1f}/{phase.seconds:g} s  "
                    f"sent {s['requests']}  ok {s['ok']}  errors {s['error_count']}  "
                    f"{s['throughput_inf_s'] or 0:.0f} inf/s  p99 {'-' if p99 is None else f'{p99:.2f}'} ms"
                )
    except KeyboardInterrupt:
        stop.set()
        raise


def print_summary(record: dict, stream=sys.stdout) -> None:
    for i, r in enumerate(record["phases"]):
        lat = r["latency_ms"]
        jpi = r["joules_per_inference"]
        print(
            f"phase {i + 1}: offered {r['offered_qps'] or '-'} req/s, {r['throughput_inf_s'] or 0:.1f} inf/s, "
            f"{r['ok']} ok / {r['error_count']} errors {r['errors'] or ''}; latency p50 {_ms(lat['p50'])} "
            f"p90 {_ms(lat['p90'])} p99 {_ms(lat['p99'])} p99.9 {_ms(lat['p99.9'])}; "
            f"J/inference {'-' if jpi is None else f'{jpi:.4g}'}",
            file=stream,
        )


def _ms(v) -> str:
    return "-" if v is None else f"{v:.3f} ms"
