"""Grouped and depthwise convolutions of NHWC/OHWI variants read HWIO weights."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_convs


def grouped_conv_hwio(mod, depthwise: bool = True):
    """Grouped NHWC convs with OHWI weights take them as HWIO (a transpose of the weights, baked at
    build time by :func:`bake_weight_transforms`); depthwise ones too unless ``depthwise`` is False.
    The window- and small-reduction kernels (:mod:`inferx_edge.compiler.cuda.rules`) map a warp's
    threads along output channels: in OHWI each thread's weights lay a whole filter (taps x group
    width elements) apart, up to 32 cache lines per load (a 7x7 depthwise conv: 49 such loads per
    output); in HWIO a warp's loads of one tap are contiguous."""
    import tvm
    from tvm import relax

    def rewrite(call, a, x, w):
        if int(a.groups) == 1 or a.data_layout != "NHWC" or a.kernel_layout != "OHWI":
            return None
        shape = getattr(w.ty, "shape", None)
        if shape is None or not isinstance(shape[3], tvm.tirx.IntImm) or (int(shape[3]) == 1 and not depthwise):
            return None
        return relax.op.nn.conv2d(
            x, relax.op.permute_dims(w, [1, 2, 3, 0]), a.strides, a.padding, a.dilation, a.groups, "NHWC",
            "HWIO", a.out_layout, a.out_dtype,
        )  # fmt: skip

    return rewrite_convs(mod, rewrite)
