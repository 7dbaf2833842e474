"""dlight rule: reductions over a few elements per output (depthwise and narrow grouped convolutions,
pooling windows), the reduction unrolled in registers: NHWC fp16, fp32 and int8 ones with 16 bytes of
consecutive channels times up to 4 pixels along W per thread (thread blocks of a few whole output rows),
others one output per thread."""

from __future__ import annotations

import math
import re

from inferx_edge.compiler.cuda.rules._common import _inlined_blocks, sliding_vars

#: :class:`SmallReduction` takes reductions of at most this many elements per output ...
SMALL_REDUCTION = 64


#: ... with at least this many outputs (enough threads to fill the GPU without a parallel reduction)
MIN_SMALL_REDUCTION_OUTPUTS = 4096


#: fp16 small reductions (depthwise convolutions, pooling) whose innermost output axis (NHWC's channels)
#: is a multiple of this give each thread this many consecutive channels: 16-byte input and weight
#: loads (8 measured faster than 4 and than one channel per thread: ``benchmarks/gpu_small_reduction.py``
#: and its record)
SMALL_REDUCTION_CHANNELS = 8


#: the same for fp32 ones: 4 channels (16 bytes) per thread. With HWIO depthwise weights this took
#: ConvNeXt-T's 7x7 depthwise kernels from 866 to 548 us at batch 64 on the H200, EfficientNet-B0's from
#: 982 to 851, MobileNetV3's from 506 to 408 (``gpu_depthwise_h200.json``; 26 of 29 kernels faster,
#: three of EfficientNet-B0's on 28x28 and 14x14 inputs 3-12 % slower); with OHWI weights (a thread's
#: 4 filters a whole filter apart) an earlier comparison had found one output per thread faster.
FP32_SMALL_REDUCTION_CHANNELS = 4


#: channel-vectorized small reductions sliding along W (depthwise and narrow grouped convolutions,
#: pooling) give a thread up to this many consecutive pixels along W as well: neighbouring windows share
#: all but a column, so one row of the padded input in registers serves every pixel's taps on it (a 7x7
#: window, 4 pixels: 10 loads per row instead of 28; wide windows: :data:`WIDE_WINDOW_PIXELS`). 1: off.
#: Measured per kernel on an H100 at batch 64 (``gpu_small_reduction_pixels_h100.json``): 4 pixels took ConvNeXt-T's 7x7 depthwise kernels from 204
#: to 121 us (56x56) and ResNeXt-50's 4-channel grouped convs from 114 to 81 us ...
SMALL_REDUCTION_PIXELS = 4

#: ... but where a kernel stores more than a byte per output and reduces fewer than this many elements
#: per output, the stores dominate: EfficientNet-B0's 3x3 depthwise kernels (fp32 out) were up to 20 %
#: slower with 4 pixels than with 1, and within 4 % of the best with 2 -- the cap there
NARROW_WINDOW = 16
NARROW_WINDOW_WIDE_OUTPUT_PIXELS = 2

#: the pixels are halved while the kernel would have fewer threads than this
MIN_SMALL_REDUCTION_THREADS = 32768

#: a row of at most this many pixels that the pixel count does not divide (a 7-wide map) is one
#: thread's whole, for windows of at least :data:`NARROW_WINDOW` elements, where the kernel keeps
#: :data:`MIN_SMALL_REDUCTION_THREADS` threads. Measured on an H100 (``gpu_small_reduction_pixels7_h100``):
#: ConvNeXt-T's 7x7 depthwise conv over 7x7 maps at batch 64, 24.1 us with one pixel per thread, 15.9 us
#: with 7; over 14x14 maps, with fp32 sums, 7 pixels lost to 2 (34.0 vs 31.9 us) (see WIDE_WINDOW_PIXELS)
WHOLE_ROW_PIXELS = 7

