"""The fused attention rewrite on whole transformer graphs, on this CPU: each model prepared as a CUDA
fp16 variant twice, attention as two matmuls and fused (the kernel's plain TE twin, ``emulated_attention``),
both compiled for the CPU and run on the exporter's seeded inputs; the record says how many softmaxes
were fused and how far the two outputs are apart (and each from torch's float64 output).

    python -m benchmarks.fused_attention_check [--models vit_b_16,swin_t,minilm_l6] [--name N]

This checks the rewrite (pattern, scalings, biases through Swin's window reshapes, the index maps into
the projections' outputs) on the graphs it is for; the CUDA kernel itself is checked by
``benchmarks/gpu_attention.py`` on a GPU. Writes ``results/fused_attention_check_<machine>.json``.
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np

from benchmarks._record import run_models, versions

TRANSFORMERS = "vit_b_16,swin_t,minilm_l6"


def _run(mod, weights, inputs: list[np.ndarray]) -> np.ndarray:
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    out = vm["main"](
        *[tvm.runtime.tensor(x) for x in inputs], *[tvm.runtime.tensor(np.array(w, order="C")) for w in weights]
    )
    out = out if hasattr(out, "numpy") else out[0]
    return out.numpy().astype(np.float64)


def check(name: str, d: Path) -> dict:
    from inferx_edge.compiler.passes.fused_attention import emulated_attention
    from inferx_edge.compiler.variant import VariantLayout, prepare_variant
    from inferx_edge.frontend import import_model

    ref = np.load(d / "ref.npz")
    inputs = {k[3:]: ref[k] for k in ref.files if k.startswith("in:")}
    want = [ref[k] for k in ref.files if k.startswith("out:")][0].astype(np.float64)
    imported = import_model(d / "model.onnx", {k: list(v.shape) for k, v in inputs.items()})
    names = [p.name for p in imported.mod["main"].params[: int(imported.mod["main"].attrs["num_input"])]]
    args = [inputs[n] for n in names]
    row: dict = {"model": name}
    outs = {}
    for attention in ("matmul", "fused"):
        t0 = time.time()
        with emulated_attention():
            pv = prepare_variant(imported, VariantLayout("fp16", "NHWC", "OHWI", "OHWI", attention), bake=True)
        if attention == "fused":
            row["fused_calls"] = pv.mod["main"].script().count("fused_attention")
        outs[attention] = _run(pv.mod, pv.weight_arrays, args)
        row[f"{attention}_s"] = round(time.time() - t0, 1)

    def rel(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    row["fused_vs_matmul_rel_l2"] = rel(outs["fused"], outs["matmul"])
    row["matmul_vs_torch_fp64_rel_l2"] = rel(outs["matmul"], want)
    row["fused_vs_torch_fp64_rel_l2"] = rel(outs["fused"], want)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=TRANSFORMERS)
    ap.add_argument("--zoo-dir", type=Path, default=Path.home() / ".cache/inferx_edge/zoo")
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    path = run_models(
        args.models.split(","),
        lambda name: [check(name, args.zoo_dir / name)],
        args.name or f"fused_attention_check_{platform.machine()}",
        {"versions": versions("apache-tvm", "inferx_edge"),
         "variant": "fp16 CUDA layout (NHWC, OHWI), compiled for this CPU"},
    )  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
