"""The passes' shared helpers: which expressions depend on weights only."""

from __future__ import annotations


def _verdicts(depth: int = 3):
    """``weight_only`` of each call's arguments in ``main``: x (input) through ``depth`` adds, plus a
    reshaped, transposed weight and a tuple of weights; {binding name: [verdict per argument]}."""
    from tvm import relax

    from inferx_edge.compiler.passes._rewrite import rewrite_calls_in_context, weight_only, weight_params

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 8], "float32"))
    w = relax.Var("w", relax.TensorType([8, 4], "float32"))
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            h = x
            for _ in range(depth):
                h = bb.emit(relax.op.add(h, relax.const(1.0, "float32")))
            wt = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(w, [4, 8]))))
            pair = bb.emit(relax.Tuple([w, relax.const(2.0, "float32")]))
            out = bb.emit_output(relax.op.add(relax.op.matmul(h, wt), relax.TupleGetItem(pair, 1)))
        bb.emit_func_output(out)
    mod = bb.get()
    weights = weight_params(mod)
    seen: dict = {}

    def record(call, ctx):
        seen.setdefault(call.op.name, []).append([weight_only(a, ctx, weights) for a in ctx.given])

    rewrite_calls_in_context(mod, record)
    return seen


def test_weight_only_looks_through_shapes_tuples_and_chains():
    """A reshape of a weight (its target shape is a constant operand) and what is computed from it are
    weight-only; the input's chain is not, at any depth."""
    v = _verdicts()
    assert v["relax.reshape"] == [[True, True]]
    assert v["relax.permute_dims"] == [[True]]
    assert v["relax.matmul"] == [[False, True]]
    assert v["relax.add"][-1] == [False, True]  # the matmul, and a constant taken out of a tuple of weights


def test_weight_only_walks_chains_deeper_than_the_recursion_limit():
    """An activation thousands of bindings from the input (a deep network's last layers) is answered,
    not a RecursionError."""
    v = _verdicts(depth=1200)
    assert v["relax.matmul"] == [[False, True]]
    assert v["relax.add"][1199] == [False, True]
