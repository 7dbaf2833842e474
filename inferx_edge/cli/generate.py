"""Generate text with an LLM artifact on this device (streams tokens to stdout, then timings)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from inferx_edge.cli._common import add_trust_argument


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1: off)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest tokens (default 0: off)")
    p.add_argument("--seed", type=int, default=None, help="seed for sampling")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", type=Path, help="LLM artifact written by 'build --model X.gguf'")
    p.add_argument("--prompt", "-p", action="append", required=True, help="prompt text; repeat to batch several")
    p.add_argument("--chat", action="store_true", help="wrap each prompt as a user message in the chat template")
    add_sampling_arguments(p)
    p.add_argument("--variant", default=None, help="precision variant (default: the manifest's default)")
    p.add_argument("--device-id", type=int, default=0, help="GPU index for CUDA artifacts")
    add_trust_argument(p)


def run(args: argparse.Namespace) -> int:
    from inferx_edge.runtime.llm import LLMEngine, TextStream
    from inferx_edge.runtime.llm_scheduler import GenerationRequest, SamplingParams, Scheduler

    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
    )
    with LLMEngine(args.artifact, variant=args.variant, device_id=args.device_id, trust=args.trust,
                   max_sequences=max(1, len(args.prompt))) as engine:  # fmt: skip
        texts = [engine.render_chat([{"role": "user", "content": p}]) if args.chat else p for p in args.prompt]
        sched = Scheduler(engine, max_queue=len(texts))
        stream = len(texts) == 1
        reqs = []
        text_stream = TextStream(engine.tokenizer) if stream else None

        def emit(ev):
            if ev[0] == "error":
                print(f"error: {ev[1]}", file=sys.stderr)
            elif text_stream is not None:
                sys.stdout.write(text_stream.push(ev[1]) if ev[0] == "token" else text_stream.flush())
                sys.stdout.flush()

        for text in texts:
            reqs.append(sched.submit(GenerationRequest(engine.encode(text), params, emit)))
        t0 = time.perf_counter()
        sched.run_until_idle()
        wall = time.perf_counter() - t0
        if stream:
            print()
        for r in reqs:
            if not stream:
                print(f"--- {engine.tokenizer.decode(r.output)}")
            ttft = (r.first_token - r.submitted) * 1e3
            n = len(r.output)
            tpot = (r.finished - r.first_token) / max(1, n - 1) * 1e3
            print(
                f"[{len(r.prompt)} prompt tokens, {n} generated ({r.finish_reason}); TTFT {ttft:.1f} ms, "
                f"TPOT {tpot:.1f} ms, {n / wall:.1f} tokens/s]",
                file=sys.stderr,
            )
    return 0
