"""A fused int8 dense-layer kernel rewritten onto the wgmma GEMM (:mod:`~inferx_edge.compiler.cuda.wgmma`).

The kernels FuseOps makes for a quantized dense layer are one reduction block
``C[i.., j] += int32(A[i.., k]) * int32(B[j, k])`` (activations with any number of leading row axes,
an ``[out, in]`` weight) followed by elementwise blocks (dequantize, bias, GELU, residual add,
requantize, casts). :func:`wgmma_kernel_for` inlines the elementwise chain into its last block, checks
that it reads the GEMM's result only at its own output element, and generates the wgmma kernel whose
store evaluates that block's expression on the accumulator, in place of the kernel's body (same
parameters, so the Relax call is unchanged). Anything else — a batched weight, a transposed operand, a
reduction or gather in the epilogue, two outputs — is left to the mma.sync schedule, with the reason.
"""

from __future__ import annotations

import math

from inferx_edge.compiler.cuda.wgmma import BM, GemmShape, element, gemm_body, split_row


def _gemm_block(sch, block):
    """``(C, A, B, row_vars, j, k)`` of a reduction block ``C[rows.., j] += int32(A[rows.., k]) *
    int32(B[j, k])`` over int8 operands, or a string saying why it is not one."""
    from tvm import tirx

    node = sch.get(block)
    body = node.body
    if not isinstance(body, tirx.BufferStore):
        return "the reduction is not one store"
    spatial = [iv.var for iv in node.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv.var for iv in node.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(reduce) != 1 or len(spatial) + 1 != len(node.iter_vars):
        return "not a single reduction axis"
    (k,) = reduce
    value = body.value
    if not (isinstance(value, tirx.Add) and _is_load(value.a) and value.a.source.same_as(body.buffer)):
        return "not an accumulation"
    prod = value.b
    if not isinstance(prod, tirx.Mul):
        return "not a product"
    loads = []
    for operand in (prod.a, prod.b):
        if not (isinstance(operand, tirx.Cast) and _dt(operand) == "int32" and _is_load(operand.value)):
            return "operands are not int8 loads cast to int32"
        loads.append(operand.value)
    if any(x.source.dtype != "int8" for x in loads) or body.buffer.dtype != "int32":
        return "not int8 x int8 -> int32"

    def weight_like(x):  # [j, k] with j an output axis
        return len(x.indices) == 2 and _is_var(x.indices[1], k) and any(_is_var(x.indices[0], v) for v in spatial)

    if weight_like(loads[1]):
        a, b = loads
    elif weight_like(loads[0]):
        b, a = loads
    else:
        return "the weight is not a K-major [N, K] matrix indexed by one output axis"
    j = b.indices[0]
    rows = [v for v in spatial if not v.same_as(j)]
    if not (_is_vars(a.indices, [*rows, k]) and _is_vars(body.indices, [*rows, j])):
        return "activations or result are not row-major over the same row axes with K / N innermost"
    for iv in node.iter_vars:
        if not (
            isinstance(iv.dom.min, tirx.IntImm) and iv.dom.min.value == 0 and isinstance(iv.dom.extent, tirx.IntImm)
        ):
            return "symbolic or offset extents"
    if [int(d) for d in a.source.shape] != [_extent(node, v) for v in [*rows, k]]:
        return "the activations are a slice of a larger tensor"
    if [int(d) for d in b.source.shape] != [_extent(node, j), _extent(node, k)]:
        return "the weight is a slice of a larger tensor"
    if [int(d) for d in body.buffer.shape] != [_extent(node, v) for v in [*rows, j]]:
        return "the result is a slice of a larger tensor"
    return body.buffer, a.source, b.source, rows, j, k


def _dt(expr) -> str:
    return str(expr.ty.dtype)


def _is_load(expr) -> bool:
    import tvm

    return isinstance(expr, tvm.ir.TensorLoad)  # what tirx.BufferLoad builds in this TVM


def _is_var(expr, var) -> bool:
    from tvm import tirx

    return isinstance(expr, tirx.Var) and expr.same_as(var)


def _is_vars(exprs, want) -> bool:
    return len(exprs) == len(want) and all(_is_var(e, v) for e, v in zip(exprs, want, strict=True))


def _rewrite(expr, subst, c, acc):
    """``expr`` with each ``(var, value)`` of ``subst`` substituted and every load of ``c`` replaced
    by ``acc``."""
    import tvm
    import tvm_ffi

    def var(v):
        return next((p for x, p in subst if x.same_as(v)), v)

    def load(e):
        return acc if e.source.same_as(c) else e

    return tvm_ffi.structural_map(expr, [(tvm.ir.TensorLoad, load), (tvm.ir.Var, var)])


def _extent(node, var) -> int:
    return next(int(iv.dom.extent) for iv in node.iter_vars if iv.var.same_as(var))


def _epilogue_store(sch, block, c, extents):
    """``(out, indices, value, vars)`` of the elementwise block that consumes ``c``: it iterates over
    ``c``'s shape and reads ``c`` only at its own iteration point; or a string saying why not."""
    import tvm
    import tvm_ffi
    from tvm import tirx

    node = sch.get(block)
    body = node.body
    if not isinstance(body, tirx.BufferStore) or any(iv.iter_type != tirx.IterVar.DataPar for iv in node.iter_vars):
        return "the epilogue is not one elementwise store"
    ivars = [iv.var for iv in node.iter_vars]
    if [int(iv.dom.extent) if isinstance(iv.dom.extent, tirx.IntImm) else -1 for iv in node.iter_vars] != extents:
        return "the epilogue does not iterate over the GEMM's result"
    bad = []

    def visit(e):
        if e.source.same_as(c) and not _is_vars(e.indices, ivars):
            bad.append(e)
        return e

    tvm_ffi.structural_map(body, [(tvm.ir.TensorLoad, visit)])
    if bad:
        return "the epilogue reads the GEMM's result away from its own element"
    return body.buffer, list(body.indices), body.value, ivars


def loop_body(shape, a, b, store):
    """The GEMM as plain loops (int32 sum over K), each element through ``store``: what the wgmma main
    loop computes, runnable on a CPU (:func:`wgmma_kernel_for`'s ``body`` for checks without a GPU)."""
    from tvm.script import tirx as T

    @T.prim_func(private=True, check_well_formed=False)
    def body():
        acc = T.alloc_buffer((1,), "int32", scope="local")
        for row, col in T.grid(shape.m, shape.n):
            acc[0] = 0
            for k in range(shape.k):
                acc[0] = acc[0] + T.Cast("int32", element(a, row, k)) * T.Cast("int32", element(b, col, k))
            store(acc[0], row, col)

    return body.body


def wgmma_kernel_for(func, body=gemm_body, min_tiles: int = 0, **tile):
    """``(kernel, reason)``: ``func`` (a fused int8 dense layer) with its body replaced by the wgmma
    GEMM and its epilogue, or ``(None, why it does not apply)``. ``tile`` are :class:`GemmShape`'s tile
    fields (its defaults where absent). A GEMM of fewer than ``min_tiles`` output tiles is refused (one
    per SM: smaller ones leave SMs idle that the mma.sync rule's smaller tiles fill). ``body(shape, a, b, store)`` makes the
    new body (:func:`~inferx_edge.compiler.cuda.wgmma.gemm_body`; tests put a plain loop there to run
    the rewritten epilogue on a CPU)."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.script.ir_builder import tirx as IB

    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(get_root_block(sch))
    if not blocks:
        return None, "no blocks"
    gemm = _gemm_block(sch, blocks[0])
    if isinstance(gemm, str):
        return None, gemm
    c, a, b, rows, j, k = gemm
    params = list(func.params)
    if not any(p.same_as(a) for p in params) or not any(p.same_as(b) for p in params):
        return None, "an operand is computed in the kernel"
    node = sch.get(blocks[0])
    row_extents = [_extent(node, v) for v in rows]
    try:
        shape = GemmShape(math.prod(row_extents), _extent(node, j), _extent(node, k), **tile)
    except ValueError as e:  # a shape the kernel does not take: the message says why
        return None, str(e)
    tiles = -(-shape.m // BM) * (shape.n // shape.bn)
    if tiles < min_tiles:
        return None, f"{tiles} output tiles of {BM}x{shape.bn}, fewer than the {min_tiles} SMs"
    try:
        for blk in blocks[1:-1]:
            sch.compute_inline(blk)
    except Exception as e:  # noqa: BLE001 - a schedule error names a kernel we do not rewrite
        return None, f"the epilogue does not inline ({type(e).__name__})"
    blocks = sch.get_child_blocks(get_root_block(sch))
    if len(blocks) > 2:
        return None, "more than one epilogue output"
    if len(blocks) == 2:
        epi = _epilogue_store(sch, blocks[1], c, [*row_extents, shape.n])
        if isinstance(epi, str):
            return None, epi
        out, out_idx, value, ivars = epi
    else:
        out, out_idx, value, ivars = c, [*rows, j], None, [*rows, j]
    if not any(p.same_as(out) for p in params):
        return None, "the kernel's output is not a parameter"

    def store(acc, row, col):
        point = [*split_row(row, row_extents), col]
        subst = [(v, tirx.Cast(_dt(v), p) if _dt(v) != _dt(p) else p) for v, p in zip(ivars, point, strict=True)]
        if value is None:
            IB.buffer_store(out, acc, [p for _, p in subst])
            return
        IB.buffer_store(out, _rewrite(value, subst, c, acc), [_rewrite(i, subst, c, acc) for i in out_idx])

    new_body = body(shape, a, b, store)
    return func.with_body(new_body).with_attr("tirx.is_scheduled", True), ""
