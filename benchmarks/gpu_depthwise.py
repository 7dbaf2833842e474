"""Depthwise convolutions of zoo networks, as an int8 CUDA build fuses them: weights OHWI vs HWIO,
fp32 kernels one output per thread vs 4 channels per thread, in one process on one GPU.

    python -m benchmarks.gpu_depthwise [--models convnext_tiny,efficientnet_b0] [--batch 64] [--compile-only]

Each network (``benchmarks/zoo_models.py``; exported on the spot where torchvision imports, else read
from ``--zoo-dir``) is quantized once (seeded calibration samples, mse), then prepared twice as
``build`` prepares an int8 CUDA variant: with depthwise weights OHWI (the layout before
``grouped_conv_hwio`` took depthwise convs) and HWIO. Every fused kernel holding a depthwise
convolution is compiled in each variant of :data:`VARIANTS` (worker processes), run on the same
random inputs (the HWIO weight is the OHWI one transposed) and timed with TVM's time evaluator.
Outputs are compared with the first variant's. Writes ``results/<name>.json`` after every model.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks._record import gpu_driver, versions, write_record

#: variant -> (weight layout, fp16 channels per thread, fp32 channels per thread)
VARIANTS = {
    "OHWI, fp32 one output per thread": ("OHWI", 8, 1),
    "HWIO, fp32 one output per thread": ("HWIO", 8, 1),
    "HWIO, fp32 4 channels per thread": ("HWIO", 8, 4),
}


def fused_modules(name: str, batch: int, zoo_dir: Path, out: Path, target: str) -> dict:
    """{weight layout: fused IRModule} of ``name``'s int8 variant, quantized once."""
    import tvm

    from benchmarks.zoo import model_dir
    from benchmarks.zoo_models import ZOO
    from inferx_edge.compiler import passes
    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda.pipeline import fusion_passes
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.quantize.driver import QuantOptions, quantizer, resolve_plan
    from inferx_edge.targets import get_target

    spec, zoo = get_target(target), ZOO[name]
    d = model_dir(name, zoo_dir, out)
    shapes = zoo.input_shapes(batch)
    calib = out / f"{name}_calib.npz"
    np.savez(calib, **zoo.example(8, seed=1))
    model = d / "model.onnx"
    imported = import_model(model, shapes)
    plan = resolve_plan(model, shapes, imported, "int8", QuantOptions(calib=calib, calib_method="mse"))
    layout = variant_layout(spec, "int8")
    quantized = quantizer(plan, "int8")(imported, layout.quant_kernel)
    tvm_target = resolve_tvm_target(spec)
    original = passes.grouped_conv_hwio
    mods = {}
    try:
        for weights in ("OHWI", "HWIO"):
            passes.grouped_conv_hwio = (lambda m: original(m, depthwise=False)) if weights == "OHWI" else original
            mod = prepare_variant(imported, layout, quantize=lambda *_: quantized, bake=False).mod
            with tvm_target:
                mods[weights] = tvm.transform.Sequential(fusion_passes())(mod)
    finally:
        passes.grouped_conv_hwio = original
    return mods


def depthwise_kernels(mod) -> dict:
    """{name: PrimFunc} of the fused kernels that hold a depthwise convolution."""
    import tvm

    out = {}
    for gv, f in mod.functions_items():
        if not isinstance(f, tvm.tirx.PrimFunc) or "conv2d" not in gv.name_hint:
            continue
        text = f.script()
        if "group_conv2d" in text or "depthwise" in text:
            out[gv.name_hint] = f
    return out


def _compile(job) -> str:
    """Worker: compile one kernel with one variant's rules, export it, return the library path."""
    func_json, target, fp16_channels, fp32_channels, path = job
    import tvm
    from tvm.s_tir import dlight as dl

    from benchmarks._kernels import compile_with_rules
    from inferx_edge.compiler.cuda import small_reduction_rule
    from inferx_edge.compiler.cuda.rules.window_reduction import window_reduction_rule

    func = tvm.ir.load_json(func_json)
    rules = [small_reduction_rule(fp16_channels, fp32_channels), window_reduction_rule(), dl.gpu.Fallback()]
    compile_with_rules(func, target, rules).export_library(path)
    return path


