"""Prove device code for GPUs we do not have by running it on the GPU we do have.

    python scripts/verify_gpu_artifacts.py prepare DIR [--artifacts a100-ptx,...] [--precisions fp32,int8]
    python scripts/verify_gpu_artifacts.py check DIR     # on a GPU host: run them, compare, write JSON

``prepare`` builds the embedded model (batch 1 and 16; fp32 and int8) and, for int8, an MLP whose
1024-wide Gemms take the int8 tensor-core path, as

- ``a100-ptx``: A100 device code (compute_80 PTX), x86 host;
- ``orin-ptx-x86host``: Jetson Orin device code (compute_87 PTX, the same NVRTC and TVM target as a
  Jetson build), paired with an x86 host CPU so that an x86 GPU host can load it;
- ``a100-cubin``, ``h200-cubin``: exact-architecture cubins (only the matching GPU runs them);

and writes inputs (holdout images; random rows for the MLP) and the x86 CPU build of the same precision's
outputs as the reference (for int8 the same int8 x int8 -> int32 arithmetic: differences come only from
float rescaling order). ``check`` runs
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
#: (artifact name) -> (registry target, device code, derived spec key)
PLANS = {
    "a100-ptx": ("a100", "ptx"),
    "orin-ptx-x86host": ("jetson-orin", "ptx"),
    "a100-cubin": ("a100", "cubin"),
    "h200-cubin": ("h200", "cubin"),
}
MLP_BATCH = 128


def _orin_devcode_x86host():
    """Jetson Orin device code (same NVRTC and TVM CUDA target as a Jetson build) with an x86 host CPU,
    so that an x86 GPU host can load it."""
    from inferx_edge.targets import get_target
    from inferx_edge.targets.registry import TARGETS

    orin = get_target("jetson-orin")
    return dataclasses.replace(
        orin,
        name="jetson-orin-devcode-x86host",
        tvm_target={**orin.tvm_target, "host": dict(TARGETS["a100"].tvm_target["host"])},
        host_triple="x86_64-linux-gnu",
        cross_compiler=None,
    )


def _mlp(path: Path) -> np.ndarray:
    """An MLP whose int8 Gemms (128 x 1024 x 1024, 128 x 256 x 1024) take the tensor-core (wmma) path."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((1024, 1024)) / 32).astype(np.float32)
    w2 = (rng.standard_normal((256, 1024)) / 32).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "w1"], ["h"], transB=1),
            helper.make_node("Relu", ["h"], ["r"]),
            helper.make_node("Gemm", ["r", "w2"], ["logits"], transB=1),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 1024])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 256])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    np.save(path.with_suffix(".calib.npy"), rng.standard_normal((64, 1024)).astype(np.float32))
    return rng.standard_normal((MLP_BATCH, 1024)).astype(np.float32)


