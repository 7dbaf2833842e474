"""Long reductions with few outputs as two kernels: over the inner reduced axes, then the outer ones.

dlight's reduction schedule gives a thread block 16 outputs and walks each output's reduction
serially: a squeeze-excite pool at batch 1 (EfficientNet-B0's first: 112 x 112 pixels x 32 channels
-> 32 means) ran as 2 thread blocks whose threads each walked 784 pixels, one load after another,
while the rest of the GPU idled. :func:`split_long_reductions` rewrites a ``mean`` or ``sum`` over
several axes (the pixels of NHWC, batch 1) with fewer outputs than :data:`SPLIT_OUTPUTS_PER_SM` per SM and at
least :data:`MIN_SPLIT_REDUCTION` elements each as the same op over its inner reduced axes (W: an
output per row and channel, the whole GPU busy) and then over the outer ones (H). A mean of
equal-sized means is the mean; no tensor is reshaped or copied.
"""

from __future__ import annotations

import math

#: a reduction is split where it has fewer outputs than this per SM (two of dlight's 16-output blocks)
#: and nothing but unit axes before its reduced axes (:func:`split_plan`)
SPLIT_OUTPUTS_PER_SM = 32

#: ... and at least this many elements per output (dlight's 16 lanes then walk 64 or more each)
MIN_SPLIT_REDUCTION = 1024

#: the first op reduces the shortest suffix of the reduced axes with at least this many elements
SPLIT_CHUNK = 16

_OPS = ("relax.mean", "relax.sum")


def split_plan(shape: list[int], axes: list[int], sm_count: int | None) -> tuple[list[int], list[int]] | None:
    """(inner axes, outer axes): a reduction over ``axes`` of ``shape`` as one over the inner axes,
    then one over the outer; None where it is not split (fewer than two axes, axes before them longer
    than 1, enough outputs, a short reduction, no outer axis left, ``sm_count`` unknown).

    Only reductions with nothing but unit axes before them (a batch-1 pool: the first kernel's outputs
    are [H, C], which dlight's reduction rule takes) are split. With a batch axis in front dlight's rule
    declines the first kernel ([N, H, C] over W) and ``GeneralReduction`` takes it: EfficientNet-B0's
    112x112x32 pool at batch 64 became 282 + 12 us on an H100 (``kernel_profile_h100_efficientnet_b0_int8_b64``;
    ~50 us unsplit), the network 34,229 -> 31,977 img/s."""
    if sm_count is None or len(axes) < 2 or math.prod(shape[: axes[0]]) != 1:
        return None
    outputs = math.prod(d for i, d in enumerate(shape) if i not in axes)
    if outputs >= SPLIT_OUTPUTS_PER_SM * sm_count or math.prod(shape[a] for a in axes) < MIN_SPLIT_REDUCTION:
        return None
    for cut in range(len(axes) - 1, 0, -1):
        if math.prod(shape[a] for a in axes[cut:]) >= SPLIT_CHUNK:
            outer, inner = axes[:cut], axes[cut:]
            return (inner, outer) if math.prod(shape[a] for a in outer) >= 2 else None
    return None


def split_long_reductions(sm_count: int | None):
    """A module pass: each ``mean``/``sum`` :func:`split_plan` splits becomes the op over the inner
    axes, then over the outer (``keepdims`` as the call had it)."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.relax_rewrite import rewrite_calls, static_shape

    ops = {tvm.ir.Op.get(name): getattr(relax.op, name.split(".")[1]) for name in _OPS}

    def rewrite(call):
        op = ops.get(getattr(call, "op", None))
        if op is None or len(call.args) != 1 or call.attrs.axis is None:
            return None
        shape = static_shape(call.args[0])
        if shape is None:
            return None
        axes = sorted({int(a) % len(shape) for a in call.attrs.axis})
        plan = split_plan(shape, axes, sm_count)
        if plan is None:
            return None
        inner, outer = plan
        keep = bool(call.attrs.keepdims)
        # outer axes precede the inner ones: dropping the inner axes (keepdims off) does not move them
        return op(op(call.args[0], axis=inner, keepdims=keep), axis=outer, keepdims=keep)

    @tvm.transform.module_pass(opt_level=0, name="InferxSplitLongReductions")
    def _pass(mod, _ctx):
        return rewrite_calls(mod, rewrite) if sm_count is not None else mod

    return _pass
