"""The tensor-core schedule of int8 and fp16 GEMMs and implicit-GEMM convolutions (sm_80+): shared-memory
staging, ldmatrix + mma.sync, cp.async pipelines, for one :class:`~inferx_edge.compiler.cuda.tile.TileConfig`."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from inferx_edge.compiler.cuda.analysis import _TENSOR_CORE_DTYPES, _innermost_is_reduction
from inferx_edge.compiler.cuda.lane_indices import copy_loops, simplify_lane_indices
from inferx_edge.compiler.cuda.tile import _PIPELINE_LEAD, DEFAULT_TILE, PIPELINES, TileConfig
from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics

_PIPELINE_KEYS = ("software_pipeline_order", "software_pipeline_stage", "software_pipeline_async_stages")


def _register_int8_mma_intrinsics() -> None:
    """Register the int8 ldmatrix/mma intrinsics for dynamic shared memory that TVM 0.27 defines only
    for fp16 (names as ``get_mma_intrin_group`` gives them); idempotent."""
    from tvm.s_tir import TensorIntrin

    import_tensor_intrinsics()  # a minute on 2 cores when imported plainly (see that module)
    from tvm.s_tir.tensor_intrin import cuda

    for name, make in (
        ("mma_ldmatrix_i8_a_dyn", lambda: cuda.get_ldmatrix_intrin(32, "int8", "A", False, "shared.dyn")),
        ("mma_ldmatrix_i8_b_trans_dyn", lambda: cuda.get_ldmatrix_intrin(32, "int8", "B", True, "shared.dyn")),
        ("mma_store_16x16_i32_shared_dyn_simple_", lambda: cuda.get_mma_store_intrin("int32", 8, "shared.dyn", False)),
    ):
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *make())


def _mma_safe_buffer_names(func):
    """``func`` with its parameters renamed to lowercase where needed, or None when that fails: TVM
    0.27's ``mma.sync`` codegen fills the operands into its asm template by replacing the letters A-F
    one after another, so a buffer named like ONNX's ``onnx__Conv_566`` had its "C" replaced by the
    accumulator's address (the generated CUDA did not compile). Parameter names are internal to the
    kernel (Relax calls it positionally); renamed through a TVMScript round trip."""
    import tvm

    from inferx_edge.compiler.cuda.kernel_names import UNSAFE, safe_name

    names = [p.name for p in func.params if UNSAFE.search(p.name)]
    if not names:
        return func
    script = func.script()
    taken = set(re.findall(r"\b\w+\b", script))
    for name in names:
        script = re.sub(rf"\b{re.escape(name)}\b", safe_name(name, taken), script)
    try:
        renamed = tvm.script.from_source(script)
    except Exception:  # not printable/parsable (e.g. omitted metadata): the caller keeps wmma
        return None
    if isinstance(renamed, tvm.IRModule):
        renamed = renamed[renamed.get_global_vars()[0]]
    return renamed.with_attrs(func.attrs) if func.attrs is not None else renamed


def _check_tile(cfg: TileConfig) -> None:
    if cfg.pipeline not in PIPELINES:
        valid = ", ".join(repr(p) for p in PIPELINES)
        raise ValueError(f"unknown tile load pipeline '{cfg.pipeline}'; valid: {valid} ('': none)")
    if cfg.intrin not in ("wmma", "mma"):
        raise ValueError(f"unknown tensor-core instructions '{cfg.intrin}'; valid: 'wmma', 'mma'")


@dataclass
class _Gemm:
    """What the steps of :func:`tensor_core_schedule` share: the schedule, the tile and its derived sizes."""

    sch: object
    cfg: TileConfig
    mma: bool
    in_dtype: str
    out_dtype: str
    item: int  # bytes per operand element
    micro_k: int  # reduction depth of one instruction
    k_factors: list
    num_ty: int  # warps per block
    warp_size: int = 32
    micro: int = 16
    out_lanes: int = 4  # outputs per epilogue vector: 4, or the largest power of two dividing J below it


def _as_gemm(sch, main_block, func, g: _Gemm):
    """Reindex the reduction block into ``C[S, I, J] += A[S, I, K] * B[S, J, K]`` (a convolution's input
    window becomes A), pad it to the tile, and return (block, per-operand elements per load) or None."""
    from tvm import tirx
    from tvm.s_tir.dlight.gpu.matmul import get_index_map

    cfg = g.cfg
    wide_weights = _innermost_is_reduction(sch.get(main_block), 1)
    reindex_a = sch.reindex(main_block, ("read", 0))
    reindex_b = sch.reindex(main_block, ("read", 1))
    reindex_c = sch.reindex(main_block, ("write", 0))
    index_maps = get_index_map(sch.get(main_block))
    if index_maps is None:
        return None
    matmul_index_map, a_index_map, b_index_map, c_index_map = index_maps
    sch.transform_layout(reindex_a, ("write", 0), a_index_map)
    sch.transform_layout(reindex_b, ("write", 0), b_index_map)
    sch.transform_layout(reindex_c, ("read", 0), c_index_map)
    sch.transform_block_layout(main_block, matmul_index_map)
    micro = g.micro
    tile = [1, micro * cfg.warps_i * cfg.frags_i, micro * cfg.warps_j * cfg.frags_j, micro * cfg.k_frags]
    extents = [iv.dom.extent for iv in sch.get(main_block).iter_vars]

    # ``cfg.vector``-byte loads for A (activations), ``cfg.padded_vector`` where they are predicated:
    # where the tile pads the GEMM (rows I or depth K) or the convolution pads its input. B (weights):
    # ``cfg.weight_vector`` bytes, at most ``cfg.vector``; 4 where B's rows do not run along K (a
    # [K, J] weight: wider vectors would gather, and TVM 0.27's CUDA codegen rejects int32x16 indices)
    def ragged(*axes):
        return any(not isinstance(extents[a], tirx.expr.IntImm) or int(extents[a].value) % tile[a] for a in axes)

    pad_a = ragged(1, 3) or "if_then_else" in func.script()
    weight_vector = cfg.weight_vector if wide_weights else min(4, cfg.weight_vector)
    widths = (min(cfg.vector, cfg.padded_vector) if pad_a else cfg.vector, min(cfg.vector, weight_vector))
    vectors = tuple(max(1, w // g.item) for w in widths)  # elements per load
    # a vector along K that can run past a row's end (K not a multiple of it: 1x1 convs over 232
    # channels) made TVM load the tile element by element: capped at K's largest power-of-two divisor
    if isinstance(extents[3], tirx.expr.IntImm):  # A always, B where the weights run along K
        k_pow2 = max(1, int(extents[3].value) & -int(extents[3].value))
        vectors = (min(vectors[0], k_pow2), min(vectors[1], k_pow2) if wide_weights else vectors[1])
    if isinstance(extents[2], tirx.expr.IntImm):  # likewise the epilogue's stores along J (58 channels: 2)
        g.out_lanes = min(4, int(extents[2].value) & -int(extents[2].value))
    sch.pad_einsum(main_block, tile)
    return main_block, vectors


def _tile_loops(sch, block, g: _Gemm):
    """Split the GEMM loops into blocks x warps x fragments x instructions and bind them; returns
    (the instruction block, its outer block, the reduction loops k0 and k1, the threadIdx.y loop)."""
    cfg, micro = g.cfg, g.micro
    batch, i, j, k = sch.get_loops(block)
    i, i_inner = sch.split(i, factors=[None, micro])
    j, j_inner = sch.split(j, factors=[None, micro])
    k, k_inner = sch.split(k, factors=[None, g.micro_k])
    sch.reorder(i, j, k, i_inner, j_inner, k_inner)
    block_outer = sch.blockize(i_inner)
    i0, i1, i2, i3 = sch.split(i, factors=[None, 1, cfg.warps_i, cfg.frags_i])
    j0, j1, j2, j3 = sch.split(j, factors=[1, None, cfg.warps_j, cfg.frags_j])
    k0, k1 = sch.split(k, g.k_factors)
    sch.reorder(i0, j0, i1, j1, j2, i2, k0, k1, i3, j3)
    sch.bind(batch, "blockIdx.z")
    sch.bind(sch.fuse(i0, j0), "blockIdx.x")
    sch.bind(sch.fuse(i1, j1), "blockIdx.y")
    thread_idy = sch.fuse(j2, i2)
    sch.bind(thread_idy, "threadIdx.y")
    return block, block_outer, k0, k1, thread_idy


def _stage_operands(sch, block_outer, k0, k1, thread_idy, vectors, g: _Gemm):
    """Operands through shared memory into registers, the accumulators back through shared memory;
    returns (register operand blocks, accumulator store block, its name, the shared tile block,
    the init block, the operand shared-memory scope)."""
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_producers

    cfg, micro = g.cfg, g.micro
    # Operands and the accumulator tile share one dynamic allocation (as dlight's), except pipelined
    # wmma operands: merged with the int32 tile, TVM 0.27's LowerAccessPtr rejects some small wmma
    # tiles (int8 vs int32 tvm_access_ptr); they go to static shared memory
    operand_scope = "shared" if cfg.pipeline and not g.mma else "shared.dyn"

    def fetch_to_shared(block, idx):
        block_read = sch.cache_read(block, idx, operand_scope)
        row, col, lane = copy_loops(sch, block_read, vectors[idx], k0)  # the lane apart: see lane_indices
        _, f_1, f_2 = sch.split(sch.fuse(row, col), factors=[None, g.num_ty, g.warp_size])
        sch.bind(f_2, "threadIdx.x")
        sch.bind(f_1, "threadIdx.y")
        sch.vectorize(lane)
        # rows 16 bytes past a multiple of 32 elements: the 8 rows an ldmatrix reads fall in distinct banks
        sch.storage_align(block_read, 0, axis=-2, factor=32, offset=16 // g.item)
        if not cfg.pipeline:
            sch.annotate(block_read, "tirx.manifest_shared_memory_local_stage", 1)
        sch.annotate(block_read, "double_buffer_scope", 0)
        return block_read

    for fetch in (fetch_to_shared(block_outer, 0), fetch_to_shared(block_outer, 1)):
        auto_inline_producers(sch, fetch)
        simplify_lane_indices(sch, fetch)
    # registers: wmma fragments, or mma's per-thread "warp" buffers in the ldmatrix/mma.sync layout
    reg_a, reg_b, reg_c = ("warp",) * 3 if g.mma else ("wmma.matrix_a", "wmma.matrix_b", "wmma.accumulator")
    a_mat, b_mat = (sch.cache_read(block_outer, i, scope) for i, scope in ((0, reg_a), (1, reg_b)))
    for mat in (a_mat, b_mat):
        sch.compute_at(mat, k1)
    acc_shared = sch.cache_write(block_outer, 0, "shared.dyn")
    sch.storage_align(acc_shared, 0, -2, 16, 4)
    store = sch.cache_write(block_outer, 0, reg_c)
    store_name = sch.get(store).name_hint
    sch.reverse_compute_at(store, thread_idy)
    sch.reverse_compute_at(acc_shared, thread_idy)
    si, sj = sch.get_loops(store)[-2:]
    si0, si1 = sch.split(si, factors=[None, micro])
    sj0, sj1 = sch.split(sj, factors=[None, micro])
    sch.reorder(si0, sj0, si1, sj1)
    init = sch.get_child_blocks(sch.decompose_reduction(block_outer, k0))[0]
    return (a_mat, b_mat), store, store_name, acc_shared, init, operand_scope


def _tensorize(sch, mats, store, init, block_inner, operand_scope, g: _Gemm) -> bool:
    """Replace the register loads, the init, the store and the multiply by the tensor-core
    intrinsics; False when the shape is one they cannot cover."""
    import_tensor_intrinsics()
    from tvm.s_tir.tensor_intrin.cuda import get_mma_intrin_group, get_wmma_intrin_group

    micro, micro_k = g.micro, g.micro_k
    if g.mma:
        _register_int8_mma_intrinsics()
        # (the accumulator store's warp shuffles are dropped from the CUDA source: see
        # compiler.cuda.drop_own_lane_shuffles)
        intrin = get_mma_intrin_group(operand_scope, "shared.dyn", g.in_dtype, g.out_dtype, trans_a=False, trans_b=True)
    else:
        intrin = get_wmma_intrin_group(
            load_scope=operand_scope, store_scope="shared.dyn", in_dtype=g.in_dtype, out_dtype=g.out_dtype, trans_b=True
        )
    try:
        loads = []
        for mat in mats:  # B is [J, K]: both operand tiles are 16 x micro_k
            li, lj = sch.get_loops(mat)[-2:]
            li0, li1 = sch.split(li, factors=[None, micro])
            lj0, lj1 = sch.split(lj, factors=[None, micro_k])
            sch.reorder(li0, lj0, li1, lj1)
            sch.unroll(li0)
            sch.unroll(lj0)
            loads.append(li1)
        if g.mma:
            from tvm.s_tir.tensor_intrin.cuda import (
                shared_16x16_to_ldmatrix_32x8_layout,
                shared_16x32_to_ldmatrix_32x16_layout,
            )

            fragment = shared_16x32_to_ldmatrix_32x16_layout if micro_k == 32 else shared_16x16_to_ldmatrix_32x8_layout

            def operand_layout(*idx):
                *lead, r, c = idx
                return (*lead, r // micro, c // micro_k, *fragment(r % micro, c % micro_k))

            def acc_layout(*idx):
                *lead, r, c = idx
                return (*lead, r // micro, c // micro, *shared_16x16_to_ldmatrix_32x8_layout(r % micro, c % micro))

            sch.transform_layout(mats[0], ("write", 0), operand_layout)
            sch.transform_layout(mats[1], ("write", 0), operand_layout)
            sch.transform_layout(store, ("read", 0), acc_layout)
        sch.tensorize(loads[0], intrin["load_a"])
        sch.tensorize(loads[1], intrin["load_b"])
        sch.tensorize(sch.get_loops(init)[-2], intrin["init"])
        sch.tensorize(sch.get_loops(store)[-2], intrin["store"])
        sch.tensorize(sch.get_loops(block_inner)[-3], intrin["compute"])
    except Exception:  # a shape these intrinsics cannot cover
        return False
    return True


def _annotate_pipelines(sch, k0, k1, g: _Gemm) -> None:
    """Fragment double buffering (``.r2``) on k1 and the cp.async pipeline on k0."""
    cfg = g.cfg
    # two fragment buffers: k1 (one 32-deep step per iteration: ldmatrix A, ldmatrix B, mma) becomes
    # a prologue (step 0's loads), a loop (the next step's loads, this step's mma) and an epilogue
    # (the last step's mma); TVM expands it before k0, so k0 then has five children
    inner = g.mma and cfg.fragment_buffers == 2 and g.k_factors[1] >= 2
    if inner:
        sch.annotate(k1, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(k1, "software_pipeline_order", [0, 1, 2])
    if cfg.pipeline:  # children of k0: A g->s, B g->s, the math (k1, or its three parts); loads run ahead
        lead = _PIPELINE_LEAD[cfg.pipeline]
        math_parts = 3 if inner else 1
        sch.annotate(k0, "software_pipeline_stage", [0, 0] + [lead] * math_parts)
        sch.annotate(k0, "software_pipeline_order", list(range(2 + math_parts)))
        sch.annotate(k0, "software_pipeline_async_stages", [0])


def _schedule_epilogue(sch, acc_shared, store_name, g: _Gemm) -> None:
    """The accumulator tile's padding, and the fused epilogue read from shared memory ``g.out_lanes``
    outputs per thread, :data:`EPILOGUE_UNROLL` steps issued together."""
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain

    cfg = g.cfg
    if cfg.acc_pad:  # on the tensorized store (the block writing the shared tile), rows padded to 32k + pad
        sch.storage_align(sch.get_sblock(store_name + "_o"), 0, axis=-2, factor=32, offset=cfg.acc_pad)
    auto_inline_consumer_chain(sch, acc_shared)
    fused = sch.fuse(*sch.get_loops(acc_shared)[-2:])
    f0, f1, f2 = sch.split(fused, factors=[None, g.warp_size, g.out_lanes])
    sch.bind(f1, "threadIdx.x")
    sch.vectorize(f2)
    # each thread's epilogue steps (a residual load, the requantize, a store) unrolled EPILOGUE_UNROLL
    # at a time, so their global loads are in flight together instead of one step's latency after another
    steps = 8 * cfg.frags_i * cfg.frags_j // g.out_lanes  # the warp's 16 frags_i x 16 frags_j / (32 x lanes)
    if steps > 1:
        _, f0 = sch.split(f0, factors=[None, math.gcd(steps, EPILOGUE_UNROLL)])
        sch.unroll(f0)


def broadcasting_epilogue(func) -> bool:
    """True when a matmul kernel writes more elements than its GEMM produces: a squeeze-excite gate
    (a GEMM over pooled channels, then a multiply broadcasting it over the feature map) fused into one
    kernel. The GEMM is tiny and the broadcast epilogue is the work; no matmul schedule can inline that
    epilogue into its output tile (dlight asserts), so such kernels go to the reduction/fallback rules."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.s_tir.dlight.gpu.matmul import get_reduction_blocks

    sch = s_tir.Schedule(func)
    reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
    if not reductions:
        return False
    try:
        written = sch.get(reductions[0]).writes[0]
        buf = getattr(written, "buffer", None) or written.source  # the GEMM's whole output buffer
        gemm_out = math.prod(int(d) for d in buf.shape)
        out = func.params[-1]  # the output (destination-passing); a Buffer in TVM 0.27's TIR
        shape = out.shape if hasattr(out, "shape") else func.buffer_map[out].shape
        return math.prod(int(d) for d in shape) > gemm_out
    except (TypeError, KeyError, IndexError, AttributeError):  # symbolic extents: not a pattern we know
        return False


