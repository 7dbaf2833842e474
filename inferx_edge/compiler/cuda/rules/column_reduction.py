"""dlight rule: softmax and norms over an axis that is not the innermost one (a detector's DFL softmax
over 16 bins of a ``(N, 16, 4, anchors)`` tensor, a LayerNorm over NCHW's channels), one thread per row
with the row's reductions in registers.

dlight's ``GeneralReduction`` gives each row a thread block and reduces across its threads: a
16-element softmax over YOLOv8n's 2.15 million rows at batch 64 took 2.99 of the model's 9.15 ms on an
H100 (275 MB in 92 GB/s; ``kernel_profile_h100_yolov8n_int8_b64.json``). Here neighbouring threads own
neighbouring rows, which are neighbouring elements along the innermost (row) axis, so each step of a
thread's serial loop over its row is one coalesced load across the warp.

The rule takes the kernel form softmax and norms lower to: every block but the last reduces over the
same row (its spatial axes) and the same reduced axes (at most :data:`MAX_COLUMN` elements); the last is elementwise over the output, which
indexes the per-row results by some of its axes (the row) and walks the reduced axes with the others.
The output's innermost axis must be a row axis (else :mod:`.row_reduction`'s warp per row is the one
that coalesces)."""

from __future__ import annotations

import math

#: rows of at most this many elements, which a thread walks serially (ConvNeXt-style channel
#: LayerNorms have 96-768; a block per row is no better for them: its loads stride across rows too)
MAX_COLUMN = 1024

#: the thread's loops over its row are unrolled up to this many elements
UNROLL_COLUMN = 64

#: and at least this many rows (threads): fewer leave the GPU idle and a block per row is no worse
MIN_COLUMN_ROWS = 4096

_THREADS = 256


def column_reduction_rows(sch, infos) -> tuple[list[int], list[int]] | None:
    """(positions of the row axes, positions of the reduced axes) among the last block's iterators for
    a kernel this rule takes, else None."""
    from tvm import tirx

    if infos is None or len(infos) < 2:
        return None
    kinds = infos[0].dom_kind()
    n_s = len(kinds) - len(kinds.lstrip("S"))
    if n_s == 0 or kinds[n_s:] != "R" * (len(kinds) - n_s):
        return None
    doms = [it.dom for it in infos[0].iters]
    if any(not isinstance(d, int) for d in doms):
        return None
    for info in infos[1:-1]:
        if info.dom_kind() != kinds or [it.dom for it in info.iters] != doms:
            return None
    last = infos[-1]
    if not last.is_injective() or "R" in last.dom_kind():
        return None
    out = sch.get(last.block_rv)
    out_vars = [iv.var for iv in out.iter_vars]
    out_doms = [it.dom for it in last.iters]
    if any(not isinstance(d, int) for d in out_doms):
        return None
    # the per-row results (max, sum; LayerNorm's sum and sum of squares from one block)
    per_row = [w.source for info in infos[:-1] for w in sch.get(info.block_rv).writes]
    rows = None
    for region in out.reads:
        if not any(region.source.same_as(b) for b in per_row):
            continue
        # an index is one of the output's iterators, or 0 on a unit axis (whose iterator normalization
        # dropped: batch 1)
        shape = [int(d) for d in region.source.shape]
        idx = [r.min for r, d in zip(region.region, shape) if not (d == 1 and isinstance(r.min, tirx.IntImm))]
        if not all(isinstance(i, tirx.Var) and any(i.same_as(v) for v in out_vars) for i in idx):
            return None
        found = [next(k for k, v in enumerate(out_vars) if v.same_as(i)) for i in idx]
        if rows is not None and found != rows:
            return None
        rows = found
    if rows is None or [out_doms[k] for k in rows] != doms[:n_s] or rows != sorted(rows):
        return None
    columns = [k for k in range(len(out_vars)) if k not in rows]
    if (
        rows[-1] != len(out_vars) - 1  # reduced axis innermost: a warp per row coalesces, not this
        or math.prod(out_doms[k] for k in columns) != math.prod(doms[n_s:])
        or math.prod(doms[n_s:]) > MAX_COLUMN
        or math.prod(doms[:n_s]) < MIN_COLUMN_ROWS
    ):
        return None
    return rows, columns


def column_reduction_rule():
    """The dlight rule (a ``GPUScheduleRule``) described in the module docstring."""
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    from inferx_edge.compiler.cuda.rules._common import _cuda_reduction_blocks

    class ColumnReduction(GPUScheduleRule):
        def apply(self, func, target, _tunable):
            prepared = _cuda_reduction_blocks(self, func, target)
            if prepared is None:
                return None
            sch, infos = prepared
            found = column_reduction_rows(sch, infos)
            if found is None:
                return None
            rows, columns = found
            loops = sch.get_loops(infos[-1].block_rv)
            sch.reorder(*[loops[k] for k in rows], *[loops[k] for k in columns])
            row = sch.fuse(*[loops[k] for k in rows]) if len(rows) > 1 else loops[rows[0]]
            bx, tx = sch.split(row, [None, _THREADS])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            unroll = math.prod(int(sch.get(loops[k]).extent) for k in columns) <= UNROLL_COLUMN
            for k in columns:
                if unroll:
                    sch.unroll(loops[k])
            for info in reversed(infos[:-1]):
                block = info.block_rv
                for i, _ in enumerate(sch.get(block).writes):
                    sch.set_scope(block, buffer_index=i, storage_scope="local")
                sch.compute_at(block, tx, preserve_unit_loops=True)
                for lp in sch.get_loops(block)[2:] if unroll else []:
                    sch.unroll(lp)
            return sch

    return ColumnReduction()
