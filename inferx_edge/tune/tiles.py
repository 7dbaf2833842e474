"""``tune --search tiles``: measure the tensor-core tiles of a CUDA model kernel by kernel.

Build schedules every int8 and fp16 GEMM and implicit-GEMM convolution (sm_80+) with
:func:`~inferx_edge.compiler.cuda.tensor_core_schedule`, its tile picked by a rule
(:func:`~inferx_edge.compiler.cuda.tile_for`). This search compiles each kernel with
every candidate tile (:func:`~inferx_edge.compiler.cuda.tile_candidates`: tile sizes,
cp.async pipeline, 128-deep stages, 16-byte predicated loads), runs them on the GPU, keeps the fastest
whose outputs match the default tile's (int8: equal; fp16: within :data:`FP16_MATCH` of the largest
output), and records it in ``tiles.json`` beside the model's MetaSchedule database (one directory per
precision). ``build`` reads the file and gives each kernel its recorded tile. (Databases written
before fp16 was searched name the file ``int8_tiles.json``; it is read, and replaced by
``tiles.json`` on the next search.)

Kernels are grouped by *tile key*: the kernel's TIR with its name, parameter names and float
constants (quantization scales) blanked, so the convolutions of a network that differ only in their
scales are measured once, and a re-calibrated model keeps its tiles. Groups are written as they finish
(atomically, under the database's lock): an interrupted search keeps every finished group and the next
run measures only what is missing.

Candidates compile in a pool of worker processes (scheduling and CUDA compilation, the slow part) while
this process times them on the GPU, one at a time, with TVM's time evaluator (median of repeats). A
search with a time limit times each group's default tile first and searches the slowest groups first.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferx_edge.compiler.tuning import TileGroup, tile_groups
from inferx_edge.errors import UsageError
from inferx_edge.records.tiles import FORMAT, KERNEL_VERSION, _tiles_path, load_tiles, save_tiles
from inferx_edge.tune.tile_gpus import _GPU, LocalGPU, RemoteGPU
from inferx_edge.tune.tile_jobs import (
    ORDER_SHARE,
    compile_candidate,
    delete_library,
    discard,
    random_args,
    slowest_first,
)

#: fp16 candidates match the default tile when every output is within this fraction of the largest
#: output magnitude (accumulation order differs between tiles; a wrong tile is off by whole terms)
FP16_MATCH = 1e-2

# --------------------------------------------------------------------------------------------------
# the search


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    for x, y in zip(a, b):
        if x.dtype == np.float16:  # tiles accumulate in different orders: close, not equal
            x, y = x.astype(np.float64), y.astype(np.float64)
            if np.isnan(x).any() or np.isnan(y).any() or (np.isinf(x) != np.isinf(y)).any():
                return False
            finite = np.isfinite(y)
            scale = float(np.abs(y[finite]).max()) if finite.any() else 0.0
            if (np.abs(x[finite] - y[finite]) > FP16_MATCH * max(scale, 1e-3)).any():
                return False
        elif x.dtype.kind == "f":
            if not np.allclose(x, y, rtol=1e-5, atol=1e-6, equal_nan=True):
                return False
        elif not np.array_equal(x, y):
            return False
    return True


@dataclass
class TileSearchSummary:
    work_dir: Path
    groups: list[dict]
    measured_now: int
    candidates_run: int
    seconds: float
    stopped_by_time: bool = False


def search_tiles(
    mod,
    spec,
    work_dir: Path,
    minutes: float | None = None,
    rpc=None,
    gpu: _GPU | None = None,
    workers: int | None = None,
    repeat: int = 7,
    min_repeat_ms: int = 10,
    log=print,
) -> TileSearchSummary:
    """Measure every candidate tile of each tensor-core kernel group of ``mod`` (legalized and fused) that
    ``work_dir`` does not record yet (whole groups, and candidates added since a group was recorded);
    record each group's fastest correct tile as it finishes. With ``minutes``, each group's default tile
    is timed first and the groups whose kernels take the most time are searched first.
    Candidates run on ``gpu``, by default this host's GPU or the one behind ``rpc``."""
    import platform

    from tvm.support.popen_pool import PopenPoolExecutor

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import MIN_INT8_DIM as MIN_DIM
    from inferx_edge.compiler.cuda import MIN_INT8_ROWS as MIN_ROWS
    from inferx_edge.compiler.cuda.rules.wgmma_matmul import wgmma_takes
    from inferx_edge.compiler.cuda.tile_policy import deep_stages_on
    from inferx_edge.records import metaschedule as tdb

    target = resolve_tvm_target(spec)
    groups = tile_groups(mod)
    on_wgmma = [wgmma_takes(g.func, target, spec.sm_count) for g in groups]
    if any(on_wgmma):
        log(f"      {sum(on_wgmma)} kernel groups run on the wgmma GEMM (no tiles to search): skipped")
        groups = [g for g, taken in zip(groups, on_wgmma, strict=True) if not taken]
        if not groups:
            raise UsageError(
                f"every tensor-core kernel of the model runs on the wgmma GEMM for {spec.name}; no tiles to search"
            )
    if not groups:
        raise UsageError(
            f"the model has no int8 or fp16 tensor-core kernels for {spec.name} (GEMMs and convolutions "
            f"of at least {MIN_ROWS} x {MIN_DIM} x {MIN_DIM}); the tiles search is for CUDA fp16/int8/mixed variants"
        )
    t0 = time.time()
    deadline = t0 + 60 * minutes if minutes else math.inf
    with tdb.locked(work_dir):
        data = load_tiles(work_dir) or {"format": FORMAT, "target": spec.name, "groups": {}}
        deep = deep_stages_on(target)
        plans = _plan(groups, data, spec.sm_count, deep_stages=deep)
        n_new = sum(1 for *_, old in plans if old is not None)
        n_stale = sum(1 for g in groups if _older_kernels(data["groups"].get(g.key, {})))
        kernels = sum(len(g.kernels) for g in groups)
        log(
            f"[3/4] tensor-core tiles: {len(groups)} kernel groups ({kernels} kernels); {len(groups) - len(plans)} "
            f"recorded in {_tiles_path(work_dir)}, {len(plans)} to measure"
            + (f" ({n_new} recorded ones only for candidates added since)" if n_new else "")
            + (f" ({n_stale} timed with older kernels: measured again in full)" if n_stale else "")
        )
        if not plans:
            return TileSearchSummary(work_dir, _rows(groups, data), 0, 0, 0.0)
        gpu = gpu or (RemoteGPU(rpc) if rpc else LocalGPU())
        if n_new and data.get("device") not in (None, gpu.name):  # timed on another GPU: measure them anew
            plans = _plan(
                groups, data, spec.sm_count, anew={g.key for g, _, old in plans if old is not None}, deep_stages=deep
            )
        data["device"] = gpu.name
        cross = spec.cross_compiler if platform.machine() != spec.host_arch else None
        n_workers = workers or max(1, (os.cpu_count() or 2) - 1)
        pool = PopenPoolExecutor(max_workers=n_workers, timeout=300, maximum_process_uses=64)
        log(f"      {sum(len(c) for _, c, _ in plans)} candidates, compiled by {n_workers} workers, run on {gpu.name}")

        def compile_job(group: TileGroup, cfg):  # a pool job: the library of ``group``'s kernel with tile ``cfg``
            return pool.submit(compile_candidate, group.func, cfg.text(), target, spec.name, cross)

        futures: list[list] = []
        measured, run, stopped = 0, 0, False
        try:
            if minutes and len(plans) > 1:  # a run that may stop early: the slowest kernels first
                until = t0 + ORDER_SHARE * (deadline - t0)
                plans, defaults = slowest_first(plans, compile_job, gpu, min_repeat_ms, until)
                log(
                    f"      timed each group's default tile ({len(plans)} groups, {time.time() - t0:.0f} s): "
                    "measuring the groups whose kernels take the most time first"
                )
            else:
                defaults = [None] * len(plans)
            futures = [
                [d or compile_job(g, cands[0])] + [compile_job(g, c) for c in cands[1:]]
                for (g, cands, _), d in zip(plans, defaults)
            ]
            for n, ((group, cands, old), futs) in enumerate(zip(plans, futures), 1):
                if time.time() > deadline:
                    stopped = True
                    break
                rec = _measure_group(group, cands, futs, gpu, repeat, min_repeat_ms)
                run += len(rec["us"])
                if old is not None:  # earlier candidates' timings kept; the default's is re-timed
                    rec["us"] = {**old.get("us", {}), **rec["us"]}
                    errors = {**old.get("errors", {}), **rec["errors"]}
                    rec["errors"] = {k: v for k, v in errors.items() if k not in rec["us"]}
                    if rec["us"]:
                        rec["best"] = min(rec["us"], key=rec["us"].get)
                data["groups"][group.key] = rec
                save_tiles(work_dir, data)
                measured += 1
                best, default = rec.get("best"), rec["default"]
                gain = (
                    f"{rec['us'][best]:.1f} us, {rec['us'][default] / rec['us'][best]:.2f}x the default {default}"
                    if best and rec["us"].get(default)
                    else (
                        f"{rec['us'][best]:.1f} us"
                        if best
                        else "no candidate ran: " + "; ".join(rec["errors"].values())[:300]
                    )
                )
                elapsed = time.time() - t0
                eta = elapsed / n * (len(plans) - n)
                log(
                    f"      [{n}/{len(plans)}] {'x'.join(map(str, group.extents))} ({len(group.kernels)} kernel"
                    f"{'s' if len(group.kernels) > 1 else ''}): {best or '-'} {gain}  [{elapsed:.0f} s, ETA {eta:.0f} s]"
                )
        except KeyboardInterrupt:
            log(f"interrupted: {measured} groups recorded in {_tiles_path(work_dir)}; run the same command to continue")
            raise
        finally:
            pool.shutdown()
            gpu.close()
            for fut in (f for futs in futures for f in futs):  # libraries compiled but not timed (stopped early)
                discard(fut)
    if stopped:
        log(f"      stopped at the time limit: {measured} groups measured this run, {len(plans) - measured} left")
    return TileSearchSummary(work_dir, _rows(groups, data), measured, run, time.time() - t0, stopped)


