"""Clips as minimum/maximum, which ConvertLayout knows how to move between layouts."""

from __future__ import annotations

import re

import numpy as np

from inferx_edge.compiler.passes._rewrite import rewrite_calls

_TE_MIN_MAX = re.compile(r"(maximum|minimum)\d*$")


def clip_to_min_max(mod):
    """Every ``relax.clip(x, lo, hi)`` as ``minimum(maximum(x, lo), hi)`` (same values, layout-convertible);
    likewise the ONNX importer's Clip with tensor bounds (``call_tir`` of TE maximum/minimum against a
    0-d tensor: a folded constant or a weight) as Relax ``maximum``/``minimum``."""
    import tvm
    from tvm import relax

    clip = tvm.ir.Op.get("relax.clip")
    call_tir = tvm.ir.Op.get("relax.call_tir")
    mod = relax.transform.FoldConstant()(mod)

    def te_min_max(call):
        callee, args = call.args[0], call.args[1]
        if not isinstance(callee, tvm.ir.GlobalVar) or not isinstance(args, relax.Tuple) or len(args.fields) != 2:
            return None
        m = _TE_MIN_MAX.match(callee.name_hint)
        x, bound = args.fields
        if m is None or not isinstance(mod[callee], tvm.tirx.PrimFunc):
            return None
        if not isinstance(x.ty, relax.TensorType) or not isinstance(bound.ty, relax.TensorType):
            return None
        if bound.ty.ndim != 0 or str(bound.ty.dtype) != str(x.ty.dtype):
            return None
        return (relax.op.maximum if m.group(1) == "maximum" else relax.op.minimum)(x, bound)

    def rewrite(call):
        if call.op == call_tir:
            return te_min_max(call)
        if call.op != clip or not isinstance(call.args[0].ty, relax.TensorType):
            return None
        dtype = str(call.args[0].ty.dtype)
        if not dtype.startswith("float"):
            return None
        bounds = [getattr(a.value, "value", a.value) for a in call.args[1:3]]  # PrimValue(IntImm | int)
        lo, hi = (relax.const(np.array(float(b), dtype)) for b in bounds)
        return relax.op.minimum(relax.op.maximum(call.args[0], lo), hi)

    return rewrite_calls(mod, rewrite)
