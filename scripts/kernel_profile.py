"""Per-kernel time of a model as ``build`` compiles it, on this machine's CPU or GPU.

    python scripts/kernel_profile.py --model M.onnx --target h200 --precision int8 \
        --input-shape image:64x3x224x224 [--calib calib.npy] [--runs 20] [--json out.json]

The module goes through the same steps as a variant of ``build`` (quantization plan, fp16 cast, the
target's tuning database, the target's Relax pipeline), then is compiled with the bytecode VM, whose
instrument hook times every call: the device is synchronized before and after each kernel, so a row
is the kernel's own time plus one launch. Each kernel is labelled by what its schedule uses: tensor
cores (wmma/mma), int8 loads, a tuned (database) schedule, and the default-schedule rule that took it.
The sum of the rows is above the uninstrumented end-to-end time printed first (sync per kernel).

Without a GPU: ``--costs-only`` writes each kernel's FLOPs, compulsory bytes, rule and launch grid
(and counts the kernels per rule, and names kernels of fewer thread blocks than the GPU has SMs that
each move 64 KiB or more: a few SMs walking a large tensor); ``--check-schedules`` runs every scheduled kernel but tensor-core ones on this CPU
with its thread loops serial against the unscheduled kernel (``compiler/schedule_check.py``; use a
small batch; for sm_90a also each wgmma epilogue over a plain-loop GEMM), and exits 1 when one differs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _device_name(dev) -> str | None:
    """The GPU's name (``NVIDIA H100 80GB HBM3``), None where the runtime does not say (CPUs)."""
    try:
        return str(dev.device_name) if dev.device_name else None
    except Exception:  # noqa: BLE001 - a device kind without the attribute
        return None


def scheduled_names(mod) -> set[str]:
    """PrimFuncs that already carry a schedule (before the target pipeline: the tuned ones)."""
    import tvm

    return {
        gv.name_hint
        for gv, f in mod.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "tirx.is_scheduled" in f.attrs
    }


def kernel_traits(mod, tuned: set[str]) -> dict[str, dict]:
    """What each PrimFunc's schedule uses, read from its TIR."""
    import tvm

    from inferx_edge.compiler.guarded_schedule import schedule_rule

    out = {}
    for gv, f in mod.functions_items():
        if not isinstance(f, tvm.tirx.PrimFunc):
            continue
        text = f.script()
        out[gv.name_hint] = {
            "tensor_cores": bool(re.search(r"tvm_mma_sync|ptx_mma|ptx_legacy\.mma\(|mma_sync", text)),
            "int8": '"int8"' in text,
            "tuned": gv.name_hint in tuned,
            "rule": schedule_rule(f),
            **launch_grid(text),
        }
    return out


_BINDING = re.compile(r'thread_binding\((?:T\.int(?:32|64)\()?(\d+)\)?, thread="((?:blockIdx|threadIdx)\.[xyz])"')


def launch_grid(text: str) -> dict[str, int]:
    """{"blocks": thread blocks, "threads": threads per block} of a scheduled kernel's TIR text (the
    largest extent bound to each of blockIdx.x/y/z and threadIdx.x/y/z); {} when nothing is bound."""
    extents: dict[str, int] = {}
    for extent, tag in _BINDING.findall(text):
        extents[tag] = max(extents.get(tag, 1), int(extent))
    if not extents:
        return {}
    blocks = threads = 1
    for tag, extent in extents.items():
        if tag.startswith("blockIdx"):
            blocks *= extent
        else:
            threads *= extent
    return {"blocks": blocks, "threads": threads}


#: --costs-only names kernels of fewer thread blocks than the GPU has SMs that each move at least this
#: many bytes: a few SMs walking a large tensor (a batch-1 squeeze-excite pool ran as 2 such blocks)
FEW_BLOCKS_BYTES_PER_BLOCK = 64 * 1024


def few_block_kernels(kernels: dict[str, dict], sm_count: int | None) -> list[str]:
    """Kernels (of ``kernels``: costs + traits) with fewer blocks than ``sm_count`` that each move
    :data:`FEW_BLOCKS_BYTES_PER_BLOCK` or more."""
    if not sm_count:
        return []
    return sorted(
        name
        for name, k in kernels.items()
        if k.get("blocks") and k["blocks"] < sm_count and k["bytes"] / k["blocks"] >= FEW_BLOCKS_BYTES_PER_BLOCK
    )


