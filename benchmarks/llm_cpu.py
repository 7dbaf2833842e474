"""SmolLM2 (or any Llama-family GGUF) on this CPU with its real weights: correctness against
transformers, perplexity and greedy agreement per precision, and speed against llama.cpp.

    python -m benchmarks.llm_cpu --gguf SmolLM2-135M-Instruct.Q4_1.gguf [--artifact A.ixa]

- correctness: the fp32 artifact's greedy 32-token continuations of 5 prompts against transformers
  (torch, fp32, CPU; its own GGUF loader), and the prompt logits' largest difference;
- perplexity of the first ``--ppl-tokens`` tokens of a licence text Debian ships
  (/usr/share/common-licenses/GPL-3) for every precision, for transformers fp32 and for llama.cpp;
- greedy-token agreement of each precision with fp32 (position by position over the 5 x 32 tokens:
  harsh, everything after a first divergence counts as a miss) and teacher-forced top-1 agreement
  (each precision fed fp32's continuation: does its next-token argmax match);
- speed, same thread count: prefill tokens/s (128-token prompt) and decode tokens/s (batch 1),
  against llama.cpp (llama-cpp-python built from source) on the same GGUF weights.
Needs transformers, accelerate and llama-cpp-python (benchmark-only dependencies).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from pathlib import Path

import numpy as np

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
]
TEXT = Path("/usr/share/common-licenses/GPL-3")


def _greedy(engine, ids_list, n):
    from inferx_edge.runtime.llm_scheduler import SamplingParams, generate

    return generate(engine, ids_list, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))


def _speed(engine, vocab, prompt_len=128, steps=64):
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, vocab, prompt_len).tolist()
    pre = []
    for r in range(3):
        engine.add_sequence(50 + r)
        t0 = time.perf_counter()
        for s in range(0, prompt_len, engine.prefill_chunk):
            engine.prefill([50 + r], [prompt[s : s + engine.prefill_chunk]])
        pre.append(time.perf_counter() - t0)
        if r < 2:
            engine.remove_sequence(50 + r)
    tok, dec = 1, []
    for _ in range(steps):
        t0 = time.perf_counter()
        tok = int(engine.decode([52], [tok])[0].argmax())
        dec.append(time.perf_counter() - t0)
    engine.remove_sequence(52)
    return {
        "prefill_tokens_per_s": round(prompt_len / statistics.median(pre), 1),
        "decode_tokens_per_s": round(1 / statistics.median(dec[4:]), 1),
        "decode_step_ms": round(statistics.median(dec[4:]) * 1e3, 2),
    }


def _llama_cpp(gguf: Path, threads: int, vocab: int, prompt_len=128, steps=64):
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=1024, verbose=False)
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, vocab, prompt_len).tolist()
    pre = []
    for _ in range(3):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        pre.append(time.perf_counter() - t0)
    dec = []
    for i in range(steps):
        t0 = time.perf_counter()
        llm.eval([1 + i])
        dec.append(time.perf_counter() - t0)
    import llama_cpp

    return {
        "prefill_tokens_per_s": round(prompt_len / statistics.median(pre), 1),
        "decode_tokens_per_s": round(1 / statistics.median(dec[4:]), 1),
        "decode_step_ms": round(statistics.median(dec[4:]) * 1e3, 2),
        "version": llama_cpp.__version__,
    }


def _llama_cpp_perplexity(gguf: Path, threads: int, ids: list[int]) -> float:
    """llama.cpp's perplexity of ``ids`` (our tokenizer's ids, the same GGUF), from all its logits."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_threads=threads, n_ctx=len(ids) + 16, logits_all=True, verbose=False)
    llm.reset()
    llm.eval(ids)
    lg = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    top = lg.max(axis=1, keepdims=True)
    logp = lg - top - np.log(np.exp(lg - top).sum(axis=1, keepdims=True))
    nll = -float(logp[np.arange(len(ids) - 1), np.asarray(ids[1:])].sum())
    return round(math.exp(nll / (len(ids) - 1)), 4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--artifact", type=Path, default=Path("build/smollm2-x86-cpu.ixa"))
    ap.add_argument("--precisions", default="fp32,fp16,int8,q4,q4_1")
    ap.add_argument("--ppl-tokens", type=int, default=1024)
    ap.add_argument("--name", default="llm_cpu_smollm2")
    args = ap.parse_args()
    import torch
    import transformers

    from benchmarks._record import versions, write_record
    from inferx_edge.llm.build import LLMBuildOptions, build_llm_artifact
    from inferx_edge.runtime._tvm import cpu_thread_budget
    from inferx_edge.runtime.llm import LLMEngine

    precisions = args.precisions.split(",")
    if not args.artifact.exists():
        build_llm_artifact(LLMBuildOptions(model=args.gguf, target="x86-cpu", output=args.artifact, precisions=tuple(precisions)))  # fmt: skip
    threads = int(os.environ.get("TVM_NUM_THREADS") or cpu_thread_budget())
    torch.set_num_threads(threads)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        args.gguf.parent, gguf_file=args.gguf.name, dtype=torch.float32
    ).eval()
    results, outputs = {}, {}
    with LLMEngine(args.artifact, variant="fp32", max_sequences=5, kv_tokens=8192) as e:
        prompt_ids = [e.encode(p) for p in PROMPTS]
        text_ids = e.encode(TEXT.read_text())[: args.ppl_tokens]
        vocab = e.vocab_size
    # transformers fp32: greedy continuations, prompt logits, perplexity
    ref_out, ref_logits = [], []
    with torch.no_grad():
        for ids in prompt_ids:
            g = ref.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
            ref_out.append(g[0, len(ids) :].tolist())
            ref_logits.append(ref(torch.tensor([ids])).logits[0].numpy())
        lp = torch.log_softmax(ref(torch.tensor([text_ids])).logits[0].double(), -1)
        ref_nll = float(-lp[torch.arange(len(text_ids) - 1), torch.tensor(text_ids[1:])].sum())
    results["transformers_fp32"] = {"perplexity": round(math.exp(ref_nll / (len(text_ids) - 1)), 4)}
    for p in precisions:
        with LLMEngine(args.artifact, variant=p, max_sequences=5, kv_tokens=8192) as e:
            row = {"dtype": e.dtype, "weight_bytes": e.variant.extra["llm"]["weight_bytes"]}
            outputs[p] = _greedy(e, prompt_ids, 32)
            errs = []
            for k, ids in enumerate(prompt_ids):
                e.add_sequence(200 + k)
                got = e.prefill([200 + k], [ids], all_logits=True)
                e.remove_sequence(200 + k)
                errs.append(float(np.abs(got - ref_logits[k]).max() / np.abs(ref_logits[k]).max()))
            row["prompt_logits_max_rel_error_vs_transformers"] = round(max(errs), 7)
            if "fp32" in outputs:  # teacher-forced: fed the fp32 continuation, does the next-token argmax agree?
                hits = total = 0
                for k, ids in enumerate(prompt_ids):
                    seq = ids + outputs["fp32"][k]
                    e.add_sequence(300 + k)
                    top = e.prefill([300 + k], [seq], all_logits=True).argmax(1)
                    e.remove_sequence(300 + k)
                    hits += int((top[len(ids) - 1 : -1] == np.array(outputs["fp32"][k])).sum())
                    total += len(outputs["fp32"][k])
                row["teacher_forced_top1_agreement_with_fp32"] = round(hits / total, 4)
            row["perplexity"] = round(math.exp(e.score(text_ids) / (len(text_ids) - 1)), 4)
            row["speed"] = _speed(e, vocab)
            results[f"inferx_{p}"] = row
            print(p, row, flush=True)
    fp32 = outputs.get("fp32")
    for p in precisions:
        same = [a == b for o, r in zip(outputs[p], fp32 or outputs[p]) for a, b in zip(o, r)]
        results[f"inferx_{p}"]["greedy_agreement_with_fp32"] = round(sum(same) / len(same), 4)
    if fp32:
        results["inferx_fp32"]["greedy_identical_to_transformers"] = [o == r for o, r in zip(fp32, ref_out)]
    results["llama_cpp_gguf"] = _llama_cpp(args.gguf, threads, vocab)
    results["llama_cpp_gguf"]["perplexity"] = _llama_cpp_perplexity(args.gguf, threads, text_ids)
    print("llama.cpp", results["llama_cpp_gguf"], flush=True)
    ratios = {
        f"inferx_{p}/llama_cpp:{m}": round(results[f"inferx_{p}"]["speed"][m] / results["llama_cpp_gguf"][m], 3)
        for p in precisions
        for m in ("prefill_tokens_per_s", "decode_tokens_per_s")
    }
    record = {
        "device": "CPU (this host)",
        "threads": threads,
        "versions": versions("apache-tvm", "torch", "transformers", "llama_cpp_python", "numpy", "inferx_edge"),
        "model": {"gguf": args.gguf.name, "sha256": __import__("inferx_edge.package.bundle", fromlist=["x"]).sha256_file(args.gguf)},
        "prompts": PROMPTS,
        "perplexity_text": {"path": str(TEXT), "tokens": len(text_ids)},
        "results": results,
        "ratios": ratios,
        "continuations_fp32": outputs.get("fp32"),
        "continuations_transformers": ref_out,
    }  # fmt: skip
    print(f"wrote {write_record(args.name, record)}")


if __name__ == "__main__":
    main()
