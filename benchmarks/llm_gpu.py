"""LLM decode/prefill speed on a GPU: inferx_edge artifacts (q4, fp16) against torch fp16 (eager and
torch.compile with CUDA graphs) on the same seeded random weights of one architecture (speed does not
depend on the values; real-weight accuracy is measured on the CPU by benchmarks/llm_cpu.py).

    python -m benchmarks.llm_gpu --config configs/llm/smollm2-135m.json --target h200 --out DIR

Measures, per system: TTFT of a 512-token prompt (one prefill), decode tokens/s at batch 1 and with
32 sequences decoding together, and for inferx_edge also 32 concurrent streams through the
continuous-batching scheduler (end-to-end tokens/s).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

PROMPT, DECODE_STEPS, STREAMS = 512, 128, 32


def random_checkpoint(cfg_path: Path, seed: int = 0):
    from inferx_edge.llm.checkpoint import Checkpoint
    from inferx_edge.llm.config import LlamaConfig

    cfg = LlamaConfig.from_json(json.loads(cfg_path.read_text()))
    rng = np.random.default_rng(seed)
    h, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nq, nkv = cfg.num_attention_heads, cfg.num_key_value_heads

    def mat(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)

    w = {"embed_tokens": mat(cfg.vocab_size, h), "norm": np.ones(h, np.float32)}
    for i in range(cfg.num_hidden_layers):
        w |= {
            f"layers.{i}.input_layernorm": np.ones(h, np.float32), f"layers.{i}.post_attention_layernorm": np.ones(h, np.float32),
            f"layers.{i}.q": mat(nq * hd, h), f"layers.{i}.k": mat(nkv * hd, h), f"layers.{i}.v": mat(nkv * hd, h),
            f"layers.{i}.o": mat(h, nq * hd), f"layers.{i}.gate": mat(f, h), f"layers.{i}.up": mat(f, h),
            f"layers.{i}.down": mat(h, f),
        }  # fmt: skip
    return Checkpoint(cfg, w, None, None, {"format": "random", "seed": seed})


def _median_ms(samples):
    return round(statistics.median(samples) * 1e3, 3)


def bench_inferx(artifact: Path, variant: str, vocab: int) -> dict:
    from inferx_edge.runtime.llm import LLMEngine
    from inferx_edge.runtime.llm_scheduler import GenerationRequest, SamplingParams, Scheduler

    rng = np.random.default_rng(1)
    out = {}
    kv = STREAMS * (PROMPT + DECODE_STEPS + 64)
    with LLMEngine(artifact, variant=variant, max_sequences=STREAMS, kv_tokens=kv, prefill_chunk=PROMPT) as e:
        prompt = rng.integers(0, vocab, PROMPT).tolist()
        ttft = []
        for r in range(6):
            e.add_sequence(100 + r)
            t0 = time.perf_counter()
            e.prefill([100 + r], [prompt])  # logits come back to the host: the step is complete
            ttft.append(time.perf_counter() - t0)
            e.remove_sequence(100 + r)
        out["ttft_512_ms"] = _median_ms(ttft[1:])
        for batch in (1, STREAMS):
            ids = list(range(batch))
            for s in ids:
                e.add_sequence(s)
            e.prefill(ids, [rng.integers(0, vocab, 16).tolist() for _ in ids])
            # the device's argmax matches the host's on the same logits (GPU artifacts sample on the device)
            logits = e._decode_step(ids, [1] * batch)
            host = logits.numpy()[:, 0].argmax(1)
            device = host if e._argmax is None else e._argmax(logits).numpy()
            out[f"decode_b{batch}_device_argmax_matches_host"] = bool((host == device).all())
            steps = []
            tok = device.tolist()
            for _ in range(DECODE_STEPS):
                t0 = time.perf_counter()
                tok = e.decode_greedy(ids, tok).tolist()  # ids to the host each step, as torch's below
                steps.append(time.perf_counter() - t0)
            for s in ids:
                e.remove_sequence(s)
            out[f"decode_b{batch}_step_ms"] = _median_ms(steps[8:])
            out[f"decode_b{batch}_tokens_per_s"] = round(batch / statistics.median(steps[8:]), 1)
        sched = Scheduler(e, max_queue=STREAMS)
        params = SamplingParams(max_tokens=DECODE_STEPS, temperature=0, ignore_eos=True)
        reqs = [GenerationRequest(rng.integers(0, vocab, 64).tolist(), params, lambda ev: None) for _ in range(STREAMS)]
        t0 = time.perf_counter()
        for r in reqs:
            sched.submit(r)
        sched.run_until_idle()
        wall = time.perf_counter() - t0
        out["streams_32_tokens_per_s"] = round(sum(len(r.output) for r in reqs) / wall, 1)
        out["streams_32_ttft_p50_ms"] = _median_ms([r.first_token - r.submitted for r in reqs])
        out["streams_32_tpot_p50_ms"] = _median_ms(
            [(r.finished - r.first_token) / (len(r.output) - 1) for r in reqs if len(r.output) > 1]
        )
        out["weight_bytes"] = e.variant.extra["llm"]["weight_bytes"]
    return out


def bench_torch(ck, compiled: bool) -> dict:
    import torch

    from benchmarks.llm_torch import TorchLlama

    cfg = ck.config.to_json()
    m = TorchLlama(ck.weights, cfg, "cuda", torch.float16, STREAMS, PROMPT + DECODE_STEPS + 64)
    fwd = m.forward
    if compiled:
        fwd = torch.compile(m.forward, mode="reduce-overhead", dynamic=False)
    rng = np.random.default_rng(1)
    out = {}
    with torch.no_grad():
        prompt = torch.tensor(rng.integers(0, cfg["vocab_size"], (1, PROMPT)), device="cuda")
        ttft = []
        for _ in range(6):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fwd(prompt, torch.tensor(0, device="cuda"))[:, -1].cpu()
            ttft.append(time.perf_counter() - t0)
        out["ttft_512_ms"] = _median_ms(ttft[1:])
        for batch in (1, STREAMS):
            fwd(
                torch.tensor(rng.integers(0, cfg["vocab_size"], (batch, 16)), device="cuda"),
                torch.tensor(0, device="cuda"),
            )
            tok = torch.ones(batch, 1, dtype=torch.long, device="cuda")
            steps = []
            for i in range(DECODE_STEPS):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                logits = fwd(tok, torch.tensor(16 + i, device="cuda"))
                tok = logits[:, -1].argmax(-1, keepdim=True).clone()
                tok.cpu()  # the host sees each token, as a server streaming it would
                steps.append(time.perf_counter() - t0)
            out[f"decode_b{batch}_step_ms"] = _median_ms(steps[8:])
            out[f"decode_b{batch}_tokens_per_s"] = round(batch / statistics.median(steps[8:]), 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=Path("configs/llm/smollm2-135m.json"))
    ap.add_argument("--target", default="h200")
    ap.add_argument("--precisions", default="q4,fp16")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--name", default="llm_h200_smollm2")
    ap.add_argument("--skip-compile", action="store_true", help="torch eager only")
    args = ap.parse_args()
    import torch

    from benchmarks._record import gpu_driver, versions, write_record
    from inferx_edge.llm.build import LLMBuildOptions, build_llm_artifact

    ck = random_checkpoint(args.config)
    args.out.mkdir(parents=True, exist_ok=True)
    art = args.out / "llm.ixa"
    t0 = time.perf_counter()
    m = build_llm_artifact(
        LLMBuildOptions(
            model=args.config, target=args.target, output=art, precisions=tuple(args.precisions.split(","))
        ),
        checkpoint=ck,
    )
    build_s = round(time.perf_counter() - t0, 1)
    rows = {}
    for v in m.variants:
        rows[f"inferx_{v.name}"] = bench_inferx(art, v.name, ck.config.vocab_size)
        print(v.name, rows[f"inferx_{v.name}"], flush=True)
    rows["torch_fp16_eager"] = bench_torch(ck, compiled=False)
    print("torch eager", rows["torch_fp16_eager"], flush=True)
    if not args.skip_compile:
        try:
            rows["torch_fp16_compile"] = bench_torch(ck, compiled=True)
        except Exception as exc:  # noqa: BLE001 - record why the peer is missing
            rows["torch_fp16_compile"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        print("torch compile", rows["torch_fp16_compile"], flush=True)
    peers = [k for k in ("torch_fp16_compile", "torch_fp16_eager") if "error" not in rows.get(k, {"error": 1})]
    ratios = {}
    for ours in [k for k in rows if k.startswith("inferx_")]:
        for peer in peers:
            for metric in ("decode_b1_tokens_per_s", f"decode_b{STREAMS}_tokens_per_s"):
                ratios[f"{ours}/{peer}:{metric}"] = round(rows[ours][metric] / rows[peer][metric], 3)
            ratios[f"{ours}/{peer}:ttft_512 (peer/ours)"] = round(
                rows[peer]["ttft_512_ms"] / rows[ours]["ttft_512_ms"], 3
            )
    record = {
        "device": torch.cuda.get_device_name(0),
        "driver": gpu_driver(),
        "versions": versions("apache-tvm", "apache-tvm-ffi", "torch", "numpy", "inferx_edge"),
        "model": {"config": json.loads(args.config.read_text()), "weights": "seeded random (seed 0), same for all systems"},
        "build": {"target": args.target, "seconds": build_s, "cuda": {k: m.target.get(k) for k in ("cuda_code", "cuda_code_arch", "cuda_toolkit")}},
        "protocol": {"prompt_tokens": PROMPT, "decode_steps": DECODE_STEPS, "streams": STREAMS, "statistic": "median step", "sampling": "greedy, argmax on the GPU for every system (token ids copied to the host each step)"},
        "results": rows,
        "ratios": ratios,
    }  # fmt: skip
    path = write_record(args.name, record)
    (args.out / path.name).write_text(path.read_text())
    print(json.dumps(ratios, indent=1))


if __name__ == "__main__":
    main()
