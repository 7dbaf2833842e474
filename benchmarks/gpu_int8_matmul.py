"""4096^3 int8 matmul on one NVIDIA GPU: MetaSchedule-tuned TVM kernel vs torch._int_mm (cuBLASLt).

    python -m benchmarks.gpu_int8_matmul --trials 256 [--minutes 7] [--target h200]

Tunes in chunks that resume from tuning_logs/<target>/int8_matmul_4096/ (commit it between chunks),
with MetaSchedule's "cuda-tensorcore" space (mma instructions), the random cost model (no xgboost on
the GPU host) and the persistent builder. Then compiles the best record, checks it exactly against
torch's int32 result, times both with the same method (CUDA events around 50 back-to-back launches),
and writes a record with the tuning curve (best latency vs trials), plus a PNG of the curve. The
same workload with the schedule ``build`` gives an untuned int8 GEMM (``compiler.cuda``:
ldmatrix + mma.sync tile, with and without the cp.async pipeline) is timed alongside; with ``--tiles``
every tile ``tune --search tiles`` would try on it (``tile_candidates``) is compiled in a
process pool and timed the same way (each checked exactly against torch), the fastest reported.
``--compare-tiles T1,T2`` only times those tiles and cuBLASLt, alternating, two rounds, with the SM
clock and board power each ran at (record ``gpu_int8_matmul_<target>_compare`` unless ``--name``).
With ``INFERX_CUDA_INTERLEAVE=0`` in the environment the tiles compile with TVM's cp.async loop as
printed (the A/B of ``compiler.cuda.interleave_pipelined_copies``: ``_compare2`` vs ``_compare2_tvm_loop``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from benchmarks._record import RESULTS, gpu_driver, versions, write_record

N = 4096


def workload(depth: int = N, m: int = N, n: int = N):
    """C[m, n] = A[m, depth] @ B[n, depth]^T in int8 -> int32."""
    from tvm import te

    a = te.placeholder((m, depth), "int8", name="A")
    b = te.placeholder((n, depth), "int8", name="B")  # row-major [N, K]: C = A @ B^T, as cuBLASLt's int8 path
    k = te.reduce_axis((0, depth), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, k].astype("int32") * b[j, k].astype("int32"), axis=k), name="C")
    return te.create_prim_func([a, b, c]).with_attr("global_symbol", "main")


def curve(work_dir: Path) -> list[list[float]]:
    """[trial number, best latency so far in ms] from the records file, in measurement order.

    After a prune between chunks the file starts with the kept best record; later trial numbers are
    offset so that they count every trial the database has seen (``inferx_tuning.json``).
    """
    from inferx_edge.records import metaschedule as tdb

    best, out = float("inf"), []
    lines = open(work_dir / "database_tuning_record.json").readlines()
    offset = max(0, tdb.trials_done(work_dir) - len(lines))
    for i, line in enumerate(lines):
        secs = json.loads(line)[1][1]
        if secs and min(secs) < 1e9:
            best = min(best, sum(secs) / len(secs) * 1e3)
        out.append([i + 1 + (offset if i else 0), best if best < float("inf") else None])
    return out


def plot_curve(rec: dict, path: Path) -> None:
    """Best-so-far TOPS vs trials, with cuBLASLt's TOPS as a line (needs matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = 2 * N**3
    pts = [p for p in rec["curve_trials_best_ms"] if p[1]]
    plt.figure(figsize=(6, 3.5))
    plt.plot([p[0] for p in pts], [ops / p[1] / 1e9 for p in pts], label="TVM MetaSchedule (best so far)")
    plt.axhline(rec["results"][1]["tops"], color="k", ls="--", label="torch._int_mm (cuBLASLt)")
    plt.xlabel("trials")
    plt.ylabel("TOPS")
    plt.title(f"int8 matmul {N}^3 on {rec['device']}")
    plt.legend()
    plt.tight_layout()
    plt.savefig(path, dpi=110)
    plt.close()


def operands(depth: int, m: int = N, n: int = N):
    """Seeded random int8 A[m, depth] and B[n, depth] on the GPU for TVM and torch, a zeroed int32
    C[m, n] for TVM, and torch's result: (a, b, c, ta, tb, ref)."""
    import torch
    import tvm

    rng = np.random.default_rng(0)
    a_np = rng.integers(-128, 128, (m, depth), dtype=np.int8)
    b_np = rng.integers(-128, 128, (n, depth), dtype=np.int8)
    dev = tvm.cuda(0)
    a, b = tvm.runtime.tensor(a_np, dev), tvm.runtime.tensor(b_np, dev)
    c = tvm.runtime.tensor(np.zeros((m, n), np.int32), dev)
    ta, tb = torch.from_numpy(a_np).cuda(), torch.from_numpy(b_np).cuda()
    return a, b, c, ta, tb, torch._int_mm(ta, tb.t())