def tensor_core_schedule(func, target, cfg: TileConfig | None = None):
    """dlight's int8 wmma matmul schedule (``MatmulInt8Tensorization``) with its tile as parameters,
    without software pipelining (which TVM 0.27 cannot lower for wmma fragments), and with
    ldmatrix/mma.sync in place of wmma when ``cfg.intrin`` is "mma"; for int8 -> int32 and fp16 ->
    fp16/fp32 matmuls (mma.sync.m16n8k32 for int8, m16n8k16 for fp16). Load widths in ``cfg`` are bytes.
    Returns the schedule or None when ``func`` is not a matmul/implicit-GEMM convolution of those
    dtypes it can tensorize.

    Steps: reindex into a GEMM and pad it to the tile (:func:`_as_gemm`), tile and bind the loops
    (:func:`_tile_loops`), stage operands and accumulators (:func:`_stage_operands`), tensorize
    (:func:`_tensorize`), pipeline annotations (:func:`_annotate_pipelines`), epilogue
    (:func:`_schedule_epilogue`)."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.s_tir.dlight.gpu.matmul import get_in_out_dtypes, get_reduction_blocks

    if not isinstance(func, tirx.PrimFunc) or "dlight.do_not_tensorize" in func.attrs.keys():
        return None
    cfg = cfg or DEFAULT_TILE
    _check_tile(cfg)
    mma = cfg.intrin == "mma"
    if mma:
        renamed = _mma_safe_buffer_names(func)
        if renamed is None:
            mma, cfg = False, replace(cfg, intrin="wmma")
        else:
            func = renamed
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(get_root_block(sch))
    reduction_blocks = get_reduction_blocks(sch, blocks)
    if not reduction_blocks:
        return None
    dtypes = tuple(str(d) for d in get_in_out_dtypes(sch.get(reduction_blocks[0])))
    if dtypes not in _TENSOR_CORE_DTYPES:
        return None
    in_dtype, out_dtype = dtypes
    if mma and in_dtype == "int8" and cfg.k_frags % 2:
        raise ValueError(f"mma int8 tiles reduce 32 elements per instruction: k_frags must be even, got {cfg.k_frags}")
    # int8 mma.m16n8k32 (two per 16x16 output fragment); fp16 mma.m16n8k16; wmma 16x16x16
    micro_k = 32 if mma and in_dtype == "int8" else 16
    g = _Gemm(
        sch, cfg, mma, in_dtype, out_dtype, item=1 if in_dtype == "int8" else 2, micro_k=micro_k,
        k_factors=[None, cfg.k_frags * 16 // micro_k], num_ty=cfg.warps_i * cfg.warps_j,
    )  # fmt: skip
    gemm = _as_gemm(sch, reduction_blocks[0], func, g)
    if gemm is None:
        return None
    block, vectors = gemm
    block_inner, block_outer, k0, k1, thread_idy = _tile_loops(sch, block, g)
    mats, store, store_name, acc_shared, init, operand_scope = _stage_operands(
        sch, block_outer, k0, k1, thread_idy, vectors, g
    )
    if not _tensorize(sch, mats, store, init, block_inner, operand_scope, g):
        return None
    _annotate_pipelines(sch, k0, k1, g)
    _schedule_epilogue(sch, acc_shared, store_name, g)
    return sch


#: epilogue steps per thread issued together (see :func:`tensor_core_schedule`)
EPILOGUE_UNROLL = 8


def strip_software_pipeline(sch) -> int:
    """Remove software-pipeline annotations from every loop of ``sch``; returns how many."""
    from tvm.s_tir.dlight.gpu.matmul import get_root_block

    def blocks(b):
        out = [b]
        for c in sch.get_child_blocks(b):
            out += blocks(c)
        return out

    removed = 0
    for b in [x for c in sch.get_child_blocks(get_root_block(sch)) for x in blocks(c)]:
        for loop in sch.get_loops(b):  # loops shared by several blocks: re-read, never unannotate twice
            for key in _PIPELINE_KEYS:
                if key in sch.get(loop).annotations:
                    sch.unannotate(loop, key)
                    removed += 1
    return removed
