"""Transposes of unit axes become reshapes with the same values."""

from __future__ import annotations

import numpy as np

from tests.helpers import main_ops


def test_unit_transposes_become_reshapes_with_the_same_values():
    """A transpose that moves only axes of extent 1 is a reshape; one that reorders longer axes stays."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import unit_transposes_to_reshapes

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType([2, 1, 5, 6], "float32"))  # one-channel NCHW -> NHWC
    b = relax.Var("b", relax.TensorType([2, 3, 1, 1], "float32"))  # pooled NCHW -> NHWC
    c = relax.Var("c", relax.TensorType([2, 3, 4, 1], "float32"))  # a real reorder
    with bb.function("main", [a, b, c], attrs={"num_input": 3}):
        with bb.dataflow():
            outs = [
                bb.emit(relax.op.permute_dims(a, [0, 2, 3, 1])),
                bb.emit(relax.op.permute_dims(b, [0, 2, 3, 1])),
                bb.emit(relax.op.permute_dims(c, [0, 2, 1, 3])),
                bb.emit(relax.op.permute_dims(a)),  # reversed: 6, 5, 1, 2 reorders
            ]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = bb.get()
    rewritten = unit_transposes_to_reshapes(mod)
    assert main_ops(rewritten) == ["relax.reshape", "relax.reshape", "relax.permute_dims", "relax.permute_dims"]
    rng = np.random.default_rng(0)
    xs = [rng.random(s, dtype=np.float32) for s in ((2, 1, 5, 6), (2, 3, 1, 1), (2, 3, 4, 1))]
    vm = relax.VirtualMachine(relax.build(rewritten, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(x) for x in xs])
    want = [xs[0].transpose(0, 2, 3, 1), xs[1].transpose(0, 2, 3, 1), xs[2].transpose(0, 2, 1, 3), xs[0].T]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w)


def test_reshapes_to_the_same_shape_are_dropped_and_values_kept():
    """A reshape to its input's own shape (between a bias add and a LayerNorm, as ConvNeXt's ONNX graph
    has it) is dropped; a reshape that changes the shape stays; outputs are unchanged."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import drop_identity_reshapes

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 4, 4, 8], "float32"))
    b = relax.Var("b", relax.TensorType([1, 1, 1, 8], "float32"))
    with bb.function("main", [x, b]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(x, b))
            y = bb.emit(relax.op.reshape(y, [2, 4, 4, 8]))
            y = bb.emit(
                relax.op.nn.layer_norm(y, relax.const(np.ones(8, "float32")), relax.const(np.zeros(8, "float32")), [-1])
            )
            y = bb.emit(relax.op.reshape(y, [2, 16, 8]))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    dropped = drop_identity_reshapes(mod)
    assert main_ops(mod).count("relax.reshape") == 2
    assert main_ops(dropped).count("relax.reshape") == 1
    args = [np.random.default_rng(0).standard_normal(s).astype("float32") for s in ((2, 4, 4, 8), (1, 1, 1, 8))]

    def run(m):
        vm = relax.VirtualMachine(relax.build(m, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()

    np.testing.assert_array_equal(run(dropped), run(mod))
