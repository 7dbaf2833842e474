"""Default CPU schedules for kernels without a tuning record: parallel outer loops, vector inner loops.

TVM 0.27 leaves untuned CPU kernels as the naive loop nests legalization writes (one thread, scalar
code; dlight's CPU rules cover only GEMV and reductions), so an untuned build ran tens of times slower
than onnxruntime. This rule gives every kernel a generic, always-valid schedule (measured in
``benchmarks/results/cpu_vision_x86-cpu.json``; ``tune`` or
``build --tune-minutes`` remain the way to full speed):

- the one reduction block (a convolution, matmul, pooling window): a register tile of up to
  :attr:`CPUDefaultSchedule.MAX_ACCUMULATORS` vector accumulators (one or two vectors of the innermost
  output axis x a divisor of the next one, e.g. output channels x output pixels, unrolled) with the
  reduction loops outside it, so each accumulator stays in a register over the whole reduction and the
  FMA units get independent chains; a convolution whose weight tile exceeds
  :attr:`CPUDefaultSchedule.CACHED_WEIGHTS_BYTES` sweeps every output row per output-channel tile, so
  those weights are read from cache, not memory; the outer output loops fused and parallelized, the
  initialisation decomposed out and vectorized (``benchmarks/results/cpu_vision_x86-cpu.json``);
- its elementwise consumers (bias, residual, activation) inlined into one block computed per register
  tile right after the tile's reduction, inside the same parallel loop, and its identity-copy
  producers (a pad with nothing to pad) inlined into it: one pass over the output instead of one per
  consumer (``benchmarks/results/zoo_x86-cpu_epyc_after.json``);
- every other block (pads, elementwise epilogues left unfused, layout changes, casts): its innermost
  loop split into whole vectors (vectorized), its outer loops fused and parallel;
- a reduction whose operands are contiguous along it (a matrix times a vector): :mod:`.row_dot`.

The schedule is exact (only loop transformations) and never fails a build: a function it cannot
schedule keeps TVM's default. Tuned kernels (``tirx.is_scheduled``) are left alone.
"""

from __future__ import annotations

import math

