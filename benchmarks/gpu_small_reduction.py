"""fp16 small-reduction kernels of networks (depthwise convolutions, grouped convolutions, pools): up to
8, 7, 4, 2 and 1 pixels x 8 channels per thread against one output per thread, and thread blocks of
several output rows against blocks along W, in one process on one GPU.

    python -m benchmarks.gpu_small_reduction [--models mobilenet_v2,convnext_tiny] [--batches 64,1]
        [--precision int8] [--variants "7 pixels x 8 channels,4 pixels x 8 channels"] [--sums fp16,fp32]

Each network (torchvision architecture, seeded random weights) goes through the steps ``build`` takes
for the precision (quantization plan on random calibration data, NHWC, fp16 casts), is legalized and
fused; every kernel :func:`~inferx_edge.compiler.cuda.channel_vectorized_reduction` schedules is
compiled each way (``small_reduction_rule(channels, pixels=..., wide_pixels=...)``, both the variant's; the pixels a kernel takes are
:func:`~inferx_edge.compiler.cuda.rules.small_reduction.row_pixels`' choice, recorded), run on the
same random inputs (outputs compared exactly: each output's accumulation order is the same) and timed
with TVM's time evaluator; ``--sums fp16,fp32`` times them both as build makes them (short float
depthwise/grouped sums in fp16) and with those sums in fp32. Writes ``results/<name>.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from benchmarks._kernels import DEPTHWISE_SUMS, depthwise_sums
from benchmarks._record import gpu_driver, versions, write_record

#: variant: (channels, pixels along W[, pixels for wide windows[, output rows per thread block]]) per
#: thread, the most a kernel may take (rows: ``block_rows``' aim; default the build's, 1: blocks along W)
VARIANTS = {
    "as built: 4 pixels or 7 for wide windows": (8, 4, 7),
    "as built with blocks along W only": (8, 4, 7, 1),
    "as built with blocks of about 8 rows": (8, 4, 7, 8),
    "as built with blocks of about 2 rows": (8, 4, 7, 2),
    "8 pixels x 8 channels": (8, 8),
    "7 pixels x 8 channels": (8, 7),
    "4 pixels x 8 channels": (8, 4),
    "2 pixels x 8 channels": (8, 2),
    "8 channels per thread": (8, 1),
    "one output per thread": (1, 1),
}


def small_reduction_kernels(model: Path, batch: int, precision: str, target: str, sums: str = "fp16") -> dict:
    """{kernel name: PrimFunc} of the kernels the channel-vectorized schedule takes, as build fuses them;
    ``sums="fp32"``: with int8 variants' float depthwise convs accumulating in fp32 (as before
    :data:`~inferx_edge.compiler.passes.fp16_depthwise.HALF_ACCUMULATION_MAX`), "fp16": as build does."""
    import onnx
    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import channel_vectorized_reduction
    from inferx_edge.frontend import import_model
    from inferx_edge.quantize.driver import QuantOptions
    from inferx_edge.targets import get_target
    from inferx_edge.tune import TuneOptions
    from inferx_edge.tune.driver import precision_module

    spec = get_target(target)
    shapes = {onnx.load(str(model), load_external_data=False).graph.input[0].name: (batch, 3, 224, 224)}
    calib = Path(tempfile.mkdtemp(prefix="inferx_calib_")) / "calib.npy"
    np.save(calib, np.random.default_rng(0).standard_normal((16, 3, 224, 224)).astype(np.float32))
    opts = TuneOptions(
        model=model,
        target=target,
        input_shapes=shapes,
        precision=precision,
        quant=QuantOptions(calib=calib, calib_method="minmax"),
    )
    with depthwise_sums(sums):
        prepared = precision_module(import_model(model, shapes), spec, opts, lambda *a: None)
    mod = relax.get_pipeline("zero")(prepared)
    tvm_target = resolve_tvm_target(spec)
    with tvm_target:
        return {
            gv.name_hint: f
            for gv, f in mod.functions_items()
            if isinstance(f, tvm.tirx.PrimFunc) and channel_vectorized_reduction(f, tvm_target) is not None
        }


def random_args(func, seed: int = 0) -> list[np.ndarray]:
    """Activations ~N(0, 1), depthwise weights ~N(0, 0.4), other constants ~N(0, 0.1), outputs zero:
    the int8 quantize epilogues see a spread of values instead of saturating."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    rng = np.random.default_rng(seed)
    infos = list(ArgInfo.from_prim_func(func))
    out = []
    for i, info in enumerate(infos):
        shape, dtype = [int(d) for d in info.shape], str(info.dtype)
        if i == len(infos) - 1:
            out.append(np.zeros(shape, dtype))
        elif dtype.startswith("int"):
            out.append(rng.integers(-127, 128, shape).astype(dtype))
        else:
            scale = 1.0 if i == 0 else 0.4 if len(shape) == 4 and shape[-1] == 1 else 0.1
            out.append((scale * rng.standard_normal(shape)).astype(dtype))
    return out


