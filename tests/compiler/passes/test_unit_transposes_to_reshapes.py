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
