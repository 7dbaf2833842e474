"""What a kernel is, for the tensor-core rules and the tile search: matmul signature, GEMM extents,
dtypes, whether its weights run along the reduction, the tile a record gave it."""

from __future__ import annotations

import re

from inferx_edge.compiler.cuda.tile import TileConfig

#: tensor cores when every non-batch matmul dim is at least this (dlight: larger than 64, which leaves
#: 64-channel convolutions, common in CNN stems and first stages, on CUDA cores)
MIN_TENSORIZE_DIM = 64


#: int8 GEMMs take tensor cores from this many rows (output pixels) when J and K reach
#: :data:`MIN_INT8_DIM`: small row counts get a small tile (:data:`TILE_LADDER`); batch-1
#: ResNet-50's last convolutions (49 rows) otherwise ran on CUDA cores
MIN_INT8_ROWS = 16


#: int8 GEMMs take tensor cores from this many output channels (J) and reduction elements (K): narrow
#: tiles (16 and 32 columns, :data:`NARROW_TILES`) and 32-deep stages keep the padding small.
#: MobileNetV2's 16-32-channel pointwise convolutions ran on CUDA cores (64 was the floor).
MIN_INT8_DIM = 16


def sm_version(target) -> int:
    """``sm_90a`` -> 90, ``sm_87`` -> 87; -1 when not a CUDA arch."""
    m = re.match(r"sm_(\d+)", str(target.attrs.get("arch", "")))
    return int(m.group(1)) if m else -1


#: (input, output) dtypes of matmul-like kernels that get a tensor-core schedule: ours
#: (:func:`tensor_core_schedule`, tile per kernel) for all of them from sm_80, dlight's
#: ``MatmulTensorization`` for fp16 on sm_70-sm_75
_INT8 = ("int8", "int32")


_TENSOR_CORE_DTYPES = (_INT8, ("float16", "float16"), ("float16", "float32"))


#: the first architecture our schedule serves fp16 on (fp16 mma.m16n8k16, cp.async)
MIN_FP16_TILE_SM = 80


def _normalized_gemm(func) -> tuple[tuple[str, str], list[int]] | None:
    """((input dtype, output dtype), static (S, I, J, K) extents: GEMM batch, rows, columns, depth) of a
    matmul-like kernel as dlight normalizes it, else None."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.gpu.matmul import get_in_out_dtypes, get_index_map, get_reduction_blocks, get_root_block

    try:
        sch = s_tir.Schedule(func)
        blocks = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        if not blocks:
            return None
        main = blocks[0]
        dtypes = tuple(str(d) for d in get_in_out_dtypes(sch.get(main)))
        if not get_index_map(sch.get(main)):
            return None
        for i, kind in ((0, "read"), (1, "read"), (0, "write")):
            sch.reindex(main, (kind, i))
        maps = get_index_map(sch.get(main))
        sch.transform_block_layout(main, maps[0])
        extents = []
        for iv in sch.get(main).iter_vars:
            if not isinstance(iv.dom.extent, tirx.expr.IntImm):
                return None
            extents.append(int(iv.dom.extent.value))
        return dtypes, extents
    except Exception:  # not a matmul dlight can normalize
        return None


def _matmul_signature(func) -> tuple[tuple[str, str], list[int]] | None:
    """((input dtype, output dtype), static (I, J, K) extents) of a matmul-like kernel, else None."""
    norm = _normalized_gemm(func)
    return None if norm is None else (norm[0], norm[1][1:])


def is_contraction(func) -> bool:
    """Whether ``func`` is a GEMM or convolution: a matmul dlight normalizes, or (where a unit axis keeps
    dlight from normalizing it: a batch-1 1x1 convolution over pooled channels, one row) a kernel whose
    reduction block sums products of two operands that both move with the reduced axes. A mean or a
    sum reads one."""
    if _matmul_signature(func) is not None:
        return True
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.s_tir.dlight.gpu.matmul import get_reduction_blocks
    from tvm.tirx.analysis import undefined_vars

    try:
        sch = s_tir.Schedule(func)
        blocks = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
    except Exception:  # not a kernel dlight's matmul analysis can read
        return False
    if not blocks or len(blocks) != 1:
        return False
    block = sch.get(blocks[0])
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == 2]  # IterVar.CommReduce
    out = block.writes[0].source
    operands = {
        r.source.name
        for r in block.reads
        if not r.source.same_as(out)
        and any(v.same_as(k) for rng in r.region for v in undefined_vars(rng.min) for k in reduce)
    }
    return len(operands) >= 2


def gemm_batch(func) -> int:
    """The batch extent of a matmul-like kernel (attention's batch x heads, a grouped convolution's
    groups; 1 for a plain GEMM or convolution, or when ``func`` is not one)."""
    norm = _normalized_gemm(func)
    return norm[1][0] if norm is not None else 1


def _innermost_is_reduction(block, read: int) -> bool:
    """Whether the innermost index of ``block``'s ``read``-th operand moves with a reduction axis."""
    from tvm.tirx.analysis import undefined_vars

    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == 2]  # IterVar.CommReduce
    region = block.reads[read].region
    return bool(region) and any(v.same_as(r) for v in undefined_vars(region[-1].min) for r in reduce)