from inferx_edge.compiler.cpu import row_dot
from inferx_edge.compiler.prim_funcs import unscheduled


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
        from tvm import s_tir
        from tvm.s_tir import meta_schedule as ms
        from tvm.s_tir.dlight.analysis import get_root_block

        if not unscheduled(func):
            return None
        try:
            sch = s_tir.Schedule(func)
            root = get_root_block(sch)
            blocks = sch.get_child_blocks(root)
            reductions = [b for b in blocks if _is_reduction(sch, b)]
            if len(reductions) > 1:
                return None
            lanes = _lanes(target, self._bits(sch, reductions[0] if reductions else blocks[-1]))
            dots = row_dot.row_dot_schedule(func, lanes) if reductions else None
            if dots is not None:  # dot products of contiguous rows
                return dots
            unroll, anchor = self._reduction_order(sch, reductions[0], lanes) if reductions else ([], None)
            epilogue = _fuse_epilogue(sch, root, reductions[0], anchor) if reductions else None
            cores = int(target.attrs.get("num-cores", 1) or 1)
            sch.annotate(root, "meta_schedule.parallel", cores * self.JOBS_PER_CORE)
            blocks = sch.get_child_blocks(root)  # after the epilogue's blocks were inlined
            if not _has_bool_buffer(sch, blocks):  # LLVM's vector stores of bool (i1) masks fail codegen
                sch.annotate(root, "meta_schedule.vectorize", lanes)
                for b in blocks:
                    if not _is_reduction(sch, b) and (epilogue is None or not _same(sch, b, epilogue)):
                        _split_for_vectors(sch, b, lanes)
            for post in (ms.postproc.RewriteParallelVectorizeUnroll(), ms.postproc.RewriteReductionBlock()):
                if not post.apply(sch):
                    return None
            for loop in unroll:
                try:
                    sch.unroll(loop)
                except Exception:  # noqa: BLE001 - a loop the postprocessors fused away: leave it
                    pass
            if epilogue is not None:
                _vectorize_innermost(sch, epilogue, lanes)
            return sch
        except Exception:  # noqa: BLE001 - a shape or pattern this rule does not cover: TVM's default
            return None

    def _bits(self, sch, block) -> int:
        region = sch.get(block).writes[0]
        buf = getattr(region, "buffer", None) or getattr(region, "source", None)
        dtype = getattr(buf, "dtype", None) or getattr(getattr(region, "ty", None), "dtype", "float32")
        return max(8, int(tvm_dtype_bits(dtype)))

    #: most vector accumulators a register tile may hold (16 vector registers on AVX2/NEON-128,
    #: 32 on AVX-512/NEON: leave room for the operands)
    MAX_ACCUMULATORS = 12
    #: a reduction's operand tile larger than this (bytes, ~ half an L2) is kept in cache across output rows
    CACHED_WEIGHTS_BYTES = 128 * 1024

    @classmethod
    def _reduction_order(cls, sch, block, lanes: int) -> tuple[list, object]:
        """Output axes outside, then the reduction, then a register tile: up to a few vectors of the
        innermost output axis times a few rows of the next one (e.g. output channels x output pixels
        of a convolution). Each accumulator stays in a register over the whole reduction, and the tile
        gives the FMA units several independent chains (one accumulator is latency-bound). Returns the
        loops to unroll (the tile's row loop) and the loop right above the reduction loops (None when
        the block was left as it was)."""
        from tvm import tirx

        loops = sch.get_loops(block)
        kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
        if len(kinds) != len(loops):
            return [], None
        spatial = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.DataPar]
        reduce = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.CommReduce]
        if not spatial or not reduce:
            return [], None
        last = _extent(spatial[-1], sch)
        group = _group_width(sch.get(block), [i for i, k in enumerate(kinds) if k == tirx.IterVar.DataPar][-1])
        if group is not None and group < lanes:
            # grouped conv with groups narrower than a vector: a vector of output channels spanning
            # several groups would gather its inputs (ResNeXt's 4-wide groups ran at 7 GFLOPS); one
            # group's channels per vector broadcast one input instead
            lanes = group & -group  # its largest power-of-two divisor
        v = _vector_width(last, lanes)
        ragged = v is None and last is not None and last >= 2 * lanes
        if ragged:  # e.g. 197 tokens: pad the output axis to whole vectors (a padded copy, then sliced)
            v = lanes
            last_iter = [i for i, k in enumerate(kinds) if k == tirx.IterVar.DataPar][-1]
            try:
                sch.pad_einsum(block, [v if i == last_iter else 1 for i in range(len(kinds))])
                loops = sch.get_loops(block)
                spatial = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.DataPar]
                reduce = [lp for lp, k in zip(loops, kinds) if k == tirx.IterVar.CommReduce]
                last = _extent(spatial[-1], sch)
                ragged = False
            except Exception:  # noqa: BLE001 - not an einsum pad_einsum accepts (a convolution)
                odd = _odd_vector_width(last, lanes)
                if odd:  # vectors of a divisor instead: 27 channels as 3 x 9
                    v, ragged = odd, False
        elif v is None:
            v = _odd_vector_width(last, lanes)
            if v is None:
                sch.reorder(*spatial, *reduce)
                return [], spatial[-1]
        # the tile's rows: the nearest output axis above the vector one that is not a unit axis
        # (a sequence-first (tokens, 1, features) matmul gave a one-row tile at 48 GFLOPS: ViT's QKV)
        while len(spatial) >= 3 and _extent(spatial[-2], sch) == 1:
            spatial = spatial[:-2] + spatial[-1:]
        rows_ext = _extent(spatial[-2], sch) if len(spatial) >= 2 else None
        vectors, rows = 1, 1
        for k in (2, 1):  # the register tile with the most accumulators (ties: more vectors)
            if last % (k * v) and not (ragged and k == 1):
                continue
            r = _row_tile(rows_ext, cls.MAX_ACCUMULATORS // k)
            if k * r > vectors * rows:
                vectors, rows = k, r
        outer, inner = sch.split(spatial[-1], [None, vectors * v])
        rows_loop = None
        if rows > 1:
            row_outer, rows_loop = sch.split(spatial[-2], [None, rows])
            reduction = math.prod(_extent(r, sch) or 1 for r in reduce)
            if len(spatial) >= 4 and reduction * vectors * v * 4 > cls.CACHED_WEIGHTS_BYTES:
                # NHWC-like with a large weight tile: each tile of output channels sweeps every output row
                # while its weights stay in cache (deep layers' weights are MBs: re-streaming them per
                # output row was the bottleneck)
                sch.reorder(spatial[0], outer, *spatial[1:-2], row_outer, *reduce, rows_loop, inner)
                anchor = row_outer
            else:
                sch.reorder(*spatial[:-2], row_outer, outer, *reduce, rows_loop, inner)
                anchor = outer
        else:
            sch.reorder(*spatial[:-1], outer, *reduce, inner)
            anchor = outer
        unroll = [rows_loop] if rows_loop is not None else []
        if vectors > 1:
            vec_outer, _ = sch.split(inner, [vectors, None])
            unroll.append(vec_outer)
        return unroll, anchor


def _fuse_epilogue(sch, root, block, anchor):
    """Elementwise consumers of ``block`` (bias, residual add, activation) inlined into the last one,
    which is then computed per register tile right after its reduction finishes (one pass over the
    output instead of one per consumer, each its own parallel region); identity-copy producers (a
    ``pad`` with nothing to pad) inlined into ``block``. ``anchor``: the loop right above the
    reduction loops (None: no tile, nothing moved). A step that does not apply is skipped. Returns the
    consumer block when it was moved into the tile, else None."""
    from tvm import tirx

    blocks = sch.get_child_blocks(root)
    index = next(i for i, b in enumerate(blocks) if _same(sch, b, block))
    for producer in blocks[:index]:
        body = sch.get(producer).body
        # a load of one buffer (tirx.BufferLoad builds an ir.TensorLoad in this TVM)
        if isinstance(body, tirx.BufferStore) and type(body.value).__name__ in ("BufferLoad", "TensorLoad"):
            try:
                sch.compute_inline(producer)
            except Exception:  # noqa: BLE001 - not inlinable here: keep the copy
                pass
    consumers = blocks[index + 1 :]
    if not consumers or anchor is None:
        return None
    for b in consumers[:-1]:
        try:
            sch.compute_inline(b)
        except Exception:  # noqa: BLE001 - not elementwise: the remaining blocks stay separate
            return None
    try:
        sch.reverse_compute_at(consumers[-1], anchor, preserve_unit_loops=True)
    except Exception:  # noqa: BLE001 - a consumer whose region the tile does not cover: separate pass
        return None
    return consumers[-1]


def _same(sch, a, b) -> bool:
    return sch.get(a).same_as(sch.get(b))


def _split_for_vectors(sch, block, lanes: int) -> None:
    """A separate pass (a pad, a layout change, an unfused epilogue): its innermost loop split into
    whole vectors, which the vectorize postprocessor then takes (it only vectorizes inner loops of at
    most one vector, so a pad over 64 channels stayed scalar)."""
    try:
        inner = sch.get_loops(block)[-1]
        ext = _extent(inner, sch)
        if ext and ext > lanes and ext % lanes == 0:
            sch.split(inner, [None, lanes])
    except Exception:  # noqa: BLE001 - nothing to split: the postprocessor decides as before
        pass


def _vectorize_innermost(sch, block, lanes: int) -> None:
    """The innermost loop of ``block`` vectorized when it spans whole vectors (else left scalar)."""
    try:
        inner = sch.get_loops(block)[-1]
        ext = _extent(inner, sch)
        if ext and ext % lanes == 0 and ext <= 4 * lanes:
            sch.vectorize(inner)
    except Exception:  # noqa: BLE001 - a loop the vectorizer refuses: scalar epilogue, still correct
        pass


def _group_width(block, spatial_index: int) -> int | None:
    """The group width ``k`` of a grouped reduction: some read indexes by ``v // k`` (times ``k``) where
    ``v`` is the block's spatial iterator ``spatial_index`` (a grouped conv's output channel); else None."""
    import tvm
    from tvm import tirx

    var = block.iter_vars[spatial_index].var
    found: list[int] = []

    def walk(e) -> None:
        if isinstance(e, tirx.FloorDiv) and isinstance(e.a, tirx.Var) and e.a.same_as(var):
            if isinstance(e.b, tirx.IntImm) and int(e.b.value) > 1:
                found.append(int(e.b.value))
            return
        for child in ("a", "b"):
            sub = getattr(e, child, None)
            if isinstance(sub, tvm.ir.expr.Expr):
                walk(sub)

    for region in block.reads:
        for rng in region.region:
            walk(rng.min)
    return min(found) if found else None


def _odd_vector_width(extent: int | None, lanes: int) -> int | None:
    """For an innermost output axis no power-of-two vector divides (27 output channels: ESPCN's last
    conv; a 21-class head): its largest divisor from 3 to one register of ``lanes``, else None (the
    vectorize postprocessor takes loops of at most ``lanes``). On the 2-core AVX-512 build host, ESPCN's
    32 -> 27 3x3 conv at 96 x 96 took 33.5 ms as a guarded scalar tail and 1.1 ms as 3 vectors of 9
    (end to end 37.4 -> 3.9 ms, onnxruntime 3.3-3.8); a 128 -> 21 1x1 conv at 40 x 40 1.37 -> 0.07 ms."""
    if not extent:
        return None
    return next((d for d in range(min(lanes, extent), 2, -1) if extent % d == 0), None)


def _row_tile(extent: int | None, at_most: int) -> int:
    """Rows of the register tile: the largest divisor of ``extent`` up to ``at_most``; when that divisor
    is under half of ``at_most`` (197 tokens, a prime: 1), ``at_most`` rows with a ragged last tile
    instead (its rows are guarded; the vector lanes are not) -- a one-row tile re-reads the whole
    weight matrix for every row (ViT's 197 x 768 x 3072 dense layer ran 10x slower than numpy)."""
    r = _largest_divisor(extent, at_most)
    if extent and extent > at_most and 2 * r < at_most:
        return at_most
    return r


def _largest_divisor(extent: int | None, at_most: int) -> int:
    if not extent:
        return 1
    return next((r for r in range(min(at_most, extent), 1, -1) if extent % r == 0), 1)


def tvm_dtype_bits(dtype) -> int:
    import tvm

    return tvm.runtime.DataType(str(dtype)).bits


def _has_bool_buffer(sch, blocks) -> bool:
    for b in blocks:
        stmt = sch.get(b)
        for region in list(stmt.reads) + list(stmt.writes):
            buf = getattr(region, "buffer", None) or getattr(region, "source", None)
            if str(getattr(buf, "dtype", "")) == "bool":
                return True
    return False


def _is_reduction(sch, block) -> bool:
    from tvm import tirx

    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)