def _older_kernels(rec: dict) -> bool:
    """Whether a group's record was timed with kernels older than :data:`KERNEL_VERSION`."""
    return bool(rec.get("best")) and rec.get("kernel_version", 1) < KERNEL_VERSION


def _plan(
    groups: list[TileGroup], data: dict, sm_count: int | None, anew: set = frozenset(), deep_stages: bool = False
) -> list[tuple]:
    """(group, candidates to measure, its record or None) for each group with something to measure,
    the most work first (I*J*K over the group's kernels; a run with a time limit then reorders them by
    their default tile's measured time, :func:`slowest_first`). A recorded group is measured again
    only for candidates its record has neither timed nor rejected (added by a newer inferx_edge), with
    its default first again as the reference for outputs; groups keyed in ``anew`` are measured in full."""
    from inferx_edge.compiler.cuda import tile_candidates

    plans = []
    for g in sorted(groups, key=lambda g: -math.prod(g.extents) * len(g.kernels)):
        cands = tile_candidates(g.extents, sm_count, g.input_padded, **g.shape_options(), deep_stages=deep_stages)
        rec = {} if g.key in anew else data["groups"].get(g.key, {})
        if _older_kernels(rec):
            rec = {}
        if not rec.get("best"):
            plans.append((g, cands, None))
            continue
        seen = set(rec.get("us", {})) | set(rec.get("errors", {}))
        new = [c for c in cands[1:] if c.text() not in seen]
        if new:
            plans.append((g, [cands[0], *new], rec))
    return plans


