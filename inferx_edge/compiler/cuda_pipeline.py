"""The Relax pipeline for CUDA targets: TVM's default, with int8 matmuls on tensor cores that compile.

TVM 0.27's default CUDA pipeline schedules untuned kernels with dlight. Its int8 tensor-core rule
(``dlight.gpu.matmul.MatmulInt8Tensorization``) annotates a two-stage software pipeline that the
``InjectSoftwarePipeline`` pass cannot lower for wmma fragments: every int8 matmul with all dims > 64
fails to compile on sm_80/sm_87 (``inject_software_pipeline.cc: fragment_info_``). On ``sm_90a`` the
rule is skipped altogether (dlight reads the arch number with ``isdigit``), so H100/H200 int8 matmuls
ran on CUDA cores.

:class:`Int8SafeMatmul` keeps int8 compute on tensor cores: it applies the same wmma int8 schedule
without the software-pipeline annotations (shared-memory staging and tensorized load/mma/store stay),
reads ``sm_90a`` as 90, and leaves every other matmul to dlight's own rule. Kernels with a tuning
record keep their tuned schedule (dlight skips scheduled functions).
"""

from __future__ import annotations

import re

_PIPELINE_KEYS = ("software_pipeline_order", "software_pipeline_stage", "software_pipeline_async_stages")
#: dlight tensorizes only when every non-batch matmul dim is larger than this (padding waste otherwise)
MIN_TENSORIZE_DIM = 64


def sm_version(target) -> int:
    """``sm_90a`` -> 90, ``sm_87`` -> 87; -1 when not a CUDA arch."""
    m = re.match(r"sm_(\d+)", str(target.attrs.get("arch", "")))
    return int(m.group(1)) if m else -1


def _int8_matmul_extents(func) -> list[int] | None:
    """Static (I, J, K) extents of an int8 x int8 -> int32 matmul-like kernel, else None."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.gpu.matmul import get_in_out_dtypes, get_index_map, get_reduction_blocks, get_root_block

    try:
        sch = s_tir.Schedule(func)
        blocks = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        if not blocks:
            return None
        main = blocks[0]
        if get_in_out_dtypes(sch.get(main)) != ("int8", "int32") or not get_index_map(sch.get(main)):
            return None
        for i, kind in ((0, "read"), (1, "read"), (0, "write")):
            sch.reindex(main, (kind, i))
        maps = get_index_map(sch.get(main))
        sch.transform_block_layout(main, maps[0])
        extents = []
        for iv in sch.get(main).iter_vars[1:]:
            if not isinstance(iv.dom.extent, tirx.expr.IntImm):
                return None
            extents.append(int(iv.dom.extent.value))
        return extents
    except Exception:  # not a matmul dlight can normalize
        return None


def int8_safe_matmul_rule():
    """A dlight rule: int8 tensor-core matmul without software pipelining, else dlight's Matmul."""
    from tvm.s_tir import dlight as dl
    from tvm.s_tir.dlight.gpu.matmul import MatmulInt8Tensorization

    class Int8SafeMatmul(dl.gpu.Matmul):
        def apply(self, func, target, tunable):
            from tvm import tirx

            if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
                return None
            if target.kind.name == "cuda" and sm_version(target) >= 70:
                extents = _int8_matmul_extents(func)
                if extents is not None:
                    if all(e > MIN_TENSORIZE_DIM for e in extents):
                        sch = MatmulInt8Tensorization().apply(func, target, tunable)
                        if sch is not None:
                            strip_software_pipeline(sch)
                            return sch
                    # CUDA-core int8 (int8 loads, int32 accumulation), never the crashing tensor-core path
                    func = func.with_attr("dlight.do_not_tensorize", True)
            return super().apply(func, target, tunable)

    return Int8SafeMatmul()


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


def cuda_pipeline(target):
    """TVM's default CUDA Relax pipeline with :func:`int8_safe_matmul_rule` in place of dlight's Matmul."""
    import tvm
    from tvm import relax
    from tvm.relax.backend.cuda import pipeline as cuda
    from tvm.s_tir import dlight as dl

    legalize = [
        relax.transform.LegalizeOps(),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        dl.ApplyDefaultSchedule(
            int8_safe_matmul_rule(),
            dl.gpu.GEMV(),
            dl.gpu.Reduction(),
            dl.gpu.GeneralReduction(),
            dl.gpu.Fallback(),
        ),
    ]

    @tvm.transform.module_pass(opt_level=0, name="InferxCUDAPipeline")
    def _pipeline(mod, _ctx):
        with target:
            seq = tvm.transform.Sequential(
                cuda.library_dispatch_passes(target)
                + legalize
                + cuda.dataflow_lower_passes(target)
                + cuda.finalize_passes(target)
            )
            return seq(mod)

    return _pipeline
