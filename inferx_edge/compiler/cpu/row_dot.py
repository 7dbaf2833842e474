"""CPU schedule for reductions whose operands are contiguous along the reduction (a matrix times a
vector with the matrix row-major, a dense layer at one row with its weight ``[out, in]``): each output
is a dot product of contiguous rows. Kernels of several reduction axes (convolutions, even 1x1 ones
with their unit window axes) are not taken.

The register-tile schedule of :mod:`~inferx_edge.compiler.cpu.default_schedule` vectorizes across
outputs, which here gathers every vector lane from another row (a 4096 x 4096 matrix times a vector
ran 12x slower than BLAS). Instead the reduction is split into vectors (``rfactor``): each output keeps
``VECTORS`` vector accumulators over contiguous loads of its row (independent FMA chains), summed
across lanes at the end; outputs run in parallel. Memory-bound, as a matrix-vector product is."""

from __future__ import annotations

#: vector accumulators per output (independent FMA chains)
VECTORS = 4

#: shorter reductions keep the register tile: at 1000 x 64 it was 1.4x faster than dot products of
#: rows, at 1000 x 128 even, beyond 2-7x slower (benchmarks/results/cpu_gemv_rule_row_dot.json)
MIN_REDUCTION = 128


def takes(sch, block) -> bool:
    """Whether ``block`` (the kernel's one reduction) reduces over one axis that is the innermost index
    of its largest operand, every other operand being at most one row of the reduction (a vector: with
    several rows, a register tile reuses each load across them and is the faster schedule)."""
    from tvm import tirx

    node = sch.get(block)
    reduce = [iv for iv in node.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    written = [w.source for w in node.writes]
    reads = [r for r in node.reads if not any(r.source.same_as(w) for w in written)]
    if len(reduce) != 1 or not reads or not isinstance(reduce[0].dom.extent, tirx.IntImm):
        return False
    sizes = [_elements(r.source) for r in reads]
    if None in sizes:
        return False
    largest = reads[sizes.index(max(sizes))]
    last = largest.region[-1].min if largest.region else None
    if not (isinstance(last, tirx.Var) and last.same_as(reduce[0].var)):
        return False
    row = int(reduce[0].dom.extent)
    return row >= MIN_REDUCTION and sum(size > row for size in sizes) == 1


def _elements(buffer) -> int | None:
    from tvm import tirx

    n = 1
    for d in buffer.shape:
        if not isinstance(d, tirx.IntImm):
            return None
        n *= int(d)
    return n


def schedule(sch, block, others: list, lanes: int) -> bool:
    """Schedule ``block`` as the module docstring says, in place, with ``others`` (the kernel's other
    blocks: elementwise consumers of the output, such as a bias) computed per output right after it;
    False where the loops do not allow it (``sch`` may be half changed: callers start over from the
    function)."""
    from tvm import tirx

    loops = sch.get_loops(block)
    kinds = [iv.iter_type for iv in sch.get(block).iter_vars]
    if len(kinds) != len(loops) or kinds[-1] != tirx.IterVar.CommReduce:
        return False
    spatial = loops[:-1]
    extent = sch.get(loops[-1]).extent
    if not isinstance(extent, tirx.IntImm):
        return False
    n = int(extent)
    width = next((lanes * k for k in (VECTORS, 2, 1) if n % (lanes * k) == 0 and n >= 2 * lanes * k), None)
    if width is None:
        return False
    outer, inner = sch.split(loops[-1], [None, width])
    partial = sch.rfactor(inner, factor_axis=len(spatial))
    sch.vectorize(sch.get_loops(partial)[-1])
    init = sch.decompose_reduction(partial, sch.get_loops(partial)[len(spatial)])
    init_loop = sch.get_loops(init)[-1]
    if sch.get(init_loop).kind != tirx.ForKind.VECTORIZED:
        sch.vectorize(init_loop)
    if not spatial:
        return not others
    row = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    for other in others:
        sch.reverse_compute_at(other, row)
    sch.parallel(row)
    return True


def row_dot_schedule(func, lanes: int):
    """``func`` scheduled as the module docstring says when its first block is a reduction
    :func:`takes` and its other blocks are elementwise consumers :func:`schedule` can place, else None."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import get_root_block

    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(get_root_block(sch))
    if not blocks or not takes(sch, blocks[0]):
        return None
    try:
        return sch if schedule(sch, blocks[0], list(blocks[1:]), lanes) else None
    except Exception:  # noqa: BLE001 - consumers it cannot place: the register-tile schedule instead
        return None
