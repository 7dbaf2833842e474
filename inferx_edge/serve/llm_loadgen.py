"""LLM load: concurrent streaming clients against ``/v1/completions``, with prompt and output lengths
drawn from ranges; reports TTFT, TPOT, end-to-end latency percentiles and tokens/s.

Prompts are random token ids (the server accepts id lists), outputs run to ``max_tokens``
(``ignore_eos``), so every request costs what its lengths say. 503 answers are counted as rejected.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LLMLoadOptions:
    url: str
    requests: int = 32
    concurrency: int = 8
    prompt_len: tuple[int, int] = (64, 256)
    output_len: tuple[int, int] = (32, 128)
    vocab: int = 1000  # prompt ids are drawn below this (any id the model accepts)
    token: str | None = None
    timeout_s: float = 120.0
    seed: int = 0


def _one(opts: LLMLoadOptions, prompt: list[int], max_tokens: int) -> dict:
    u = urllib.parse.urlsplit(opts.url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=opts.timeout_s)
    body = json.dumps(
        {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "temperature": 0}
    )
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {opts.token}"} if opts.token else {})
    t0 = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body, headers)
        resp = conn.getresponse()
        if resp.status != 200:
            resp.read()
            return {"status": resp.status}
        first, chunks = None, 0
        for line in resp:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return {"status": 500}
            if event["choices"][0]["text"] and first is None:
                first = time.perf_counter()
            chunks += 1
        end = time.perf_counter()
        return {
            "status": 200,
            "ttft": (first or end) - t0,
            "e2e": end - t0,
            "tokens": max_tokens,
            "first": first,
            "end": end,
        }
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return {"status": 0, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        conn.close()


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1e3, 2) if values else None


def run_llm_load(opts: LLMLoadOptions, progress=print) -> dict:
    rng = np.random.default_rng(opts.seed)
    work = [
        (rng.integers(1, opts.vocab, int(rng.integers(opts.prompt_len[0], opts.prompt_len[1] + 1))).tolist(),
         int(rng.integers(opts.output_len[0], opts.output_len[1] + 1)))
        for _ in range(opts.requests)
    ]  # fmt: skip
    results: list[dict] = []
    lock = threading.Lock()
    it = iter(work)

    def worker():
        while True:
            with lock:
                job = next(it, None)
            if job is None:
                return
            r = _one(opts, *job)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(opts.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ok = [r for r in results if r["status"] == 200]
    ttft = [r["ttft"] for r in ok]
    tpot = [(r["end"] - r["first"]) / (r["tokens"] - 1) for r in ok if r["first"] and r["tokens"] > 1]
    e2e = [r["e2e"] for r in ok]
    record = {
        "scenario": "llm-streaming",
        "options": {k: getattr(opts, k) for k in ("requests", "concurrency", "prompt_len", "output_len", "seed")},
        "completed": len(ok),
        "rejected_503": sum(r["status"] == 503 for r in results),
        "errors": sum(r["status"] not in (200, 503) for r in results),
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(sum(r["tokens"] for r in ok) / wall, 1),
        "ttft_ms": {"p50": _pct(ttft, 50), "p90": _pct(ttft, 90), "p99": _pct(ttft, 99)},
        "tpot_ms": {"p50": _pct(tpot, 50), "p90": _pct(tpot, 90), "p99": _pct(tpot, 99)},
        "e2e_ms": {"p50": _pct(e2e, 50), "p90": _pct(e2e, 90), "p99": _pct(e2e, 99)},
    }
    progress(
        f"{len(ok)}/{opts.requests} completed, {record['rejected_503']} rejected, {record['errors']} errors; "
        f"{record['output_tokens_per_s']} tokens/s; TTFT p50 {record['ttft_ms']['p50']} ms p99 "
        f"{record['ttft_ms']['p99']} ms; TPOT p50 {record['tpot_ms']['p50']} ms"
    )
    return record