def _measure_group(group: TileGroup, cands, futs, gpu, repeat: int, min_repeat_ms: int) -> dict:
    """Time each compiled candidate; the default (first) gives the reference outputs."""
    host_args = random_args(group.func, seed=0)
    rec = {
        "kernels": group.kernels,
        "extents": group.extents,
        # what else the tile rule and the candidates depend on: lets a recorded group be scored
        # against another default-tile rule later (scripts/tile_survey.py)
        "shape": {"input_padded": group.input_padded, **group.shape_options()},
        "default": cands[0].text(),
        "kernel_version": KERNEL_VERSION,
        "us": {},
        "errors": {},
    }
    reference = None
    for cfg, fut in zip(cands, futs):
        text = cfg.text()
        try:
            path = fut.result()
            if path is None:
                rec["errors"][text] = "tile does not apply to this kernel"
                continue
            try:
                seconds, after = gpu.measure(path, host_args, repeat, min_repeat_ms)
            finally:
                delete_library(path)  # timed: its library is not needed
        except Exception as exc:  # a candidate that fails to compile or run is recorded, not fatal
            rec["errors"][text] = (
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}"
            )
            continue
        if reference is None:
            if text != rec["default"]:
                rec["errors"]["reference"] = "the default tile failed; outputs compared with the first that ran"
            reference = after
        elif not _same(after, reference):
            rec["errors"][text] = "outputs differ from the default tile's"
            continue
        rec["us"][text] = round(seconds * 1e6, 3)
    if rec["us"]:
        rec["best"] = min(rec["us"], key=rec["us"].get)
    return rec


def _rows(groups: list[TileGroup], data: dict) -> list[dict]:
    rows = []
    for g in groups:
        rec = data["groups"].get(g.key, {})
        us = rec.get("us", {})
        best = rec.get("best")
        rows.append(
            {
                "group": g.key,
                "extents": g.extents,
                "kernels": len(g.kernels),
                "best": best,
                "best_us": us.get(best) if best else None,
                "default_us": us.get(rec.get("default")),
            }
        )
    return rows


def print_tile_summary(summary: TileSearchSummary, out=sys.stdout) -> None:
    print(f"{'GEMM (I x J x K)':24s} {'kernels':>7s} {'default':>10s} {'best':>10s}  tile", file=out)
    default_sum = best_sum = 0.0
    for r in summary.groups:
        d, b = r["default_us"], r["best_us"]
        if d and b:
            default_sum += d * r["kernels"]
            best_sum += b * r["kernels"]
        print(
            f"{'x'.join(map(str, r['extents'])):24s} {r['kernels']:7d} "
            f"{(f'{d:.1f} us' if d else '-'):>10s} {(f'{b:.1f} us' if b else '-'):>10s}  {r['best'] or 'unmeasured'}",
            file=out,
        )
    if best_sum:
        print(
            f"sum over measured kernels: {default_sum:.1f} us with the default tiles, {best_sum:.1f} us with the "
            f"recorded ones ({default_sum / best_sum:.2f}x); {summary.measured_now} groups measured this run, "
            f"{summary.candidates_run} candidates in {summary.seconds:.0f} s",
            file=out,
        )
