"""LLM prefill speed by prompt length on this CPU: an LLM artifact against llama.cpp on the same GGUF
and thread count (benchmarks/llm_cpu.py measures one 128-token prompt; long prompts are where the
attention kernels show).

    python -m benchmarks.llm_cpu_prefill --gguf SmolLM2-135M-Instruct.Q4_1.gguf --artifact A.ixa \
        [--variant q4_1] [--lengths 128,512,1024]

Per length: median of 3 prefills of seeded random token ids (the artifact in ``prefill_chunk``
pieces of 256, as the scheduler runs them; llama.cpp in one ``eval``), tokens/s and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--artifact", type=Path, required=True)
    ap.add_argument("--variant", default="q4_1")
    ap.add_argument("--lengths", default="128,512,1024")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--name", default="llm_cpu_prefill_smollm2")
    args = ap.parse_args()
    from llama_cpp import Llama

    from benchmarks._record import versions, write_record
    from inferx_edge.runtime._tvm import cpu_thread_budget
    from inferx_edge.runtime.llm import LLMEngine

    threads = int(os.environ.get("TVM_NUM_THREADS") or cpu_thread_budget())
    lengths = [int(n) for n in args.lengths.split(",")]
    rng = np.random.default_rng(0)
    rows = {}
    with LLMEngine(args.artifact, variant=args.variant, max_sequences=4, kv_tokens=max(lengths) * 2 + 64, prefill_chunk=args.chunk) as e:  # fmt: skip
        prompts = {n: rng.integers(0, e.vocab_size, n).tolist() for n in lengths}
        for n in lengths:
            walls = []
            for r in range(4):
                e.add_sequence(r)
                t0 = time.perf_counter()
                for s in range(0, n, args.chunk):
                    e.prefill([r], [prompts[n][s : s + args.chunk]])
                walls.append(time.perf_counter() - t0)
                e.remove_sequence(r)
            rows[n] = {"inferx_tokens_per_s": round(n / statistics.median(walls[1:]), 1)}
    llm = Llama(model_path=str(args.gguf), n_threads=threads, n_threads_batch=threads, n_ctx=max(lengths) + 64, verbose=False)  # fmt: skip
    for n in lengths:
        walls = []
        for _ in range(4):
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(prompts[n])
            walls.append(time.perf_counter() - t0)
        rows[n]["llama_cpp_tokens_per_s"] = round(n / statistics.median(walls[1:]), 1)
        rows[n]["ratio"] = round(rows[n]["inferx_tokens_per_s"] / rows[n]["llama_cpp_tokens_per_s"], 3)
        print(n, rows[n], flush=True)
    record = {
        "device": "CPU (this host)",
        "threads": threads,
        "versions": versions("apache-tvm", "llama_cpp_python", "numpy", "inferx_edge"),
        "model": {"gguf": args.gguf.name, "variant": args.variant, "prefill_chunk": args.chunk},
        "protocol": "median of the last 3 of 4 prefills of seeded random token ids per length",
        "results": {str(n): r for n, r in rows.items()},
    }
    print(f"wrote {write_record(args.name, record)}")


if __name__ == "__main__":
    main()