#: windows of at least :data:`NARROW_WINDOW` elements over maps whose width this divides take this
#: many pixels per thread (where the kernel keeps :data:`MIN_SMALL_REDUCTION_THREADS` threads). With fp16
#: sums (``compiler.passes.fp16_depthwise``), measured on an H100 at batch 64
#: (``gpu_small_reduction_fp16_sums.json``; 4 -> 7 pixels, outputs identical): ConvNeXt-T's 7x7
#: depthwise kernels 77.5 -> 73.1 us (56x56 maps), 44.9 -> 39.9 (28x28), 31.0 -> 23.9 (14x14, where
#: 4 pixels had halved to 2), ResNeXt-50's 3x3 convs over 4 channels per group 53.0 -> 46.3 (56x56)
WIDE_WINDOW_PIXELS = 7

_SMALL_REDUCTION_THREADS = 64

#: channel-vectorized small reductions whose window slides along H as well give a thread block about
#: this many consecutive output rows of the same pixels (all their channels), so the input rows those
#: rows' windows share are read from the SM's L1 instead of L2 once per output row: 3x3 windows over 4
#: rows read 6 input rows instead of 12, 7x7 ones over 8 rows 14 instead of 56. The rows taken divide H
#: and make the block whole warps (:func:`block_rows`). 1: off (a block is 64 threads along W and C).
#: Measured per kernel on an H100 at batch 64 (``gpu_small_reduction_block_rows_s70``, outputs identical):
#: ResNeXt-50's 4-channel grouped convs 46.3 -> 43.8 us (8 rows: 45.3), ConvNeXt-T's 7x7 depthwise
#: kernels 61.5 -> 54.3 (56x56), 33.8 -> 29.0 (28x28), 18.4 -> 16.3 (14x14); end to end within the
#: run-to-run spread (docs/zoo.md, "Thread blocks of output rows")
BLOCK_ROWS = 4

#: ... the most threads such a block may have
MAX_BLOCK_ROW_THREADS = 256


#: a thread's copy of an operand window (e.g. 3x3 taps x 8 channels) stays in registers up to this
#: many elements; a larger window is loaded one reduction step at a time
_MAX_THREAD_WINDOW = 128


def _small_reduction_extents(red) -> tuple[int, int] | None:
    """(outputs, reduction elements per output) of a reduction block over static spatial and reduction
    axes, when :class:`SmallReduction` takes it (at most :data:`SMALL_REDUCTION` elements per output,
    at least :data:`MIN_SMALL_REDUCTION_OUTPUTS` outputs); else None."""
    if any(not isinstance(it.dom, int) or it.kind not in "SR" for it in red.iters):
        return None
    s_ext = math.prod(it.dom for it in red.iters if it.kind == "S")
    r_ext = math.prod(it.dom for it in red.iters if it.kind == "R")
    return (s_ext, r_ext) if r_ext <= SMALL_REDUCTION and s_ext >= MIN_SMALL_REDUCTION_OUTPUTS else None


def _loops_below(sch, block, anchor) -> list:
    """The loops of ``block`` nested under the loop ``anchor``."""
    loops = sch.get_loops(block)
    at = sch.get(anchor)
    return loops[[i for i, lp in enumerate(loops) if sch.get(lp).same_as(at)][0] + 1 :]


def _thread_copy(sch, block, tx, reduction_loops) -> None:
    """Place a copy block (a cache read, a padding block) in the thread: at the outermost of ``tx`` and
    ``reduction_loops`` where its window is small enough to stay in registers (the innermost reduction
    loop when none is); vectorized by 16 bytes along its innermost (contiguous) elements."""
    import tvm

    for anchor in (tx, *reduction_loops):
        sch.compute_at(block, anchor)
        if math.prod(int(sch.get(lp).extent) for lp in _loops_below(sch, block, anchor)) <= _MAX_THREAD_WINDOW:
            break
    loops = _loops_below(sch, block, anchor)
    if not loops:  # one element
        return
    lanes = 16 * 8 // tvm.DataType(str(sch.get(block).writes[0].source.dtype)).bits
    window = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    extent = int(sch.get(window).extent)
    if extent % lanes == 0 and extent > lanes:
        steps, vector = sch.split(window, [None, lanes])
        sch.unroll(steps)
        sch.vectorize(vector)
    elif extent == lanes:
        sch.vectorize(window)
    else:
        sch.unroll(window)


