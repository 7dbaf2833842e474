"""Helpers the dlight rules share."""

from __future__ import annotations


def _inlined_blocks(rule, func, target):
    """(schedule, block infos after dlight's inlining) of ``func`` for a GPU rule, or None."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight import base
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    if not isinstance(func, tirx.PrimFunc) or not rule.is_target_available(target):
        return None
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    return None if infos is None else (sch, base.try_inline(sch, infos))


def _cuda_reduction_blocks(rule, func, target):
    """(schedule, block infos with contiguous spatial producers inlined) of ``func`` for a CUDA-only
    reduction rule (dlight's ``GeneralReduction`` preparation), or None."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base import try_inline_contiguous_spatial

    if not isinstance(func, tirx.PrimFunc) or not rule.is_target_available(target) or target.kind.name != "cuda":
        return None
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    return None if infos is None else (sch, try_inline_contiguous_spatial(sch, infos))


def sliding_vars(block) -> set:
    """The spatial (output) variables of ``block`` that an index of one of its reads combines with a
    reduction variable (``w + kw``: a sliding window; ``g * Cg + c``: a grouped channel). Empty for row
    reductions (softmax, norms, means)."""
    from tvm import tirx
    from tvm.tirx.analysis import undefined_vars

    spatial = {iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar}
    reduce = {iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce}
    found = set()
    for region in block.reads:
        for rng in region.region:
            used = set(undefined_vars(rng.min))
            if used & reduce:
                found |= used & spatial
    return found
