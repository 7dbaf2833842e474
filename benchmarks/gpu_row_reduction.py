"""Row-reduction kernels of transformers (softmax, masked softmax, LayerNorm): one warp per row
(``row_reduction_rule``) against dlight's ``GeneralReduction`` (one 256-thread block per row), in one
process on one GPU.

    python -m benchmarks.gpu_row_reduction [--batches 1,64] [--dtypes float32,float16]

The kernels are the shapes of ViT-B/16 (197 tokens, 12 heads, width 768), Swin-T's first stage (7x7
windows: 49 tokens, 3 heads, width 96) and MiniLM-L6 at sequence 128 (12 heads, width 384, an additive
attention mask, added by the kernel before the softmax, as the networks' fusion leaves it), built
from Relax operators, legalized and fused as ``build`` does. Each is compiled
both ways, run on the same random inputs, checked against numpy float64 and timed with TVM's time
evaluator. Writes ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import numpy as np

from benchmarks._kernels import compare_schedules
from benchmarks._record import write_gpu_record

SCHEDULES = ("one warp per row", "dlight block per row")


def _ref_softmax(x, mask=None, scale=1.0):
    z = x.astype(np.float64) * scale
    if mask is not None:
        z = z + mask.astype(np.float64)
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def _ref_layernorm(x, g, b):
    x = x.astype(np.float64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * g + b


def cases(batch: int) -> dict:
    """{name: (kind, shapes)} of the kernels timed at ``batch``."""
    return {
        "vit softmax": ("softmax", [(batch, 12, 197, 197)]),
        "vit layernorm": ("layernorm", [(batch, 197, 768)]),
        "swin window softmax": ("softmax", [(batch * 64, 3, 49, 49)]),
        "swin layernorm": ("layernorm", [(batch, 3136, 96)]),
        "minilm masked softmax": ("masked_softmax", [(batch, 12, 128, 128), (batch, 1, 1, 128)]),
        "minilm layernorm": ("layernorm", [(batch, 128, 384)]),
    }


def kernel(kind: str, shapes: list, dtype: str):
    """(PrimFunc, numpy inputs, float64 reference) for one case."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.cuda.pipeline import fusion_passes

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shapes[0], dtype))
    host = [(2.0 * rng.standard_normal(shapes[0])).astype(dtype)]
    params = [x]
    if kind == "layernorm":
        width = shapes[0][-1]
        g, b = relax.Var("g", relax.TensorType([width], dtype)), relax.Var("b", relax.TensorType([width], dtype))
        params += [g, b]
        host += [(1 + 0.1 * rng.standard_normal(width)).astype(dtype), (0.1 * rng.standard_normal(width)).astype(dtype)]
    elif kind == "masked_softmax":
        m = relax.Var("m", relax.TensorType(shapes[1], dtype))
        params.append(m)
        mask = np.zeros(shapes[1], dtype)
        mask[..., shapes[1][-1] * 3 // 4 :] = -10000.0  # the last quarter of every sequence is padding
        host.append(mask)
    with bb.function("main", params):
        with bb.dataflow():
            if kind == "layernorm":
                out = bb.emit(relax.op.nn.layer_norm(x, params[1], params[2], axes=[-1]))
            elif kind == "softmax":
                out = bb.emit(relax.op.nn.softmax(x, axis=-1))
            else:
                scaled = bb.emit(relax.op.add(relax.op.multiply(x, relax.const(0.125, dtype)), params[1]))
                out = bb.emit(relax.op.nn.softmax(scaled, axis=-1))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential(fusion_passes())(bb.get())
    funcs = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)}
    # the scale and mask add of the masked softmax are a kernel of their own (as in the networks)
    (func,) = [f for n, f in funcs.items() if ("layer_norm" if kind == "layernorm" else "softmax") in n]
    if kind == "masked_softmax":
        host = [(host[0].astype(np.float64) * 0.125 + host[1]).astype(dtype)]
    if kind == "layernorm":
        ref = _ref_layernorm(*host)
    elif kind == "softmax":
        ref = _ref_softmax(host[0])
    else:
        ref = _ref_softmax(host[0])
    return func, host, ref


def compile_kernel(func, target: str, schedule: str):
    from tvm.s_tir import dlight as dl

    from benchmarks._kernels import compile_with_rules
    from inferx_edge.compiler.cuda.rules.row_reduction import row_reduction_rule

    rules = [dl.gpu.GeneralReduction(), dl.gpu.Fallback()]
    if schedule == SCHEDULES[0]:
        rules.insert(0, row_reduction_rule())
    return compile_with_rules(func, target, rules)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    import tvm

    dev = tvm.cuda(0)
    results = []
    for dtype in args.dtypes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            for name, (kind, shapes) in cases(batch).items():
                func, host, ref = kernel(kind, shapes, dtype)
                row = {"kernel": name, "dtype": dtype, "batch": batch, "shape": list(shapes[0])}
                compile_one = partial(compile_kernel, func, args.target)
                results.append(compare_schedules(row, SCHEDULES, compile_one, dev, host, [ref], dtype))
                print(json.dumps(row), flush=True)
    path = write_gpu_record(
        args.name or f"gpu_row_reduction_{args.target}", {"schedules": list(SCHEDULES), "results": results}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
