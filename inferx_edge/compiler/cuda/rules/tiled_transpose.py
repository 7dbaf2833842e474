"""dlight rule: layout changes that move the innermost axis (NHWC -> NCHW at a detector's output, with
the concatenations fused in) through a shared-memory tile, so that both the loads and the stores of a
warp are contiguous.

dlight's fallback (and :mod:`.vectorized_elementwise`) walk the output in order: neighbouring threads
write neighbouring pixels and read them a whole channel row apart. YOLOv8n's head (three NHWC feature
maps, 144 channels, concatenated and transposed into ``(N, 144, 8400)``) moved 619 MB in 0.65 ms that
way at batch 64 on an H100 (957 GB/s; ``kernel_profile_h100_yolov8n_int8_b64.json``). Here a thread
block owns a :data:`TILE` x :data:`TILE` tile of (input-contiguous axis, output-innermost axis): its
threads gather the tile along the input's contiguous axis into shared memory (rows padded by one
element against bank conflicts) and store it along the output's."""

from __future__ import annotations

import math

#: the tile's side along each of the two axes
TILE = 32

#: the two axes must each be at least this long (a 3-channel image is not worth a tile)
MIN_TRANSPOSE_EXTENT = 16

#: and the output at least this many elements
MIN_TRANSPOSE_ELEMENTS = 1 << 16

_THREADS = 256


def transposed_axes(block) -> tuple[int, int] | None:
    """(position of the axis that the inputs' innermost indices walk with unit stride, position of the
    output's innermost axis) among ``block``'s iterators when its reads are transposed — an input's
    innermost index follows another output axis and the output's innermost axis indexes an outer
    dimension — and none is read along the output's innermost axis (the tile would make that read
    strided); else None. Reads that do not depend on the output's innermost axis (broadcasts) are
    left as they are."""
    import tvm.sym
    from tvm import tirx
    from tvm.tirx.analysis import undefined_vars

    ivars = [iv.var for iv in block.iter_vars]
    if len(ivars) < 2 or any(iv.iter_type != tirx.IterVar.DataPar for iv in block.iter_vars):
        return None
    inner = ivars[-1]
    analyzer = tvm.sym.Analyzer()
    found = set()
    for region in block.reads:
        if not region.region:
            continue
        used = undefined_vars(region.region[-1].min)
        if any(inner.same_as(u) for u in used):
            return None  # read along the output's innermost axis: not a transpose
        if not any(any(inner.same_as(u) for u in undefined_vars(r.min)) for r in region.region[:-1]):
            continue  # does not follow the output's innermost axis at all
        follows = [k for k, v in enumerate(ivars) if any(v.same_as(u) for u in used)]
        if len(follows) != 1 or not isinstance(
            analyzer.simplify(region.region[-1].min - ivars[follows[0]]), tirx.IntImm
        ):
            return None  # innermost index not unit stride along one output axis
        found.add(follows[0])
    return (found.pop(), len(ivars) - 1) if len(found) == 1 else None


def _schedule_output(sch, block) -> bool:
    """Tile one output block (False: it does not have the form, nothing changed)."""
    from tvm import tirx

    stmt = sch.get(block)
    found = transposed_axes(stmt)
    if found is None or len(stmt.writes) != 1:
        return False
    a, b = found
    ivars = [iv.var for iv in stmt.iter_vars]
    doms = [iv.dom.extent for iv in stmt.iter_vars]
    if any(not isinstance(d, tirx.IntImm) for d in doms):
        return False
    doms = [int(d) for d in doms]
    # the output must be indexed by its iterators in order (0 on a unit axis normalization dropped)
    out_shape = [int(d) for d in stmt.writes[0].source.shape]
    write = [(dim, r.min) for dim, (r, d) in enumerate(zip(stmt.writes[0].region, out_shape))]
    write = [(dim, m) for dim, m in write if not (out_shape[dim] == 1 and isinstance(m, tirx.IntImm))]
    if len(write) != len(ivars) or any(not m.same_as(v) for (_, m), v in zip(write, ivars)):
        return False
    a_dim = write[a][0]  # the output buffer's dimension for axis a
    if min(doms[a], doms[b]) < MIN_TRANSPOSE_EXTENT or math.prod(doms) < MIN_TRANSPOSE_ELEMENTS:
        return False
    loops = sch.get_loops(block)
    if len(loops) != len(ivars):
        return False
    ao, ai = sch.split(loops[a], [None, TILE])
    bo, bi = sch.split(loops[b], [None, TILE])
    others = [lp for k, lp in enumerate(loops) if k not in (a, b)]
    sch.reorder(*others, ao, bo, ai, bi)
    bx = sch.fuse(*others, ao, bo)
    sch.bind(bx, "blockIdx.x")
    store = sch.cache_write(block, 0, "shared")
    sch.storage_align(block, 0, axis=a_dim, factor=TILE, offset=1)
    sch.reverse_compute_at(store, bx)
    # gather: neighbouring threads take neighbouring elements along the input's contiguous axis
    sch.reorder(bi, ai)
    steps, tx = sch.split(sch.fuse(bi, ai), [None, _THREADS])
    sch.bind(tx, "threadIdx.x")
    sch.unroll(steps)
    # store: along the output's innermost axis
    tile = sch.get_loops(store)[1:]
    steps, tx = sch.split(sch.fuse(*tile) if len(tile) > 1 else tile[0], [None, _THREADS])
    sch.bind(tx, "threadIdx.x")
    sch.unroll(steps)
    return True


def tiled_transpose_rule():
    """The dlight rule (a ``GPUScheduleRule``) described in the module docstring: takes an injective
    kernel when every output block it computes has a transposed read."""
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
    from tvm.s_tir.schedule import ScheduleError

    from inferx_edge.compiler.cuda.rules._common import _inlined_blocks

    class TiledTranspose(GPUScheduleRule):
        def apply(self, func, target, _tunable):
            if target.kind.name != "cuda":
                return None
            found = _inlined_blocks(self, func, target)
            if found is None:
                return None
            sch, infos = found
            if not infos or any(not info.is_injective() for info in infos):
                return None
            params = list(sch.mod["main"].params)  # TVM 0.27's TIR: buffers
            writes = [w.source for info in infos for w in sch.get(info.block_rv).writes]
            if any(not any(w.same_as(p) for p in params) for w in writes):
                return None  # an intermediate block left over: not ours
            try:
                for info in infos:  # each declines (None) unless it reads transposed: see _schedule_output
                    if not _schedule_output(sch, info.block_rv):
                        return None
            except ScheduleError:
                return None
            return sch

    return TiledTranspose()