def prepare(out: Path, names: list[str], precisions: list[str], with_mlp: bool) -> None:
    """Build ``names`` x ``precisions`` x batches of the embedded model (and the int8 MLP), with the x86 CPU
    build of the same precision as the reference (int8: the same int8 arithmetic, exact int32 sums)."""
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.models import DEFAULT_DATA, DEFAULT_MODEL
    from inferx_edge.quantize.driver import QuantOptions
    from inferx_edge.runtime import Engine

    out.mkdir(parents=True, exist_ok=True)
    with np.load(DEFAULT_DATA) as npz:
        x = npz["holdout_images"][:64, None].astype(np.float32) / np.float32(255)
    refs = {"x_fmnist": x}
    cases = [("fmnist", DEFAULT_MODEL, p, b, {"image": (b, 1, 28, 28)}, None) for p in precisions for b in BATCHES]
    if with_mlp and "int8" in precisions:
        mlp = out / "mlp.onnx"
        refs["x_mlp"] = _mlp(mlp)
        cases.append(("mlp", mlp, "int8", MLP_BATCH, {"x": (MLP_BATCH, 1024)}, mlp.with_suffix(".calib.npy")))
    quiet = {"log": lambda *a: None}
    for model_key, model, precision, b, shapes, calib in cases:
        common = {
            "input_shapes": shapes,
            "precisions": (precision,),
            "tuning": False,
            "quant": QuantOptions(calib=calib),
        }
        cpu = out / "cpu.ixa"
        build_artifact(BuildOptions(model=model, target="x86-cpu", output=cpu, **common), **quiet)
        xs = refs[f"x_{model_key}"]
        with Engine(cpu) as e:
            name = e.variant.inputs[0].name
            refs[f"ref_{model_key}_{precision}_b{b}"] = np.concatenate(
                [e.run({name: xs[i : i + b]})[e.variant.outputs[0].name] for i in range(0, len(xs), b)]
            )
        cpu.unlink()
        for art_name in names:
            target, code = PLANS[art_name]
            spec = _orin_devcode_x86host() if art_name.startswith("orin") else None
            art = out / f"{art_name}-{model_key}-{precision}-b{b}.ixa"
            build_artifact(
                BuildOptions(model=model, target=target, output=art, cuda_code=code, **common), spec=spec, **quiet
            )
            print(f"built {art.name}", flush=True)
    np.savez(out / "reference.npz", **refs)


def check(src: Path, report: Path) -> None:
    from inferx_edge.errors import TargetMismatchError
    from inferx_edge.runtime import Engine
    from inferx_edge.runtime.compat import driver_cuda_version

    refs = np.load(src / "reference.npz")
    rows = []
    for art in sorted(src.glob("*.ixa")):
        stem, b = art.stem.rsplit("-b", 1)
        b = int(b)
        _, model_key, precision = stem.rsplit("-", 2)
        x = refs[f"x_{model_key}"]
        row = {"artifact": art.name, "model": model_key, "precision": precision, "batch": b}
        try:
            with Engine(art) as e:
                t = e.manifest.target
                row |= {
                    "device_code": f"{t['cuda_code']} {t['cuda_code_arch']}",
                    "toolkit": t["cuda_toolkit"],
                    "gpu": e.device.device_name,
                    "gpu_sm": e.device.compute_version,
                }
                name, out_name = e.variant.inputs[0].name, e.variant.outputs[0].name
                got = np.concatenate([e.run({name: x[i : i + b]})[out_name] for i in range(0, len(x), b)])
                ref = refs[f"ref_{model_key}_{precision}_b{b}"]
                row |= {
                    "ran": True,
                    "reference": f"x86 CPU build, {precision}",
                    "max_abs_diff": float(np.abs(got - ref).max()),
                    "max_abs_ref": float(np.abs(ref).max()),
                    "top1_agreement": float((got.argmax(1) == ref.argmax(1)).mean()),
                    "p50_ms": e.benchmark(x[:b], warmup=20, repeat=200).p50_ms,
                }
        except TargetMismatchError as exc:
            row |= {"ran": False, "refused": str(exc)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    import tvm

    body = {
        "command": " ".join(["python", *sys.argv]),
        "host": platform.node(),
        "tvm": tvm.__version__,
        "driver_cuda": driver_cuda_version(),
        "results": rows,
    }
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(body, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["prepare", "check"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--report", type=Path, default=Path("gpu_artifacts_check.json"))
    ap.add_argument("--artifacts", default=",".join(PLANS), help=f"prepare: which of {', '.join(PLANS)}")
    ap.add_argument("--precisions", default="fp32,int8", help="prepare: fp32 and/or int8")
    ap.add_argument("--mlp", action="store_true", help="prepare: also the int8 tensor-core MLP (4 MB of weights)")
    args = ap.parse_args()
    if args.mode == "prepare":
        prepare(args.dir, args.artifacts.split(","), args.precisions.split(","), args.mlp)
    else:
        check(args.dir, args.report)


if __name__ == "__main__":
    main()
