"""Grouped convolutions of NHWC/OHWI variants read HWIO weights."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_convs


def grouped_conv_hwio(mod):
    """Grouped (not depthwise) NHWC convs with OHWI weights take them as HWIO (a transpose of the
    weights, baked at build time by :func:`bake_weight_transforms`). The window-reduction kernel
    (:mod:`inferx_edge.compiler.cuda.rules.window_reduction`) maps a warp's threads along output
    channels: in OHWI each thread's weights lay a whole filter (9 x group width elements) apart, 32 cache
    lines per load; in HWIO a warp's loads are contiguous."""
    import tvm
    from tvm import relax

    def rewrite(call, a, x, w):
        if int(a.groups) == 1 or a.data_layout != "NHWC" or a.kernel_layout != "OHWI":
            return None
        shape = getattr(w.ty, "shape", None)
        if shape is None or not isinstance(shape[3], tvm.tirx.IntImm) or int(shape[3]) == 1:  # depthwise
            return None
        return relax.op.nn.conv2d(
            x, relax.op.permute_dims(w, [1, 2, 3, 0]), a.strides, a.padding, a.dilation, a.groups, "NHWC",
            "HWIO", a.out_layout, a.out_dtype,
        )  # fmt: skip

    return rewrite_convs(mod, rewrite)
