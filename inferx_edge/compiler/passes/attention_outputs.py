"""The fused attention kernel writes what its readers make of its output: the heads merged side by side
and quantized to int8, where that is all the output is used for."""

from __future__ import annotations

import numpy as np

from inferx_edge.compiler.passes._rewrite import (
    bindings,
    op_name,
    readers,
    rewrite_calls_in_context,
    static_shape,
    use_counts,
)
from inferx_edge.compiler.passes._views import MAX_CHECKED, constant_value, reshape_coords

_LAYOUT = ("relax.reshape", "relax.permute_dims")


def _heads(ops: list, shape: list[int]) -> int | None:
    """The ``heads`` of :class:`~inferx_edge.compiler.cuda.attention.Store` whose layout equals the
    [nb, s, dv] output taken through ``ops`` (``("reshape", shape)`` / ``("permute", axes)``) and read
    row-major; None where no such layout does. Candidates are tried on a sample, the one found checked
    on every element (up to :data:`MAX_CHECKED`)."""
    nb, s, dv = shape

    def places(flat):
        n, i, e = flat // (s * dv), flat // dv % s, flat % dv
        coords, cur = [n, i, e], list(shape)
        for kind, arg in ops:
            if kind == "reshape":
                coords, cur = reshape_coords(coords, cur, arg), list(arg)
            else:
                coords, cur = [coords[a] for a in arg], [cur[a] for a in arg]
        got = np.zeros_like(flat)
        for c, x in zip(coords, cur, strict=True):
            got = got * x + c
        return n, i, e, got

    total = nb * s * dv
    rng = np.random.default_rng(0)
    sample = np.unique(np.concatenate([np.arange(min(total, 4096)), rng.integers(0, total, 4096), [total - 1]]))
    n, i, e, got = places(sample)
    for h in (x for x in range(1, nb + 1) if nb % x == 0):
        if np.array_equal(got, ((n // h * s + i) * h + n % h) * dv + e):
            break
    else:
        return None
    if total > MAX_CHECKED:
        return None
    for lo in range(0, total, 1 << 20):
        n, i, e, got = places(np.arange(lo, min(total, lo + (1 << 20)), dtype=np.int64))
        if not np.array_equal(got, ((n // h * s + i) * h + n % h) * dv + e):
            return None
    return h


def _chain(var, found_readers: dict, uses: dict):
    """From an attention output ``var``, the bindings that only lay it out and quantize it to int8:
    ``(last variable, layout ops, scale, lo, hi)``, or None. Float casts may come before the scaling;
    layout ops anywhere; the scaling by a constant, ``round``, the clip (``clip`` or ``maximum`` and
    ``minimum`` by constants) and the int8 cast in that order, every variable read once."""
    ops, scale, rounded, lo, hi = [], None, False, None, None
    cur = var
    while True:
        found = found_readers.get(cur, [])
        if len(found) != 1 or uses.get(cur, 0) != 1:
            return None
        nxt, call, _ = found[0]
        name = op_name(call)
        other = [a for j, a in enumerate(call.args) if j != found[0][2]]
        const = constant_value(other[0]) if len(other) == 1 else None
        if name == "relax.reshape":
            ops.append(("reshape", static_shape(call)))
        elif name == "relax.permute_dims":
            rank = len(static_shape(cur))
            axes = list(reversed(range(rank))) if call.attrs.axes is None else [int(a) % rank for a in call.attrs.axes]
            ops.append(("permute", axes))
        elif name == "relax.astype" and str(call.attrs.dtype) in ("float16", "float32") and scale is None:
            pass
        elif name == "relax.multiply" and scale is None and const is not None:
            scale = const
        elif name == "relax.round" and scale is not None and not rounded:
            rounded = True
        elif name == "relax.maximum" and rounded and lo is None and const is not None:
            lo = const
        elif name == "relax.minimum" and rounded and hi is None and const is not None:
            hi = const
        elif name == "relax.clip" and rounded and lo is None and hi is None:
            lo, hi = constant_value(call.args[1]), constant_value(call.args[2])
        elif name == "relax.astype" and str(call.attrs.dtype) == "int8" and None not in (lo, hi):
            return nxt, ops, scale, lo, hi
        else:
            return None
        if any(x is None for _, x in ops):
            return None
        cur = nxt


def store_attention_outputs(mod, kernels: dict, factory):
    """``mod`` with each fused attention call (``kernels``: its PrimFunc's name -> ``factory``'s
    arguments for the same kernel writing int8) whose output is only merged over its heads and
    quantized to int8 replaced by one kernel that writes the int8 tensor itself (ViT-B/16 at batch 64:
    one 18 us head-merging quantize per layer gone, the fp16 output never written)."""
    from tvm import relax

    from inferx_edge.compiler.cuda.attention import Store

    found_readers, uses = readers(mod), use_counts(mod)
    plans: dict = {}
    for b in bindings(mod):
        v = b.value
        if op_name(v) != "relax.call_tir" or getattr(v.args[0], "name_hint", None) not in kernels:
            continue
        found = _chain(b.var, found_readers, uses)
        shape = static_shape(b.var)
        if found is None or shape is None or len(shape) != 3:
            continue
        last, ops, scale, lo, hi = found
        heads = _heads(ops, shape)
        if heads is not None:
            plans[last] = (v, Store(heads, scale, lo, hi), shape)

    def rewrite(call, ctx):
        plan = plans.get(ctx.var) if ctx.var is not None else None
        if plan is None:
            return None
        attn, store, (nb, s, dv) = plan
        kernel = factory(*kernels[attn.args[0].name_hint], store=store)
        gv = ctx.builder.add_func(kernel, "fused_attention")
        args = [ctx.rewritten(a) for a in attn.args[1].fields]
        out = ctx.builder.emit(relax.call_tir(gv, args, relax.TensorType(list(store.shape(nb, s, dv)), "int8")))
        return relax.op.reshape(out, static_shape(ctx.var))

    if not plans:
        return mod
    return relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))
