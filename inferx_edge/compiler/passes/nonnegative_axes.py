"""Negative axes of ``squeeze`` and ``permute_dims`` as their non-negative equivalents.

TVM's ConvertLayout asks every op for its layout, and the layout rules of these two ops index the
layout string with the axis as given: ``squeeze(x, axis=[-2])`` ends in ``std::bad_alloc`` (torch.export
writes one per ``nn.MultiheadAttention``: ViT-B/16 did not build from its ``.pt2``) and
``permute_dims(x, axes=[0, -1, 1, 2])`` in ``Invalid layout``. Every other op with an axis attribute
converts with negative axes (checked against an unconverted build). Same values; runs before
ConvertLayout.
"""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_calls


def nonnegative_axes(mod):
    """``mod`` with the negative axes of every ``squeeze``/``permute_dims`` of known rank made
    non-negative."""
    import tvm
    from tvm import relax

    squeeze = tvm.ir.Op.get("relax.squeeze")
    permute = tvm.ir.Op.get("relax.permute_dims")

    def rewrite(call):
        if call.op not in (squeeze, permute):
            return None
        ty = call.args[0].ty
        ndim = getattr(ty, "ndim", -1) if isinstance(ty, relax.TensorType) else -1
        axes = call.attrs.axis if call.op == squeeze else call.attrs.axes
        if ndim < 0 or axes is None or all(int(a) >= 0 for a in axes):
            return None
        fixed = [int(a) % ndim for a in axes]
        if call.op == squeeze:
            return relax.op.squeeze(call.args[0], axis=fixed)
        return relax.op.permute_dims(call.args[0], axes=fixed)

    return rewrite_calls(mod, rewrite)
