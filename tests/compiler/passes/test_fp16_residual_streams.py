"""A pre-norm transformer's residual stream (read by LayerNorms and adds only) is stored in fp16."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import main_bindings, op_of, run_on_cpu


def _blocks(stream_is_output: bool = False, extra_reader: bool = False):
    """Two pre-norm blocks over x [2, 9, 16]: ``v = x + dense(LN(x))``, ``y = v + dense(LN(v))``, final LN.
    ``stream_is_output``: ``v`` is returned too; ``extra_reader``: ``v`` is also multiplied (a reader
    that is neither a LayerNorm nor an add)."""
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 9, 16], "float32"))

    def const(*shape, scale=1.0):
        return relax.const((rng.standard_normal(shape) * scale).astype(np.float32))

    def block(h):
        n = bb.emit(relax.op.nn.layer_norm(h, const(16), const(16), axes=[-1]))
        return bb.emit(relax.op.add(h, relax.op.add(relax.op.matmul(n, const(16, 16, scale=0.25)), const(16))))

    with bb.function("main", [x]):
        with bb.dataflow():
            v = block(bb.emit(relax.op.add(x, const(9, 16))))
            y = block(v)
            out = bb.emit(relax.op.nn.layer_norm(y, const(16), const(16), axes=[-1]))
            if extra_reader:
                out = bb.emit(relax.op.add(out, relax.op.multiply(v, relax.const(np.float32(0.5)))))
            out = bb.emit_output(relax.Tuple([out, v]) if stream_is_output else out)
        bb.emit_func_output(out)
    return relax.transform.Normalize()(bb.get())


def _casts_to_fp16(mod) -> int:
    return sum(
        op_of(v) == "relax.astype" and str(v.ty.dtype) == "float16" and op_of_arg(mod, v) == "relax.minimum"
        for v in main_bindings(mod).values()
    )


def op_of_arg(mod, value) -> str:
    return op_of(main_bindings(mod).get(value.args[0]))


@pytest.mark.parametrize("stream_is_output", [False, True])
def test_streams_read_by_layer_norms_and_adds_are_stored_fp16(stream_is_output):
    from inferx_edge.compiler.passes import fp16_residual_streams

    mod = _blocks(stream_is_output)
    new = fp16_residual_streams(mod)
    bound = main_bindings(new)
    # the embedding sum and the first block's output are streams; a returned v keeps float32
    assert _casts_to_fp16(new) == (1 if stream_is_output else 2)
    norms = [v for v in bound.values() if op_of(v) == "relax.nn.layer_norm"]
    assert sum(str(v.ty.dtype) == "float16" for v in norms) == (1 if stream_is_output else 2)  # not the last
    x = np.random.default_rng(1).standard_normal((2, 9, 16)).astype(np.float32)
    got, want = run_on_cpu(new, x), run_on_cpu(mod, x)
    for g, w in zip(got, want, strict=True):
        assert np.abs(g - w).max() <= 1e-2 * np.abs(w).max()  # fp16 storage and fp16 normalised values
    if stream_is_output:
        assert got[1].dtype == np.float32


def test_a_stream_with_another_reader_stays_float32():
    from inferx_edge.compiler.passes import fp16_residual_streams

    mod = _blocks(extra_reader=True)
    new = fp16_residual_streams(mod)
    assert _casts_to_fp16(new) == 1  # only the embedding sum (x + position): v is multiplied too
