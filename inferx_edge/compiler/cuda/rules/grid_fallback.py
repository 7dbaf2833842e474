"""dlight rule after dlight's ``Fallback``: the same generic schedule with the outer spatial axes on
``blockIdx.y`` instead of fused with the inner ones into one thread index.

It only schedules kernels whose ``Fallback`` schedule failed code generation (the build hands such a
kernel on, :func:`~inferx_edge.compiler.compile.compile_variant`). One such failure: ``Fallback`` fuses
every output axis into one index, and for MViTv2-S's relative-position update (a 2 x 6273 x 1569
slice-assigned attention map) TVM's buffer flattening then made an int32 literal of 7,716,392,208 and
stopped ("Literal value ... exceeds range of int32"). Here the smallest suffix of spatial axes with at
least one thread block's worth of elements is fused onto ``blockIdx.x`` / ``threadIdx.x`` and the rest
onto ``blockIdx.y``, so no index divides the whole output; reductions stay serial per thread, as in
``Fallback``."""

from __future__ import annotations

import math

#: CUDA's limit on ``gridDim.y``
MAX_GRID_Y = 65535


def grid_fallback_rule():
    """The dlight rule (a ``GPUScheduleRule``) described in the module docstring. A kernel it cannot
    split (one spatial axis, outer axes beyond :data:`MAX_GRID_Y`, symbolic extents) gets
    ``Fallback``'s own schedule, so a kernel failing under both is reported under this rule's name."""
    from tvm import s_tir, tirx
    from tvm.s_tir import dlight as dl
    from tvm.s_tir.dlight import base
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    def split(sch, info, threads: int) -> bool:
        """``info``'s block on a 2-D grid (see the module docstring); False where it cannot be."""
        block = info.block_rv
        loops = sch.get_loops(block)
        kinds = info.dom_kind()
        if len(kinds) != len(loops) or any(sch.get(loop).thread_binding is not None for loop in loops):
            return False
        spatial = [loop for loop, kind in zip(loops, kinds, strict=True) if kind == "S"]
        extents = [sch.get(loop).extent for loop in spatial]
        if len(spatial) < 2 or not all(isinstance(e, tirx.IntImm) for e in extents):
            return False
        sizes = [int(e) for e in extents]
        inner = len(sizes) - 1  # the smallest suffix with a thread block's worth of elements...
        while inner > 1 and math.prod(sizes[inner:]) < threads:
            inner -= 1
        while inner > 0 and math.prod(sizes[:inner]) > MAX_GRID_Y:  # ...and a grid CUDA launches
            inner -= 1
        if inner == 0:
            return False
        reduce = [loop for loop, kind in zip(loops, kinds, strict=True) if kind == "R"]
        sch.reorder(*spatial, *[loop for loop, kind in zip(loops, kinds, strict=True) if kind != "S"])
        outer = sch.fuse(*spatial[:inner]) if inner > 1 else spatial[0]
        rest = sch.fuse(*spatial[inner:]) if len(spatial) - inner > 1 else spatial[inner]
        bx, tx = sch.split(rest, factors=[None, threads])
        sch.bind(outer, "blockIdx.y")
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        if reduce:
            sch.decompose_reduction(block, reduce[0])
        return True

    class GridFallback(GPUScheduleRule):
        def apply(self, func, target, tunable):
            if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
                return None
            sch = s_tir.Schedule(func)
            infos = normalize_prim_func(sch)
            if infos is not None:
                infos = base.try_inline(sch, infos)
                threads = base.max_threads_per_block(target)
                if all(split(sch, info, threads) for info in infos):
                    return sch
            return dl.gpu.Fallback().apply(func, target, tunable)

    return GridFallback()
