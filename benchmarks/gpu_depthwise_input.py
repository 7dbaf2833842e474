"""A depthwise convolution whose input is also a residual stream (ConvNeXt's blocks), two ways, in one
process on one GPU: its input saturated and cast to fp16 (what int8 variants do to float depthwise
convolutions, ``compiler/passes/fp16_depthwise.py``) against the convolution reading the fp32 stream.

    python -m benchmarks.gpu_depthwise_input [--shapes 64x56x96k7,64x14x384k7] [--target h200]

Where the depthwise input's producer also feeds the residual path, the cast cannot fuse into that
producer's kernel: it becomes a kernel of its own that reads the fp32 stream and writes an fp16 copy,
and the convolution then reads the copy. Reading the fp32 stream directly moves fewer bytes in all
(the convolution's loads are twice as wide, the extra kernel is gone) but takes the fp32 schedule (4
channels per thread instead of 8). Each shape (``NxHWxCkK``: batch, height = width, channels, window) is
a Relax module ``s = x + r; y = depthwise(s) + b; return (s, y)`` built whole as ``build`` builds a CUDA
variant (both compute ``s`` the same way), run on the same random inputs, its ``y`` checked against
numpy float64 on the first two images, and timed end to end (all its kernels) with the VM's time
evaluator. Writes ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import json
import re

import numpy as np

#: ConvNeXt-T's four stages at batch 64
DEFAULT_SHAPES = "64x56x96k7,64x28x192k7,64x14x384k7,64x7x768k7"

FORMS = ("fp16 input (cast kernel)", "fp32 input")


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """``NxHWxCkK`` -> (batch, height = width, channels, window)."""
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)k(\d+)", text.strip())
    if not m:
        raise SystemExit(f"bad shape {text!r}: expected NxHWxCkK, e.g. 64x56x96k7")
    return tuple(int(v) for v in m.groups())


def residual_depthwise(n: int, hw: int, c: int, k: int, fp16_input: bool):
    """``s = x + r; y = depthwise_conv(s) + b`` (NHWC, HWIO weights, fp32 accumulation), returning
    ``(s, y)``; with ``fp16_input`` the convolution reads ``s`` saturated to fp16 and fp16 weights."""
    from tvm import relax

    from inferx_edge.compiler.passes.fp16_depthwise import saturated_fp16

    bb = relax.BlockBuilder()
    x, r = (relax.Var(name, relax.TensorType([n, hw, hw, c], "float32")) for name in "xr")
    w = relax.Var("w", relax.TensorType([k, k, 1, c], "float16" if fp16_input else "float32"))
    b = relax.Var("b", relax.TensorType([1, 1, 1, c], "float32"))
    with bb.function("main", [x, r, w, b]):
        with bb.dataflow():
            s = bb.emit(relax.op.add(x, r))
            y = relax.op.nn.conv2d(
                saturated_fp16(s) if fp16_input else s, w, padding=[k // 2] * 4, groups=c, data_layout="NHWC",
                kernel_layout="HWIO", out_dtype="float32",
            )  # fmt: skip
            out = bb.emit_output(relax.Tuple([s, relax.op.add(y, b)]))
        bb.emit_func_output(out)
    return bb.get()


def reference(x: np.ndarray, r: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy float64 ``depthwise(x + r) + b`` (same padding, HWIO weights)."""
    s = x.astype(np.float64) + r
    k = w.shape[0]
    p = k // 2
    padded = np.pad(s, ((0, 0), (p, p), (p, p), (0, 0)))
    h, wd = s.shape[1:3]
    out = np.zeros_like(s)
    for i in range(k):
        for j in range(k):
            out += padded[:, i : i + h, j : j + wd, :] * w[i, j, 0].astype(np.float64)
    return out + b.astype(np.float64)


def random_inputs(n: int, hw: int, c: int, k: int, seed: int = 0) -> list[np.ndarray]:
    """x, r ~ N(0, 1); weights ~ N(0, 1/k); bias ~ N(0, 0.1) (fp32; the fp16 form casts its weights)."""
    rng = np.random.default_rng(seed)
    x, r = (rng.standard_normal((n, hw, hw, c)).astype(np.float32) for _ in range(2))
    w = (rng.standard_normal((k, k, 1, c)) / k).astype(np.float32)
    b = (0.1 * rng.standard_normal((1, 1, 1, c))).astype(np.float32)
    return [x, r, w, b]


def build(mod, target: str):
    """``mod`` built whole for ``target`` as ``build`` builds a CUDA variant (cubin, cp.async allowed)."""
    from tvm import relax

    from inferx_edge.compiler.compile import pass_config, resolve_tvm_target
    from inferx_edge.compiler.cuda import cuda_pipeline, device_compiler
    from inferx_edge.targets import get_target

    spec = get_target(target)
    tvm_target = resolve_tvm_target(spec)
    with device_compiler(spec, "cubin"), tvm_target, pass_config(async_copy=True):
        return relax.build(mod, tvm_target, relax_pipeline=cuda_pipeline(tvm_target, sm_count=spec.sm_count))


def kernel_names(mod) -> list[str]:
    """The kernels ``mod`` fuses into, as the CUDA pipeline fuses them."""
    import tvm

    from inferx_edge.compiler.cuda.pipeline import fusion_passes

    fused = tvm.transform.Sequential(fusion_passes())(mod)
    return sorted(gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


def measure(shape: tuple[int, int, int, int], target: str, dev) -> dict:
    import tvm
    from tvm import relax

    n, hw, c, k = shape
    x, r, w, b = random_inputs(n, hw, c, k)
    row = {"shape": {"batch": n, "hw": hw, "channels": c, "window": k}}
    for form in FORMS:
        fp16 = form == FORMS[0]
        mod = residual_depthwise(n, hw, c, k, fp16)
        vm = relax.VirtualMachine(build(mod, target), dev)
        weights = w.astype(np.float16) if fp16 else w
        args = [tvm.runtime.tensor(a, dev) for a in (x, r, weights, b)]
        _, y = vm["main"](*args)
        got = y.numpy()[:2].astype(np.float64)
        ref = reference(x[:2], r[:2], weights.astype(np.float32), b)  # the weights as this form reads them
        timer = vm.time_evaluator("main", dev, number=20, repeat=5, min_repeat_ms=50)
        row[form] = {
            "kernels": kernel_names(mod),
            "us": float(np.median(timer(*args).results)) * 1e6,
            "max_rel_error": float(np.abs(got - ref).max() / np.abs(ref).max()),
        }
    row["fp32 input speedup"] = row[FORMS[0]]["us"] / row[FORMS[1]]["us"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"NxHWxCkK, comma-separated (default {DEFAULT_SHAPES})")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    import tvm

    from benchmarks._record import write_gpu_record

    shapes = [parse_shape(s) for s in args.shapes.split(",")]
    dev = tvm.cuda(0)
    results = []
    for shape in shapes:
        results.append(measure(shape, args.target, dev))
        print(json.dumps(results[-1]), flush=True)
    totals = {form: sum(r[form]["us"] for r in results) for form in FORMS}
    print(json.dumps(totals))
    path = write_gpu_record(
        args.name or f"gpu_depthwise_input_{args.target}",
        {"target": args.target, "shapes": args.shapes, "totals_us": totals, "results": results},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
