"""Tuning records applied to a module at build time: MetaSchedule's schedules and the tile records of
the tensor-core kernels (:mod:`inferx_edge.records`), and the kernel groups those records are keyed by.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferx_edge.compiler.prim_funcs import is_scheduled, unscheduled
from inferx_edge.records import metaschedule as msdb
from inferx_edge.records.tiles import load_tiles, tile_key


def legalized_and_fused(mod, cuda: bool, sm_count: int | None = None):
    """``mod`` legalized and fused into the kernels a build compiles: for CUDA by the CUDA pipeline's own
    passes (:func:`~inferx_edge.compiler.cuda.pipeline.fusion_passes`: squeeze-excite gates kept out of
    GEMM kernels, long reductions split for a GPU of ``sm_count`` SMs), for CPUs by TVM's. The tuner
    measures these kernels and a tuned build applies its records to them: both must see the kernels
    the untuned build compiles, or a tuned build loses those rules (a tuned RegNet-Y-800MF ran 17 %
    slower than its untuned build when both used TVM's plain fusion)."""
    import tvm
    from tvm import relax

    if not cuda:
        return relax.get_pipeline("zero")(mod)
    from inferx_edge.compiler.cuda.pipeline import fusion_passes

    return tvm.transform.Sequential(fusion_passes(sm_count))(mod)


def apply_tuning(mod, target, work_dir: Path, sm_count: int | None = None) -> tuple[Any, int, int, int]:
    """Legalize + fuse (:func:`legalized_and_fused`; ``sm_count``: a CUDA target's SMs), then give each
    kernel the best schedule ``work_dir``'s MetaSchedule database holds, and each int8 tensor-core
    kernel without one the tile its int8 tile records name (:mod:`inferx_edge.records.tiles`).

    Returns the module and (kernels with a tuned schedule, kernels with a recorded tile, kernels in total).
    Hand-scheduled kernels (already ``tirx.is_scheduled``, e.g. the fused attention kernel) are not
    counted as tuned.
    """
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics

    mod = legalized_and_fused(mod, target.kind.name == "cuda", sm_count)
    hand_scheduled = set(_scheduled(mod))
    if msdb.has_database(work_dir):
        import_tensor_intrinsics()  # traces may replay tensorize steps
        # Read a snapshot: a tuning run may be appending to the database right now (a torn last line).
        with tempfile.TemporaryDirectory(prefix="inferx_edge-db-") as snap:
            msdb.snapshot(work_dir, Path(snap))
            with target, ms.database.JSONDatabase(work_dir=snap):
                mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
    mod, tiled = annotate_tiles(mod, work_dir)
    total = sum(1 for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    tuned = len(set(_scheduled(mod)) - hand_scheduled)
    return mod, tuned, tiled, total


def _scheduled(mod):
    """Names of ``mod``'s PrimFuncs that carry a schedule (``tirx.is_scheduled``)."""
    for gv, f in mod.functions_items():
        if is_scheduled(f):
            yield gv.name_hint


@dataclass
class TileGroup:
    """Kernels sharing a tile key: one is measured, all get its tile."""

    key: str
    extents: list[int]
    input_padded: bool  # the convolution pads its input (predicated activation loads with any tile)
    func: object  # the first kernel's PrimFunc
    kernels: list[str] = field(default_factory=list)
    weights_along_k: bool = True  # 16-byte weight loads apply (compiler.cuda.analysis.weights_along_k)
    int8: bool = True  # int8 operands (fp16 ones do not get the 8-warp tiles: too much shared memory)
    batch: int = 1  # GEMMs per kernel (attention's batch x heads, a grouped convolution's groups)

    def shape_options(self) -> dict:
        """What :func:`~inferx_edge.compiler.cuda.tile_candidates` takes about the kernel beyond its extents."""
        return {"weights_along_k": self.weights_along_k, "int8": self.int8, "batch": self.batch}


def tile_groups(mod) -> list[TileGroup]:
    """The tensor-core kernels (int8 and fp16) of a legalized, fused module (not yet scheduled), by
    tile key, in module order."""
    from inferx_edge.compiler.cuda import gemm_batch, input_padded, is_int8_gemm, tile_gemm_extents, weights_along_k

    groups: dict[str, TileGroup] = {}
    for gv, func in mod.functions_items():
        if not unscheduled(func):
            continue
        extents = tile_gemm_extents(func)
        if extents is None:
            continue
        script = func.script()
        key = tile_key(script)
        if key not in groups:
            groups[key] = TileGroup(
                key, list(extents), input_padded(func, script), func, [], weights_along_k(func), is_int8_gemm(func),
                gemm_batch(func),
            )  # fmt: skip
        groups[key].kernels.append(gv.name_hint)
    return list(groups.values())


def annotate_tiles(mod, work_dir: Path) -> tuple[object, int]:
    """Give each tensor-core kernel of ``mod`` (legalized and fused) the tile ``work_dir`` records
    for its tile key (when the recorded GEMM extents match); returns the module and how many kernels
    got one."""
    from inferx_edge.compiler.cuda import TILE_ATTR, TileConfig

    groups = load_tiles(work_dir, repair=False).get("groups", {})  # build reads; only tune repairs
    if not groups:
        return mod, 0
    done = 0
    for group in tile_groups(mod):
        rec = groups.get(group.key)
        if not rec or not rec.get("best") or rec.get("extents") != group.extents:
            continue
        TileConfig.parse(rec["best"])  # a bad record fails here, naming the file's text
        for name in group.kernels:
            gv = mod.get_global_var(name)
            mod[gv] = mod[gv].with_attr(TILE_ATTR, rec["best"])
            done += 1
    return mod, done
