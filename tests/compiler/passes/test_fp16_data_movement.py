"""A value widened from fp16 is reshaped, transposed and sliced in fp16 where every path from it ends
in elementwise readers; the widening follows the data movement and the values are unchanged."""

from __future__ import annotations

import numpy as np

from tests.helpers import main_bindings, op_of


def _shuffle(conv_reader: bool = False):
    """NHWC, batch 2: two convs' outputs saturated to fp16 and concatenated (as ``fp16_concat_inputs``
    leaves a concat), widened, channel-shuffled (reshape -> transpose -> reshape) and halved; one half
    is quantized-like (multiply, round), the other goes to a ReLU (``conv_reader``: a conv instead)."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 6, 6, 8], "float32"))
    wa = relax.Var("wa", relax.TensorType([8, 1, 1, 8], "float32"))
    wb = relax.Var("wb", relax.TensorType([8, 1, 1, 8], "float32"))
    nhwc = {"data_layout": "NHWC", "kernel_layout": "OHWI"}
    with bb.function("main", [x, wa, wb], attrs={"num_input": 1}):
        with bb.dataflow():
            a = bb.emit(relax.op.astype(relax.op.nn.conv2d(x, wa, **nhwc), "float16"))
            b = bb.emit(relax.op.astype(relax.op.nn.conv2d(x, wb, **nhwc), "float16"))
            c = bb.emit(relax.op.astype(relax.op.concat([a, b], axis=3), "float32"))
            g = bb.emit(relax.op.reshape(c, [2, 6, 6, 2, 8]))
            t = bb.emit(relax.op.permute_dims(g, [0, 1, 2, 4, 3]))
            s = bb.emit(relax.op.reshape(t, [2, 6, 6, 16]))
            h1 = bb.emit(relax.op.strided_slice(s, [3], [0], [8]))
            h2 = bb.emit(relax.op.strided_slice(s, [3], [8], [16]))
            q = bb.emit(relax.op.round(relax.op.multiply(h1, relax.const(3.0, "float32"))))
            r = bb.emit(relax.op.nn.conv2d(h2, wb, **nhwc) if conv_reader else relax.op.nn.relu(h2))
            out = bb.emit_output(relax.op.add(q, r))
        bb.emit_func_output(out)
    return bb.get()


def _dtypes(mod) -> dict[str, list[str]]:
    """dtype of each reshape / permute_dims / strided_slice result, by op."""
    out: dict[str, list[str]] = {}
    for var, value in main_bindings(mod).items():
        op = op_of(value)
        if op in ("relax.reshape", "relax.permute_dims", "relax.strided_slice") and var.ty.ndim >= 4:
            out.setdefault(op, []).append(str(var.ty.dtype))
    return out


def _run(mod, args):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _args():
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype(np.float32) for s in ((2, 6, 6, 8), (8, 1, 1, 8), (8, 1, 1, 8))]


def test_a_shuffle_of_widened_fp16_moves_fp16_and_computes_the_same():
    from inferx_edge.compiler.passes import fp16_data_movement

    mod = _shuffle()
    out = fp16_data_movement(mod)
    assert _dtypes(mod) == {
        k: ["float32"] * n for k, n in (("relax.reshape", 2), ("relax.permute_dims", 1), ("relax.strided_slice", 2))
    }
    assert _dtypes(out) == {
        k: ["float16"] * n for k, n in (("relax.reshape", 2), ("relax.permute_dims", 1), ("relax.strided_slice", 2))
    }
    widenings = [v for v in main_bindings(out).values() if op_of(v) == "relax.astype" and str(v.ty.dtype) == "float32"]
    assert len(widenings) == 2  # one per half, where it is read
    np.testing.assert_array_equal(_run(out, _args()), _run(mod, _args()))


def test_a_shuffle_a_conv_reads_stays_float32():
    """The conv could not fuse a widening in front of it: moving it would add a kernel."""
    from inferx_edge.compiler.passes import fp16_data_movement

    mod = _shuffle(conv_reader=True)
    assert fp16_data_movement(mod)["main"].script() == mod["main"].script()
