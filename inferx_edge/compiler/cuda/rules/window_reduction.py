"""dlight rule: window reductions too large to unroll (grouped convolutions, large pooling windows) over
many outputs: a register tile of outputs per thread, the reduction a serial loop in the thread.

dlight's reduction rules give such a kernel one thread block per output and reduce its 100-odd
elements across the block's threads, most of them idle: RegNet's grouped convolutions took 69 ms per
batch-64 call that way. Here a thread accumulates ``pixels x channels`` outputs (consecutive along the
two innermost output axes: NHWC's W and C) in registers, so each input value it loads serves its
channels and each weight its pixels."""

from __future__ import annotations

import math
import re

from inferx_edge.compiler.cuda.rules._common import _inlined_blocks, sliding_vars
from inferx_edge.compiler.cuda.rules.small_reduction import MIN_SMALL_REDUCTION_OUTPUTS, SMALL_REDUCTION

#: :func:`window_reduction_rule` takes reductions of more than :data:`SMALL_REDUCTION` and at most this
#: many elements per output (with at least :data:`MIN_SMALL_REDUCTION_OUTPUTS` outputs)
MAX_WINDOW_REDUCTION = 4096

#: the register tile shrinks (pixels first) until the kernel has at least this many threads
MIN_WINDOW_THREADS = 32768

#: largest tile along each of the two innermost output axes
WINDOW_TILE = 4

_THREADS = 128


def mixes_window(block) -> bool:
    """Whether an index of one of ``block``'s reads combines an output and a reduction variable
    (:func:`sliding_vars`): convolutions and pooling, not row reductions (softmax, norms, means), whose
    threads would stride across rows."""
    return bool(sliding_vars(block))


def _tile(extent: int) -> int:
    return next(t for t in (WINDOW_TILE, 2, 1) if extent % t == 0)


def window_tile(s_extents: list[int]) -> tuple[int, int]:
    """(pixels, channels) per thread for a kernel with these output extents (outermost first): up to
    :data:`WINDOW_TILE` each where they divide the two innermost extents, shrunk (pixels first) while
    the kernel would have fewer than :data:`MIN_WINDOW_THREADS` threads."""
    outputs = math.prod(s_extents)
    channels = _tile(s_extents[-1])
    pixels = _tile(s_extents[-2]) if len(s_extents) > 1 else 1
    while pixels * channels > 1 and outputs // (pixels * channels) < MIN_WINDOW_THREADS:
        if pixels > 1:
            pixels //= 2
        else:
            channels //= 2
    return pixels, channels


def window_reduction_rule():
    """A dlight rule for :func:`mixes_window` reductions of (:data:`SMALL_REDUCTION`,
    :data:`MAX_WINDOW_REDUCTION`] elements per output and at least :data:`MIN_SMALL_REDUCTION_OUTPUTS`
    outputs: :func:`window_tile` outputs per thread, accumulated in registers over a serial reduction
    loop (its innermost axis unrolled), the fused epilogue applied in the thread."""
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
    from tvm.s_tir.schedule import ScheduleError

    class WindowReduction(GPUScheduleRule):
        def apply(self, func, target, _tunable):
            found = _inlined_blocks(self, func, target)
            if found is None:
                return None
            sch, infos = found
            reductions = [b for b in infos if "R" in b.dom_kind()]
            if len(reductions) != 1 or infos.index(reductions[0]) != 0:  # unfused producers: not ours
                return None
            if any(not b.is_injective() for b in infos[1:]):
                return None
            red = reductions[0]
            kinds = red.dom_kind()
            if not re.fullmatch(r"S+R+", kinds) or any(not isinstance(it.dom, int) for it in red.iters):
                return None
            s_ext = [it.dom for it in red.iters if it.kind == "S"]
            r_ext = math.prod(it.dom for it in red.iters if it.kind == "R")
            if not SMALL_REDUCTION < r_ext <= MAX_WINDOW_REDUCTION or math.prod(s_ext) < MIN_SMALL_REDUCTION_OUTPUTS:
                return None
            block = red.block_rv
            if not mixes_window(sch.get(block)):
                return None
            try:
                return self._schedule(sch, block, kinds, s_ext, [b.block_rv for b in infos[1:]])
            except ScheduleError:
                return None

        @staticmethod
        def _schedule(sch, block, kinds, s_ext, epilogue):
            pixels, channels = window_tile(s_ext)
            loops = sch.get_loops(block)
            s_loops = [lp for lp, k in zip(loops, kinds) if k == "S"]
            r_loops = [lp for lp, k in zip(loops, kinds) if k == "R"]
            c_out, c_in = sch.split(s_loops[-1], [None, channels])
            if len(s_loops) > 1:
                p_out, p_in = sch.split(s_loops[-2], [None, pixels])
                outer, inner = [*s_loops[:-2], p_out, c_out], [p_in, c_in]
            else:
                outer, inner = [c_out], [c_in]
            sch.reorder(*outer, *r_loops, *inner)
            bx, tx = sch.split(sch.fuse(*outer), [None, _THREADS])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            if epilogue:
                sch.set_scope(block, 0, "local")  # the accumulators never leave the thread
            else:
                epilogue = [sch.cache_write(block, 0, "local")]
            for consumer in reversed(epilogue):
                sch.reverse_compute_at(consumer, tx)
            if int(sch.get(r_loops[-1]).extent) <= 32:
                sch.unroll(r_loops[-1])
            for lp in inner:
                sch.unroll(lp)
            sch.decompose_reduction(block, r_loops[0])
            return sch

    return WindowReduction()
