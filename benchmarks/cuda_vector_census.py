"""Which CUDA kernels of zoo models lost their vector loads, without a GPU.

A schedule asks for 4-, 8- or 16-wide vector loads; where TVM's vectorizer cannot prove a loop's lanes
contiguous or its conditions the same for every lane (a padding test, which input of a concatenation)
it falls back to a serial loop over the lanes (``for (int x_s = 0; x_s < 4; ++x_s)`` in the CUDA
source) and every element is loaded alone. This builds each model's variant as ``benchmarks.zoo
--build-only`` does, keeps the generated CUDA source (``INFERX_DUMP_CUDA``) and counts, per model, the
kernels holding such a loop, concatenation kernels among them, and names them::

    python -m benchmarks.cuda_vector_census --models densenet121,yolov8n --name cuda_vector_census_X

The models come from the zoo cache (``benchmarks.zoo_export``). Structural only: not a timing.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._record import RESULTS, versions, write_record
from benchmarks.kernel_costs import add_variant_args, exported_models

ROOT = Path(__file__).resolve().parents[1]

#: the serial loop the vectorizer leaves where it gave up on a vector loop
SCALARIZED = re.compile(r"for \(int \w+_s = 0; \w+_s < (?:2|4|8|16); \+\+\w+_s\)")


def kernels(source: str) -> dict[str, str]:
    """Kernel name -> body of every ``__global__`` definition in a CUDA source (declarations skipped)."""
    out = {}
    for part in source.split('extern "C" __global__ ')[1:]:
        head = part.partition("\n")[0]
        name = re.search(r"void (?:__launch_bounds__\(\d+\) )?(\w+)\(", head)
        if name and not head.rstrip().endswith(";"):
            out[name.group(1)] = part
    return out


def census(sources: list[str]) -> dict:
    """Counts and names of the kernels in ``sources`` that hold a scalarized vector loop."""
    found: dict[str, str] = {}
    for s in sources:
        found |= kernels(s)
    scalar = sorted(n for n, body in found.items() if SCALARIZED.search(body))
    concat = [n for n in found if "concatenate" in n]
    return {
        "kernels": len(found),
        "scalarized": len(scalar),
        "concat_kernels": len(concat),
        "concat_scalarized": sum(1 for n in concat if n in scalar),
        "scalarized_kernels": scalar,
    }


def build_sources(model: str, target: str, precision: str, batch: int, zoo_dir: Path) -> list[str]:
    """The CUDA sources of ``model``'s ``precision`` variant at ``batch`` as the zoo benchmark builds it."""
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "cuda"
        dump.mkdir()
        cmd = [sys.executable, "-m", "benchmarks.zoo", "--target", target, "--build-only", "--precisions", precision]
        # the zoo benchmark also writes its (build-only) record into benchmarks/results/: a throwaway name,
        # removed after
        name = f"_vector_census_{os.getpid()}"
        cmd += ["--batches", str(batch), "--models", model, "--zoo-dir", str(zoo_dir), "--out", tmp, "--name", name]
        env = {**os.environ, "INFERX_DUMP_CUDA": str(dump)}
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        finally:
            for suffix in (".json", ".md"):
                (RESULTS / f"{name}{suffix}").unlink(missing_ok=True)
        sources = [p.read_text() for p in sorted(dump.glob("*.cu"))]
        if proc.returncode != 0 or not sources:
            lines = (proc.stderr or proc.stdout).strip().splitlines() or ["no output"]
            raise RuntimeError(f"building {model} for {target} gave no CUDA source: {lines[-1]}")
        return sources


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_variant_args(ap)
    args = ap.parse_args(argv)
    models = exported_models(ap, args.models, args.zoo_dir)
    rows = {}
    for model in models:
        rows[model] = row = census(build_sources(model, args.target, args.precision, args.batch, args.zoo_dir))
        print(
            f"{model}: {row['scalarized']} of {row['kernels']} kernels scalarized "
            f"({row['concat_scalarized']} of {row['concat_kernels']} concatenations)",
            flush=True,
        )
    record = {
        "note": "no GPU: kernels whose vector loops TVM's vectorizer turned into serial loops (structural)",
        "versions": versions("apache-tvm", "inferx_edge"),
        "batch": args.batch,
        "precision": args.precision,
        "target": args.target,
        "models": rows,
    }
    print(write_record(args.name, record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
