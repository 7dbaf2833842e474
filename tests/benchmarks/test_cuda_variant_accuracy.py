"""The CUDA-variant accuracy emulation runs a built module on the CPU as the build would hand it over."""

from __future__ import annotations

import numpy as np


def test_outputs_keep_scalar_weights_and_take_the_first_output():
    """A 0-d weight stays 0-d (``np.ascontiguousarray`` would make it 1-d and the call fail), and a
    tuple result contributes its first output, one row per sample."""
    from tvm import relax

    from benchmarks.cuda_variant_accuracy import _outputs

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 4], "float32"))
    s = relax.Var("s", relax.TensorType([], "float32"))
    with bb.function("main", [x, s]):
        with bb.dataflow():
            y = bb.emit(relax.op.multiply(x, s))
            out = bb.emit_output(relax.Tuple([y, x]))
        bb.emit_func_output(out)
    samples = [{"x": np.full((1, 4), i, np.float32)} for i in range(3)]
    got = _outputs(bb.get(), [np.array(2.0, np.float32)], samples, ["x"])
    np.testing.assert_array_equal(got, np.repeat(np.arange(3.0)[:, None] * 2, 4, axis=1))