def compile_kernel(
    func, target: str, channels: int, pixels: int, wide_pixels: int | None = None, rows: int | None = None
):
    from tvm.s_tir import dlight as dl

    from benchmarks._kernels import compile_with_rules
    from inferx_edge.compiler.cuda import small_reduction_rule
    from inferx_edge.compiler.cuda.rules.small_reduction import BLOCK_ROWS

    rule = small_reduction_rule(
        channels, pixels=pixels, wide_pixels=wide_pixels or pixels, rows=BLOCK_ROWS if rows is None else rows
    )
    return compile_with_rules(func, target, [rule, dl.gpu.Fallback()])


def _channel_vectorized(func, target: str, channels: int):
    """(the reduction block, its iterators, channels per thread) of ``func`` where the
    channel-vectorized schedule takes it with ``channels``; None where it declines."""
    from tvm.s_tir import Schedule
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda.rules.small_reduction import FP32_SMALL_REDUCTION_CHANNELS, thread_channels
    from inferx_edge.targets import get_target

    with resolve_tvm_target(get_target(target)):
        sch = Schedule(func)
        infos = normalize_prim_func(sch)
    reds = [b for b in infos or [] if "R" in b.dom_kind()]
    if len(reds) != 1:
        return None
    block = sch.get(reds[0].block_rv)
    per_thread = thread_channels(block, channels, FP32_SMALL_REDUCTION_CHANNELS)
    return (block, reds[0].iters, per_thread) if per_thread and per_thread > 1 else None


def pixels_taken(
    func, target: str, channels: int, pixels: int, wide_pixels: int | None = None, rows: int | None = None
) -> int:
    """The pixels along W per thread the channel-vectorized schedule gives ``func`` (1 when it declines)
    with ``pixels`` and ``wide_pixels`` (default: ``pixels``, as :func:`compile_kernel` compiles);
    ``rows`` is ignored (see :func:`rows_taken`)."""
    import tvm

    from inferx_edge.compiler.cuda.rules.small_reduction import row_pixels

    taken = _channel_vectorized(func, target, channels)
    if taken is None:
        return 1
    block, iters, per_thread = taken
    bits = tvm.DataType(str(func.params[-1].dtype)).bits
    return row_pixels(block, iters, per_thread, pixels, bits, wide_pixels=wide_pixels or pixels)


def rows_taken(func, target: str, channels: int, *_, rows: int | None = None) -> int:
    """The output rows per thread block the channel-vectorized schedule gives ``func`` with ``channels``
    and ``rows`` (default: the build's :data:`BLOCK_ROWS`); 1 when it declines or takes none."""
    from inferx_edge.compiler.cuda.rules.small_reduction import BLOCK_ROWS, block_rows

    taken = _channel_vectorized(func, target, channels)
    if taken is None:
        return 1
    block, iters, per_thread = taken
    return block_rows(block, iters, per_thread, BLOCK_ROWS if rows is None else rows)