def thread_channels(block, channels: int, fp32_channels: int) -> int | None:
    """Consecutive channels per thread for a small reduction ``block`` reading one dtype: ``channels``
    for fp16, ``fp32_channels`` for fp32, twice ``channels`` for int8 (max pooling of quantized
    activations: the same 16-byte loads as fp16's); None for other or mixed dtypes, and for int8 reads
    accumulated in a wider type (an int8 convolution's int32 sums: 16-lane int32 vectors have no CUDA
    type; such a kernel takes one output per thread where no tensor-core rule takes it first)."""
    dtypes = {str(r.source.dtype) for r in block.reads}
    if len(dtypes) != 1 or (dtypes == {"int8"} and str(block.writes[0].source.dtype) != "int8"):
        return None
    return {"float16": channels, "float32": fp32_channels, "int8": 2 * channels if channels > 1 else 1}.get(
        dtypes.pop()
    )


def row_pixels(
    block,
    iters,
    channels: int,
    pixels: int = SMALL_REDUCTION_PIXELS,
    out_bits: int = 8,
    wide_pixels: int = WIDE_WINDOW_PIXELS,
) -> int:
    """Pixels along W per thread for a channel-vectorized small reduction with block iterators
    ``iters`` (dlight's, NHWC order: ..., W, C, then the reduction) whose output elements are
    ``out_bits`` wide: ``wide_pixels`` for windows of at least :data:`NARROW_WINDOW` elements where it
    is more than ``pixels``, divides W and keeps :data:`MIN_SMALL_REDUCTION_THREADS` threads; else up to
    ``pixels`` (:data:`NARROW_WINDOW_WIDE_OUTPUT_PIXELS` for narrow windows with wide outputs), halved
    until it divides W and the kernel keeps those threads; 1 where the window does not slide along W."""
    spatial = [it for it in iters if it.kind == "S"]
    if len(spatial) < 2 or spatial[-2].var not in sliding_vars(block):
        return 1
    reduced = math.prod(it.dom for it in iters if it.kind == "R")
    if out_bits > 8 and reduced < NARROW_WINDOW:
        pixels = min(pixels, NARROW_WINDOW_WIDE_OUTPUT_PIXELS)
    outputs = math.prod(it.dom for it in spatial)
    width = spatial[-2].dom
    if (
        reduced >= NARROW_WINDOW
        and wide_pixels > pixels
        and width % wide_pixels == 0
        and outputs // (channels * wide_pixels) >= MIN_SMALL_REDUCTION_THREADS
    ):
        return wide_pixels
    if (
        width <= WHOLE_ROW_PIXELS
        and width % pixels
        and pixels < width
        and reduced >= NARROW_WINDOW
        and outputs // (channels * width) >= MIN_SMALL_REDUCTION_THREADS
    ):
        return width
    while pixels > 1 and (width % pixels or outputs // (channels * pixels) < MIN_SMALL_REDUCTION_THREADS):
        pixels //= 2
    return max(pixels, 1)


def block_rows(block, iters, channels: int, rows: int = BLOCK_ROWS) -> int:
    """Output rows per thread block for a channel-vectorized small reduction with block iterators
    ``iters`` (NHWC order, ``channels`` per thread): of the divisors of H from 2 up that make a block of
    rows x (C / channels) threads whole warps and at most :data:`MAX_BLOCK_ROW_THREADS`, the one closest
    to ``rows`` (the smaller on a tie); 1 where none does, ``rows`` is 1 or the window does not slide
    along H."""
    spatial = [it for it in iters if it.kind == "S"]
    if rows <= 1 or len(spatial) < 3 or spatial[-3].var not in sliding_vars(block):
        return 1
    height, lanes = spatial[-3].dom, spatial[-1].dom // channels
    fits = [
        r
        for r in range(2, height + 1)
        if height % r == 0 and (r * lanes) % 32 == 0 and r * lanes <= MAX_BLOCK_ROW_THREADS
    ]
    return min(fits, key=lambda r: (abs(math.log(r / rows)), r)) if fits else 1


def channel_vectorized_reduction(
    func,
    target,
    channels: int = SMALL_REDUCTION_CHANNELS,
    fp32_channels: int = FP32_SMALL_REDUCTION_CHANNELS,
    pixels: int = SMALL_REDUCTION_PIXELS,
    wide_pixels: int = WIDE_WINDOW_PIXELS,
    rows: int = BLOCK_ROWS,
):
    """Schedule a small fp16 reduction with ``channels`` consecutive innermost outputs per thread (an
    fp32 one with ``fp32_channels``, an int8 one with twice ``channels``; 1: not this schedule) times up
    to ``pixels`` (``wide_pixels`` for wide windows) along W (:func:`row_pixels`), thread blocks of
    about ``rows`` output rows (:func:`block_rows`), or None when it does not apply (another dtype,
    channels not a multiple, a schedule error).

    The input's padding block is not inlined: each thread copies its padded window into registers
    (16-byte loads, the bounds test once per tap), as it does weights and epilogue constants; the
    accumulators and the epilogue stay in the thread, stores are 4 elements wide."""
    import tvm
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline
    from tvm.s_tir.schedule import ScheduleError

    try:
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        reductions = [i for i, b in enumerate(infos) if "R" in b.dom_kind()]
        if len(reductions) != 1:
            return None
        red = infos[reductions[0]]
        producers = infos[: reductions[0]]  # the input's padding: copied per thread, not inlined
        rest = try_inline(sch, infos[reductions[0] :])
        if (
            rest[0] is not red
            or any(b.is_reduction() for b in rest[1:])
            or any(not p.is_injective() for p in producers)
        ):
            return None
        block = red.block_rv
        kinds = red.dom_kind()
        channels = thread_channels(sch.get(block), channels, fp32_channels)
        if not channels or channels == 1 or not re.fullmatch(r"S+R+", kinds):
            return None
        if _small_reduction_extents(red) is None or red.iters[kinds.index("R") - 1].dom % channels:
            return None
        loops = sch.get_loops(block)
        s_loops = [lp for lp, k in zip(loops, kinds) if k == "S"]
        r_loops = [lp for lp, k in zip(loops, kinds) if k == "R"]
        c_out, c_in = sch.split(s_loops[-1], [None, channels])
        inner = [c_in]
        outer = [*s_loops[:-1], c_out]
        out_bits = tvm.DataType(str(sch.get(rest[-1].block_rv).writes[0].source.dtype)).bits
        per_row = row_pixels(sch.get(block), red.iters, channels, pixels, out_bits, wide_pixels)
        if per_row > 1:
            p_out, p_in = sch.split(s_loops[-2], [None, per_row])
            inner = [p_in, c_in]
            outer = [*s_loops[:-2], p_out, c_out]
        threads = _SMALL_REDUCTION_THREADS
        per_block = block_rows(sch.get(block), red.iters, channels, rows)
        if per_block > 1:  # (..., H / rows, W / pixels, rows, C / channels): a block is rows x C
            h_out, h_in = sch.split(outer[-3], [None, per_block])
            outer = [*outer[:-3], h_out, outer[-2], h_in, c_out]
            threads = per_block * red.iters[kinds.index("R") - 1].dom // channels
        sch.reorder(*outer, *r_loops, *inner)
        bx, tx = sch.split(sch.fuse(*outer), [None, threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        padded = {sch.get(p.block_rv).writes[0].source.name for p in producers}
        out_name = sch.get(block).writes[0].source.name
        for i, region in enumerate(list(sch.get(block).reads)):
            if region.source.name not in padded and region.source.name != out_name:
                _thread_copy(sch, sch.cache_read(block, i, "local"), tx, r_loops)
        for p in producers:
            sch.set_scope(p.block_rv, 0, "local")
            _thread_copy(sch, p.block_rv, tx, r_loops)
        epilogue = [b.block_rv for b in rest[1:]]
        if not epilogue:  # accumulate in registers, store once
            epilogue = [sch.cache_write(block, 0, "local")]
        else:
            sch.set_scope(block, 0, "local")
        for consumer in reversed(epilogue):
            sch.reverse_compute_at(consumer, tx)
        acc = sch.get(block).writes[0].source.name
        for consumer in epilogue:
            for i, region in enumerate(list(sch.get(consumer).reads)):
                if region.source.scope() == "global" and region.source.name != acc and len(region.region):
                    _thread_copy(sch, sch.cache_read(consumer, i, "local"), tx, [])
        # 4-wide epilogue: float32x8 constants do not compile in TVM 0.27's CUDA codegen
        store_out, store_in = sch.split(sch.get_loops(epilogue[-1])[-1], [None, 4])
        for lp in (*_loops_below(sch, epilogue[-1], tx)[:-2], store_out):  # accumulators: registers
            sch.unroll(lp)
        sch.vectorize(store_in)
        for lp in (*r_loops, *inner):
            sch.unroll(lp)
        sch.decompose_reduction(block, r_loops[0])
        return sch
    except ScheduleError:
        return None


def small_reduction_rule(
    channels: int = SMALL_REDUCTION_CHANNELS,
    fp32_channels: int = FP32_SMALL_REDUCTION_CHANNELS,
    pixels: int = SMALL_REDUCTION_PIXELS,
    wide_pixels: int = WIDE_WINDOW_PIXELS,
    rows: int = BLOCK_ROWS,
):
    """A dlight rule for reductions over a few elements per output: :func:`channel_vectorized_reduction`
    for fp16, fp32 and int8 NHWC ones (``channels`` / ``fp32_channels`` per thread, a multiple of 4, int8
    twice ``channels``; 1: off; up to ``pixels`` along W, ``wide_pixels`` for wide windows, blocks of
    about ``rows`` output rows), else one output per thread."""
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    class SmallReduction(GPUScheduleRule):
        def apply(self, func, target, _tunable):
            from tvm import tirx

            if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
                return None
            vectorized = channel_vectorized_reduction(func, target, channels, fp32_channels, pixels, wide_pixels, rows)
            if vectorized is not None:
                return vectorized
            found = _inlined_blocks(self, func, target)
            if found is None:
                return None
            sch, infos = found
            reductions = [b for b in infos if "R" in b.dom_kind()]
            if len(reductions) != 1 or any(b.is_reduction() for b in infos if b is not reductions[0]):
                return None
            red = reductions[0]
            if infos.index(red) != 0:  # unfused producers left: not ours
                return None
            if _small_reduction_extents(red) is None:
                return None
            block = red.block_rv
            loops = sch.get_loops(block)
            s_loops = [lp for lp, k in zip(loops, red.dom_kind()) if k == "S"]
            r_loops = [lp for lp, k in zip(loops, red.dom_kind()) if k == "R"]
            sch.reorder(*s_loops, *r_loops)
            bx, tx = sch.split(sch.fuse(*s_loops), factors=[None, 256])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            for consumer in reversed([b.block_rv for b in infos[1:]]):
                sch.reverse_compute_at(consumer, tx)
            if len(infos) > 1:
                sch.set_scope(block, 0, "local")  # the accumulator never leaves the thread
            else:  # accumulate in a register, store once (not a read-modify-write of global per element)
                sch.reverse_compute_at(sch.cache_write(block, 0, "local"), tx)
            for lp in r_loops:
                sch.unroll(lp)
            sch.decompose_reduction(block, r_loops[0])
            return sch

    return SmallReduction()
