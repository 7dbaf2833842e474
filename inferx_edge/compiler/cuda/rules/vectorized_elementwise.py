"""dlight rule: large elementwise kernels with 4-wide vector loads and stores."""

from __future__ import annotations

from inferx_edge.compiler.cuda.rules._common import _inlined_blocks

#: :func:`vectorized_elementwise_rule` takes injective kernels with at least this many elements
MIN_VECTORIZED_ELEMENTS = 1 << 16


_VECTOR = 4

#: lanes for kernels whose streamed tensors hold elements of at most 2 bytes (fp16 in, int8 out):
#: 16-byte loads and 8-byte stores instead of 8- and 4-byte ones
_NARROW_VECTOR = 8


def _lanes(block) -> int:
    """:data:`_NARROW_VECTOR` where every tensor ``block`` reads or writes of rank 2 or more has
    elements of at most 2 bytes (per-channel vectors and scalars, which stay in cache, may be wider)
    and every last axis longer than one is a multiple of it (so a concatenation's or a padding's starts
    along the innermost axis are too), else :data:`_VECTOR`."""
    for buf in [r.source for r in (*block.reads, *block.writes)]:
        if len(buf.shape) >= 2 and buf.dtype.bits * buf.dtype.lanes > 16:
            return _VECTOR
        last = buf.shape[-1] if len(buf.shape) else 1
        if not isinstance(last, int) and not hasattr(last, "value"):
            return _VECTOR
        if int(last) > 1 and int(last) % _NARROW_VECTOR:
            return _VECTOR
    return _NARROW_VECTOR


def vectorized_elementwise_rule():
    """A dlight rule for large elementwise kernels (int8 quantize, casts, layout changes): each thread
    handles 4 consecutive elements of the innermost axis (16-byte fp32 loads, 4-byte int8 stores), 8
    where the streamed tensors are fp16 / int8 (:func:`_lanes`: 16-byte fp16 loads).
    dlight's fallback gives one element per thread, far below the memory bandwidth for such kernels."""
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
            block = infos[0].block_rv
            lanes = _lanes(sch.get(block))
            if extents[-1] % lanes or total % (256 * lanes):
                lanes = _VECTOR
            if extents[-1] % lanes or total % (256 * lanes) or total < MIN_VECTORIZED_ELEMENTS:
                return None
            if "if_then_else" in str(sch.get(block).body):
                # picks between inputs (a concatenation, a padding): the innermost axis split for the
                # lanes, so its index stays ``lanes * io + lane`` and a test on it (``< start``, a
                # multiple of the lanes) holds for the whole vector
                *outer, inner = sch.get_loops(block)
                io, vec = sch.split(inner, factors=[None, lanes])
                bx, tx = sch.split(sch.fuse(*outer, io), factors=[None, 256])
            else:  # the flat index: the fewest index computations
                bx, tx, vec = sch.split(sch.fuse(*sch.get_loops(block)), factors=[None, 256, lanes])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            sch.vectorize(vec)
            return sch

    return VectorizedElementwise()
