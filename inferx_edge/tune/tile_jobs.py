"""Compiling and timing candidate tiles for the tile search (:mod:`inferx_edge.tune.tiles`): the
compile job a pool worker runs, the seeded arguments kernels are timed on, the clean-up of candidate
libraries, and the order a time-limited search measures its groups in (slowest default first)."""

from __future__ import annotations

import math
import os
import shutil
import time

import numpy as np

#: niceness added to a compile worker (once per process, see :func:`compile_candidate`)
COMPILE_NICENESS = 10
_niced = False


def compile_candidate(
    func, cfg_text: str, target, spec_name: str, cross_compiler: str | None, lower_priority: bool = True
) -> str | None:
    """Runs in a pool worker: schedule ``func`` with the tile, compile it, export a shared library.
    Returns its path, or None when the tile does not apply to the kernel. With ``lower_priority`` the
    worker (and the CUDA compiler it spawns) drops to :data:`COMPILE_NICENESS`: candidates are timed
    on a local GPU while others compile on every core, and a starved launching process puts gaps
    between kernel launches, which reads as a slow tile."""
    global _niced
    if lower_priority and not _niced:
        _niced = True
        try:
            os.nice(COMPILE_NICENESS)
        except OSError:  # not permitted here: compile at the normal priority
            pass
    from inferx_edge.compiler.compile import compile_kernel
    from inferx_edge.compiler.cuda import TileConfig, tensor_core_schedule
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.compiler.tvm_ops import tvm_op_fixes
    from inferx_edge.targets import get_target
    from inferx_edge.tune.builder import export_candidate

    import_tensor_intrinsics()
    tvm_op_fixes()
    sch = tensor_core_schedule(func, target, TileConfig.parse(cfg_text))
    if sch is None:
        return None
    lib = compile_kernel(sch.mod["main"], get_target(spec_name), target)  # exported: callable from the library
    return export_candidate(lib, "inferx_tile_", cross_compiler)


def random_args(func, seed: int) -> list[np.ndarray]:
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    rng = np.random.default_rng(seed)
    out = []
    for info in ArgInfo.from_prim_func(func):
        shape, dtype = [int(d) for d in info.shape], str(info.dtype)
        if dtype.startswith("int") or dtype.startswith("uint"):
            bound = 127 if dtype in ("int8", "uint8") else 1000
            out.append(rng.integers(-bound if dtype.startswith("int") else 0, bound + 1, shape).astype(dtype))
        else:
            out.append(rng.uniform(0.5, 1.5, shape).astype(dtype))
    return out


def discard(fut) -> None:
    """Delete the candidate library ``fut`` compiled, if it finished and left one."""
    try:
        path = fut.result(timeout=0) if fut.done() else None
    except Exception:  # failed to compile: nothing on disk
        return
    if path:
        delete_library(path)


def delete_library(path: str) -> None:
    """Delete a candidate library and the temporary folder :func:`export_candidate` made for it."""
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


#: repeats of the time evaluator when each group's default tile is timed only to order the groups
ORDER_REPEAT = 3

#: the share of a time-limited search that timing the default tiles may take (many groups behind a
#: slow RPC link); groups not timed by then follow the timed ones in work order
ORDER_SHARE = 0.25


def slowest_first(plans, compile_job, gpu, min_repeat_ms, until: float = math.inf):
    """``plans`` ordered by the time their kernels take with the default tile (the first candidate's,
    timed once per group, times the group's kernels), the slowest first, and each plan's compile job
    of that default (``compile_job(group, tile)``: a pool job returning the library's path), reused as
    its first candidate (None where it failed to compile or run: compiled again with the rest, and the
    plan goes first, its own search recording why).

    Work (I*J*K, the order of :func:`_plan`) misjudges memory-bound kernels: the grouped convolutions'
    GEMMs (16 outputs per group) came 23rd-29th of ResNeXt-50's 29 groups and 19th-30th of RegNet-Y's 39
    while taking 18-23 % of their profiled kernel time (``kernel_profile_h100_*_s63`` records), where a search
    stopped by ``--minutes`` may not reach them. Timing stops at ``until`` (a time.time()); the groups
    left follow in their order, with their defaults compiled."""
    jobs = [compile_job(g, cands[0]) for g, cands, _ in plans]
    keyed = []
    try:
        for n, ((group, cands, old), job) in enumerate(zip(plans, jobs)):
            if time.time() > until:  # out of time for ordering: work order, its compile job kept as is
                keyed.append((1, 0.0, n, (group, cands, old), job))
                continue
            path, seconds = None, math.inf
            try:
                path = job.result()
                if path is not None:
                    args = random_args(group.func, seed=0)
                    seconds = gpu.measure(path, args, ORDER_REPEAT, min_repeat_ms)[0]
            except Exception:  # noqa: BLE001 - a default that fails is searched first; its search says why
                if path is not None:
                    delete_library(path)
                path = None
            keyed.append((0, -seconds * len(group.kernels), n, (group, cands, old), job if path else None))
    except BaseException:  # interrupted: no compiled default is left behind
        for job in jobs:
            discard(job)
        raise
    keyed.sort(key=lambda k: k[:3])
    return [k[3] for k in keyed], [k[4] for k in keyed]
