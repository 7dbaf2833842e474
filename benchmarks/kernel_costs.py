"""Per-call kernel launches and compulsory memory traffic of zoo models' CUDA variants, without a GPU.

Runs ``scripts/kernel_profile.py --costs-only`` for each model (the variant as the CUDA pipeline builds
it: every kernel's FLOPs, compulsory bytes and launches per call) and writes one record. With
``--before RECORD`` (this script's record from another commit) each model also carries that record's
totals and the kernels only one of the two has: what a compiler change did to the kernels, before any
GPU time is spent timing it::

    python -m benchmarks.kernel_costs --models convnext_tiny --batch 64 --name kernel_costs_X \\
        [--before benchmarks/results/kernel_costs_Y.json]

The models come from the zoo cache (``benchmarks.zoo_export``: ``<zoo-dir>/<model>/model.onnx``,
``calib.npz``, ``export.json``). Compulsory bytes count each kernel's parameter buffers once per launch
(a lower bound on its traffic); they are not a timing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._record import versions, write_record

ROOT = Path(__file__).resolve().parents[1]


def costs(model_dir: Path, batch: int, precision: str, target: str) -> dict:
    """``kernel_profile --costs-only``'s document for the model in ``model_dir`` at ``batch``."""
    spec = json.loads((model_dir / "export.json").read_text())
    cmd = [sys.executable, str(ROOT / "scripts" / "kernel_profile.py"), "--model", str(model_dir / "model.onnx")]
    cmd += ["--target", target, "--precision", precision, "--costs-only"]
    for name, shape in spec["inputs"].items():
        cmd += ["--input-shape", f"{name}:" + "x".join(str(d) for d in [batch, *shape[1:]])]
    if precision != "fp32" and (model_dir / "calib.npz").exists():
        cmd += ["--calib", str(model_dir / "calib.npz")]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "costs.json"
        proc = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0 or not out.exists():
            lines = (proc.stderr or proc.stdout).strip().splitlines() or ["no output"]
            errors = [ln for ln in lines if "Error" in ln]  # the exception's line, not a trailing warning
            raise RuntimeError(f"kernel_profile failed on {model_dir.name}: {(errors or lines)[-1]}")
        return json.loads(out.read_text())


def summary(doc: dict) -> dict:
    """Totals per call of one ``--costs-only`` document, and each kernel's bytes, launches and rule."""
    kernels = doc["kernels"]
    return {
        "kernels": len(kernels),
        "launches": sum(k.get("calls", 0) for k in kernels.values()),
        "traffic_MB": round(sum(k["bytes"] * k.get("calls", 0) for k in kernels.values()) / 1e6, 1),
        "GFLOP": round(sum((k["flops"] or 0) * k.get("calls", 0) for k in kernels.values()) / 1e9, 2),
        "per_kernel": {
            name: {"bytes": k["bytes"], "calls": k.get("calls", 0), "rule": k.get("rule")}
            for name, k in sorted(kernels.items())
        },
    }


def compare(after: dict, before: dict) -> dict:
    """``before``'s totals, the ratio of traffic, and the kernels only one side has (bytes x launches)."""
    mine, theirs = after["per_kernel"], before["per_kernel"]

    def moved(side, other):
        return {n: round(k["bytes"] * k["calls"] / 1e6, 1) for n, k in side.items() if n not in other}

    return {
        "before": {k: before[k] for k in ("kernels", "launches", "traffic_MB", "GFLOP")},
        "traffic_ratio": round(after["traffic_MB"] / before["traffic_MB"], 3) if before["traffic_MB"] else None,
        "only_before_MB": moved(theirs, mine),
        "only_after_MB": moved(mine, theirs),
    }


def add_variant_args(ap: argparse.ArgumentParser) -> None:
    """The options every no-GPU zoo script takes: which exported models, which variant of them (batch,
    precision, target) and the record's name."""
    ap.add_argument("--models", required=True, help="comma-separated zoo model names")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--precision", default="int8", choices=["fp32", "fp16", "int8", "mixed"])
    ap.add_argument("--target", default="h200", help="a CUDA target (h200, a100, jetson-orin)")
    ap.add_argument("--zoo-dir", type=Path, default=Path.home() / ".cache" / "inferx_edge" / "zoo")
    ap.add_argument("--name", required=True, help="record name (benchmarks/results/<name>.json)")


def exported_models(ap: argparse.ArgumentParser, names: str, zoo_dir: Path) -> list[str]:
    """The comma-separated zoo model ``names``, each checked to be exported in ``zoo_dir`` before any
    slow work (``ap.error`` naming the first missing one and the command that exports it)."""
    models = [m.strip() for m in names.split(",") if m.strip()]
    for model in models:
        if not (zoo_dir / model / "model.onnx").exists():
            ap.error(f"no exported model in {zoo_dir / model} (python -m benchmarks.zoo_export --models {model})")
    return models


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_variant_args(ap)
    ap.add_argument("--before", type=Path, help="this script's record from another commit, to compare with")
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)
    before = json.loads(args.before.read_text()) if args.before else None
    models = exported_models(ap, args.models, args.zoo_dir)
    rows = {}
    for model in models:
        row = summary(costs(args.zoo_dir / model, args.batch, args.precision, args.target))
        print(f"{model}: {row['kernels']} kernels, {row['launches']} launches, {row['traffic_MB']} MB per call")
        if before and model in before["models"]:
            row["vs_before"] = compare(row, before["models"][model])
            b = row["vs_before"]["before"]
            print(f"  before ({before['git_commit'][:7]}): {b['launches']} launches, {b['traffic_MB']} MB per call")
        rows[model] = row
    record = {
        "note": args.note
        or "no GPU: per-call kernel launches and compulsory bytes of each model's variant (kernel_profile --costs-only)",
        "versions": versions("apache-tvm", "inferx_edge"),
        "batch": args.batch,
        "precision": args.precision,
        "target": args.target,
        "before_record": {"path": str(args.before), "git_commit": before["git_commit"]} if before else None,
        "models": rows,
    }
    print(write_record(args.name, record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
