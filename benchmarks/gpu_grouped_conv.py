"""Grouped 3x3 convolutions (RegNet, ResNeXt shapes) on one GPU: the batched tensor-core GEMM, the
window-reduction register tile, dlight's reduction rules and cuDNN, in one process.

    python -m benchmarks.gpu_grouped_conv [--batches 64,1] [--dtypes float32,float16] [--name NAME]

Each case is an NHWC grouped conv with bias and ReLU, legalized and fused as ``build`` does, and
scheduled four ways: as one batched GEMM on fp16 tensor cores
(:func:`~inferx_edge.compiler.passes.grouped_conv_gemm`, fp32 accumulation; for a float32 case the
operands are fp16 as in int8 variants, the input cast not timed: a network's producer writes it),
:func:`~inferx_edge.compiler.cuda.rules.window_reduction.window_reduction_rule` on HWIO weights, the
same rule on OHWI weights, and without the rule ("before": the small-reduction rule, then dlight's
reductions); timed with TVM's time
evaluator; torch runs the same conv + bias + ReLU (cuDNN, NCHW fp32 with TF32 off, fp16
channels-last) timed with CUDA events. Outputs are checked against torch fp32 on the same inputs.
Writes ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from benchmarks._record import gpu_driver, versions, write_record

#: (network, input H=W, channels, group width, stride)
CASES = [
    ("regnet_y_800mf", 56, 64, 16, 1),
    ("regnet_y_800mf", 56, 144, 16, 2),
    ("regnet_y_800mf", 28, 144, 16, 1),
    ("regnet_y_800mf", 14, 320, 16, 1),
    ("regnet_y_800mf", 7, 784, 16, 1),
    ("resnext50_32x4d", 56, 128, 4, 1),
    ("resnext50_32x4d", 28, 256, 8, 1),
    ("resnext50_32x4d", 14, 512, 16, 1),
    ("resnext50_32x4d", 7, 1024, 32, 1),
]


#: (name, window-reduction rule, HWIO weights)
VARIANTS = [("window rule", True, True), ("window rule OHWI", True, False), ("before", False, False)]

#: the tensor-core variant's column
GEMM = "tensor-core gemm"


def grouped_conv_module(n, hw, c, group_width, stride=1, dtype="float32"):
    """Relax ``main(x, w, b)``: NHWC grouped 3x3 conv (OHWI weights) + bias + ReLU."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, hw, hw, c], dtype))
    w = relax.Var("w", relax.TensorType([c, 3, 3, group_width], dtype))
    b = relax.Var("b", relax.TensorType([1, 1, 1, c], dtype))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(
                x, w, strides=[stride, stride], padding=[1, 1, 1, 1], groups=c // group_width,
                data_layout="NHWC", kernel_layout="OHWI",
            )  # fmt: skip
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(y, b)))
        bb.emit_func_output(out)
    return bb.get()


def grouped_conv_func(n, hw, c, group_width, stride, dtype, hwio: bool):
    """The fused PrimFunc of :func:`grouped_conv_module` as the build's legalization and fusion make
    it, with OHWI weights or (``hwio``) after :func:`~inferx_edge.compiler.passes.grouped_conv_hwio`."""
    import tvm

    from inferx_edge.compiler.cuda.pipeline import fusion_passes

    mod = grouped_conv_module(n, hw, c, group_width, stride, dtype)
    if hwio:
        from inferx_edge.compiler.passes import grouped_conv_hwio

        mod = grouped_conv_hwio(mod)
    mod = tvm.transform.Sequential(fusion_passes())(mod)
    (func,) = [f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and "conv" in gv.name_hint]
    return func


def gemm_case(n, hw, c, group_width, stride, dtype, w, b):
    """The fused kernel of :func:`grouped_conv_module` after
    :func:`~inferx_edge.compiler.passes.grouped_conv_gemm` (None when that leaves the conv alone) and
    its weight operand computed from the OHWI weights ``w`` (bias ``b``) as the build bakes it
    (:func:`~inferx_edge.compiler.passes.bake_weight_transforms`)."""
    import tvm

    from inferx_edge.compiler.cuda.pipeline import fusion_passes
    from inferx_edge.compiler.passes import bake_weight_transforms, grouped_conv_gemm

    mod = grouped_conv_module(n, hw, c, group_width, stride, dtype)
    mod["main"] = mod["main"].with_attr("num_input", 1)
    mod, _names, arrays = bake_weight_transforms(grouped_conv_gemm(mod, saturate=dtype == "float32"), [w, b])
    mod = tvm.transform.Sequential(fusion_passes())(mod)
    funcs = [f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and "gemm" in gv.name_hint]
    if not funcs:
        return None
    (w5,) = [np.asarray(a) for a in arrays if np.asarray(a).ndim == 5]  # [groups, J, KH, KW, C]
    return funcs[0], w5


def compile_kernel(func, target: str, window: bool):
    from tvm.s_tir import dlight as dl

    from benchmarks._kernels import compile_with_rules
    from inferx_edge.compiler.cuda.rules.small_reduction import small_reduction_rule
    from inferx_edge.compiler.cuda.rules.window_reduction import window_reduction_rule

    rules = [small_reduction_rule(), *([window_reduction_rule()] if window else [])]
    return compile_with_rules(func, target, [*rules, dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()])


def torch_us(fn, iters: int = 50) -> float:
    """Median of 5 CUDA-event timings, microseconds per call."""
    from benchmarks.gpu_int8_matmul import time_cuda

    return float(np.median([time_cuda(fn, iters) for _ in range(5)])) * 1e3