def load_tile(spec, target, tile: str, depth: int = N):
    """``tile`` on the workload of ``depth``, compiled in this process as build and the tile search
    compile it (device compiler, CUDA source repairs; normal priority): the ``main`` function."""
    import tvm

    from inferx_edge.tune.tile_jobs import compile_candidate

    path = compile_candidate(workload(depth), tile, target, spec.name, None, False)
    if path is None:
        raise RuntimeError(f"the tile {tile} does not apply")
    return tvm.runtime.load_module(path)["main"]


def run_exact(f, a, b, c, ref) -> bool:
    """Zero ``c``, run ``f(a, b, c)`` once, and whether ``c`` equals torch's ``ref`` exactly."""
    import torch

    c.copyfrom(np.zeros((N, N), np.int32))
    f(a, b, c)
    return bool(torch.equal(torch.from_numpy(c.numpy()).cuda(), ref))


def record_head() -> dict:
    """The fields every record of this benchmark starts with: GPU, driver (torch's device name
    without NVML), versions, workload."""
    import torch

    return {
        "device": torch.cuda.get_device_name(0),
        "driver": gpu_driver() or torch.cuda.get_device_properties(0).name,
        "versions": versions("apache-tvm", "torch", "inferx_edge") | {"cuda": torch.version.cuda},
        "workload": f"C[{N},{N}] int32 = A[{N},{N}] int8 @ B[{N},{N}]^T int8",
    }


def time_cuda(fn, iters: int = 50) -> float:
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def compile_tiles(spec, target, tiles: list[str]) -> list[tuple]:
    """(library path or None, exception or None) for each tile of the workload, compiled in a process
    pool as ``tune --search tiles`` does (device compiler, CUDA source repairs); the pool is shut
    down before returning (compiles running on every core starved the launching thread: a tile timed
    while others compiled ran at a third of its speed)."""
    import os

    from tvm.support.popen_pool import PopenPoolExecutor

    from inferx_edge.tune.tile_jobs import compile_candidate

    pool = PopenPoolExecutor(max_workers=max(1, min(len(tiles), (os.cpu_count() or 2) - 1)), timeout=300)
    futures = [pool.submit(compile_candidate, workload(), t, target, spec.name, None) for t in tiles]
    built = []
    for fut in futures:
        try:
            built.append((fut.result(), None))
        except Exception as exc:  # record it and go on
            built.append((None, exc))
    pool.shutdown()
    return built


def compare_tiles(spec, target, tiles: list[str], rounds: int = 2) -> list[dict]:
    """``tiles`` and torch._int_mm: compiled first (:func:`compile_tiles`), each checked exactly, then
    all timed one after another for ``rounds`` rounds, with the SM clock and board power (NVML) each
    ran at: tiles that differ by a few percent are compared at the clock they got."""
    import torch
    import tvm

    a, b, c, ta, tb, ref = operands(N)
    ops, calls, rows = 2 * N**3, {"torch._int_mm (cuBLASLt)": lambda: torch._int_mm(ta, tb.t())}, []
    for tile, (path, error) in zip(tiles, compile_tiles(spec, target, tiles)):
        if error is not None or path is None:
            rows.append({"system": tile, "error": f"{type(error).__name__}: {error}"[:400] if error else "not applied"})
            continue
        f = tvm.runtime.load_module(path)["main"]
        if not run_exact(f, a, b, c, ref):
            rows.append({"system": tile, "exact": False})
            continue
        calls[tile] = lambda f=f: f(a, b, c)
    for rnd in range(rounds):
        for system, fn in calls.items():
            ms = time_cuda(fn)
            rows.append({"round": rnd, "system": system, "ms": ms, "tops": ops / ms / 1e9} | clocks_and_power(fn))
            rows[-1] |= {} if system.startswith("torch") else {"exact": True}
            print(json.dumps(rows[-1]), flush=True)
    return rows


