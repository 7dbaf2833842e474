"""int8 GEMMs of a ViT-B/16 batch of 64 on one sm_90 GPU: the wgmma kernel
(:mod:`inferx_edge.compiler.cuda.wgmma`) against the mma.sync tile schedule builds use today and
against torch._int_mm (cuBLASLt), each checked exactly against torch's int32 result.

    python -m benchmarks.gpu_wgmma_gemm [--shapes 12608x2304x768,...] [--name NAME]

Every kernel is timed with CUDA events around 50 back-to-back launches, alternating systems over two
rounds; the record keeps every time, the TOPS and the ratios to cuBLASLt and to the mma.sync tile.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks._record import gpu_driver, versions, write_record
from benchmarks.gpu_int8_matmul import operands, time_cuda, workload
from inferx_edge.compiler.cuda.wgmma import parse_tile

#: a ViT-B/16 layer at batch 64 (64 x 197 tokens): QKV, attention out-projection, MLP in, MLP out
VIT_SHAPES = ((12608, 2304, 768), (12608, 768, 768), (12608, 3072, 768), (12608, 768, 3072))
#: wgmma tiles (``wgmma.parse_tile``): the one session 72 measured, a wgmma group left in flight,
#: each swizzle, 128-byte stages, 256-wide tiles, deeper pipelines, and the fence's cost
VARIANTS = (
    "128:4", "128:4:i1", "128:4:i1:sw64", "128:6:i1:sw64", "256:4:i1:sw64", "128:3:i1:k128:sw128",
    "128:4:i1:k128:sw128", "256:3:i1:k128:sw128", "128:4:i1:sw64:nf",
)  # fmt: skip
#: the mma.sync tile an untuned ViT build picks (``--mma-tiles`` adds others, e.g. the tile search's
#: fastest on its QKV GEMM, 2x2.2x4.k8.v16.a8.w16.mma)
MMA_TILES = ("2x4.2x4.k8.v16.a8.w16.mma",)


def compile_wgmma(shape, target: str):
    import tvm

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import device_compiler
    from inferx_edge.compiler.cuda.wgmma import gemm_kernel
    from inferx_edge.targets import get_target

    spec = get_target(target)
    tgt = resolve_tvm_target(spec)
    func = gemm_kernel(shape).with_attr("global_symbol", "main")
    with device_compiler(spec, "cubin"), tgt:
        return tvm.compile(tvm.IRModule({"main": func}), target=tgt)["main"]


def compile_mma(m: int, n: int, k: int, tile: str, target: str):
    import tvm

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.targets import get_target
    from inferx_edge.tune.tile_jobs import compile_candidate

    path = compile_candidate(workload(k, m, n), tile, resolve_tvm_target(get_target(target)), target, None, False)
    if path is None:
        raise RuntimeError(f"the tile {tile} does not apply to {m}x{n}x{k}")
    return tvm.runtime.load_module(path)["main"]


def run_shape(m: int, n: int, k: int, target: str, variants: list[dict], mma_tiles, rounds: int = 2) -> dict:
    import torch

    from inferx_edge.compiler.cuda.wgmma import GemmShape, tile_label

    a, b, c, ta, tb, ref = operands(k, m, n)
    tbt = tb.t()
    systems = {"cublaslt (torch._int_mm)": lambda: torch._int_mm(ta, tbt)}
    row = {"shape": [m, n, k], "gop": 2 * m * n * k / 1e9, "exact": {}, "compile_s": {}, "errors": {}}
    builds = [
        (f"wgmma {tile_label(GemmShape(m, n, k, **v))}",
         lambda v=v: compile_wgmma(GemmShape(m, n, k, **v), target))
        for v in variants
    ] + [(f"mma.sync {tile}", lambda tile=tile: compile_mma(m, n, k, tile, target)) for tile in mma_tiles]  # fmt: skip
    for label, build in builds:
        t0 = time.perf_counter()
        try:
            f = build()
        except Exception as e:  # noqa: BLE001 - recorded, the others still run
            row["errors"][label] = f"{type(e).__name__}: {e}"[:400]
            continue
        row["compile_s"][label] = round(time.perf_counter() - t0, 1)
        systems[label] = lambda f=f: f(a, b, c)
    for label, fn in list(systems.items()):
        if label.startswith("cublas"):
            continue
        c.copyfrom(np.zeros((m, n), np.int32))
        fn()
        got = torch.from_numpy(c.numpy()).cuda()
        row["exact"][label] = bool(torch.equal(got, ref))
        if not row["exact"][label]:
            diff = (got != ref).nonzero()
            row["errors"][label] = f"{len(diff)} of {m * n} elements differ; first at {diff[0].tolist()}"
            del systems[label]
    times = {label: [] for label in systems}
    for _ in range(rounds):
        for label, fn in systems.items():
            times[label].append(time_cuda(fn) * 1e3)  # us
    row["us"] = {label: min(ts) for label, ts in times.items()}
    row["us_all"] = times
    row["tops"] = {label: row["gop"] / us * 1e3 for label, us in row["us"].items()}
    base = row["us"]["cublaslt (torch._int_mm)"]
    mma = [row["us"][x] for x in row["us"] if x.startswith("mma.sync")]
    row["speedup_vs_cublaslt"] = {label: base / us for label, us in row["us"].items()}
    if mma:
        row["speedup_vs_best_mma_sync"] = {label: min(mma) / us for label, us in row["us"].items()}
    return row


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in VIT_SHAPES))
    p.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="wgmma tiles in wgmma.parse_tile's spelling, BN:STAGES[:i1][:k128][:sw64|:sw128][:nf][:ds] (nf: no "
        "proxy fence, only to measure its cost: such a kernel may race)",
    )
    p.add_argument("--mma-tiles", default=",".join(MMA_TILES))
    p.add_argument("--target", default="h200")
    p.add_argument("--name", default="gpu_wgmma_gemm_h100")
    args = p.parse_args()
    variants = [parse_tile(x) for x in args.variants.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for m, n, k in shapes:
        row = run_shape(m, n, k, args.target, variants, args.mma_tiles.split(","))
        print({key: row[key] for key in ("shape", "us", "tops", "exact", "errors")}, flush=True)
        rows.append(row)
    rec = {
        "device": torch.cuda.get_device_name(0),
        "driver": gpu_driver(),
        "versions": versions("apache-tvm", "torch", "inferx_edge") | {"cuda": torch.version.cuda},
        "workload": "C[m,n] int32 = A[m,k] int8 @ B[n,k]^T int8, seeded random operands",
        "variants": variants,
        "mma_tiles": args.mma_tiles.split(","),
        "rows": rows,
    }
    print(write_record(args.name, rec))


if __name__ == "__main__":
    main()
