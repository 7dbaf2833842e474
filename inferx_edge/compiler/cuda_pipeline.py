"""The Relax pipeline for CUDA targets: TVM's default, with int8 matmuls on tensor cores that compile.

TVM 0.27's default CUDA pipeline schedules untuned kernels with dlight. Its int8 tensor-core rule
(``dlight.gpu.matmul.MatmulInt8Tensorization``) annotates a two-stage software pipeline that the
``InjectSoftwarePipeline`` pass cannot lower for wmma fragments: every int8 matmul with all dims > 64
fails to compile on sm_80/sm_87 (``inject_software_pipeline.cc: fragment_info_``). On ``sm_90a`` the
rule is skipped altogether (dlight reads the arch number with ``isdigit``), so H100/H200 int8 matmuls
ran on CUDA cores.

:class:`Int8SafeMatmul` keeps int8 compute on tensor cores: it applies the same wmma int8 schedule
without the software-pipeline annotations (shared-memory staging and tensorized load/mma/store stay),
reads ``sm_90a`` as 90, and leaves every other matmul to dlight's own rule. The same arch parsing kept
fp16 matmuls and convolutions off tensor cores on ``sm_90a``: the rule applies dlight's fp16 wmma
schedule there too (also without software pipelining). Convolutions reach these rules as implicit
GEMMs (dlight's reindex turns the input window into the A operand in shared memory).

:class:`SmallReduction` schedules reductions over a few elements per output (depthwise convolutions,
pooling windows) one output per thread with the reduction unrolled in registers and the epilogue in
the same thread. dlight's general-reduction rule gave them one thread block per output with 256
threads sharing 9 products (MobileNetV2's depthwise convolutions: 20-28 ms each at batch 64 on an H200).

Kernels with a tuning record keep their tuned schedule (dlight skips scheduled functions).
"""

from __future__ import annotations

import re

_PIPELINE_KEYS = ("software_pipeline_order", "software_pipeline_stage", "software_pipeline_async_stages")
#: tensor cores when every non-batch matmul dim is at least this (dlight: larger than 64, which left
#: ResNet-50's 64-channel convs on CUDA-core int8: about a quarter of its int8 batch-64 time on an H200)
MIN_TENSORIZE_DIM = 64


def sm_version(target) -> int:
    """``sm_90a`` -> 90, ``sm_87`` -> 87; -1 when not a CUDA arch."""
    m = re.match(r"sm_(\d+)", str(target.attrs.get("arch", "")))
    return int(m.group(1)) if m else -1


#: (input, output) dtypes of matmul-like kernels that get a wmma schedule, and the dlight rule giving it
_TENSOR_CORE_DTYPES = {("int8", "int32"): "MatmulInt8Tensorization", ("float16", "float16"): "MatmulTensorization",
                       ("float16", "float32"): "MatmulTensorization"}  # fmt: skip


def _matmul_signature(func) -> tuple[tuple[str, str], list[int]] | None:
    """((input dtype, output dtype), static (I, J, K) extents) of a matmul-like kernel, else None."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.gpu.matmul import get_in_out_dtypes, get_index_map, get_reduction_blocks, get_root_block

    try:
        sch = s_tir.Schedule(func)
        blocks = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        if not blocks:
            return None
        main = blocks[0]
        dtypes = tuple(get_in_out_dtypes(sch.get(main)))
        if not get_index_map(sch.get(main)):
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
        return dtypes, extents
    except Exception:  # not a matmul dlight can normalize
        return None


def _int8_matmul_extents(func) -> list[int] | None:
    """Static (I, J, K) extents of an int8 x int8 -> int32 matmul-like kernel, else None."""
    sig = _matmul_signature(func)
    return sig[1] if sig is not None and sig[0] == ("int8", "int32") else None


def int8_safe_matmul_rule():
    """A dlight rule: int8 and fp16 tensor-core matmuls without software pipelining, else dlight's Matmul."""
    from tvm.s_tir import dlight as dl
    from tvm.s_tir.dlight.gpu import matmul as dl_matmul

    class Int8SafeMatmul(dl.gpu.Matmul):
        def apply(self, func, target, tunable):
            from tvm import tirx

            if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
                return None
            if target.kind.name == "cuda" and sm_version(target) >= 70:
                sig = _matmul_signature(func)
                if sig is not None and sig[0] in _TENSOR_CORE_DTYPES:
                    dtypes, extents = sig
                    if all(e >= MIN_TENSORIZE_DIM for e in extents):
                        sch = getattr(dl_matmul, _TENSOR_CORE_DTYPES[dtypes])().apply(func, target, tunable)
                        if sch is not None:
                            strip_software_pipeline(sch)
                            return sch
                    if dtypes == ("int8", "int32"):
                        # CUDA-core int8 (int8 loads, int32 accumulation), never the crashing tensor-core path
                        func = func.with_attr("dlight.do_not_tensorize", True)
            return super().apply(func, target, tunable)

    return Int8SafeMatmul()


