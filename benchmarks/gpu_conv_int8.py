"""Untuned int8 tensor-core convolutions on one NVIDIA GPU: tile configurations of
``inferx_edge.compiler.cuda.tensor_core_schedule`` against each other and against cuDNN fp16
(torch, channels_last) on the same shapes, in one process.

    python -m benchmarks.gpu_conv_int8 --out DIR [--configs 4x2.4x2.k1.v4,4x2.4x2.k4.v16] [--batch 64]

Shapes: ResNet-50's convolutions and MobileNetV2's narrow pointwise ones (NHWC activations, OHWI weights, as inferx_edge's CUDA int8 variants
run them). Each kernel is checked exactly against a float64 convolution of the same int8 values, then
timed (p50 of synchronous calls); TOPS = 2 * MACs / p50. A config is "WIxFI.WJxFJ.kK.vV[.pP][.async]
[.mma|.wmma]" (warps and 16x16 fragments per warp along I and J, 16*K reduction elements per stage, V-byte
global loads, P-byte predicated activation loads, the cp.async pipeline, ldmatrix + mma.sync or wmma), or
"auto" and any of those suffixes: the tile ``build`` picks for the shape and the GPU's SMs (with its
instructions unless one is named). Records up to gpu_conv_int8_h200_b64_narrow.json picked "auto" from
(I, J) only: 64-deep stages where build uses 32 for K <= 32.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import numpy as np

from benchmarks._record import gpu_driver, versions, write_record

#: (name, H=W of the input, C in, O out, kernel, stride) of ResNet-50 and MobileNetV2 convolutions
SHAPES = [
    ("l1.1x1.256-64", 56, 256, 64, 1, 1),
    ("l1.3x3.64-64", 56, 64, 64, 3, 1),
    ("l1.1x1.64-256", 56, 64, 256, 1, 1),
    ("l2.3x3.128-128", 28, 128, 128, 3, 1),
    ("l3.1x1.1024-256", 14, 1024, 256, 1, 1),
    ("l3.3x3.256-256", 14, 256, 256, 3, 1),
    ("l3.1x1.256-1024", 14, 256, 1024, 1, 1),
    ("l4.3x3.512-512", 7, 512, 512, 3, 1),
    ("l4.1x1.2048-512", 7, 2048, 512, 1, 1),
    # MobileNetV2's narrow pointwise convolutions (16-32 channels in or out)
    ("mb.1x1.32-16", 112, 32, 16, 1, 1),
    ("mb.1x1.16-96", 112, 16, 96, 1, 1),
    ("mb.1x1.144-24", 56, 144, 24, 1, 1),
    ("mb.1x1.24-144", 56, 24, 144, 1, 1),
    ("mb.1x1.192-32", 28, 192, 32, 1, 1),
]


def parse_config(text: str, extents=None, sm_count=None):
    """A :class:`TileConfig` from its text (``TileConfig.parse``), or "auto" followed by any of the
    text's suffixes (``.pP .aA .wW .async|.async3 .mma|.wmma``, read by the same parser): the tile
    ``build`` picks for the GEMM ``extents`` (I, J, K) and ``sm_count``, with the suffixes named."""
    from dataclasses import fields, replace

    from inferx_edge.compiler.cuda import TileConfig, tile_for

    parts = text.split(".")
    try:
        if parts[0] != "auto":
            return TileConfig.parse(text)
        # the suffixes parsed onto a placeholder tile; only the fields they name replace build's pick
        named = TileConfig.parse(".".join(["1x1", "1x1", "k1", "v4", *parts[1:]]))
    except ValueError as exc:
        msg = str(exc).replace("'1x1.1x1.k1.v4", "'auto")
        raise SystemExit(f"{msg} (or 'auto' followed by those suffixes: build's tile for the shape)") from None
    base = TileConfig.parse("1x1.1x1.k1.v4")
    cfg = tile_for(extents or (1 << 20, 1 << 20, 1 << 20), sm_count)
    changed = {
        f.name: getattr(named, f.name) for f in fields(TileConfig) if getattr(named, f.name) != getattr(base, f.name)
    }
    if "wmma" in parts[1:]:
        changed["intrin"] = "wmma"
    return replace(cfg, **changed)


def conv_module(n: int, hw: int, c: int, o: int, k: int, stride: int, dtype: str = "int8"):
    """An NHWC conv with OHWI weights: int8 -> int32, or float16 -> float16."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([n, hw, hw, c], dtype))
    w = relax.Var("w", relax.TensorType([o, k, k, c], dtype))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(
                x, w, strides=[stride] * 2, padding=[k // 2] * 4, data_layout="NHWC", kernel_layout="OHWI",
                out_dtype="int32" if dtype == "int8" else dtype,
            )  # fmt: skip
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--configs", default="4x2.4x2.k1.v4,4x2.4x2.k4.v16,2x4.2x4.k4.v16")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--target", default="h200")
    ap.add_argument("--name", default=None)
    ap.add_argument("--shapes", default=None, help="comma-separated shape names (default: all)")
    args = ap.parse_args()
    import torch
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import pass_config, resolve_tvm_target
    from inferx_edge.compiler.cuda import cuda_pipeline, device_compiler
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.runtime.engine import time_calls
    from inferx_edge.targets import get_target

    args.out.mkdir(parents=True, exist_ok=True)
    import_tensor_intrinsics()
    spec = get_target(args.target)
    target = resolve_tvm_target(spec)
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    results = []
    name = args.name or f"gpu_conv_int8_{args.target}"

    def save():
        rec = write_record(
            name,
            {
                "device": torch.cuda.get_device_name(0),
                "driver": gpu_driver(),
                "versions": versions("apache-tvm", "torch", "inferx_edge"),
                "batch": args.batch,
                "results": results,
            },
        )
        (args.out / rec.name).write_text(rec.read_text())

    shapes = SHAPES if args.shapes is None else [s for s in SHAPES if s[0] in args.shapes.split(",")]
    if not shapes:
        raise SystemExit(f"no shapes match; valid: {', '.join(s[0] for s in SHAPES)}")
    for shape_name, hw, c, o, k, stride in shapes:
        n = args.batch
        x = rng.integers(-127, 128, (n, hw, hw, c), dtype=np.int8)
        w = rng.integers(-127, 128, (o, k, k, c), dtype=np.int8)
        out_hw = (hw + 2 * (k // 2) - k) // stride + 1
        macs = n * out_hw * out_hw * o * c * k * k
        xt = torch.from_numpy(x).cuda().permute(0, 3, 1, 2)
        wt = torch.from_numpy(w).cuda().permute(0, 3, 1, 2)
        with torch.no_grad():
            ref = torch.nn.functional.conv2d(xt.double(), wt.double(), stride=stride, padding=k // 2)
            ref = ref.permute(0, 2, 3, 1).cpu().numpy()
            xh = xt.half().contiguous(memory_format=torch.channels_last)
            wh = wt.half().contiguous(memory_format=torch.channels_last)
            s = time_calls(
                lambda xh=xh, wh=wh, st=stride, pad=k // 2: torch.nn.functional.conv2d(xh, wh, stride=st, padding=pad),
                torch.cuda.synchronize, 10, 50, 0.5,
            )  # fmt: skip
        row = {"shape": shape_name, "system": "cudnn fp16 (torch, channels_last)", "p50_ms": s.p50_ms}
        results.append(row | {"tops": 2 * macs / (s.p50_ms * 1e-3) / 1e12})
        print(json.dumps(results[-1]), flush=True)
        for text in args.configs.split(","):
            cfg = parse_config(text, (n * out_hw * out_hw, o, c * k * k), spec.sm_count)
            row = {"shape": shape_name, "system": f"inferx int8 wmma {text}", "config": cfg.__dict__}
            t0 = time.time()
            try:
                with device_compiler(spec, "cubin"), target, pass_config(async_copy=True):
                    ex = relax.build(
                        conv_module(n, hw, c, o, k, stride), target, relax_pipeline=cuda_pipeline(target, cfg)
                    )
                vm = relax.VirtualMachine(ex, dev)
                xd, wd = tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev)
                got = vm["main"](xd, wd).numpy()
                exact = bool(np.array_equal(got.astype(np.float64), ref))
                s = time_calls(lambda vm=vm, xd=xd, wd=wd: vm["main"](xd, wd), dev.sync, 10, 50, 0.5)
                row |= {"exact": exact, "p50_ms": s.p50_ms, "tops": 2 * macs / (s.p50_ms * 1e-3) / 1e12}
            except Exception as exc:  # record and go on
                row |= {"error": f"{type(exc).__name__}: {exc}"[:500]}
                traceback.print_exc()
            row["build_s"] = round(time.time() - t0, 1)
            results.append(row)
            print(json.dumps(row), flush=True)
            save()
    print(f"wrote {name}.json")


if __name__ == "__main__":
    main()
