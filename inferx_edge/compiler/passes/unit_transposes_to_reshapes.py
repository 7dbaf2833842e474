"""Transposes that only move axes of extent 1 become reshapes (views, no copy kernel); reshapes that
keep the shape are dropped."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import permute_axes, rewrite_calls, static_shape


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
        shape = static_shape(x)
        if shape is None:
            return None
        axes = permute_axes(call, len(shape))
        moved = [a for a in axes if shape[a] != 1]
        if moved != sorted(moved):
            return None
        return relax.op.reshape(x, [shape[a] for a in axes])

    return rewrite_calls(mod, rewrite)


def drop_identity_reshapes(mod):
    """Every ``reshape`` to its input's own (static) shape replaced by its input. Such a reshape (ONNX
    graphs of channels-last blocks carry them: ConvNeXt-T's LayerNorms) is not elementwise, so FuseOps
    does not fuse it into the kernel that produces its input: it ended a convolution's fused epilogue,
    or, after a LayerNorm, was a float32 copy kernel of its own (ConvNeXt-T int8 at batch 64: 154 MB)."""
    import tvm
    from tvm import relax

    reshape = tvm.ir.Op.get("relax.reshape")

    def rewrite(call):
        if call.op != reshape:
            return None
        shape = static_shape(call.args[0])
        return call.args[0] if shape is not None and shape == static_shape(call) else None

    return relax.transform.CanonicalizeBindings()(rewrite_calls(mod, rewrite))
