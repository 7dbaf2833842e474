"""Default CPU schedules for kernels without a tuning record: parallel outer loops, vector inner loops.

TVM 0.27 leaves untuned CPU kernels as the naive loop nests legalization writes (one thread, scalar
code; dlight's CPU rules cover only GEMV and reductions), so an untuned build ran tens of times slower
than onnxruntime. This rule gives every kernel a generic, always-valid schedule (measured in
``benchmarks/results/cpu_latency_x86-cpu_rocketlake_default_schedules.json``; ``tune`` or
``build --tune-minutes`` remain the way to full speed):

- the one reduction block (a convolution, matmul, pooling window): the innermost output axis split by
  the vector width and vectorized, the reduction loops moved inside the output tile so each vector of
  accumulators is reused across the whole reduction, the outer output loops fused and parallelized,
  the initialisation decomposed out and vectorized;
- every other block (pads, elementwise epilogues, layout changes, casts): its loops fused, split by
  the vector width, the outer part parallel and the inner part vectorized.

The schedule is exact (only loop transformations) and never fails a build: a function it cannot
schedule keeps TVM's default. Tuned kernels (``tirx.is_scheduled``) are left alone.
"""

from __future__ import annotations


def _extent(loop_sref, sch) -> int | None:
    from tvm import tirx

    ext = sch.get(loop_sref).extent
    return int(ext.value) if isinstance(ext, tirx.expr.IntImm) else None


def _vector_width(extent: int | None, lanes: int) -> int | None:
    if extent is None:
        return None
    for v in (lanes, lanes // 2, lanes // 4, 4):
        if v >= 2 and extent % v == 0:
            return v
    return None


def _lanes(target, dtype_bits: int) -> int:
    """Vector lanes for one register: 512-bit with AVX-512, else 256 (x86) / 128 (Arm NEON)."""
    features = set()
    try:
        import tvm

        features = set(tvm.target.codegen.llvm_get_cpu_features(target))
    except Exception:  # noqa: BLE001 - not an llvm target we can ask: assume the narrowest
        pass
    bits = 512 if "avx512f" in features else 256 if "avx2" in features or "avx" in features else 128
    return max(2, bits // dtype_bits)


class CPUDefaultSchedule:
    """The dlight rule of :mod:`inferx_edge.compiler.cpu.default_schedule` (see there). Loop order is
    set here; parallel and vector loops are then made by MetaSchedule's own postprocessors
    (``RewriteParallelVectorizeUnroll``, ``RewriteReductionBlock``), which keep every step legal."""

    #: parallel jobs per core the parallel loop may have (MetaSchedule's default)
    JOBS_PER_CORE = 16

    def apply(self, func, target, _tunable: bool):
        from tvm import s_tir, tirx
        from tvm.s_tir import meta_schedule as ms
        from tvm.s_tir.dlight.analysis import get_root_block

        if not isinstance(func, tirx.PrimFunc) or (func.attrs is not None and "tirx.is_scheduled" in func.attrs):
            return None
        try:
            sch = s_tir.Schedule(func)
            root = get_root_block(sch)
            blocks = sch.get_child_blocks(root)
            reductions = [b for b in blocks if _is_reduction(sch, b)]
            if len(reductions) > 1:
                return None
            lanes = _lanes(target, self._bits(sch, reductions[0] if reductions else blocks[-1]))
            if reductions:
                self._reduction_order(sch, reductions[0], lanes)
            cores = int(target.attrs.get("num-cores", 1) or 1)
            sch.annotate(root, "meta_schedule.parallel", cores * self.JOBS_PER_CORE)
            sch.annotate(root, "meta_schedule.vectorize", lanes)
            for post in (ms.postproc.RewriteParallelVectorizeUnroll(), ms.postproc.RewriteReductionBlock()):
                if not post.apply(sch):
                    return None
            return sch
        except Exception:  # noqa: BLE001 - a shape or pattern this rule does not cover: TVM's default
            return None

    def _bits(self, sch, block) -> int:
        region = sch.get(block).writes[0]
        buf = getattr(region, "buffer", None) or getattr(region, "source", None)
        dtype = getattr(buf, "dtype", None) or getattr(getattr(region, "ty", None), "dtype", "float32")
        return max(8, int(tvm_dtype_bits(dtype)))

    @staticmethod
    def _reduction_order(sch, block, lanes: int) -> None:
        """Output axes outside, then the reduction, then a vector's worth of the innermost output axis:
        each vector of accumulators stays in registers over the whole reduction."""
        from tvm import tirx

        loops = sch.get_loops(block)
        kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
        if len(kinds) != len(loops):
            return
        spatial = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.DataPar]
        reduce = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.CommReduce]
        if not spatial or not reduce:
            return
        v = _vector_width(_extent(spatial[-1], sch), lanes)
        if v is None:
            sch.reorder(*spatial, *reduce)
            return
        outer, inner = sch.split(spatial[-1], [None, v])
        sch.reorder(*spatial[:-1], outer, *reduce, inner)


def tvm_dtype_bits(dtype) -> int:
    import tvm

    return tvm.runtime.DataType(str(dtype)).bits


def _is_reduction(sch, block) -> bool:
    from tvm import tirx

    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)


def cpu_pipeline(target):
    """TVM's default CPU Relax pipeline with :class:`CPUDefaultSchedule` after fusion: dlight's GEMV
    rule first, ours next, dlight's general reduction rule for what ours declines (functions with
    several reductions: softmax, normalizations). Ours must come before dlight's reduction rule, which
    also claims convolutions and schedules them an order of magnitude slower."""
    import tvm
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic
    from tvm.s_tir import dlight as dl

    rule = _as_dlight_rule(CPUDefaultSchedule())

    @tvm.transform.module_pass(opt_level=0, name="InferxCPUPipeline")
    def _pipeline(mod, _ctx):
        with target:
            seq = tvm.transform.Sequential(
                cpu_generic.library_dispatch_passes(target)
                + cpu_generic.legalize_passes(target)
                + [dl.ApplyDefaultSchedule(dl.cpu.GEMV(), rule, dl.cpu.Reduction())]
                + cpu_generic.dataflow_lower_passes(target)
                + cpu_generic.finalize_passes(target)
            )
            return seq(mod)

    return _pipeline


def _as_dlight_rule(rule: CPUDefaultSchedule):
    from tvm.s_tir.dlight.base import ScheduleRule

    class _Rule(ScheduleRule):
        def apply(self, func, target, tunable):
            return rule.apply(func, target, tunable)

        def apply_config(self, func, config):  # pragma: no cover - not used by ApplyDefaultSchedule
            return None

    return _Rule()
