"""Grouped convs of CUDA (NHWC/OHWI) variants read HWIO weights, transposed once at build time."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from tests.helpers import main_ops, write_onnx


def _grouped_net(path):
    """Conv 3x3 with 4 groups of 8 channels, ReLU, then a depthwise conv."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((32, 8, 3, 3)) * 0.2).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b1")
    w2 = numpy_helper.from_array((rng.standard_normal((32, 1, 3, 3)) * 0.3).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], group=4, pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["y"], group=32, pads=[1, 1, 1, 1]),
    ]
    return write_onnx(path, nodes, {"x": [2, 32, 12, 12]}, {"y": [2, 32, 12, 12]}, [w1, b1, w2])


def test_grouped_conv_weights_become_hwio_at_build_time_with_the_same_results(tmp_path):
    import tvm
    from tvm import relax

    from inferx_edge.compiler.variant import VariantLayout, prepare_variant
    from inferx_edge.frontend import import_model

    im = import_model(_grouped_net(tmp_path / "g.onnx"), {"x": (2, 32, 12, 12)})
    prepared = prepare_variant(im, VariantLayout("fp32", "NHWC", "OHWI"), bake=True)
    convs = [
        (int(b.value.attrs.groups), b.value.attrs.kernel_layout)
        for blk in prepared.mod["main"].body.blocks
        for b in blk.bindings
        if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", "") == "relax.nn.conv2d"
    ]
    assert sorted(convs) == [(4, "HWIO"), (32, "HWIO")]  # grouped and depthwise
    x = np.random.default_rng(1).standard_normal((2, 32, 12, 12)).astype(np.float32)

    def run(mod, params):
        vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        return vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in params]).numpy()

    np.testing.assert_allclose(run(prepared.mod, prepared.weight_arrays), run(im.mod, im.params), rtol=1e-5, atol=1e-5)
    # weight transposes ran here, not in the model: what is left moves the activation to NHWC and back
    assert main_ops(prepared.mod).count("relax.permute_dims") == 2
