"""Transposes that only move axes of extent 1 become reshapes (views, no copy kernel)."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_calls


def unit_transposes_to_reshapes(mod):
    """Every ``permute_dims`` that keeps the order of the axes longer than 1 as a ``reshape`` (the same
    values in the same memory order).

    ConvertLayout transposes a one-channel NCHW input to NHWC and a pooled (N, 1, 1, C) result back;
    as transposes those are index-computing copy kernels (fused with the input normalization), as reshapes the
    normalization is a plain elementwise kernel and a lone reshape is a view.
    """
    import tvm
    from tvm import relax

    permute = tvm.ir.Op.get("relax.permute_dims")

    def rewrite(call):
        if call.op != permute:
            return None
        x = call.args[0]
        if not isinstance(x.ty, relax.TensorType) or x.ty.shape is None or not hasattr(x.ty.shape, "values"):
            return None
        shape = list(x.ty.shape.values)
        if any(not isinstance(d, tvm.tirx.IntImm) for d in shape):
            return None
        axes = list(reversed(range(len(shape)))) if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
        moved = [a for a in axes if int(shape[a]) != 1]
        if moved != sorted(moved):
            return None
        return relax.op.reshape(x, [int(shape[a]) for a in axes])

    return rewrite_calls(mod, rewrite)
