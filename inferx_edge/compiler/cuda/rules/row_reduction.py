"""dlight rule: row reductions with short rows (softmax, LayerNorm, RMSNorm over at most
:data:`MAX_ROW` elements) over many rows, one warp per row and several rows per thread block.

dlight's ``GeneralReduction`` gives every row a 256-thread block and reduces across it through shared
memory, once per reduction of the kernel (softmax: max, then sum): a 197-element attention row leaves
59 of the 256 threads idle and spends the kernel in block-wide synchronisation (ViT-B/16's batch-64
softmax moved 15 MB in 2.7 ms: 65 GB/s). Here 32 threads own a row (each reads every 32nd element, so a
warp's loads stay coalesced) and the reductions lower to warp shuffles; the block holds
:data:`ROWS_PER_BLOCK` rows (fewer where the row count is not a multiple) so that it is not one warp.

The rule takes the kernel shape ``GeneralReduction`` handles in its common form: every block but the
last reduces over the same trailing axes, the last is elementwise over the full row (the normalised
output). Any other form returns None and goes on to dlight's rules."""

from __future__ import annotations

import math

#: rows of at most this many elements (32 per thread) take one warp each; longer rows keep dlight's
#: block per row
MAX_ROW = 1024

#: and only kernels with at least this many rows (fewer leave most of the GPU idle either way, and
#: dlight's wider blocks finish a single long row sooner)
MIN_ROWS = 128

#: rows (warps) per thread block, the largest of these that divides the row count
ROWS_PER_BLOCK = (8, 4, 2, 1)

_WARP = 32


def row_reduction_extents(infos) -> tuple[list[int], int] | None:
    """(the iteration extents, how many of them lead as row axes) of a kernel this rule takes, else None."""
    if infos is None or len(infos) < 2:
        return None
    dom_kind = infos[0].dom_kind()
    leading = len(dom_kind) - len(dom_kind.lstrip("S"))
    trailing = len(dom_kind) - len(dom_kind.rstrip("R"))
    if leading == 0 or trailing == 0 or leading + trailing != len(dom_kind):
        return None
    if any(info.dom_kind() != dom_kind for info in infos[1:-1]):
        return None
    last = infos[-1]
    if not last.is_injective() or len(last.dom_kind()) != len(dom_kind) or "R" in last.dom_kind():
        return None
    doms = [it.dom for it in infos[0].iters]
    if any(not isinstance(d, int) for d in doms):
        return None
    last_doms = [it.dom for it in last.iters]
    if last_doms != doms:  # the output must walk the same row axes in the same order
        return None
    if math.prod(doms[leading:]) > MAX_ROW or math.prod(doms[:leading]) < MIN_ROWS:
        return None
    return doms, leading


def _flatten(strides: list[int]):
    """An index function mapping a row-major index with these strides to one flat index."""

    def flat(*idx):
        return [sum(x * st for x, st in zip(idx, strides))]

    return flat


def _unroll(sch, loop) -> None:
    sch.annotate(loop, ann_key="pragma_auto_unroll_max_step", ann_val=256)
    sch.annotate(loop, ann_key="pragma_unroll_explicit", ann_val=1)


def row_reduction_rule():
    """The dlight rule (a ``GPUScheduleRule``) described in the module docstring."""
    from tvm import tirx
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    from inferx_edge.compiler.cuda.rules._common import _cuda_reduction_blocks

    class RowReduction(GPUScheduleRule):
        def apply(self, func, target, _tunable):
            prepared = _cuda_reduction_blocks(self, func, target)
            if prepared is None:
                return None
            sch, infos = prepared
            found = row_reduction_extents(infos)
            if found is None:
                return None
            doms, leading = found
            rows = math.prod(doms[:leading])
            per_block = next(r for r in ROWS_PER_BLOCK if rows % r == 0)
            trailing = len(doms) - leading
            if leading > 1:
                # one row axis in every block (below), so the row a warp owns is ``bx * per_block + ty``,
                # an affine index each reduction placed under ``ty`` covers exactly; first the per-row
                # results (max, sum, mean) go to 1-d buffers indexed by that row
                for info in infos[:-1]:
                    for i, region in enumerate(sch.get(info.block_rv).writes):
                        shape = [int(d) for d in region.source.shape]
                        if math.prod(shape) != rows:
                            return None
                        strides = [math.prod(shape[k + 1 :]) for k in range(len(shape))]
                        flat = tirx.IndexMap.from_func(_flatten(strides), ndim=len(shape))
                        sch.transform_layout(info.block_rv, ("write", i), flat)

                def fuse_rows(*iters):
                    row = iters[0]
                    for it, d in zip(iters[1:leading], doms[1:leading]):
                        row = row * d + it
                    return [row, *iters[leading:]]

                index_map = tirx.IndexMap.from_func(fuse_rows, ndim=len(doms))
                for info in infos:
                    sch.transform_block_layout(info.block_rv, index_map)
            # every block now has one row axis, then the row's elements
            row, *elements = sch.get_loops(infos[-1].block_rv)
            bx, ty = sch.split(row, [None, per_block])
            steps, tx = sch.split(sch.fuse(*elements) if len(elements) > 1 else elements[0], [None, _WARP])
            sch.reorder(tx, steps)
            sch.bind(bx, "blockIdx.x")
            sch.bind(ty, "threadIdx.y")
            sch.bind(tx, "threadIdx.x")
            _unroll(sch, steps)
            for info in reversed(infos[:-1]):
                block = info.block_rv
                for i, _ in enumerate(sch.get(block).writes):
                    sch.set_scope(block, buffer_index=i, storage_scope="local")
                sch.compute_at(block, ty, preserve_unit_loops=True)
                red = sch.get_loops(block)[-trailing:]
                r = sch.fuse(*red) if len(red) > 1 else red[0]
                r, rtx = sch.split(r, [None, _WARP])
                sch.reorder(rtx, r)
                sch.bind(rtx, "threadIdx.x")
                _unroll(sch, r)
            return sch

    return RowReduction()
