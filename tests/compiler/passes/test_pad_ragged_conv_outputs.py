"""CPU float convs whose output channels no vector width divides compute padded, whole vectors."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from tests.helpers import main_ops, write_onnx


def _head(path, out_channels: int):
    """An SSD-style 1x1 prediction conv (anchors x classes outputs) after a 3x3 conv."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((24, 8, 3, 3)) * 0.2).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((out_channels, 24, 1, 1)) * 0.2).astype(np.float32), "w2")
    b2 = numpy_helper.from_array(rng.standard_normal(out_channels).astype(np.float32), "b2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["y"]),
    ]
    return write_onnx(path, nodes, {"x": [1, 8, 10, 10]}, {"y": [1, out_channels, 10, 10]}, [w1, w2, b2])


def _run(mod, x, params):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    return vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in params]).numpy()


def test_ragged_output_channels_are_padded_to_whole_vectors_and_sliced(tmp_path):
    from inferx_edge.compiler.passes import PAD_TO
    from inferx_edge.compiler.variant import VariantLayout, prepare_variant
    from inferx_edge.frontend import import_model

    im = import_model(_head(tmp_path / "h.onnx", 546), {"x": (1, 8, 10, 10)})
    prepared = prepare_variant(im, VariantLayout("fp32", "NHWC", "HWIO"), bake=True)
    assert main_ops(prepared.mod).count("relax.strided_slice") == 1
    assert "relax.nn.pad" not in main_ops(prepared.mod)  # the weight pad ran at build time
    assert any(a.shape == (1, 1, 24, 560) for a in prepared.weight_arrays) and 560 % PAD_TO == 0
    x = np.random.default_rng(1).standard_normal((1, 8, 10, 10)).astype(np.float32)
    got = _run(prepared.mod, x, prepared.weight_arrays)
    np.testing.assert_allclose(got, _run(im.mod, x, im.params), rtol=1e-5, atol=1e-5)


def test_output_channels_a_vector_width_divides_are_left_alone(tmp_path):
    from inferx_edge.compiler.variant import VariantLayout, prepare_variant
    from inferx_edge.frontend import import_model

    for out in (24, 544, 30):  # 24, 544: a multiple of 4; 30: under MIN_RAGGED_CHANNELS
        im = import_model(_head(tmp_path / f"h{out}.onnx", out), {"x": (1, 8, 10, 10)})
        prepared = prepare_variant(im, VariantLayout("fp32", "NHWC", "HWIO"), bake=True)
        assert "relax.strided_slice" not in main_ops(prepared.mod), out
