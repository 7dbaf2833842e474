"""dlight rule: large elementwise kernels with 4-wide vector loads and stores."""

from __future__ import annotations

from inferx_edge.compiler.cuda.rules._common import _inlined_blocks

#: :func:`vectorized_elementwise_rule` takes injective kernels with at least this many elements
MIN_VECTORIZED_ELEMENTS = 1 << 16


_VECTOR = 4


def vectorized_elementwise_rule():
    """A dlight rule for large elementwise kernels (int8 quantize, casts, layout changes): each thread
    handles 4 consecutive elements of the innermost axis (16-byte fp32 loads, 4-byte int8 stores).
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
            if extents[-1] % _VECTOR or total % (256 * _VECTOR) or total < MIN_VECTORIZED_ELEMENTS:
                return None
            block = infos[0].block_rv
            if "if_then_else" in str(sch.get(block).body):
                # picks between inputs (a concatenation, a padding): the innermost axis split for the
                # lanes, so its index stays ``4 * io + lane`` and a test on it (``< start``, a multiple
                # of 4) holds for the whole vector
                *outer, inner = sch.get_loops(block)
                io, vec = sch.split(inner, factors=[None, _VECTOR])
                bx, tx = sch.split(sch.fuse(*outer, io), factors=[None, 256])
            else:  # the flat index: the fewest index computations
                bx, tx, vec = sch.split(sch.fuse(*sch.get_loops(block)), factors=[None, 256, _VECTOR])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            sch.vectorize(vec)
            return sch

    return VectorizedElementwise()