def cpu_pipeline(target, first_rules=()):
    """TVM's default CPU Relax pipeline with :class:`CPUDefaultSchedule` after fusion, then dlight's
    general reduction rule for what ours declines (functions with several reductions: softmax,
    normalizations). Ours must come before dlight's reduction rule, which also claims convolutions and
    schedules them an order of magnitude slower. dlight's CPU GEMV rule is not used: it vectorizes 128
    outputs around their reduction loops, which LLVM took minutes to compile where the outputs are a
    multiple of 128 (a 1-channel 1x1 conv over 128 x 128 pixels in DPT's depth head: 629 s; 1024 x 32
    over a minute), and ran 1.4-11x slower than ours on every shape measured
    (``benchmarks/cpu_gemv_rule.py``). ``first_rules`` (objects
    with dlight's ``apply(func, target, tunable)``) are tried before all of them."""
    import tvm
    from tvm.relax.backend.cpu_generic import pipeline as cpu_generic
    from tvm.s_tir import dlight as dl

    from inferx_edge.compiler.guarded_schedule import guarded_default_schedule
    from inferx_edge.compiler.op_patterns import after_op_patterns
    from inferx_edge.compiler.tvm_ops import tvm_op_fixes

    tvm_op_fixes()  # vector exp among them: lowered when this pipeline's kernels are compiled
    rule = _as_dlight_rule(CPUDefaultSchedule())
    extra = [_as_dlight_rule(r) for r in first_rules]

    @tvm.transform.module_pass(opt_level=0, name="InferxCPUPipeline")
    def _pipeline(mod, _ctx):
        with target:
            seq = tvm.transform.Sequential(
                cpu_generic.library_dispatch_passes(target)
                + after_op_patterns(cpu_generic.legalize_passes(target))
                + [guarded_default_schedule(*extra, rule, dl.cpu.Reduction())]
                + cpu_generic.dataflow_lower_passes(target)
                + cpu_generic.finalize_passes(target)
            )
            return seq(mod)

    return _pipeline


def _as_dlight_rule(rule: CPUDefaultSchedule):
    from tvm.s_tir.dlight.base import ScheduleRule

    class _Rule(ScheduleRule):
        name = type(rule).__name__  # what build records and kernel profiles name the rule

        def apply(self, func, target, tunable):
            return rule.apply(func, target, tunable)

        def apply_config(self, func, config):  # pragma: no cover - not used by ApplyDefaultSchedule
            return None

    return _Rule()