def weights_along_k(func) -> bool:
    """Whether the weight (B) operand of a matmul-like kernel runs along K in memory, as
    :func:`tensor_core_schedule` needs for 16-byte weight loads (False also when ``func`` is not one)."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.s_tir.dlight.gpu.matmul import get_reduction_blocks

    sch = s_tir.Schedule(func)
    blocks = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
    return bool(blocks) and _innermost_is_reduction(sch.get(blocks[0]), 1)


def input_padded(func, script: str | None = None) -> bool:
    """Whether a matmul-like kernel reads an operand through a bounds check (a convolution that pads its
    input: ``if_then_else`` in its TIR), so every tile's activation loads are predicated. ``script``:
    ``func.script()`` where the caller has printed it already."""
    return "if_then_else" in (script if script is not None else func.script())


#: PrimFunc attribute naming the tile a kernel was measured fastest with (``TileConfig.text``), set
#: from a tuning database (:func:`inferx_edge.tune.tiles.annotate_tiles`)
TILE_ATTR = "inferx.tile"


def _recorded_tile(func) -> TileConfig | None:
    text = func.attrs.get(TILE_ATTR) if func.attrs is not None else None
    return TileConfig.parse(str(text)) if text is not None else None


def _tensorizable(dtypes, extents, tiled: bool = True) -> bool:
    """Whether a matmul of these dtypes and (I, J, K) is large enough for tensor cores: from
    :data:`MIN_INT8_ROWS` x :data:`MIN_INT8_DIM` with our schedule's narrow tiles (``tiled``), from
    :data:`MIN_TENSORIZE_DIM` in every dim with dlight's."""
    min_rows, min_dim = (MIN_INT8_ROWS, MIN_INT8_DIM) if tiled else (MIN_TENSORIZE_DIM,) * 2
    return extents[0] >= min_rows and all(e >= min_dim for e in extents[1:])


def tile_gemm_extents(func) -> list[int] | None:
    """(I, J, K) of ``func`` when :func:`tensor_core_matmul_rule` schedules it with
    :func:`tensor_core_schedule` on sm_80+ (an int8 -> int32 or fp16 matmul or implicit-GEMM
    convolution large enough), else None."""
    sig = _matmul_signature(func)
    return sig[1] if sig is not None and sig[0] in _TENSOR_CORE_DTYPES and _tensorizable(*sig) else None


def is_int8_gemm(func) -> bool:
    """Whether ``func`` is an int8 -> int32 matmul-like kernel (:func:`tile_candidates`' ``int8``)."""
    sig = _matmul_signature(func)
    return sig is not None and sig[0] == _INT8
