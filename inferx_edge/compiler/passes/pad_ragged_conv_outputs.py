"""Float NHWC/HWIO convolutions with an output channel count off a multiple of 4 compute whole vectors."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_convs

#: output channels are padded up to a multiple of this (a 512-bit vector of fp32)
PAD_TO = 16

#: convolutions with fewer output channels are left alone (the schedule's narrower vectors cover them)
MIN_RAGGED_CHANNELS = 32


def pad_ragged_conv_outputs(mod, multiple: int = PAD_TO):
    """Float ``conv2d`` (groups 1, NHWC data, HWIO weights) whose output channels (at least
    :data:`MIN_RAGGED_CHANNELS`) are not a multiple of 4: the weights get zero output channels up to a
    multiple of ``multiple`` (baked at build time) and the extra outputs are sliced off. The CPU
    schedule vectorizes along output channels; with no vector width dividing them (SSDlite's 546 =
    6 anchors x 91 classes) its vectors were predicated and ran at 15 GFLOPS instead of ~160."""
    import tvm
    from tvm import relax

    def rewrite(call, a, x, w):
        shape = getattr(w.ty, "shape", None)
        if (
            a.data_layout != "NHWC"
            or a.kernel_layout != "HWIO"
            or a.out_layout not in ("", "NHWC")
            or int(a.groups) != 1
            or not str(w.ty.dtype).startswith("float")
            or shape is None
            or not isinstance(shape[3], tvm.tirx.IntImm)
        ):
            return None
        out = int(shape[3])
        if out < MIN_RAGGED_CHANNELS or out % 4 == 0:
            return None
        w = relax.op.nn.pad(w, [0, 0, 0, 0, 0, 0, 0, -out % multiple])
        y = relax.op.nn.conv2d(x, w, a.strides, a.padding, a.dilation, 1, "NHWC", "HWIO", a.out_layout, a.out_dtype)
        return relax.op.strided_slice(y, axes=[3], begin=[0], end=[out])

    return rewrite_convs(mod, rewrite)
