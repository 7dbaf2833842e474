"""CPU schedule for the LLM's weight-reading kernels (``matmul_kn_*``, dequantization inlined).

Rows (tokens: symbolic, hundreds in prefill) are tiled by :data:`ROWS` with a guarded tail, outputs by
up to six vectors (:data:`VECTORS`; 4 x 6 AVX-512 accumulators measured fastest on SmolLM2's matrices,
8 spills); the reduction runs between them, so each weight row segment read (and dequantized) once
serves every row of the tile. Decode kernels (``[batch, 1, in]``: one token per sequence) take one row
per tile instead: a guarded row kept its accumulators in memory (a load and a store per FMA) and
recomputed the dequantization, which is all a one-token tile does. The row-tile x output-tile loop is
parallel. Epilogues (residual add, cast) are computed per tile. Kernels of another shape are left to
the next rule.
"""

from __future__ import annotations

from inferx_edge.compiler.prim_funcs import unscheduled

ROWS = 4
VECTORS = (6, 4, 3, 2, 1)  # output vectors per tile, first that divides; x ROWS accumulators in registers


def _lanes(target) -> int:
    from tvm.target import codegen

    host = target.host or target
    feats = {str(f) for f in codegen.llvm_get_cpu_features(host)} if host.kind.name == "llvm" else set()
    return 16 if "avx512f" in feats else 8 if "avx2" in feats or "avx" in feats else 4


class LLMMatmulCPU:
    """A dlight schedule rule (``apply(func, target, tunable)``) for ``matmul_kn_*`` kernels."""

    def apply(self, func, target, _tunable: bool):
        from tvm import s_tir, tirx
        from tvm.s_tir.dlight.analysis import get_root_block

        if not unscheduled(func):
            return None
        try:
            sch = s_tir.Schedule(func)
            blocks = sch.get_child_blocks(get_root_block(sch))
            names = [sch.get(b).name_hint for b in blocks]
            main = [b for b, n in zip(blocks, names) if n.startswith("matmul_kn_") and not n.endswith("_groups")]
            groups = [b for b, n in zip(blocks, names) if n.startswith("matmul_kn_") and n.endswith("_groups")]
            if len(main) != 1 or len(groups) > 1:
                return None
            block = main[0]
            epilogue = blocks[blocks.index(block) + 1 :] if block in blocks else []
            loops = sch.get_loops(block)
            kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
            if kinds[-1] != tirx.IterVar.CommReduce or any(k != tirx.IterVar.DataPar for k in kinds[:-1]):
                return None
            *lead, j, k = loops
            n_out = int(sch.get(j).extent)
            lanes = _lanes(target)
            width = next(v * lanes for v in VECTORS if n_out % (v * lanes) == 0)
            if n_out % width:
                return None
            # decode kernels read [batch, 1, in] (model.batch_decode): one row per tile, so no row is
            # guarded and the accumulators stay in registers; prefill ([1, tokens, in]) tiles rows by ROWS
            extents = [sch.get(loop).extent for loop in lead]
            decode = len(extents) >= 2 and isinstance(extents[-1], tirx.IntImm) and int(extents[-1]) == 1
            m = sch.fuse(*lead) if len(lead) > 1 else lead[0]
            m_o, m_i = sch.split(m, [None, 1 if decode else ROWS])
            j_o, j_v, j_l = sch.split(j, [None, width // lanes, lanes])
            sch.reorder(m_o, j_o, k, m_i, j_v, j_l)
            par = sch.fuse(m_o, j_o)
            sch.parallel(par)
            sch.unroll(m_i)
            sch.unroll(j_v)
            sch.vectorize(j_l)
            if groups:  # int4 group sums (quant.WeightMatrix._grouped_kn): the tile's, per group, in registers
                part = groups[0]
                sch.compute_at(part, k)
                sch.set_scope(part, 0, "local")
                p_loops = sch.get_loops(part)
                under = [i for i, lp in enumerate(p_loops) if sch.get(lp).same_as(sch.get(k))][0] + 1
                *p_m, p_j, p_r = p_loops[under:]  # the tile's rows (none when one row), its outputs, the group
                p_jv, p_jl = sch.split(p_j, [None, lanes])
                sch.reorder(p_r, *p_m, p_jv, p_jl)
                sch.unroll(p_r)
                for lp in p_m:
                    sch.unroll(lp)
                sch.unroll(p_jv)
                sch.vectorize(p_jl)
                p_init = sch.decompose_reduction(part, p_r)
                sch.vectorize(sch.get_loops(p_init)[-1])
            init = sch.decompose_reduction(block, k)
            sch.vectorize(sch.get_loops(init)[-1])
            for epi in epilogue:
                sch.reverse_compute_at(epi, par)
                sch.vectorize(sch.split(sch.get_loops(epi)[-1], [None, lanes])[-1])
            return sch
        except Exception:  # noqa: BLE001 - a kernel this rule does not cover: the next rule
            return None
