"""Values read only by concats are written in fp16 and widened by the concats that read them."""

from __future__ import annotations

import numpy as np

from tests.helpers import main_bindings, op_of


def _dense_block(returned_concat: bool = False, extra_reader: bool = False):
    """DenseNet-shaped, NHWC, batch 2: ``x`` -> conv ``a``; concat(x0, a) -> conv ``b``; concat(x0, a, b)
    (``x0`` = relu(x), read by conv ``a`` too; ``a`` read by both concats). ``returned_concat``: the last
    concat is returned as it is, else it goes through a 1x1 conv first. ``extra_reader``: ``a`` is also
    read by an add."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 8, 8, 16], "float32"))
    wa = relax.Var("wa", relax.TensorType([8, 3, 3, 16], "float32"))
    wb = relax.Var("wb", relax.TensorType([8, 3, 3, 24], "float32"))
    wc = relax.Var("wc", relax.TensorType([4, 1, 1, 32], "float32"))
    nhwc = {"data_layout": "NHWC", "kernel_layout": "OHWI", "padding": [1] * 4}
    with bb.function("main", [x, wa, wb, wc], attrs={"num_input": 1}):
        with bb.dataflow():
            x0 = bb.emit(relax.op.nn.relu(x))
            a = bb.emit(relax.op.nn.conv2d(x0, wa, **nhwc))
            c1 = bb.emit(relax.op.concat([x0, a], axis=3))
            b = bb.emit(relax.op.nn.conv2d(c1, wb, **nhwc))
            if extra_reader:
                b = bb.emit(relax.op.add(b, a))
            c2 = relax.op.concat([x0, a, b], axis=3)
            if returned_concat:
                out = bb.emit_output(c2)
            else:
                c2 = bb.emit(c2)
                out = bb.emit_output(relax.op.nn.conv2d(c2, wc, data_layout="NHWC", kernel_layout="OHWI"))
        bb.emit_func_output(out)
    return bb.get()


def _concat_fields(mod) -> list[tuple[str, list[str]]]:
    """Per concat: its dtype and, per field, ``copy`` (an fp16 copy its producer writes: the producer's
    only reader is that saturation), ``rounded`` (a float32 value with other readers, saturated to fp16
    for this concat) or the field's dtype where it is read as it is."""
    from tvm import relax

    b = main_bindings(mod)
    readers: dict = {}
    for val in b.values():
        for a in getattr(val, "args", ()):
            for x in a.fields if isinstance(a, relax.Tuple) else [a]:
                if isinstance(x, relax.Var):
                    readers[x] = readers.get(x, 0) + 1
    out = []
    for val in b.values():
        if op_of(val) != "relax.concat":
            continue
        fields = []
        for f in val.args[0].fields:
            src = b.get(f)
            if op_of(src) == "relax.astype" and str(f.ty.dtype) == "float16":
                v = b[b[src.args[0]].args[0]].args[0]  # astype(minimum(maximum(v, lo), hi))
                fields.append("copy" if readers.get(v) == 1 else "rounded")
            else:
                fields.append(str(f.ty.dtype))
        out.append((str(val.ty.dtype), fields))
    return out


def _run(mod, args):
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _args(seed: int = 0):
    rng = np.random.default_rng(seed)
    shapes = ((2, 8, 8, 16), (8, 3, 3, 16), (8, 3, 3, 24), (4, 1, 1, 32))
    return [
        (rng.standard_normal(s) / (np.sqrt(np.prod(s[1:])) if i else 1)).astype(np.float32)
        for i, s in enumerate(shapes)
    ]


def test_concat_inputs_are_read_from_fp16_copies():
    """The conv outputs, read by concats only, are written as fp16 copies (each conv's only reader is its
    saturation, which fuses into it); both concats join in fp16, ``x0`` (also read by a conv) saturated
    for each of them. Results within fp16 rounding of the float32 graph."""
    from inferx_edge.compiler.passes import fp16_concat_inputs

    mod = _dense_block()
    rewritten = fp16_concat_inputs(mod)
    assert _concat_fields(rewritten) == [
        ("float16", ["rounded", "copy"]),
        ("float16", ["rounded", "copy", "copy"]),
    ]
    b = main_bindings(rewritten)
    convs = [v for v, val in b.items() if op_of(val) == "relax.nn.conv2d"][:2]
    for conv in convs:
        readers = [
            val
            for val in b.values()
            if any(getattr(a, "same_as", lambda _: False)(conv) for a in getattr(val, "args", ()))
        ]
        assert [op_of(r) for r in readers] == ["relax.maximum"]
    args = _args()
    ref, got = _run(mod, args), _run(rewritten, args)
    assert np.abs(got - ref).max() / np.abs(ref).max() < 2e-3
    assert not np.array_equal(got, ref)  # fp16 rounding did happen


def test_a_value_with_another_reader_and_a_returned_concat_keep_float32():
    """``a`` is also read by an add: no fp16 copy (it would be an extra write); the first concat, with no
    copy to read, stays float32. A concat the function returns reads float32 inputs, so its result is
    exact."""
    from inferx_edge.compiler.passes import fp16_concat_inputs

    extra = fp16_concat_inputs(_dense_block(extra_reader=True))
    assert _concat_fields(extra) == [
        ("float32", ["float32", "float32"]),
        ("float16", ["rounded", "rounded", "copy"]),
    ]

    mod = _dense_block(returned_concat=True)
    rewritten = fp16_concat_inputs(mod)
    # a and b: read by the returned concat (a by the other one too)
    assert _concat_fields(rewritten) == [
        ("float32", ["float32", "float32"]),
        ("float32", ["float32"] * 3),
    ]
    args = _args(1)
    np.testing.assert_array_equal(_run(rewritten, args), _run(mod, args))


def test_variant_pipeline_runs_the_pass_for_cuda_int8_only():
    """``PASSES`` runs it for CUDA int8/mixed variants, not for their float ones or CPU int8."""
    from inferx_edge.compiler.passes import PASSES
    from inferx_edge.compiler.variant import variant_layout
    from inferx_edge.targets import get_target

    step = next(p for p in PASSES if p.name == "fp16_concat_inputs")
    cuda, cpu = get_target("h200"), get_target("x86-cpu")
    assert step.applies(variant_layout(cuda, "int8")) and step.applies(variant_layout(cuda, "mixed"))
    assert not any(step.applies(variant_layout(cuda, p)) for p in ("fp16", "fp32"))
    assert not step.applies(variant_layout(cpu, "int8"))
