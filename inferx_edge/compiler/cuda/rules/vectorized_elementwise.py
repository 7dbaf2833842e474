"""dlight rule: large elementwise kernels with 4-wide vector loads and stores."""

from __future__ import annotations

from inferx_edge.compiler.cuda.rules._common import _inlined_blocks

#: :func:`vectorized_elementwise_rule` takes injective kernels with at least this many elements
MIN_VECTORIZED_ELEMENTS = 1 << 16


_VECTOR = 4

#: vectors per thread for kernels whose vectors move fewer than :data:`UNROLL_BELOW_BYTES` bytes each
#: (:func:`vectorized_elementwise_rule`). Measured on H100 (``benchmarks/gpu_elementwise.py``, record
#: ``gpu_elementwise_unroll_s66``, times of 1 / 2 / 4 vectors per thread): DenseNet-121's concatenation +
#: BatchNorm + ReLU + int8 quantize at batch 64 (12 bytes a vector: 8 of fp16 in, 4 of int8 out) 100.2 / 90.9
#: / 84.5 us (56x56x224) and 23.8 / 22.6 / 22.2 us (14x14x992), an fp16 -> int8 quantize (12 bytes)
#: 58.3 / 53.1 / 54.3 us; an fp16 add + ReLU (24 bytes, at the device copy's bandwidth with one vector)
#: 102.7 / 104.1 / 104.5 us
UNROLL = 4
UNROLL_BELOW_BYTES = 16

#: a kernel picking between inputs along its innermost axis (a concatenation) walks that axis in runs
#: no input boundary splits, the runs outermost (:func:`_concat_chunk`), so a warp's vectors come from
#: one input and a pixel's run is written in one piece; only where a run holds at least
#: :data:`CHUNK_MIN_BYTES` of the narrowest dtype the kernel touches (a whole 32-byte sector). Measured
#: on H100 (``benchmarks/gpu_elementwise.py``, record ``gpu_elementwise_chunk_major_s68``, output order /
#: runs outermost, four vectors per thread): DenseNet-121's concatenation + BatchNorm + ReLU + int8 at
#: batch 64 84.1 / 76.8 us (56x56x224) and 22.1 / 16.0 us (14x14x992). End to end, int8 b64 untuned
#: (``zoo_gpu_chunk_major_{off,on}_{a,b}_s68``): DenseNet-121 19,219 / 20,707 and 19,729 / 20,700 img/s
#: (+7.7 %, +4.9 %), YOLOv8n 13,125 / 13,358 (+1.8 %), Swin-T 14,678 / 14,691 (same)
CHUNK_MAJOR = True
CHUNK_MIN_BYTES = 32


def _unroll_for(extent: int, unroll: int) -> int:
    """The largest power of two <= ``unroll`` such that ``extent`` (vectors) splits into whole blocks of
    256 threads with that many vectors each."""
    while unroll > 1 and extent % (256 * unroll):
        unroll //= 2
    return max(unroll, 1)


def _buffers(block) -> list:
    """The buffers ``block`` reads and writes, each once."""
    seen = []
    for region in [*block.reads, *block.writes]:
        if not any(region.source.same_as(b) for b in seen):
            seen.append(region.source)
    return seen


def _element_bytes(buf) -> int:
    from tvm import DataType

    return DataType(str(buf.dtype)).bits // 8


def _bytes_per_element(block, total: int) -> float:
    """Bytes a kernel of ``total`` output elements reads and writes per element: each buffer ``block``
    touches counted whole, so a concatenation's inputs add up to one read per element and a per-channel
    parameter adds next to nothing; infinite where a buffer's shape is symbolic."""
    moved = 0
    for buf in _buffers(block):
        numel = 1
        for extent in buf.shape:
            if not isinstance(extent, int) and not hasattr(extent, "value"):
                return float("inf")  # a symbolic extent: not counted as small
            numel *= int(extent)
        moved += numel * _element_bytes(buf)
    return moved / total


def _concat_chunk(block, extent: int) -> int:
    """The widest run of the innermost axis that no ``axis < start`` test in ``block``'s body splits:
    the gcd of ``extent`` and every ``start`` (DenseNet's concatenations of a 64-channel and five
    32-channel inputs: 32). ``extent`` where no such test exists."""
    from math import gcd

    from tvm import tirx

    var = block.iter_vars[-1].var
    chunk = extent
    stack = [block.body]
    while stack:  # every sub-expression of the body
        node = stack.pop()
        if isinstance(node, tirx.LT) and node.a.same_as(var) and isinstance(node.b, tirx.IntImm):
            chunk = gcd(chunk, int(node.b.value))
        for field in ("a", "b", "value", "condition", "true_value", "false_value"):
            child = getattr(node, field, None)
            if child is not None and not isinstance(child, (int, float, str)):
                stack.append(child)
        for field in ("args", "indices"):
            stack.extend(getattr(node, field, None) or [])
    return chunk


def _min_element_bytes(block) -> int:
    """Bytes of the narrowest dtype among the buffers ``block`` reads and writes."""
    return min(_element_bytes(buf) or 1 for buf in _buffers(block))


def vectorized_elementwise_rule(unroll: int | None = None, chunk_major: bool | None = None):
    """A dlight rule for large elementwise kernels (int8 quantize, casts, layout changes): each thread
    handles 4 consecutive elements of the innermost axis (16-byte fp32 loads, 4-byte int8 stores).
    dlight's fallback gives one element per thread, far below the memory bandwidth for such kernels.

    ``unroll``: vectors per thread, a block's 256 threads taking ``unroll`` consecutive runs of 256
    vectors (each run read by the block's warps in order, the loads of all runs independent, so more
    bytes are in flight per thread); fewer where the extent does not split. By default
    :data:`UNROLL` where a vector moves fewer than :data:`UNROLL_BELOW_BYTES` bytes (an fp16 -> int8
    kernel: 12), else one.

    ``chunk_major``: in a kernel picking between inputs along the innermost axis, take the runs of that
    axis between input boundaries outermost (default :data:`CHUNK_MAJOR`): the vectors of one input are
    then consecutive, so the test picking the input holds for whole warps (a thread block, mostly)
    instead of diverging inside each warp, and each input is read as one stream."""
    if unroll is not None and unroll < 1:
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
                major = CHUNK_MAJOR if chunk_major is None else chunk_major
                chunk = _concat_chunk(sch.get(block), extents[-1]) if major and outer else extents[-1]
                wide = chunk < extents[-1] and chunk * _min_element_bytes(sch.get(block)) >= CHUNK_MIN_BYTES
                if wide and chunk % _VECTOR == 0:
                    # (run, pixel, vector in run): ``run * chunk + 4 * io + lane < start`` holds for
                    # whole runs, so the test reads ``run < start / chunk``
                    cj, cr = sch.split(inner, factors=[None, chunk])
                    io, vec = sch.split(cr, factors=[None, _VECTOR])
                    sch.reorder(cj, *outer)
                    vectors = sch.fuse(cj, *outer, io)
                else:
                    io, vec = sch.split(inner, factors=[None, _VECTOR])
                    vectors = sch.fuse(*outer, io)
            else:  # the flat index: the fewest index computations
                vectors, vec = sch.split(sch.fuse(*sch.get_loops(block)), factors=[None, _VECTOR])
            per_thread = unroll
            if per_thread is None:
                small = _VECTOR * _bytes_per_element(sch.get(block), total) < UNROLL_BELOW_BYTES
                per_thread = UNROLL if small else 1
            runs = _unroll_for(total // _VECTOR, per_thread)
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