#: :class:`SmallReduction` takes reductions of at most this many elements per output ...
SMALL_REDUCTION = 64
#: ... with at least this many outputs (enough threads to fill the GPU without a parallel reduction)
MIN_SMALL_REDUCTION_OUTPUTS = 4096


def small_reduction_rule():
    """A dlight rule for reductions over a few elements per output: one output per thread."""
    from tvm import s_tir
    from tvm.s_tir.dlight import base
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    class SmallReduction(GPUScheduleRule):
        def apply(self, func, target, _tunable):
            from tvm import tirx

            if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
                return None
            sch = s_tir.Schedule(func)
            infos = normalize_prim_func(sch)
            if infos is None:
                return None
            infos = base.try_inline(sch, infos)
            reductions = [b for b in infos if "R" in b.dom_kind()]
            if len(reductions) != 1 or any(b.is_reduction() for b in infos if b is not reductions[0]):
                return None
            red = reductions[0]
            if infos.index(red) != 0:  # unfused producers left: not ours
                return None
            s_ext, r_ext = 1, 1
            for it in red.iters:
                if not isinstance(it.dom, int) or it.kind not in "SR":
                    return None
                if it.kind == "S":
                    s_ext *= it.dom
                else:
                    r_ext *= it.dom
            if r_ext > SMALL_REDUCTION or s_ext < MIN_SMALL_REDUCTION_OUTPUTS:
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
            for lp in r_loops:
                sch.unroll(lp)
            sch.decompose_reduction(block, r_loops[0])
            return sch

    return SmallReduction()


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


#: :func:`vectorized_elementwise_rule` takes injective kernels with at least this many elements
MIN_VECTORIZED_ELEMENTS = 1 << 16
_VECTOR = 4


def vectorized_elementwise_rule():
    """A dlight rule for large elementwise kernels (int8 quantize, casts, layout changes): each thread
    handles 4 consecutive elements of the innermost axis (16-byte fp32 loads, 4-byte int8 stores).
    dlight's fallback gave one element per thread: ResNet-50's standalone quantize kernels moved
    ~0.7 TB/s on an H200 (4.8 TB/s peak)."""
    from tvm import s_tir
    from tvm.s_tir.dlight import base
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

    class VectorizedElementwise(GPUScheduleRule):
        def apply(self, func, target, _tunable):
            from tvm import tirx

            if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
                return None
            sch = s_tir.Schedule(func)
            infos = normalize_prim_func(sch)
            if infos is None:
                return None
            infos = base.try_inline(sch, infos)
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
            bx, tx, vec = sch.split(sch.fuse(*sch.get_loops(block)), factors=[None, 256, _VECTOR])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
            sch.vectorize(vec)
            return sch

    return VectorizedElementwise()


def cuda_pipeline(target):
    """TVM's default CUDA Relax pipeline with :func:`int8_safe_matmul_rule` in place of dlight's Matmul
    and :func:`small_reduction_rule` ahead of its reduction rules, :func:`vectorized_elementwise_rule`
    ahead of its fallback."""
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
            small_reduction_rule(),
            dl.gpu.Reduction(),
            dl.gpu.GeneralReduction(),
            vectorized_elementwise_rule(),
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
