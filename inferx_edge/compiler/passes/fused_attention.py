"""Attention (``softmax(Q K^T * scale + bias) V``) as one fused kernel on CUDA tensor cores."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import numpy as np

from inferx_edge.compiler.passes._rewrite import (
    op_name,
    readers,
    rewrite_calls_in_context,
    static_shape,
    swaps_last_two,
    use_counts,
)
from inferx_edge.compiler.passes._views import (
    axis_groups,
    common_refinement,
    constant_value,
    reshape_coords,
    source_of,
    vector_width,
)
from inferx_edge.compiler.passes.attention_outputs import store_attention_outputs
from inferx_edge.compiler.passes.fp16_depthwise import saturated_fp16

_CHAIN = ("relax.astype", "relax.reshape", "relax.multiply", "relax.divide", "relax.add")


@dataclass
class _Scores:
    """What lies between the two matmuls: the constant scale, the other scalar factors (weights: known
    only when the weights are), the bias terms and the batch views the scores took."""

    scale: float = 1.0
    factors: list = field(default_factory=list)  # (1-element expr, divides)
    terms: list = field(default_factory=list)  # (bias expr, constant multiplier, factors, batch view)


def _one_element(expr) -> bool:
    shape = static_shape(expr)
    return shape is not None and math.prod(shape) == 1


def _reaches_matmul(expr, ctx, depth: int = 0) -> bool:
    """Whether ``expr`` is a ``matmul`` through the ops attention puts between it and the softmax."""
    call = ctx.producer(expr)
    name = op_name(call)
    if name is None or depth > 16:
        return False
    if name == "relax.matmul":
        return True
    if name in ("relax.astype", "relax.reshape"):
        return _reaches_matmul(call.args[0], ctx, depth + 1)
    if name in ("relax.multiply", "relax.divide", "relax.add"):
        return any(_reaches_matmul(a, ctx, depth + 1) for a in call.args)
    return False


def _walk_scores(x, ctx):
    """From the softmax input back to the Q x K^T matmul: ``(matmul call, _Scores)`` or None."""
    scores, mult, factors = _Scores(), 1.0, []
    for _ in range(32):
        call = ctx.producer(x)
        name = op_name(call)
        if name not in (*_CHAIN, "relax.matmul"):
            return None
        shape = static_shape(call)
        if shape is None:
            return None
        if name == "relax.matmul":
            scores.scale, scores.factors = mult, factors
            return call, scores
        if name == "relax.astype":
            x = call.args[0]
        elif name == "relax.reshape":
            before = static_shape(call.args[0])
            if before is None or before[-2:] != shape[-2:]:
                return None  # a reshape that mixes score rows or columns is not attention
            x = call.args[0]
        elif name in ("relax.multiply", "relax.divide"):
            a, b = call.args
            if _one_element(b) and static_shape(a) == shape:
                x, c = a, b
            elif name == "relax.multiply" and _one_element(a) and static_shape(b) == shape:
                x, c = b, a
            else:
                return None
            k = constant_value(c, ctx)
            if k == 0:
                return None
            if k is None:
                factors = [*factors, (c, name == "relax.divide")]
            else:
                mult = mult / k if name == "relax.divide" else mult * k
        else:  # add: one operand is the score path, the other a bias
            a, b = call.args
            path = [_reaches_matmul(a, ctx), _reaches_matmul(b, ctx)]
            if path.count(True) != 1:
                return None
            x, bias = (a, b) if path[0] else (b, a)
            if static_shape(bias) is None or static_shape(x) != shape:
                return None
            scores.terms.append((bias, mult, factors, shape[:-2]))
    return None


#: elementwise ops a cast after them fuses into (a projection's dequantize / bias add epilogue)
_EPILOGUE_OPS = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.astype")


def _fusable_epilogue(producer) -> bool:
    """Whether a float32 Q/K/V source was made by an elementwise op, so an fp16 cast of it fuses into
    that kernel (a source that is a parameter or a reduction's output keeps its float32 read)."""
    return op_name(producer) in _EPILOGUE_OPS


def _quantized_only(var, found_readers: dict, uses: dict) -> bool:
    """Whether every reader of ``var`` (:func:`~._rewrite.readers`), through reshapes and transposes,
    quantizes it to int8 (a multiply by a constant scalar that only ``round`` reads): its float32
    precision is never used."""
    import tvm

    stack = [var]
    while stack:
        v = stack.pop()
        found = found_readers.get(v, [])
        if not found or len(found) != uses.get(v, 0):  # read by nothing, or also returned
            return False
        for reader, value, _ in found:
            name = op_name(value)
            if name in ("relax.reshape", "relax.permute_dims"):
                stack.append(reader)
                continue
            scalar = [a for a in value.args if isinstance(a, tvm.ir.expr.Constant) and _one_element(a)]
            after = found_readers.get(reader, [])
            if name != "relax.multiply" or not scalar or len(after) != 1 or op_name(after[0][1]) != "relax.round":
                return False
    return True


def _scaled(expr, factors, ctx, dtype: str):
    """Relax: ``expr`` multiplied (divided) by each of ``factors`` (1-element tensors), in ``dtype``."""
    from tvm import relax

    for f, divides in factors:
        same = str(f.ty.dtype) == dtype
        f = relax.op.reshape(ctx.rewritten(f), [])
        f = f if same else relax.op.astype(f, dtype)
        expr = relax.op.divide(expr, f) if divides else relax.op.multiply(expr, f)
    return expr


def _bias_in_view(bias, view: list[int], final: list[int]):
    """Relax: ``bias`` (broadcastable to ``view + [S, T]``) as a tensor over ``final + [S|1, T|1]``
    broadcasting wherever it did, and that shape; a group of axes (:func:`axis_groups`) that is only
    partly broadcast is expanded."""
    from tvm import relax

    shape = static_shape(bias)
    shape = [1] * (len(view) + 2 - len(shape)) + shape
    full, out = list(shape), [1] * len(final)
    for ga, gf in axis_groups(view, final):
        if any(shape[x] != 1 for x in ga):
            for x in ga:
                full[x] = view[x]
            for y in gf:
                out[y] = final[y]
    expr = bias if full == shape else relax.op.broadcast_to(relax.op.reshape(bias, shape), full)
    return relax.op.reshape(expr, [*out, shape[-2], shape[-1]]), [*out, shape[-2], shape[-1]]


#: the kernel factory of :func:`fused_attention` (see :func:`emulated_attention`)
_FACTORY: list = []


@contextlib.contextmanager
def emulated_attention():
    """Within it, :func:`fused_attention` calls the kernel's plain TE twin
    (:func:`~inferx_edge.compiler.cuda.attention_reference.attention_reference`), which any target compiles: a CUDA
    variant's module built for the CPU, to measure its numerics without a GPU."""
    from inferx_edge.compiler.cuda.attention_reference import attention_reference

    _FACTORY.append(attention_reference)
    try:
        yield
    finally:
        _FACTORY.pop()


def fused_attention(mod):
    """Every ``matmul(softmax(scores), V)`` whose scores are ``matmul(Q, K^T)`` through scalings, additive
    biases, casts and reshapes that keep the score rows (torch and ONNX multi-head attention, BERT's
    padding mask, Swin's relative position bias and shifted-window mask) becomes one call of the fused
    kernel of :mod:`inferx_edge.compiler.cuda.attention`: the score matrix (batch x heads x S x T fp32,
    119 MB per layer in ViT-B/16 at batch 64) is never written. Q, K and V are read as fp16 (saturated to
    its range); the bias terms are summed into one broadcast tensor (weight-only work: computed at build
    time). Attention the kernel cannot take (head widths that are not multiples of 16 up to 128, dynamic
    shapes, broadcast batch axes) is left to the matmul kernels."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.cuda.attention import Bias, Operand, attention_kernel, contiguous, supports

    matmul = tvm.ir.Op.get("relax.matmul")
    found_readers, uses = readers(mod), use_counts(mod)
    factory = _FACTORY[-1] if _FACTORY else attention_kernel
    kernels: dict = {}  # kernel name -> its arguments, writing int8 (store_attention_outputs)

    def rewrite(call, ctx):
        if call.op != matmul or len(ctx.given) != 2:
            return None
        p, sm = ctx.given[0], None
        for _ in range(4):
            sm = ctx.producer(p)
            if op_name(sm) != "relax.astype":
                break
            p = sm.args[0]
        if op_name(sm) != "relax.nn.softmax":
            return None
        rank = len(sm.ty.shape)
        if int(sm.attrs.axis) not in (-1, rank - 1):
            return None
        found = _walk_scores(sm.args[0], ctx)
        shapes = [static_shape(x) for x in (*ctx.given, sm)]
        if found is None or any(x is None for x in shapes):
            return None
        qk, scores = found
        _, v_shape, p_shape = shapes
        odt = str(call.attrs.out_dtype)
        odt = odt if odt not in ("", "void", "None") else str(ctx.given[1].ty.dtype)
        q_shape, kt_shape = static_shape(qk.args[0]), static_shape(qk.args[1])
        if q_shape is None or kt_shape is None or len(q_shape) != len(kt_shape) or len(q_shape) < 2:
            return None
        s, d, t, dv = q_shape[-2], q_shape[-1], kt_shape[-1], v_shape[-1]
        final = p_shape[:-2]
        if q_shape[:-2] != kt_shape[:-2] or v_shape[:-2] != final or p_shape[-2:] != [s, t] or v_shape[-2] != t:
            return None
        nb = math.prod(final)
        if math.prod(q_shape[:-2]) != nb or supports(s, t, d, dv) or odt not in ("float32", "float16"):
            return None
        b = ctx.builder
        views, factor = [], scores.scale
        kt_producer = ctx.producer(qk.args[1])
        k_swapped = not swaps_last_two(kt_producer)  # reading K^T itself: rows and columns swap
        k_given = qk.args[1] if k_swapped else kt_producer.args[0]
        roles = (
            (qk.args[0], s, d, q_shape[:-2], True),
            (k_given, t, d, kt_shape[:-2], True),
            (ctx.given[1], t, dv, v_shape[:-2], False),
        )
        halves: dict = {}  # a float32 source -> its fp16 copy (Q, K and V often share one)
        for role, (given, rows, cols, batch, scalars) in enumerate(roles):

            def coords(n, r, c, batch=batch, swap=role == 1 and k_swapped):
                return [*reshape_coords([n], [nb], batch), *((c, r) if swap else (r, c))]

            if role == 0 and scores.factors:  # a weight scale: Q * it, materialized
                x = _scaled(ctx.rewritten(given), scores.factors, ctx, str(given.ty.dtype))
                x = b.emit(relax.op.reshape(saturated_fp16(b.emit(x)), [nb, rows, cols]))
                views.append((x, contiguous(nb, rows, cols)))
                continue
            src, index, k, steps = source_of(given, ctx, coords, scalars=scalars)
            shape, dtype = static_shape(src), str(src.ty.dtype)
            read = ctx.rewritten(src)
            if dtype == "float32" and _fusable_epilogue(ctx.producer(src)):
                # the producer's fused epilogue (a projection's bias add) writes fp16: half the bytes
                # written there and read here (K and V once per query tile), the same saturating cast
                if src not in halves:
                    halves[src] = b.emit(saturated_fp16(read))
                read, dtype = halves[src], "float16"
            key = (tuple(batch), role == 1 and k_swapped, steps, dtype)  # what the map is made of
            width = vector_width(index, shape, (nb, rows, cols), 8 if dtype == "float16" else 4, key)
            views.append((read, Operand(tuple(shape), dtype, index, width)))
            factor *= k
        operands = [x for x, _ in views]
        bias, bias_spec = relax.const(np.zeros(1, "float32")), None  # the kernel never reads it
        if scores.terms:
            # the bias is indexed over the finest batch view every term and the output agree on: a term
            # that varies along part of a merged axis (Swin's shifted-window mask, [1, windows, 1, S, T]
            # added in a [batch, windows, heads] view of a [batch x windows, heads] output) stays that
            # small instead of being expanded over the whole merged axis (118 MB per call at batch 64)
            view_of = common_refinement([list(final), *(list(v) for *_, v in scores.terms)]) or list(final)
            total, tshape = None, None
            for term, mult, factors, view in scores.terms:
                expr, shape = _bias_in_view(ctx.rewritten(term), list(view), view_of)
                if str(term.ty.dtype) != "float32":
                    expr = relax.op.astype(expr, "float32")
                if mult != 1.0:
                    expr = relax.op.multiply(expr, relax.const(mult, "float32"))
                expr = _scaled(expr, factors, ctx, "float32")
                total = expr if total is None else relax.op.add(total, expr)
                tshape = shape if tshape is None else [max(x, y) for x, y in zip(tshape, shape, strict=True)]
            try:
                bias_spec = Bias(tuple(tshape), tuple(view_of), "float32")
            except ValueError:  # a bias the kernel cannot index: this attention stays two matmuls
                return None
            bias = b.emit(relax.op.reshape(relax.op.broadcast_to(total, tshape), [bias_spec.size]))
        # an output only int8 quantizes read is written fp16 (11 significant bits for 8): half the bytes
        # written here and read by the quantize (ViT-B/16: its head-merging transpose)
        quantized = odt == "float32" and ctx.var is not None and _quantized_only(ctx.var, found_readers, uses)
        written = "float16" if quantized else odt
        specs = tuple(op for _, op in views)
        kernel = factory(nb, s, t, d, dv, factor, written, bias_spec, specs)
        gv = b.add_func(kernel, "fused_attention")
        kernels[gv.name_hint] = (nb, s, t, d, dv, factor, "int8", bias_spec, specs)
        out = b.emit(relax.call_tir(gv, [*operands, bias], relax.TensorType([nb, s, dv], written)))
        out = relax.op.reshape(out, [*final, s, dv])
        return out if written == odt else relax.op.astype(out, odt)

    mod = relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))
    return store_attention_outputs(mod, kernels, factory)