def time_variants(model_name: str, name: str, func, batch: int, target: str, dev, variants=VARIANTS) -> dict:
    """One kernel compiled, run and timed as each of ``variants`` (name: (channels, pixels))."""
    import tvm

    host = random_args(func)
    row = {"model": model_name, "kernel": name, "batch": batch, "input_shape": list(host[0].shape)}
    outputs = {}
    for variant, (channels, pixels, *wide) in variants.items():  # wide: [wide pixels[, rows]]
        lib = compile_kernel(func, target, channels, pixels, *wide)
        tensors = [tvm.runtime.tensor(a, dev) for a in host]
        lib["main"](*tensors)
        outputs[variant] = tensors[-1].numpy()
        # tvm.compile returns an Executable; its runtime module has the time evaluator
        timer = lib.mod.time_evaluator("main", dev, number=20, repeat=5, min_repeat_ms=50)
        row[f"{variant} us"] = float(np.median(timer(*tensors).results)) * 1e6
        row[f"{variant} pixels"] = pixels_taken(func, target, channels, pixels, *wide)
        row[f"{variant} rows"] = rows_taken(func, target, channels, rows=(wide[1:] or [None])[0])
    first = next(iter(outputs.values()))
    row["identical"] = all(np.array_equal(first, o) for o in outputs.values())
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--models", default="mobilenet_v2", help="torchvision architectures, comma-separated (default mobilenet_v2)"
    )
    ap.add_argument("--batches", default="64,1")
    ap.add_argument("--precision", default="int8", choices=["int8", "fp16", "mixed"])
    ap.add_argument("--target", default="h200")
    ap.add_argument("--name", default=None)
    ap.add_argument(
        "--sums",
        default="fp16",
        help="comma-separated, of fp16 (as build: short depthwise/grouped sums in fp16), fp32 (summed in fp32)",
    )
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, of: {', '.join(VARIANTS)} (the most pixels a kernel may take; default all)",
    )
    args = ap.parse_args()
    unknown = [v for v in args.variants.split(",") if v not in VARIANTS]
    if unknown:
        ap.error(f"unknown variant(s) {unknown}; valid: {list(VARIANTS)}")
    variants = {v: VARIANTS[v] for v in args.variants.split(",")}
    sums = args.sums.split(",")
    if set(sums) - set(DEPTHWISE_SUMS):
        ap.error(f"--sums: {args.sums!r}; valid: {', '.join(DEPTHWISE_SUMS)}")
    import torch
    import tvm

    from benchmarks.gpu_vision import export, make_net

    dev = tvm.cuda(0)
    results: list[dict] = []

    def record():  # rewritten after every kernel: a run cut by a time limit keeps what it measured
        totals = {
            f"{m} b{b} {s} sums {v} us": sum(
                r[f"{v} us"] for r in results if (r["model"], r["batch"], r["sums"]) == (m, b, s)
            )
            for m, b, s in sorted({(r["model"], r["batch"], r["sums"]) for r in results})
            for v in variants
        }
        return totals, write_record(
            args.name or f"gpu_small_reduction_{args.target}",
            {
                "device": torch.cuda.get_device_name(0),
                "driver": gpu_driver(),
                "versions": versions("apache-tvm", "torch", "inferx_edge"),
                "models": args.models.split(","),
                "precision": args.precision,
                "variants": variants,
                "sums": sums,
                "totals": totals,
                "results": results,
            },
        )

    for model_name in args.models.split(","):
        model = Path(tempfile.mkdtemp(prefix="inferx_bench_")) / f"{model_name}.onnx"
        export(make_net(model_name), model)
        for batch in (int(b) for b in args.batches.split(",")):
            for sum_dtype in sums:
                kernels = small_reduction_kernels(model, batch, args.precision, args.target, sum_dtype)
                for name, func in kernels.items():
                    row = time_variants(model_name, name, func, batch, args.target, dev, variants)
                    results.append({"sums": sum_dtype, **row})
                    print(json.dumps(results[-1]), flush=True)
                    record()
    totals, path = record()
    print(json.dumps(totals))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
