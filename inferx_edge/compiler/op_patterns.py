"""Operator patterns ``AnnotateTIROpPattern`` gets wrong in a way that makes ``FuseOps`` build wrong kernels.

TVM classifies a PrimFunc by its index expressions: a constant ``pad`` reads ``x[i, j]`` where it writes
``y[i, j]`` (under an ``if_then_else``), so it is marked elementwise, and ``FuseOps`` fuses it into the
epilogue of the GEMM or convolution before it. Every schedule of such a kernel computes the epilogue per
tile of the GEMM's output (``reverse_compute_at``), which covers only the part of the padded output the
GEMM's elements map to: the border is never written and the output holds whatever the memory held.
Swin3D-T's patch merging (a residual add, then a pad of the odd 7 x 7 window grid to 8 x 8) came out of
an x86 build with 8 % error from ONNX for this reason.

:func:`mark_growing_ops_injective` runs between ``AnnotateTIROpPattern`` and ``FuseOps`` in every
pipeline: a PrimFunc marked elementwise or broadcast whose output has more elements than each of its
inputs is marked injective, so ``FuseOps`` ends the GEMM's kernel before it and fuses it with what
follows instead. (A broadcast whose output is as large as one of its inputs, ``y = x + bias``, is
untouched.)
"""

from __future__ import annotations

import math

#: ``relay.op.OpPattern`` values
ELEMWISE, BROADCAST, INJECTIVE = 0, 1, 2


def _numel(buf) -> int | None:
    try:
        return math.prod(int(d) for d in buf.shape)
    except TypeError:  # symbolic
        return None


def grows(func) -> bool:
    """Whether PrimFunc ``func`` (a ``call_tir`` callee: inputs, then one output) writes more elements
    than it reads from any one input."""
    params = [p for p in func.params if getattr(p, "shape", None) is not None]  # buffer parameters
    if len(params) < 2:
        return False
    out = _numel(params[-1])
    ins = [_numel(b) for b in params[:-1]]
    if out is None or any(n is None for n in ins):
        return False
    return all(out > n for n in ins)


def mark_growing_ops_injective():
    """The module pass described above."""
    import tvm

    @tvm.transform.module_pass(opt_level=0, name="InferxMarkGrowingOpsInjective")
    def _pass(mod, _ctx):
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tvm.tirx.PrimFunc) or func.attrs is None or "op_pattern" not in func.attrs:
                continue
            if int(func.attrs["op_pattern"]) in (ELEMWISE, BROADCAST) and grows(func):
                updates[gv] = func.with_attr("op_pattern", INJECTIVE)
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    return _pass


def after_op_patterns(passes: list) -> list:
    """``passes`` with :func:`mark_growing_ops_injective` right after its ``AnnotateTIROpPattern``."""
    names = [p.info.name for p in passes]
    i = names.index("AnnotateTIROpPattern")
    return [*passes[: i + 1], mark_growing_ops_injective(), *passes[i + 1 :]]
