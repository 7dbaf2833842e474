"""Bandwidth-bound elementwise kernels (DenseNet's concatenations with BatchNorm, ReLU and the int8
quantize of the next conv fused in; an fp16 -> int8 quantize; a residual add + ReLU) under the
vectorized elementwise rule with 1, 2 and 4 vectors per thread (the concatenations also with their
input runs outermost, ``chunk_major``, and without), against a device-to-device copy of the same bytes,
in one process on one GPU.

    python -m benchmarks.gpu_elementwise [--batch 64] [--unrolls 1,2,4] [--target h200] [--name NAME]

Each kernel is built from Relax operators, legalized and fused as ``build`` does (one fused kernel),
compiled once per ``unroll`` (:func:`~inferx_edge.compiler.cuda.rules.vectorized_elementwise.
vectorized_elementwise_rule`), run on the same random inputs, checked against numpy float64 (int8
outputs may differ by one where float32 rounds a value at .5 the other way) and timed with TVM's time
evaluator. The copy (``torch.Tensor.copy_`` of a buffer as large as the kernel's inputs, reading and
writing them) is the bandwidth reference. Writes ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def _quantize(bb, y, scale: float):
    from tvm import relax

    y = relax.op.multiply(y, relax.const(np.float32(scale)))
    return relax.op.astype(relax.op.clip(relax.op.round(y), -128, 127), "int8")


def concat_bn_quantize(shapes, scale: float = 8.0):
    """concat(fp16 inputs, channels) -> float32 -> per-channel affine (BatchNorm) -> ReLU -> int8."""
    from tvm import relax

    channels = sum(s[-1] for s in shapes)
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(list(s), "float16")) for i, s in enumerate(shapes)]
    g, b = (relax.Var(name, relax.TensorType([channels], "float32")) for name in "gb")
    with bb.function("main", [*xs, g, b]):
        with bb.dataflow():
            y = relax.op.astype(relax.op.concat(xs, axis=3), "float32")
            y = relax.op.nn.relu(relax.op.add(relax.op.multiply(y, g), b))
            out = bb.emit_output(_quantize(bb, y, scale))
        bb.emit_func_output(out)
    return bb.get()


def quantize(shape, scale: float = 8.0):
    """fp16 -> int8 with one scale (the input of an int8 conv)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(list(shape), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(_quantize(bb, relax.op.astype(x, "float32"), scale))
        bb.emit_func_output(out)
    return bb.get()


def add_relu(shape):
    """relu(a + b) in fp16 (a residual join)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    a, b = (relax.Var(name, relax.TensorType(list(shape), "float16")) for name in "ab")
    with bb.function("main", [a, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(a, b)))
        bb.emit_func_output(out)
    return bb.get()


def _q64(y, scale: float = 8.0):
    return np.clip(np.round(y * scale), -128, 127)


def cases(n: int) -> dict:
    """{name: (module, numpy inputs, float64 reference, output dtype)} at batch ``n``."""
    rng = np.random.default_rng(0)
    out = {}
    for label, hw, first, layers in (("dense block 1, layer 6", 56, 64, 5), ("dense block 3, layer 24", 14, 256, 23)):
        shapes = [(n, hw, hw, first)] + [(n, hw, hw, 32)] * layers
        xs = [rng.standard_normal(s).astype("float16") for s in shapes]
        c = sum(s[-1] for s in shapes)
        g = (0.5 + rng.random(c)).astype("float32")
        b = (0.2 * rng.standard_normal(c)).astype("float32")
        y = np.concatenate([x.astype(np.float64) for x in xs], 3) * g + b
        ref = _q64(np.maximum(y, 0))
        out[f"concat + BN + ReLU + int8, {label} ({hw}x{hw}x{c})"] = (
            concat_bn_quantize(shapes),
            [*xs, g, b],
            ref,
            "int8",
        )
    x = rng.standard_normal((n, 56, 56, 256)).astype("float16")
    out["fp16 -> int8 quantize (56x56x256)"] = (quantize(x.shape), [x], _q64(x.astype(np.float64)), "int8")
    a, b = (rng.standard_normal((n, 56, 56, 256)).astype("float16") for _ in range(2))
    ref = np.maximum(a.astype(np.float64) + b, 0)
    out["fp16 add + ReLU (56x56x256)"] = (add_relu(a.shape), [a, b], ref, "float16")
    return out


def copy_us(nbytes: int) -> float:
    """Median microseconds of a device-to-device copy of ``nbytes`` (torch, CUDA events)."""
    import torch

    from benchmarks.gpu_grouped_conv import torch_us

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return torch_us(lambda: dst.copy_(src))


def main() -> None:
    from benchmarks._kernels import check_and_time, compile_with_rules
    from benchmarks._record import write_gpu_record
    from benchmarks.gpu_layout_kernels import fused_kernel
    from inferx_edge.compiler.cuda.rules.vectorized_elementwise import vectorized_elementwise_rule

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--unrolls", default="1,2,4")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    unrolls = [int(u) for u in args.unrolls.split(",")]
    import tvm
    from tvm.s_tir import dlight as dl

    dev = tvm.cuda(0)
    results = []
    for name, (mod, host, ref, out_dtype) in cases(args.batch).items():
        func = fused_kernel(mod)
        inputs = [tvm.runtime.tensor(a, dev) for a in host]
        zeros = np.zeros(ref.shape, out_dtype)
        output = tvm.runtime.tensor(zeros, dev)
        in_bytes = sum(a.nbytes for a in host)
        moved = in_bytes + zeros.nbytes
        row = {"kernel": name, "batch": args.batch, "bytes moved": moved}
        row["copy us"] = copy_us(in_bytes)
        row["copy GB/s"] = 2 * in_bytes / row["copy us"] / 1e3
        variants = [(u, False) for u in unrolls]
        if name.startswith("concat"):
            variants += [(u, True) for u in unrolls]
        for u, major in variants:
            rule = vectorized_elementwise_rule(u, chunk_major=major)
            lib = compile_with_rules(func, args.target, [rule, dl.gpu.Fallback()])
            err, us = check_and_time(lib, dev, inputs, [output], [ref])
            v = f"unroll {u}" + (" chunk-major" if major else "")
            row[f"{v} max abs error"], row[f"{v} us"] = err, us
            row[f"{v} GB/s"] = moved / us / 1e3
            row[f"{v} / copy bandwidth"] = row[f"{v} GB/s"] / row["copy GB/s"]
            row[f"{v} speedup vs unroll {unrolls[0]}"] = row[f"unroll {unrolls[0]} us"] / us
        results.append(row)
        print(json.dumps(row), flush=True)
    path = write_gpu_record(args.name or f"gpu_elementwise_{args.target}", {"unrolls": unrolls, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
