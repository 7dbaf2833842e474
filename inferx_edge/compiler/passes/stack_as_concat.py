"""``stack`` as a ``concat`` of ``expand_dims``: TVM's ConvertLayout has no working layout rule for
``relax.stack`` (``Index -1 out of bounds``, ``Invalid SLayout: can't find S``), so any model with a
stack failed its NHWC conversion, convolutions or not. ONNX ``Max`` / ``Min`` with several inputs
import as a stack and a reduction (``torch.max(a, b)`` exported to ONNX did not build). Same values;
runs before ConvertLayout.
"""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_calls


def stack_as_concat(mod):
    """``mod`` with every ``relax.stack(xs, axis)`` of tensors of known rank written as
    ``concat([expand_dims(x, axis) for x in xs], axis)`` (the axis made non-negative)."""
    import tvm
    from tvm import relax

    stack = tvm.ir.Op.get("relax.stack")

    def rewrite(call):
        if call.op != stack or not isinstance(call.args[0], relax.Tuple):
            return None
        fields = list(call.args[0].fields)
        ndim = getattr(call.ty, "ndim", -1)
        if not fields or ndim < 0:
            return None
        axis = int(call.attrs.axis) % ndim
        return relax.op.concat([relax.op.expand_dims(x, axis) for x in fields], axis=axis)

    return rewrite_calls(mod, rewrite)
