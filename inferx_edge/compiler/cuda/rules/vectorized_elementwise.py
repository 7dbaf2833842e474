"""dlight rule: large elementwise kernels with 4-wide vector loads and stores."""

from __future__ import annotations

from inferx_edge.compiler.cuda.rules._common import _inlined_blocks

#: :func:`vectorized_elementwise_rule` takes injective kernels with at least this many elements
MIN_VECTORIZED_ELEMENTS = 1 << 16


_VECTOR = 4

#: vectors per thread (:func:`vectorized_elementwise_rule`'s default ``unroll``)
UNROLL = 1


def _unroll_for(extent: int, unroll: int) -> int:
    """The largest power of two <= ``unroll`` such that ``extent`` (vectors) splits into whole blocks of
    256 threads with that many vectors each."""
    while unroll > 1 and extent % (256 * unroll):
        unroll //= 2
    return max(unroll, 1)


def vectorized_elementwise_rule(unroll: int | None = None):
    """A dlight rule for large elementwise kernels (int8 quantize, casts, layout changes): each thread
    handles 4 consecutive elements of the innermost axis (16-byte fp32 loads, 4-byte int8 stores).
    dlight's fallback gives one element per thread, far below the memory bandwidth for such kernels.

    ``unroll`` (default :data:`UNROLL`): vectors per thread, a block's 256 threads taking ``unroll``
    consecutive runs of 256 vectors (each run read by the block's warps in order, the loads of all
    runs independent, so more bytes are in flight per thread); fewer where the extent does not split."""
    if unroll is None:
        unroll = UNROLL
    if unroll < 1:
        raise ValueError(f"unroll must be >= 1 (got {unroll})")
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    class VectorizedElementwise(GPUScheduleRule):
        def apply(self, func, target, _tunable):
            found = _inlined_blocks(self, func, target)
            if found is None:
                return None
            sch, infos = found
            if len(infos) != 1 or not infos[0].is_injective():
                return None
            extents = [it.dom for it in infos[0].iters]
            if not extents or not all(isinstance(e, int) for e in extents):
                return None
            total = 1
            for e in extents:
                total *= e
            if extents[-1] % _VECTOR or total % (256 * _VECTOR) or total < MIN_VECTORIZED_ELEMENTS:
                return None
            block = infos[0].block_rv
            if "if_then_else" in str(sch.get(block).body):
                # picks between inputs (a concatenation, a padding): the innermost axis split for the
                # lanes, so its index stays ``4 * io + lane`` and a test on it (``< start``, a multiple
                # of 4) holds for the whole vector
                *outer, inner = sch.get_loops(block)
                io, vec = sch.split(inner, factors=[None, _VECTOR])
                vectors = sch.fuse(*outer, io)
            else:  # the flat index: the fewest index computations
                vectors, vec = sch.split(sch.fuse(*sch.get_loops(block)), factors=[None, _VECTOR])
            runs = _unroll_for(total // _VECTOR, unroll)
            if runs > 1:
                bx, u, tx = sch.split(vectors, factors=[None, runs, 256])
                sch.reorder(bx, tx, u)
                sch.unroll(u)
            else:
                bx, tx = sch.split(vectors, factors=[None, 256])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            sch.vectorize(vec)
            return sch

    return VectorizedElementwise()
