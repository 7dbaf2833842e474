"""Prove device code for GPUs we do not have by running it on the GPU we do have.

    python scripts/verify_gpu_artifacts.py prepare DIR   # on any host: build artifacts + CPU reference
    python scripts/verify_gpu_artifacts.py check DIR     # on a GPU host: run them, compare, write JSON

``prepare`` builds the embedded model (batch 1 and 16) as

- ``a100-ptx``: A100 device code (compute_80 PTX), x86 host;
- ``orin-ptx-x86host``: Jetson Orin device code (compute_87 PTX, the same NVRTC and TVM target as a
  Jetson build), paired with an x86 host CPU so that an x86 GPU host can load it;
- ``a100-cubin``, ``h200-cubin``: exact-architecture cubins (only the matching GPU runs them);

and writes inputs (holdout images) and the x86 CPU build's outputs as the reference. ``check`` runs
each artifact that this GPU can run (PTX for an older SM is JIT-compiled by the driver), and records
max |diff| against the reference and top-1 agreement. Only the runtime is used on the GPU host.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BATCHES = (1, 16)


def prepare(out: Path) -> None:
    from inferx_edge.cli._common import DEFAULT_DATA, DEFAULT_MODEL
    from inferx_edge.compiler import BuildOptions, build_artifact
    from inferx_edge.runtime import Engine
    from inferx_edge.targets import get_target
    from inferx_edge.targets.registry import TARGETS

    out.mkdir(parents=True, exist_ok=True)
    with np.load(DEFAULT_DATA) as npz:
        x = npz["holdout_images"][:64, None].astype(np.float32) / np.float32(255)
    orin = get_target("jetson-orin")
    x86_host = dict(TARGETS["a100"].tvm_target["host"])
    orin_x86 = dataclasses.replace(
        orin,
        name="jetson-orin-devcode-x86host",
        tvm_target={**orin.tvm_target, "host": x86_host},
        host_triple="x86_64-linux-gnu",
        cross_compiler=None,
    )
    plan = {
        "a100-ptx": ("a100", "ptx", None),
        "orin-ptx-x86host": ("jetson-orin", "ptx", orin_x86),
        "a100-cubin": ("a100", "cubin", None),
        "h200-cubin": ("h200", "cubin", None),
    }
    refs = {"x": x}
    for b in BATCHES:
        cpu = out / f"cpu-b{b}.ixa"
        build_artifact(BuildOptions(DEFAULT_MODEL, "x86-cpu", cpu, {"image": (b, 1, 28, 28)}), log=lambda *a: None)
        with Engine(cpu) as e:
            refs[f"ref_b{b}"] = np.concatenate([e.run(x[i : i + b])["logits"] for i in range(0, 64, b)])
        cpu.unlink()
        for name, (target, code, spec) in plan.items():
            art = out / f"{name}-b{b}.ixa"
            build_artifact(
                BuildOptions(DEFAULT_MODEL, target, art, {"image": (b, 1, 28, 28)}, cuda_code=code),
                log=lambda *a: None,
                spec=spec,
            )
            print(f"built {art.name}")
    np.savez(out / "reference.npz", **refs)


def check(src: Path, report: Path) -> None:
    from inferx_edge.errors import TargetMismatchError
    from inferx_edge.runtime import Engine
    from inferx_edge.runtime.compat import driver_cuda_version

    refs = np.load(src / "reference.npz")
    x = refs["x"]
    rows = []
    for art in sorted(src.glob("*.ixa")):
        b = int(art.stem.rsplit("-b", 1)[1])
        row = {"artifact": art.name, "batch": b}
        try:
            with Engine(art) as e:
                t = e.manifest.target
                row |= {
                    "device_code": f"{t['cuda_code']} {t['cuda_code_arch']}",
                    "toolkit": t["cuda_toolkit"],
                    "gpu": e.device.device_name,
                    "gpu_sm": e.device.compute_version,
                }
                got = np.concatenate([e.run(x[i : i + b])["logits"] for i in range(0, 64, b)])
                ref = refs[f"ref_b{b}"]
                row |= {
                    "ran": True,
                    "max_abs_diff": float(np.abs(got - ref).max()),
                    "top1_agreement": float((got.argmax(1) == ref.argmax(1)).mean()),
                    "p50_ms": e.benchmark(x[:b], warmup=20, repeat=200).p50_ms,
                }
        except TargetMismatchError as exc:
            row |= {"ran": False, "refused": str(exc)}
        rows.append(row)
        print(json.dumps(row))
    import tvm

    body = {
        "command": " ".join(["python", *sys.argv]),
        "host": platform.node(),
        "tvm": tvm.__version__,
        "driver_cuda": driver_cuda_version(),
        "results": rows,
    }
    report.write_text(json.dumps(body, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["prepare", "check"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--report", type=Path, default=Path("gpu_artifacts_check.json"))
    args = ap.parse_args()
    prepare(args.dir) if args.mode == "prepare" else check(args.dir, args.report)


if __name__ == "__main__":
    main()