def kernel_costs(mod) -> dict[str, dict]:
    """FLOPs (TVM's estimate from the loop nest; count them before scheduling: tensor-core intrinsics
    are not counted) and compulsory bytes (every parameter buffer read or written once) of each
    PrimFunc: the roofline inputs of the Jetson twin's latency model."""
    import tvm

    out = {}
    for gv, f in mod.functions_items():
        if not isinstance(f, tvm.tirx.PrimFunc):
            continue
        try:
            flops = float(tvm.s_tir.analysis.estimate_tir_flops(tvm.IRModule({"main": f})))
        except Exception:  # noqa: BLE001 - a function TVM cannot count (e.g. dynamic loops)
            flops = None
        nbytes = 0
        for buf in f.params:
            if getattr(buf, "shape", None) is None or not hasattr(buf, "dtype"):
                continue  # a scalar parameter
            n = 1
            for d in buf.shape:
                n *= int(d) if isinstance(d, tvm.tirx.IntImm) else 1
            nbytes += n * tvm.runtime.DataType(buf.dtype).bits // 8
        out[gv.name_hint] = {"flops": flops, "bytes": nbytes}
    return out


def unscheduled_kernels(mod, spec, target):
    """The module fused as the target pipeline fuses it, before any schedule: the kernels carry their
    names but no tensor-core intrinsics yet, so their FLOPs can be counted from the loop nests."""
    import tvm

    from inferx_edge.compiler.cuda.pipeline import fusion_passes

    passes = []
    if spec.is_cuda:
        from tvm.relax.backend.cuda import pipeline as cuda

        passes += cuda.library_dispatch_passes(target)
    passes += fusion_passes(spec.sm_count)
    with target:
        return tvm.transform.Sequential(passes)(mod)


