"""INT8 accuracy of the CUDA int8 variant's numerics, on this host's CPU: the real-weight zoo models
built as a CUDA int8 variant is prepared (NHWC convolutions, OHWI weights, every CUDA rewrite: fp16
depthwise/grouped operands and fp16 sums, fused attention (its plain TE twin), dense weights along
K...) but compiled for the CPU, against the host's own int8 build and fp32, on the real data of
:mod:`benchmarks.zoo_accuracy`; also with the depthwise/grouped sums in fp32, as they were before
fp16 sums (the CPU rounds each fp16 multiply and add where the GPU's HFMA2 rounds once: an upper
bound of the GPU's error).

    python -m benchmarks.cuda_variant_accuracy [--models mobilenet_v2,efficientnet_lite0,minilm_l6]

The accuracy budgets of ``quantize``/``build --precision mixed`` are measured on the host's build,
which has none of the CUDA variants' fp16 reads; this measures what those change. Same int8 plan
(calibrated once, ``mse``) for both. Writes ``results/cuda_variant_accuracy_<host>.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks._kernels import depthwise_sums
from benchmarks._record import run_models, versions

REAL_WEIGHT_MODELS = "mobilenet_v2,efficientnet_lite0,minilm_l6"


def _outputs(mod, weights, samples, inputs: list[str]) -> np.ndarray:
    """``mod`` compiled for this CPU, run on every sample; its first output stacked (float64)."""
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    w = [tvm.runtime.tensor(np.array(a, order="C")) for a in weights]  # (ascontiguousarray makes 0-d 1-d)
    outs = []
    for s in samples:
        got = vm["main"](*[tvm.runtime.tensor(s[k]) for k in inputs], *w)
        got = got if hasattr(got, "numpy") else got[0]  # a tuple of outputs: the first
        outs.append(got.numpy().astype(np.float64))
    return np.concatenate(outs)


def measure(name: str, zoo_dir: Path) -> list[dict]:
    from benchmarks.zoo import calibration
    from benchmarks.zoo_accuracy import _compare, eval_samples
    from benchmarks.zoo_models import spec_of
    from inferx_edge.compiler.passes.fused_attention import emulated_attention
    from inferx_edge.compiler.variant import VariantLayout, prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.quantize.driver import QuantOptions, quantizer, resolve_plan
    from inferx_edge.targets import get_target

    m = spec_of(name)
    d = zoo_dir / name
    exported = json.loads((d / "export.json").read_text())
    if not exported.get("real_weights"):
        return [{"model": name, "error": "exported with seeded random weights: accuracy not measured"}]
    samples = eval_samples(m, d)
    inputs = list(samples[0])
    shapes = {k: list(v.shape) for k, v in samples[0].items()}
    imported = import_model(d / "model.onnx", shapes)
    calib = calibration(name, d)
    plan = resolve_plan(
        d / "model.onnx", shapes, imported, "int8", QuantOptions(calib=calib, calib_method="mse"), log=lambda *a: None
    )
    host = get_target("x86-cpu")
    cuda, cuda_fused = (
        VariantLayout("int8", "NHWC", "OHWI", "OHWI"),
        VariantLayout("int8", "NHWC", "OHWI", "OHWI", "fused"),
    )
    # label: (layout, quantizer, depthwise sums)
    builds = {
        "fp32": (variant_layout(host, "fp32"), None, "fp16"),
        "int8 host build": (variant_layout(host, "int8"), quantizer(plan, "int8"), "fp16"),
        "int8 CUDA variant": (cuda, quantizer(plan, "int8"), "fp16"),
        "int8 CUDA variant, fused attention": (cuda_fused, quantizer(plan, "int8"), "fp16"),
        "int8 CUDA variant, fp32 depthwise sums": (cuda_fused, quantizer(plan, "int8"), "fp32"),
    }
    outs, rows = {}, []
    for label, (layout, quantize, sums) in builds.items():
        t0 = time.time()
        with emulated_attention(), depthwise_sums(sums):  # attention: the fused kernel's plain twin
            pv = prepare_variant(imported, layout, quantize=quantize, bake=True)
        outs[label] = _outputs(pv.mod, pv.weight_arrays, samples, inputs)
        print(f"{name} {label}: {len(samples)} samples in {time.time() - t0:.0f} s", flush=True)
        if label != "fp32":
            rows.append(
                {"model": name, "build": label, "samples": len(samples)} | _compare(m, outs["fp32"], outs[label])
            )
            print(rows[-1], flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=REAL_WEIGHT_MODELS)
    ap.add_argument("--zoo-dir", type=Path, default=Path.home() / ".cache/inferx_edge/zoo")
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    import platform

    path = run_models(
        args.models.split(","),
        lambda name: measure(name, args.zoo_dir),
        args.name or f"cuda_variant_accuracy_{platform.machine()}",
        {"versions": versions("apache-tvm", "inferx_edge"),
         "calib_method": "mse"},
    )  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