def _weight_index(ohwi_args, hwio_func) -> tuple[int, int] | None:
    """(index in the OHWI kernel's arguments, index in the HWIO kernel's) of the depthwise weight."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    shapes = [tuple(int(d) for d in a.shape) for a in ArgInfo.from_prim_func(hwio_func)]
    for i, a in enumerate(ohwi_args):
        if a.ndim == 4 and a.shape[3] == 1 and a.shape[1] == a.shape[2]:
            want = tuple(np.transpose(a, (1, 2, 3, 0)).shape)
            if want in shapes:
                return i, shapes.index(want)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="convnext_tiny,efficientnet_b0,mobilenet_v3_large,mobilenet_v2")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--target", default="h200")
    ap.add_argument("--zoo-dir", type=Path, default=Path.home() / ".cache/inferx_edge/zoo")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--compile-only", action="store_true", help="no GPU: compile every variant, time nothing")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    import tvm

    from benchmarks.gpu_small_reduction import random_args

    work = Path(tempfile.mkdtemp(prefix="inferx_dw_"))
    dev = None if args.compile_only else tvm.cuda(0)
    results, totals = [], {}
    for name in args.models.split(","):
        mods = fused_modules(name, args.batch, args.zoo_dir, work, args.target)
        kernels = {w: depthwise_kernels(m) for w, m in mods.items()}
        names = sorted(set(kernels["OHWI"]) & set(kernels["HWIO"]))
        jobs, keys = [], []
        for k in names:
            for v, (weights, c16, c32) in VARIANTS.items():
                path = str(work / f"{name}_{k}_{weights}_{c16}_{c32}.so")
                jobs.append((tvm.ir.save_json(kernels[weights][k]), args.target, c16, c32, path))
                keys.append((k, v))
        with ProcessPoolExecutor(args.jobs) as pool:
            libs = dict(zip(keys, pool.map(_compile, jobs)))
        print(f"{name}: {len(names)} depthwise kernels compiled {len(VARIANTS)} ways", flush=True)
        for k in names:
            base = random_args(kernels["OHWI"][k])
            row = {"model": name, "kernel": k, "batch": args.batch, "input_shape": list(base[0].shape)}
            widx = _weight_index(base, kernels["HWIO"][k])
            if widx is None:
                row["error"] = "depthwise weight not found in both layouts"
                results.append(row)
                continue
            outputs = {}
            for v, (weights, _, _) in VARIANTS.items():
                host = list(base)
                if weights == "HWIO":
                    host[widx[1]] = np.ascontiguousarray(np.transpose(base[widx[0]], (1, 2, 3, 0)))
                    if widx[1] != widx[0]:
                        host[widx[0]] = base[widx[1]]
                if dev is None:
                    continue
                lib = tvm.runtime.load_module(libs[(k, v)])
                tensors = [tvm.runtime.tensor(a, dev) for a in host]
                lib["main"](*tensors)
                outputs[v] = tensors[-1].numpy()
                timer = lib.time_evaluator("main", dev, number=20, repeat=5, min_repeat_ms=50)
                row[f"{v} us"] = float(np.median(timer(*tensors).results)) * 1e6
            if outputs:
                first = next(iter(outputs.values())).astype(np.float64)
                scale = max(float(np.abs(first).max()), 1e-30)
                row["max_diff_vs_first"] = {
                    v: float(np.abs(o.astype(np.float64) - first).max() / scale) for v, o in outputs.items()
                }
            results.append(row)
            print(json.dumps(row), flush=True)
        for v in VARIANTS:
            totals[f"{name} {v} us"] = sum(r.get(f"{v} us", 0.0) for r in results if r["model"] == name)
        if not args.compile_only:  # rewritten after every model: a cut run keeps what it measured
            _write(args, totals, results)
    print(json.dumps(totals, indent=1))


def _write(args, totals: dict, results: list) -> None:
    import torch

    path = write_record(
        args.name or f"gpu_depthwise_{args.target}",
        {
            "device": torch.cuda.get_device_name(0),
            "driver": gpu_driver(),
            "versions": versions("apache-tvm", "torch", "inferx_edge"),
            "precision": "int8",
            "batch": args.batch,
            "totals": totals,
            "results": results,
        },
    )
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