def _run_and_time(lib, args, out_shape, dtype, ref, row: dict, name: str) -> None:
    """Run ``lib`` on ``args`` (host arrays), record its error against ``ref`` and its time in ``row``."""
    import tvm

    dev = tvm.cuda(0)
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    tensors.append(tvm.runtime.tensor(np.zeros(out_shape, dtype), dev))
    lib["main"](*tensors)
    got = tensors[-1].numpy().astype(np.float32)
    row[f"{name} rel error"] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    timer = lib.mod.time_evaluator("main", dev, number=10, repeat=5, min_repeat_ms=50)
    row[f"{name} us"] = float(np.median(timer(*tensors).results)) * 1e6


def run_case(case, batch: int, dtype: str, target: str) -> dict:
    import torch
    import torch.nn.functional as F

    net, hw, c, gw, stride = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, hw, hw, c)).astype(dtype)
    w = (rng.standard_normal((c, 3, 3, gw)) / np.sqrt(9 * gw)).astype(dtype)
    b = (0.1 * rng.standard_normal((1, 1, 1, c))).astype(dtype)
    row = {"network": net, "batch": batch, "dtype": dtype, "hw": hw, "channels": c, "group_width": gw}
    row |= {"stride": stride, "gflop": 2 * batch * (hw // stride) ** 2 * c * 9 * gw / 1e9}

    tx = torch.from_numpy(x.astype(np.float32)).cuda().permute(0, 3, 1, 2).contiguous()
    tw = torch.from_numpy(w.astype(np.float32)).cuda().permute(0, 3, 1, 2).contiguous()
    tb = torch.from_numpy(b.astype(np.float32).reshape(-1)).cuda()
    torch.backends.cudnn.allow_tf32 = False
    groups = c // gw
    with torch.inference_mode():
        ref = F.relu(F.conv2d(tx, tw, tb, stride, 1, 1, groups)).permute(0, 2, 3, 1).cpu().numpy()
        row["cudnn fp32 us"] = torch_us(lambda: F.relu(F.conv2d(tx, tw, tb, stride, 1, 1, groups)))
        hx = tx.half().contiguous(memory_format=torch.channels_last)
        hw_ = tw.half().contiguous(memory_format=torch.channels_last)
        hb = tb.half()
        row["cudnn fp16 channels-last us"] = torch_us(lambda: F.relu(F.conv2d(hx, hw_, hb, stride, 1, 1, groups)))
    gemm = gemm_case(batch, hw, c, gw, stride, dtype, w, b)
    if gemm is not None:
        from benchmarks._kernels import compile_with_rules
        from inferx_edge.compiler.cuda.rules.tensor_core_matmul import tensor_core_matmul_rule

        func, w5 = gemm
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        lib = compile_with_rules(func, target, [tensor_core_matmul_rule(None, sms)], async_copy=True)
        _run_and_time(lib, (x.astype(np.float16), w5, b), ref.shape, dtype, ref, row, GEMM)
    for variant, window, hwio in VARIANTS:
        lib = compile_kernel(grouped_conv_func(batch, hw, c, gw, stride, dtype, hwio), target, window)
        weights = np.ascontiguousarray(w.transpose(1, 2, 3, 0)) if hwio else w
        _run_and_time(lib, (x, weights, b), ref.shape, dtype, ref, row, variant)
    peer = "cudnn fp16 channels-last us" if dtype == "float16" else "cudnn fp32 us"
    row["speedup vs before"] = row["before us"] / row["window rule us"]
    row["window rule / cudnn (time ratio)"] = row["window rule us"] / row[peer]
    row["window rule TFLOPS"] = row["gflop"] / row["window rule us"] * 1e3
    if f"{GEMM} us" in row:
        row[f"{GEMM} / window rule (time ratio)"] = row[f"{GEMM} us"] / row["window rule us"]
        row[f"{GEMM} / cudnn (time ratio)"] = row[f"{GEMM} us"] / row[peer]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="64,1")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    import torch

    results: list[dict] = []

    def save():
        totals = {}
        for key in sorted({(r["network"], r["batch"], r["dtype"]) for r in results}):
            rows = [r for r in results if (r["network"], r["batch"], r["dtype"]) == key and "error" not in r]
            if rows:
                cols = (
                    f"{GEMM} us",
                    "window rule us",
                    "window rule OHWI us",
                    "before us",
                    "cudnn fp32 us",
                    "cudnn fp16 channels-last us",
                )
                # the gemm column: what a build runs (the window kernel where the pass leaves a conv alone)
                totals[f"{key[0]} b{key[1]} {key[2]} ({len(rows)} convs)"] = {
                    k: round(sum(r.get(k, r["window rule us"] if k == f"{GEMM} us" else 0) for r in rows), 1)
                    for k in cols
                }
        path = write_record(
            args.name or f"gpu_grouped_conv_{args.target}",
            {
                "device": torch.cuda.get_device_name(0),
                "driver": gpu_driver(),
                "versions": versions("apache-tvm", "torch", "inferx_edge"),
                "totals_us": totals,
                "results": results,
            },
        )
        return path, totals

    for batch in (int(b) for b in args.batches.split(",")):
        for dtype in args.dtypes.split(","):
            for case in CASES:
                try:
                    row = run_case(case, batch, dtype, args.target)
                except Exception as exc:  # recorded, the other cases still run
                    row = {"network": case[0], "case": list(case), "batch": batch, "dtype": dtype}
                    row["error"] = f"{type(exc).__name__}: {exc}"[:600]
                results.append(row)
                print(json.dumps(row), flush=True)
                save()
    path, totals = save()
    print(json.dumps(totals, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
