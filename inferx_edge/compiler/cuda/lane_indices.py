"""Operand loads whose index arithmetic keeps the vector lane apart, so TVM can vectorize them.

A tensor-core kernel copies its operand tiles global -> shared ``lanes`` elements per load. For an
implicit-GEMM convolution the element ``k`` of the reduction is ``(kh, kw, c)``: its input index
divides ``k`` by ``C`` and ``KW * C``, and where the conv pads its input the load is guarded by a test
on those quotients. With the lane inside ``k`` (``k = k0 * 64 + t * 4 + lane``) and a channel count
that is not a multiple of the tile depth (32, 96), TVM's simplifier cannot see that ``k // 96`` is the
same for the 4 lanes (it has no rule dividing out a common factor of a sum), its vectorizer then finds
a per-lane guard and makes the whole load element by element (the "scalarized" loops
``benchmarks/cuda_vector_census.py`` counts: 13 kernels of YOLOv8n, 14 of GoogLeNet).

:func:`copy_loops` gives the copy block an iterator of its own for the lane (``k = 4 * kq + lane``),
and :func:`simplify_lane_indices`, after the producers (the conv's pad, the GEMM reindex) are inlined
into it, simplifies its divisions and remainders with the block's iterator domains, where TVM does
have the rule: ``(4 * kq + lane) // 96`` -> ``kq // 24`` and ``(4 * kq + lane) % 96`` -> ``kq % 24 * 4 +
lane`` for ``0 <= lane < 4``. The loads are then lane-invariant tests and one vector each. Only the
form of the arithmetic changes: the simplifications hold for every value in the domains.
"""

from __future__ import annotations


def copy_loops(sch, block, lanes: int, loop):
    """Give the operand copy ``block`` (iterators ``s, i, k`` at the root, trivial bindings) a lane
    iterator of its own, ``(s, i, k // lanes, k % lanes)``, move it under ``loop`` and return its loops
    (row, column, lane). ``k``'s extent must be a multiple of ``lanes`` (operand tiles are padded to the
    tile depth, a multiple of every load width); one-element loads keep ``k`` whole (a lane loop of 1)."""
    if lanes > 1:
        sch.transform_block_layout(block, lambda s, i, k: (s, i, k // lanes, k % lanes))
    sch.compute_at(block, loop)
    if lanes > 1:
        return sch.get_loops(block)[-3:]
    row, col = sch.get_loops(block)[-2:]
    return (row, *sch.split(col, factors=[None, 1]))


def simplify_lane_indices(sch, block) -> None:
    """Rewrite every ``//`` and ``%`` in ``block`` (its body, reads and writes) as TVM's arithmetic
    simplifies it given the block's iterator domains; the block keeps its place in ``sch``."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    stmt = sch.get(block)
    analyzer = tvm.sym.Analyzer()
    for iv in stmt.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    rewritten = tvm_ffi.structural_map(stmt, [(tirx.FloorDiv, analyzer.simplify), (tirx.FloorMod, analyzer.simplify)])
    if not rewritten.same_as(stmt):
        sch.state.replace(sch.get_sref(block), rewritten, {stmt: rewritten})
