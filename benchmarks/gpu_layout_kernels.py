"""Detector-head and layout kernels: the column-reduction and tiled-transpose rules against the
schedules that had them before (dlight's ``GeneralReduction``; the vectorized elementwise rule and
dlight's ``Fallback``), in one process on one GPU.

    python -m benchmarks.gpu_layout_kernels [--batches 1,64] [--target h200]

The kernels are built from Relax operators, legalized and fused as ``build`` does: YOLOv8's DFL softmax
(16 bins over axis 1 of ``(N, 16, 4, 8400)``, times the bin index), a LayerNorm over NCHW channels (96 x 80 x 80),
YOLOv8's output assembly (three NHWC maps of 64 box + 80 class channels concatenated, transposed to
channels-first, flattened and split: ``(N, 64, 8400)`` and ``(N, 80, 8400)``) and a channel-shuffle
network's NCHW -> NHWC transpose. Each is compiled both ways, run on the same random inputs, checked
against numpy float64 and timed with TVM's time evaluator. Writes ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import numpy as np

SCHEDULES = ("new rule", "before")


def dfl_softmax(shape, axis: int = 1):
    """softmax(x, axis) times the bin index along that axis (YOLOv8's DFL decode before its sum)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    n = shape[axis]
    along = [n if i == axis % len(shape) else 1 for i in range(len(shape))]
    proj = relax.const(np.arange(n, dtype="float32").reshape(along))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.multiply(relax.op.nn.softmax(x, axis=axis), proj))
        bb.emit_func_output(out)
    return bb.get()


def channel_layer_norm(shape, axis: int = 1):
    """LayerNorm over ``axis`` (NCHW's channels) with a gain and a bias."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    g, b = (relax.Var(name, relax.TensorType([shape[axis]], "float32")) for name in "gb")
    with bb.function("main", [x, g, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.layer_norm(x, g, b, axes=[axis]))
        bb.emit_func_output(out)
    return bb.get()


def detector_head(n: int = 2, sizes=(80, 40, 20), box: int = 64, cls: int = 80):
    """YOLOv8's output assembly in NHWC: per scale, box and class maps concatenated along channels,
    transposed to channels-first and flattened; the scales concatenated along the anchors and split
    back into box and class outputs."""
    from tvm import relax

    bb = relax.BlockBuilder()
    xs = []
    for s in sizes:
        xs += [relax.Var(f"box{s}", relax.TensorType([n, s, s, box], "float32"))]
        xs += [relax.Var(f"cls{s}", relax.TensorType([n, s, s, cls], "float32"))]
    with bb.function("main", xs):
        with bb.dataflow():
            per_scale = []
            for i, s in enumerate(sizes):
                cat = bb.emit(relax.op.concat([xs[2 * i], xs[2 * i + 1]], axis=-1))
                nchw = bb.emit(relax.op.permute_dims(cat, [0, 3, 1, 2]))
                per_scale.append(bb.emit(relax.op.reshape(nchw, [n, box + cls, s * s])))
            out = bb.emit_output(relax.op.split(relax.op.concat(per_scale, axis=2), [box], axis=1))
        bb.emit_func_output(out)
    return bb.get()


def transpose(shape, axes):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.permute_dims(x, axes))
        bb.emit_func_output(out)
    return bb.get()


def fused_kernel(mod):
    """The module's one PrimFunc after legalization and fusion as ``build`` does them."""
    import tvm

    from inferx_edge.compiler.cuda.pipeline import fusion_passes

    mod = tvm.transform.Sequential(fusion_passes())(mod)
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    return func


def cases(batch: int) -> dict:
    """{name: (kind, module, numpy inputs, float64 references)} of the kernels timed at ``batch``."""
    rng = np.random.default_rng(0)
    out = {}
    x = (4 * rng.standard_normal((batch, 16, 4, 8400))).astype("float32")
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    proj = np.arange(16, dtype="float32").reshape(1, 16, 1, 1)  # the fused kernel takes the constant as a parameter
    out["dfl softmax"] = ("column", dfl_softmax(list(x.shape)), [x, proj], [e / e.sum(1, keepdims=True) * proj])
    x = rng.standard_normal((batch, 96, 80, 80)).astype("float32")  # >= 4,096 rows at batch 1
    g, b = rng.standard_normal(96).astype("float32"), rng.standard_normal(96).astype("float32")
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    out["nchw layernorm"] = (
        "column",
        channel_layer_norm(list(x.shape)),
        [x, g, b],
        [ref * g.reshape(1, -1, 1, 1) + b.reshape(1, -1, 1, 1)],
    )
    maps = [rng.standard_normal((batch, s, s, c)).astype("float32") for s in (80, 40, 20) for c in (64, 80)]
    scales = [
        np.concatenate(maps[2 * i : 2 * i + 2], -1).transpose(0, 3, 1, 2).reshape(batch, 144, -1) for i in range(3)
    ]
    whole = np.concatenate(scales, 2)
    out["yolo head assembly"] = ("transpose", detector_head(batch), maps, [whole[:, :64], whole[:, 64:]])
    x = rng.standard_normal((batch, 116, 28, 28)).astype("float32")
    out["nchw->nhwc 116 ch"] = ("transpose", transpose(list(x.shape), [0, 2, 3, 1]), [x], [x.transpose(0, 2, 3, 1)])
    return out


def compile_kernel(func, target: str, kind: str, schedule: str):
    from tvm.s_tir import dlight as dl

    from benchmarks._kernels import compile_with_rules
    from inferx_edge.compiler.cuda.rules.column_reduction import column_reduction_rule
    from inferx_edge.compiler.cuda.rules.tiled_transpose import tiled_transpose_rule
    from inferx_edge.compiler.cuda.rules.vectorized_elementwise import vectorized_elementwise_rule

    before = [dl.gpu.GeneralReduction()] if kind == "column" else [vectorized_elementwise_rule()]
    new = column_reduction_rule() if kind == "column" else tiled_transpose_rule()
    rules = ([new] if schedule == SCHEDULES[0] else []) + before + [dl.gpu.Fallback()]
    return compile_with_rules(func, target, rules)


def main() -> None:
    from benchmarks._kernels import compare_schedules
    from benchmarks._record import write_gpu_record

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--target", default="h200")
    ap.add_argument("--name", default=None)
    args = ap.parse_args()
    import tvm

    dev = tvm.cuda(0)
    results = []
    for batch in (int(b) for b in args.batches.split(",")):
        for name, (kind, mod, host, refs) in cases(batch).items():
            func = fused_kernel(mod)
            row = {"kernel": name, "batch": batch, "shapes": [list(a.shape) for a in host]}
            compile_one = partial(compile_kernel, func, args.target, kind)
            results.append(compare_schedules(row, SCHEDULES, compile_one, dev, host, refs))
            print(json.dumps(row), flush=True)
    path = write_gpu_record(
        args.name or f"gpu_layout_kernels_{args.target}", {"schedules": list(SCHEDULES), "results": results}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
