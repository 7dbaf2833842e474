"""Transposes of a dense layer's rows move to its input at import (``nn.MultiheadAttention``'s
sequence-first output projection); values stay, and nothing is computed twice."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.frontend import import_model
from inferx_edge.runtime import Engine
from inferx_edge.targets import host_target_name
from tests.helpers import main_bindings, op_of, run_on_cpu

torch = pytest.importorskip("torch")


class Block(torch.nn.Module):
    """A pre-norm transformer block's attention half, batch-first as ViT writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(32)
        self.attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x):
        h = self.norm(x)
        return x + self.attn(h, h, h, need_weights=False)[0]


def _residual_reads_a_transpose(mod) -> bool:
    """Whether an ``add`` of the block's input reads a ``permute_dims`` (the projection's rows
    transposed back to batch-first before the residual add)."""
    bound = main_bindings(mod)
    x = mod["main"].params[0]
    return any(
        op_of(v) == "relax.add" and x in v.args and any(op_of(bound.get(a)) == "relax.permute_dims" for a in v.args)
        for v in bound.values()
    )


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_attention_output_projection_runs_batch_first_and_matches_torch(tmp_path, fmt):
    torch.manual_seed(0)
    net = Block().eval()
    x = torch.randn(3, 7, 32)
    path = tmp_path / f"block.{fmt}"
    if fmt == "pt2":
        torch.export.save(torch.export.export(net, (x,)), str(path))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(net, (x,), str(path), dynamo=False, input_names=["x"], output_names=["y"])
    imported = import_model(path, {})
    assert not _residual_reads_a_transpose(imported.mod)
    # both projections read [N, L, E] rows: the input projection the LayerNorm's output as it is, the
    # output projection the merged heads (and the residual add follows its bias add)
    bound = main_bindings(imported.mod)
    dense = [v for v in bound.values() if op_of(v) == "relax.matmul" and len(v.args[1].ty.shape) == 2]
    assert [[int(d) for d in m.args[0].ty.shape] for m in dense] == [[3, 7, 32], [3, 7, 32]]
    assert op_of(bound[dense[0].args[0]]) == "relax.nn.layer_norm"
    out = tmp_path / "block.ixa"
    build_artifact(BuildOptions(model=path, target=host_target_name(), output=out), log=lambda *a: None)
    with Engine(out) as engine, torch.no_grad():
        (got,) = engine.run({"x": x.numpy()}).values()
        want = net(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _module(second_reader: bool, axes: list[int], gelu: bool):
    """x [6, 4, 2, 8] (sequence, batch, heads, width) -> rows [24, 16] @ w + b (-> gelu) -> [6, 4, 16]
    -> permute(axes); with ``second_reader`` the biased rows are also returned."""
    from tvm import relax

    rng = np.random.default_rng(0)
    w = relax.const(rng.standard_normal((16, 16)).astype(np.float32))
    b = relax.const(rng.standard_normal((16,)).astype(np.float32))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((6, 4, 2, 8), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            rows = bb.emit(relax.op.reshape(x, (24, 16)))
            y = bb.emit(relax.op.add(relax.op.matmul(rows, w), b))
            z = bb.emit(relax.op.nn.gelu(y)) if gelu else y
            out = bb.emit(relax.op.permute_dims(relax.op.reshape(z, (6, 4, 16)), axes))
            result = bb.emit_output(relax.Tuple([out, y]) if second_reader else out)
        bb.emit_func_output(result)
    return bb.get()


def _permutes(mod) -> list[list[int]]:
    return [[int(a) for a in v.attrs.axes] for v in main_bindings(mod).values() if op_of(v) == "relax.permute_dims"]


@pytest.mark.parametrize("gelu", [False, True])
def test_rows_transposed_at_the_input_give_the_same_values(gelu):
    from tvm import relax

    from inferx_edge.frontend.row_permutes import hoist_row_permutes

    mod = relax.transform.Normalize()(_module(False, [1, 0, 2], gelu))
    new = hoist_row_permutes(mod)
    # the transpose now acts on the [6, 4, 2, 8] input (its heads and width axes kept)
    assert _permutes(new) == [[1, 0, 2, 3]]
    x = np.random.default_rng(1).standard_normal((6, 4, 2, 8)).astype(np.float32)
    np.testing.assert_array_equal(run_on_cpu(new, x)[0], run_on_cpu(mod, x)[0])


@pytest.mark.parametrize(("second_reader", "axes"), [(True, [1, 0, 2]), (False, [0, 2, 1]), (False, [2, 1, 0])])
def test_rows_read_twice_or_columns_moved_are_left_alone(second_reader, axes):
    from inferx_edge.frontend.row_permutes import hoist_row_permutes

    mod = _module(second_reader, axes, gelu=False)
    assert _permutes(hoist_row_permutes(mod)) == _permutes(mod) == [axes]


def _input_projection(then_transpose: bool):
    """x [4, 6, 16] -> permute [1, 0, 2] -> @ w [16, 48] + b -> reshape [6, 4, 3, 16] -> then either a
    transpose (a head split) or a LayerNorm over the last axis."""
    from tvm import relax

    rng = np.random.default_rng(2)
    w = relax.const(rng.standard_normal((16, 48)).astype(np.float32))
    b = relax.const(rng.standard_normal((48,)).astype(np.float32))
    gamma, beta = (relax.const(np.full(16, v, np.float32)) for v in (1.0, 0.0))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 6, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(relax.op.permute_dims(x, [1, 0, 2]))
            y = bb.emit(relax.op.add(relax.op.matmul(t, w), b))
            heads = bb.emit(relax.op.reshape(y, (6, 4, 3, 16)))
            if then_transpose:
                out = relax.op.permute_dims(heads, [2, 1, 0, 3])
            else:
                out = relax.op.nn.layer_norm(heads, gamma, beta, axes=[-1])
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return relax.transform.Normalize()(bb.get())


@pytest.mark.parametrize("then_transpose", [True, False], ids=["head_split", "layer_norm"])
def test_a_transpose_sinks_below_a_dense_layer_only_into_another_transpose(then_transpose):
    """Sunk below the layer, the transpose acts on its 3x wider output: only where it then composes
    with a transpose that is there anyway; in front of a LayerNorm it stays on the narrow input."""
    from tvm import relax

    from inferx_edge.frontend.row_permutes import sink_row_permutes

    mod = _input_projection(then_transpose)
    new = sink_row_permutes(mod)
    dense = [v for v in main_bindings(new).values() if op_of(v) == "relax.matmul"]
    x = new["main"].params[0]
    assert (dense[0].args[0] == x) == then_transpose
    xv = np.random.default_rng(3).standard_normal((4, 6, 16)).astype(np.float32)
    np.testing.assert_allclose(
        run_on_cpu(relax.transform.Normalize()(new), xv)[0], run_on_cpu(mod, xv)[0], rtol=1e-6, atol=1e-6
    )