def time_tile_candidates(spec, target, a, b, c, ref, timer, extra=()) -> list[dict]:
    """Every int8 tile-search candidate for the workload (and the ``extra`` tiles): compiled
    (:func:`compile_tiles`), then run once each, compared exactly with ``ref`` and timed with ``timer``."""
    import tvm

    from inferx_edge.compiler.cuda import tile_candidates
    from inferx_edge.compiler.cuda.tile_policy import deep_stages_on

    deep = deep_stages_on(target)  # the default first, as build picks it
    cands = [t.text() for t in tile_candidates((N, N, N), spec.sm_count, input_padded=False, deep_stages=deep)]
    cands += list(extra)
    built = compile_tiles(spec, target, cands)
    ops, out = 2 * N**3, []
    for tile, (path, error) in zip(cands, built):
        row = {"system": f"inferx_edge int8 tile {tile}", "tile": tile}
        try:
            if error is not None:
                raise error
            if path is None:
                raise RuntimeError("the tile does not apply")
            f = tvm.runtime.load_module(path)["main"]
            row["exact"] = run_exact(f, a, b, c, ref)
            row["ms"] = timer(lambda f=f: f(a, b, c))
            row["tops"] = ops / row["ms"] / 1e9
        except Exception as exc:  # record it and go on
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def clocks_and_power(fn, seconds: float = 1.5) -> dict:
    """Median SM clock (MHz) and board power (W) read from NVML while ``fn`` runs back to back for
    ``seconds`` (the first third of the samples, the ramp, left out); {} without NVML."""
    import threading

    import torch

    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    except Exception:  # no NVML
        return {}
    samples, done = [], threading.Event()

    def poll():
        while not done.is_set():
            clock = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
            samples.append((clock, pynvml.nvmlDeviceGetPowerUsage(handle) / 1000))
            time.sleep(0.02)

    thread = threading.Thread(target=poll)
    thread.start()
    t0 = time.time()
    while time.time() - t0 < seconds:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    done.set()
    thread.join()
    kept = samples[len(samples) // 3 :] or samples
    return {"sm_mhz": float(np.median([c for c, _ in kept])), "watts": float(np.median([w for _, w in kept]))}


def k_scaling(spec, target, tile: str, depths) -> list[dict]:
    """``tile`` and torch._int_mm on C[N, N] = A[N, K] @ B[N, K]^T for each K of ``depths``: time,
    exactness, SM clock and power. Time = fixed + K x rate separates what each call pays once (block
    start-up, the int32 result's write) from the main loop."""
    import torch

    rows = []
    for depth in depths:
        a, b, c, ta, tb, ref = operands(depth)
        ops = 2 * N * N * depth
        f = load_tile(spec, target, tile, depth)
        exact = run_exact(f, a, b, c, ref)
        for system, fn in (
            ("torch._int_mm (cuBLASLt)", lambda ta=ta, tb=tb: torch._int_mm(ta, tb.t())),
            (tile, lambda f=f, a=a, b=b, c=c: f(a, b, c)),
        ):
            ms = time_cuda(fn)
            row = {"k": depth, "system": system, "ms": ms, "tops": ops / ms / 1e9} | clocks_and_power(fn)
            if system == tile:
                row["exact"] = exact
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=256, help="total trials the database should hold")
    ap.add_argument("--minutes", type=float, default=None)
    ap.add_argument("--target", default="h200")
    ap.add_argument("--per-iter", type=int, default=32)
    ap.add_argument("--name", default=None, help="record name (default gpu_int8_matmul_<target>)")
    ap.add_argument("--tiles", action="store_true", help="also time every int8 tile-search candidate")
    ap.add_argument("--extra-tiles", default="", help="comma-separated tiles (TileConfig text) timed with --tiles")
    ap.add_argument(
        "--k-scaling", default="", metavar="TILE", help="also time TILE and cuBLASLt at K = 2048, 4096, 8192"
    )
    ap.add_argument(
        "--compare-tiles",
        default="",
        metavar="T1,T2,...",
        help="only time these tiles against cuBLASLt (two alternating rounds, clocks and power); no tuning",
    )
    args = ap.parse_args()

    import torch
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.records import metaschedule as tdb
    from inferx_edge.targets import get_target
    from inferx_edge.tune.builder import PersistentBuilder
    from inferx_edge.tune.progress import Progress

    import_tensor_intrinsics()
    spec = get_target(args.target)
    target = resolve_tvm_target(spec)
    if args.compare_tiles:
        rows = compare_tiles(spec, target, [t for t in args.compare_tiles.split(",") if t])
        rec = record_head() | {"results": rows}
        print(f"wrote {write_record(args.name or f'gpu_int8_matmul_{spec.name}_compare', rec)}")
        return
    work_dir = tdb.default_root() / spec.name / "int8_matmul_4096"
    mod = tvm.IRModule({"main": workload()})
    with tdb.locked(work_dir):
        tdb.repair(work_dir)
        done = tdb.trials_done(work_dir)
        remaining = args.trials - done
        t0 = time.time()
        if remaining > 0:
            print(f"tuning {remaining} more trials (database has {done})")
            builder = PersistentBuilder(timeout_sec=120)
            progress = Progress(["int8_matmul"], {"int8_matmul": done}, remaining, args.minutes)
            try:
                ms.tune_tir(
                    mod,
                    target,
                    str(work_dir),
                    max_trials_global=remaining,
                    num_trials_per_iter=args.per_iter,
                    builder=builder,
                    runner=ms.runner.LocalRunner(),
                    cost_model="random",
                    space="cuda-tensorcore",
                    measure_callbacks=ms.measure_callback.MeasureCallback.create("default") + [progress.callback()],
                )
            finally:
                builder.shutdown()
                progress.close()
                tdb.note_trials(work_dir, done + progress.trials)
        tune_s = time.time() - t0
        database = ms.database.JSONDatabase(work_dir=str(work_dir))
        sch = ms.tir_integration.compile_tir(database, mod, target)
    if sch is None:
        raise SystemExit("no valid record in the database yet")
    with target:
        lib = tvm.compile(sch.mod, target=target)
    a, b, c, ta, tb, ref = operands(N)
    f = lib["main"]
    exact = run_exact(f, a, b, c, ref)
    tvm_ms = time_cuda(lambda: f(a, b, c))
    torch_ms = time_cuda(lambda: torch._int_mm(ta, tb.t()))
    ops = 2 * N**3
    from dataclasses import replace

    from inferx_edge.compiler.cuda import tile_for

    untuned = []
    for pipeline in ("", "async"):
        cfg = replace(tile_for((N, N, N), spec.sm_count), pipeline=pipeline)
        name = "inferx_edge untuned (build's int8 tile" + (", cp.async)" if pipeline else ")")
        try:
            dmain = load_tile(spec, target, cfg.text())
            d_exact = run_exact(dmain, a, b, c, ref)
            d_ms = time_cuda(lambda dmain=dmain: dmain(a, b, c))
            untuned.append({"system": name, "config": cfg.__dict__, "exact": d_exact, "ms": d_ms,
                            "tops": ops / d_ms / 1e9})  # fmt: skip
        except Exception as exc:  # record it and go on
            untuned.append({"system": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
        print(json.dumps(untuned[-1]), flush=True)
    extra = [t for t in args.extra_tiles.split(",") if t]
    searched = time_tile_candidates(spec, target, a, b, c, ref, time_cuda, extra) if args.tiles else []
    scaling = k_scaling(spec, target, args.k_scaling, (2048, 4096, 8192)) if args.k_scaling else []
    exact_tiles = [r for r in searched if r.get("exact")]
    best_tile = min(exact_tiles, key=lambda r: r["ms"]) if exact_tiles else None
    pts = curve(work_dir)
    rec = record_head() | {
        "space": "cuda-tensorcore",
        "cost_model": "random",
        "trials_in_database": pts[-1][0] if pts else 0,
        "tuning_seconds_this_run": tune_s,
        "exact_vs_torch": exact,
        "results": [
            {"system": "inferx_edge MetaSchedule tuned", "ms": tvm_ms, "tops": ops / tvm_ms / 1e9},
            {"system": "torch._int_mm (cuBLASLt)", "ms": torch_ms, "tops": ops / torch_ms / 1e9},
            *untuned,
            *searched,
        ],
        "tuned_over_cublaslt_throughput": torch_ms / tvm_ms,
        "tile_search_best": best_tile
        and {"tile": best_tile["tile"], "over_cublaslt_throughput": torch_ms / best_tile["ms"]},
        "curve_trials_best_ms": pts,
    }
    if scaling:
        rec["k_scaling"] = scaling
    name = args.name or f"gpu_int8_matmul_{spec.name}"
    path = write_record(name, rec)
    plot_curve(rec, RESULTS / f"{name}.png")
    print(
        f"tuned {tvm_ms:.3f} ms ({ops / tvm_ms / 1e9:.0f} TOPS) vs cuBLASLt {torch_ms:.3f} ms "
        f"({ops / torch_ms / 1e9:.0f} TOPS): {torch_ms / tvm_ms * 100:.0f} %; exact={exact}; wrote {path}"
    )


if __name__ == "__main__":
    main()
