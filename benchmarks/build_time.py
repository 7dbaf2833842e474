"""Wall time of ``inferx_edge build`` for zoo models, by ``--jobs`` (variants compiled at once).

    python -m benchmarks.build_time --models densenet121 --target h200 --precision int8 --jobs 2,1

Each build is its own process (``python -m inferx_edge build``), one after the other, on the zoo's
exported ONNX file (exported on the spot where torchvision imports) and its calibration data. The log is read as it comes:
the record has the wall time, when the first variant started compiling (import + calibration before it),
and each variant's compile and link times as the build reports them. One JSON record per run.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._record import versions, write_record
from benchmarks.zoo import calibration, model_dir
from benchmarks.zoo_models import spec_of

_VARIANT = re.compile(r"(?:\[(?P<name>[\w.-]+)\] )?compiled in (?P<compile>[\d.]+) s, linked in (?P<link>[\d.]+) s")


def build_once(model: str, zoo: Path, target: str, precision: str, batches: str, jobs: int, out: Path) -> dict:
    d = model_dir(model, zoo, Path("/tmp/zoo"))
    spec = spec_of(model)
    batch = int(batches.split(",")[0])
    shapes = [f"{k}:{'x'.join(map(str, v))}" for k, v in spec.input_shapes(batch).items()]
    cmd = [sys.executable, "-m", "inferx_edge", "build", "--model", str(d / "model.onnx"), "--target", target]
    cmd += ["--precision", precision, "--batch-sizes", batches, "--jobs", str(jobs), "--output", str(out), "--force"]
    cmd += [a for s in shapes for a in ("--input-shape", s)]
    if precision in ("int8", "mixed"):
        cmd += ["--calib", str(calibration(model, d)), "--calib-method", "entropy"]
    t0 = time.perf_counter()
    first_compile, variants, log = None, [], []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            log.append(line.rstrip())
            if first_compile is None and line.startswith("[2/4] compiling"):
                first_compile = round(time.perf_counter() - t0, 1)
            if m := _VARIANT.search(line):
                variants.append({"compile_s": float(m["compile"]), "link_s": float(m["link"])})
    wall = round(time.perf_counter() - t0, 1)
    if proc.returncode != 0:
        return {"model": model, "jobs": jobs, "error": "\n".join(log[-20:])}
    return {
        "model": model,
        "jobs": jobs,
        "wall_s": wall,
        "until_first_compile_s": first_compile,
        "variants": variants,
        "command": " ".join(cmd[1:]),
    }


def save(args, models: list[str], results: list[dict]) -> Path:
    ok = [r for r in results if "wall_s" in r]
    by = {(r["model"], r["jobs"]): r["wall_s"] for r in ok}
    ratios = {
        f"{m} jobs {j} vs 1": round(by[(m, 1)] / by[(m, j)], 2)
        for (m, j) in by
        if j != 1 and (m, 1) in by
    }  # fmt: skip
    return write_record(
        args.name or f"build_time_{models[0]}_jobs",
        {
            "what": f"inferx_edge build wall time by --jobs ({args.precision}, batches {args.batch_sizes}, target "
            f"{args.target}; cross-compiled on this host)",
            "versions": versions("apache-tvm", "numpy"),
            "results": results,
            "speedup": ratios,
        },
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="densenet121")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--precision", default="int8")
    ap.add_argument("--batch-sizes", default="1,64")
    ap.add_argument("--jobs", default="2,1", help="comma list: one build per value, in this order")
    ap.add_argument("--zoo-dir", type=Path, default=Path.home() / ".cache/inferx_edge/zoo")
    ap.add_argument("--name", default=None, help="record name (default build_time_<first model>_jobs)")
    args = ap.parse_args()
    models = args.models.split(",")
    results = []
    out = Path("/tmp") / f"build_time_{time.time_ns()}.ixa"
    for model in models:
        for jobs in (int(j) for j in args.jobs.split(",")):
            results.append(build_once(model, args.zoo_dir, args.target, args.precision, args.batch_sizes, jobs, out))
            print(results[-1], flush=True)
            path = save(args, models, results)  # after each build: a run cut short keeps what it measured
    out.unlink(missing_ok=True)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
