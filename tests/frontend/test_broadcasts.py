"""Explicit broadcasts that the consumer does by itself are dropped at import; the others stay."""

from __future__ import annotations

import numpy as np

from tests.helpers import run_on_cpu


def _module(build):
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 2, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def _count(mod, name):
    from tvm import relax

    ops = []
    relax.analysis.post_order_visit(mod["main"], lambda e: ops.append(getattr(getattr(e, "op", None), "name", "")))
    return ops.count(name)


def test_broadcasts_the_consumer_does_itself_go_and_values_stay():
    from tvm import relax

    from inferx_edge.frontend.broadcasts import drop_redundant_broadcasts

    rng = np.random.default_rng(0)
    w = relax.const(rng.standard_normal((8, 6)).astype(np.float32))
    b = relax.const(rng.standard_normal((6,)).astype(np.float32))

    def build(bb, x):
        wb = bb.emit(relax.op.broadcast_to(w, (4, 8, 6)))  # torch.export's sequence-first in-projection
        y = bb.emit(relax.op.matmul(x, wb))
        bias = bb.emit(relax.op.broadcast_to(b, (4, 2, 6)))
        y = bb.emit(relax.op.add(y, bias))
        same = bb.emit(relax.op.broadcast_to(y, (4, 2, 6)))  # to the shape it already has
        return bb.emit(relax.op.multiply(same, same))

    mod = _module(build)
    x = rng.standard_normal((4, 2, 8)).astype(np.float32)
    new = drop_redundant_broadcasts(mod)
    assert _count(mod, "relax.broadcast_to") == 3 and _count(new, "relax.broadcast_to") == 0
    np.testing.assert_allclose(run_on_cpu(new, x)[0], run_on_cpu(mod, x)[0], rtol=1e-6)


def test_broadcasts_that_shape_the_result_stay():
    from tvm import relax

    from inferx_edge.frontend.broadcasts import drop_redundant_broadcasts

    rng = np.random.default_rng(1)
    w = relax.const(rng.standard_normal((1, 8, 6)).astype(np.float32))
    other = relax.const(rng.standard_normal((2, 1)).astype(np.float32))

    def build(bb, x):
        x2 = bb.emit(relax.op.take(x, relax.const(np.int64(0)), axis=0))  # (2, 8)
        wb = bb.emit(relax.op.broadcast_to(w, (4, 8, 6)))  # (2,8) @ (1,8,6) would be (1,2,6): kept
        y = bb.emit(relax.op.matmul(x2, wb))
        ob = bb.emit(relax.op.broadcast_to(other, (4, 2, 6)))
        small = bb.emit(relax.op.take(y, relax.const(np.int64(0)), axis=0))  # (2, 6)
        return bb.emit(relax.op.add(ob, small))  # (2,1) + (2,6) would be (2,6): kept

    mod = _module(build)
    x = rng.standard_normal((4, 2, 8)).astype(np.float32)
    new = drop_redundant_broadcasts(mod)
    assert _count(new, "relax.broadcast_to") == 2
    np.testing.assert_allclose(run_on_cpu(new, x)[0], run_on_cpu(mod, x)[0], rtol=1e-6)