def check_schedules(plain, scheduled, only: str | None = None, tolerance: float = 1e-3, wgmma: bool = False) -> int:
    """Print each kernel's check (:func:`inferx_edge.compiler.schedule_check.check_module`; ``wgmma``:
    also :func:`~inferx_edge.compiler.schedule_check.check_wgmma_epilogues`); 1 when one differs from its
    unscheduled kernel by more than ``tolerance`` of its largest output (at least 1)."""
    from inferx_edge.compiler.schedule_check import check_module, check_wgmma_epilogues

    checked, bad = 0, []
    rows = list(check_module(plain, scheduled, only=only))
    if wgmma:  # the epilogues the sm_90a wgmma rewrite evaluates, with a plain-loop GEMM
        rows += [(name, "wgmma epilogue", diff, why) for name, diff, why in check_wgmma_epilogues(plain, only=only)]
    for name, rule, diff, skipped in rows:
        if skipped:
            print(f"  skip  {name[:70]:70s} {rule or '-':22s} {skipped}")
            continue
        checked += 1
        ok = diff <= tolerance
        bad += [] if ok else [name]
        print(f"  {'ok  ' if ok else 'DIFF'}  {name[:70]:70s} {rule or '-':22s} {diff:.2e}", flush=True)
    print(f"{checked} kernels checked, {len(bad)} differ" + (f": {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def _sm_clock_mhz() -> float | None:
    """The GPU's SM clock now (NVML, read only), or None."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return float(pynvml.nvmlDeviceGetClockInfo(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001 - no NVML here
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", "-m", type=Path, required=True)
    ap.add_argument("--target", "-t", required=True)
    ap.add_argument("--input-shape", action="append", default=[])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "int8", "mixed"])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--no-tuning", action="store_true")
    ap.add_argument(
        "--tuning-root",
        type=Path,
        default=None,
        help="look the model's tuning database up under this folder instead of tuning_logs/ (e.g. the "
        "tuning_logs/ a `benchmarks.zoo --tune-tiles` run wrote)",
    )
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--calib", type=Path, default=None, help="int8/mixed: calibration data (see build --help)")
    ap.add_argument("--calib-method", default="entropy")
    ap.add_argument("--quant-plan", type=Path, default=None, help="int8/mixed: a plan written by 'quantize'")
    ap.add_argument(
        "--gpu-lock",
        type=Path,
        default=None,
        help="hold an exclusive lock on this file while running on the device: several profiles can then "
        "compile in parallel and still time one at a time",
    )
    ap.add_argument(
        "--costs-only",
        action="store_true",
        help="write each kernel's FLOPs, compulsory bytes and launch grid (--json) and name kernels of few "
        "thread blocks, without compiling or running: no GPU needed",
    )
    ap.add_argument(
        "--check-schedules",
        action="store_true",
        help="run every scheduled kernel (but tensor-core ones) on this CPU with its thread loops serial and "
        "compare it with the unscheduled kernel on random inputs: what the schedules compute, no GPU needed "
        "(use a small batch)",
    )
    ap.add_argument("--kernels", default=None, help="--check-schedules: only kernels whose name contains this")
    args = ap.parse_args(argv)

    import tvm
    from tvm import relax

    from inferx_edge.compiler.compile import pass_config, relax_pipeline, resolve_tvm_target
    from inferx_edge.compiler.cuda import device_compiler
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.frontend.shapes import parse_input_shapes
    from inferx_edge.records import metaschedule as tdb
    from inferx_edge.runtime._tvm import set_default_cpu_threads
    from inferx_edge.targets import get_target

    print(f"CPU threads: {set_default_cpu_threads()}")  # as the runtime runs CPU kernels
    spec = get_target(args.target)
    shapes = parse_input_shapes(args.input_shape)
    imported = import_model(args.model, shapes)
    quantize = None
    if args.precision in ("int8", "mixed"):
        from inferx_edge.quantize.driver import QuantOptions, quantizer, resolve_plan

        q = QuantOptions(calib=args.calib, calib_method=args.calib_method, quant_plan=args.quant_plan)
        quantize = quantizer(resolve_plan(args.model, shapes, imported, args.precision, q), args.precision)
    tuning_dir = None if args.no_tuning else tdb.find_database(spec, imported, args.precision, args.tuning_root)
    if args.tuning_root and tuning_dir is None and not args.no_tuning:
        print(f"note: no tuning database for this model, shapes and precision under {args.tuning_root}")
    target = resolve_tvm_target(spec)
    t0 = time.perf_counter()
    prepared = prepare_variant(
        imported, variant_layout(spec, args.precision), quantize=quantize, target=target, tuning_dir=tuning_dir,
        bake=True, log=print, sm_count=spec.sm_count,
    )  # fmt: skip
    mod, tuned, weights = prepared.mod, prepared.tuning, prepared.weight_arrays
    imported = prepared.model
    cuda_ctx = device_compiler(spec, "cubin") if spec.is_cuda else contextlib.nullcontext()
    with cuda_ctx, target, pass_config(async_copy=spec.is_cuda):
        pipeline = relax_pipeline(spec, target)
        pipeline = relax.get_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
        tuned_names = scheduled_names(mod)
        plain = unscheduled_kernels(mod, spec, target)
        mod = pipeline(mod)
        if args.check_schedules:
            from inferx_edge.compiler.cuda.rules.wgmma_matmul import wgmma_target

            return check_schedules(plain, mod, args.kernels, wgmma=wgmma_target(target))
        costs = kernel_costs(plain)
        from inferx_edge.compiler.relax_rewrite import call_counts

        for name, n in call_counts(plain).items():
            if name in costs:
                costs[name]["calls"] = n
        traits = kernel_traits(mod, tuned_names)
        if args.costs_only:
            doc = {
                "model": str(args.model),
                "target": spec.name,
                "precision": args.precision,
                "input_shapes": {k: list(v) for k, v in shapes.items()},
                "kernels": {k: {**v, **traits.get(k, {})} for k, v in costs.items()},
            }
            if args.json:
                args.json.write_text(json.dumps(doc, indent=1) + "\n")
            launches = sum(v.get("calls", 0) for v in costs.values())
            moved = sum(v["bytes"] * v.get("calls", 0) for v in costs.values())
            print(
                f"{len(costs)} kernels, {sum(v['flops'] or 0 for v in costs.values()) / 1e9:.2f} GFLOP; "
                f"per call: {launches} launches, {moved / 1e6:.0f} MB compulsory traffic"
            )
            rules = collections.Counter((traits.get(k) or {}).get("rule") or "-" for k in costs)
            print("schedule rules: " + ", ".join(f"{r} {n}" for r, n in rules.most_common()))
            for name in few_block_kernels(doc["kernels"], spec.sm_count):
                k = doc["kernels"][name]
                print(f"few blocks: {name} ({k['blocks']} blocks of {k['threads']} threads, {k['bytes']} bytes)")
            return 0
        ex = relax.build(mod, target, relax_pipeline=None, exec_mode="bytecode")
    print(f"compiled in {time.perf_counter() - t0:.1f} s; tuning: {tuned}")

    lock = open(args.gpu_lock, "a") if args.gpu_lock else None  # noqa: SIM115 (held until exit)
    if lock:
        import fcntl

        fcntl.flock(lock, fcntl.LOCK_EX)
    dev = tvm.cuda(0) if spec.is_cuda else tvm.cpu(0)
    vm = relax.VirtualMachine(ex, dev)
    rng = np.random.default_rng(0)
    inputs = [tvm.runtime.tensor(rng.standard_normal(t.shape).astype(t.dtype), dev) for t in imported.inputs]
    params = [tvm.runtime.tensor(p, dev) for p in weights]

    def run():
        vm["main"](*inputs, *params)

    for _ in range(3):
        run()
    dev.sync()
    t0 = time.perf_counter()
    for _ in range(args.runs):
        run()
    dev.sync()
    e2e_ms = (time.perf_counter() - t0) / args.runs * 1e3

    acc: dict[str, float] = collections.defaultdict(float)
    calls: dict[str, int] = collections.Counter()
    start = [0.0]

    def instrument(_func, name, before, _ret, *_args):
        dev.sync()
        if before:
            start[0] = time.perf_counter()
        else:
            acc[name] += time.perf_counter() - start[0]
            calls[name] += 1
        return 0

    vm.set_instrument(instrument)
    clocks = []
    for _ in range(args.runs):
        run()
        clocks.append(_sm_clock_mhz())
    clocks = [c for c in clocks if c is not None]
    rows = sorted(
        (
            {
                "kernel": k,
                "calls_per_run": calls[k] // args.runs,
                "ms_per_run": v / args.runs * 1e3,
                **traits.get(k, {}),
                **costs.get(k, {}),
            }
            for k, v in acc.items()
        ),
        key=lambda r: -r["ms_per_run"],
    )
    total = sum(r["ms_per_run"] for r in rows)
    print(f"end to end (no instrument) {e2e_ms:.3f} ms/run; instrumented sum {total:.3f} ms/run")
    print(f"{'kernel':60s} {'calls':>5s} {'ms/run':>9s} {'share':>6s}  traits")
    for r in rows:
        flags = ",".join([k for k in ("tensor_cores", "int8", "tuned") if r.get(k)] + [r.get("rule") or ""]).strip(",")
        print(
            f"{r['kernel'][:60]:60s} {r['calls_per_run']:5d} {r['ms_per_run']:9.4f} {r['ms_per_run'] / total:6.1%}  {flags}"
        )
    if args.json:
        from benchmarks._record import git_commit, gpu_driver, versions

        commit, dirty = git_commit()
        args.json.write_text(
            json.dumps(
                {
                    "command": " ".join(sys.argv),
                    "git_commit": commit,
                    "git_dirty": dirty,
                    "model": str(args.model),
                    "target": spec.name,
                    "precision": args.precision,
                    "input_shapes": {k: list(v) for k, v in shapes.items()},
                    "device": str(dev),
                    "device_name": _device_name(dev),
                    "driver": gpu_driver() if spec.is_cuda else None,
                    "versions": versions("apache-tvm", "inferx_edge"),
                    "e2e_ms": e2e_ms,
                    "instrumented_sum_ms": total,
                    "sm_clock_mhz": float(np.median(clocks)) if clocks else None,
                    "kernels": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
