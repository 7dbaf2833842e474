"""Where an LLM decode step's time goes on a GPU: per-kernel GPU time (CUPTI, through torch.profiler,
which sees every kernel of the process, TVM's included) against the step's wall time.

    python scripts/llm_gpu_profile.py --out DIR [--precisions q4,fp16] [--batches 1,32]

Builds the architecture of ``--config`` with seeded random weights (benchmarks/llm_gpu.py's), decodes
``--steps`` greedy steps per (precision, batch) after a warm-up, and writes ``DIR/llm_gpu_profile.json``:
wall ms per step, summed GPU kernel ms per step, and the kernels by total time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _row(prof, walls, steps) -> dict:
    kernels = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t:
            kernels[ev.key] = {"ms_per_step": round(t / 1e3 / steps, 4), "calls_per_step": ev.count / steps}
    top = dict(sorted(kernels.items(), key=lambda kv: -kv[1]["ms_per_step"]))
    return {
        "wall_ms_per_step": round(statistics.median(walls) * 1e3, 3),
        "gpu_ms_per_step": round(sum(k["ms_per_step"] for k in top.values()), 3),
        "kernels_per_step": round(sum(k["calls_per_step"] for k in top.values()), 1),
        "kernels": dict(list(top.items())[:25]),
    }


def _show(label: str, row: dict) -> None:
    print(label, {k: v for k, v in row.items() if k != "kernels"}, flush=True)
    for name, k in list(row["kernels"].items())[:12]:
        print(f"   {k['ms_per_step']:8.4f} ms {k['calls_per_step']:6.1f}x  {name[:110]}", flush=True)


def _prefill(e, tokens: int, steps: int, rng) -> dict:
    """One sequence's prompt of ``tokens`` (in prefill_chunk pieces), ``steps`` times."""
    from torch.profiler import ProfilerActivity, profile

    prompt = rng.integers(0, e.vocab_size, tokens).tolist()

    def once(seq: int) -> float:
        e.add_sequence(seq)
        t0 = time.perf_counter()
        for s in range(0, tokens, e.prefill_chunk):
            e.prefill([seq], [prompt[s : s + e.prefill_chunk]])
        wall = time.perf_counter() - t0
        e.remove_sequence(seq)
        return wall

    once(1000)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        walls = [once(1001 + i) for i in range(steps)]
    row = _row(prof, walls, steps)
    _show(f"prefill {tokens}", row)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=Path("configs/llm/smollm2-135m.json"))
    ap.add_argument("--target", default="h200")
    ap.add_argument("--precisions", default="q4,fp16")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--prefill", type=int, default=0, help="also profile a prefill of this many tokens (one sequence)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--artifact", type=Path, help="an artifact of --config to profile instead of building one")
    args = ap.parse_args()
    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.llm_gpu import random_checkpoint
    from inferx_edge.llm.build import LLMBuildOptions, build_llm_artifact
    from inferx_edge.runtime.llm import LLMEngine

    args.out.mkdir(parents=True, exist_ok=True)
    art = args.artifact or args.out / "llm.ixa"
    if not args.artifact:
        opts = LLMBuildOptions(model=args.config, target=args.target, output=art, precisions=tuple(args.precisions.split(",")))  # fmt: skip
        build_llm_artifact(opts, checkpoint=random_checkpoint(args.config))
    rng = np.random.default_rng(0)
    report = {}
    for variant in args.precisions.split(","):
        chunk = max(256, args.prefill)
        with LLMEngine(art, variant=variant, max_sequences=64, kv_tokens=64 * 256, prefill_chunk=chunk) as e:
            for batch in (int(b) for b in args.batches.split(",")):
                ids = list(range(batch))
                for s in ids:
                    e.add_sequence(s)
                for s in ids:  # one prefill per sequence: a step takes prefill_chunk tokens at most
                    e.prefill([s], [rng.integers(0, e.vocab_size, 16).tolist()])
                tok = [1] * batch
                for _ in range(10):
                    tok = e.decode_greedy(ids, tok).tolist()
                walls = []
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(args.steps):
                        t0 = time.perf_counter()
                        tok = e.decode_greedy(ids, tok).tolist()
                        walls.append(time.perf_counter() - t0)
                torch.cuda.synchronize()
                for s in ids:
                    e.remove_sequence(s)
                row = _row(prof, walls, args.steps)
                report[f"{variant}_b{batch}"] = row
                _show(f"{variant} decode b{batch}", row)
            if args.prefill:
                report[f"{variant}_prefill{args.prefill}"] = _prefill(e, args.prefill, args.steps, rng)
    (args.out / "llm_gpu_profile.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
