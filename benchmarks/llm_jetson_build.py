"""Cross-build an LLM for Jetson Orin on this host and check the artifact structurally (no Jetson):
aarch64 library, sm_87 cubins by a CUDA 12 compiler, JetPack 6 requirement, and the memory it needs
(weights + KV cache at the configured context and sequence count) against the Orin Nano's 8 GB.

    python -m benchmarks.llm_jetson_build --gguf SmolLM2-135M-Instruct.Q4_1.gguf --precisions q4_1,q4,int8
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

ORIN_NANO_BYTES = 8 * 2**30  # shared by CPU and GPU


def _elf(lib: Path) -> dict:
    from inferx_edge.package.elf import elf_machine, embedded_cuda_code, needed_libraries

    return {"machine": elf_machine(lib), "needed": needed_libraries(lib), "cuda_code": embedded_cuda_code(lib)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--target", default="jetson-orin")
    ap.add_argument("--precisions", default="q4_1,q4,int8")
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--name", default="llm_jetson-orin_build")
    args = ap.parse_args()
    from benchmarks._record import versions, write_record
    from inferx_edge.llm.build import LLMBuildOptions, build_llm_artifact
    from inferx_edge.llm.config import LlamaConfig
    from inferx_edge.package import open_artifact

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "llm.ixa"
        t0 = time.perf_counter()
        m = build_llm_artifact(
            LLMBuildOptions(
                model=args.gguf, target=args.target, output=out, precisions=tuple(args.precisions.split(",")),
                context_length=args.context,
            )
        )  # fmt: skip
        build_s = round(time.perf_counter() - t0, 1)
        cfg = LlamaConfig.from_json(m.model["config"])
        kv_bytes = cfg.kv_bytes_per_token(2) * args.context * args.sequences  # fp16 cache on the GPU
        rows = {}
        with open_artifact(out) as art:
            for v in m.variants:
                elf = _elf(art.member(v.library))
                weights = v.extra["llm"]["weight_bytes"]
                rows[v.name] = {
                    "elf": elf,
                    "aarch64": elf["machine"] == "aarch64",
                    "sm_87_cubin": "sm_87" in elf["cuda_code"].get("cubin", []),
                    "no_cudart_13": not any("cudart.so.13" in n for n in elf["needed"]),
                    "weight_bytes": weights,
                    "weight_kinds": v.extra["llm"]["weight_kinds"],
                    "kv_cache_bytes": kv_bytes,
                    "total_bytes": weights + kv_bytes,
                    "share_of_orin_nano_8gb": round((weights + kv_bytes) / ORIN_NANO_BYTES, 4),
                }
                print(v.name, rows[v.name], flush=True)
    record = {
        "device": "build host (no Jetson: structural checks only)",
        "versions": versions("apache-tvm", "numpy", "inferx_edge"),
        "target": {k: m.target.get(k) for k in ("name", "host_triple", "cuda_arch", "cuda_code", "cuda_toolkit", "min_driver_cuda", "min_jetpack")},
        "build_s": build_s,
        "kv_cache": {"sequences": args.sequences, "context": args.context, "dtype": "float16",
                     "bytes_per_token": cfg.kv_bytes_per_token(2)},
        "variants": rows,
    }  # fmt: skip
    print(f"wrote {write_record(args.name, record)}")


if __name__ == "__main__":
    main()
