"""Concatenations on CUDA: the input is picked per 4-lane vector through a search tree, and the values
are exactly numpy's."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.helpers import kernel_source, needs_nvrtc


def _concat_module(shapes, axis, dtype="float32", epilogue=None):
    from tvm import relax

    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(list(s), dtype)) for i, s in enumerate(shapes)]
    with bb.function("main", xs):
        with bb.dataflow():
            y = relax.op.concat(xs, axis=axis)
            out = bb.emit_output(epilogue(y) if epilogue else y)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    ("shapes", "axis"),
    [
        ([(2, 3, 4), (2, 5, 4), (2, 1, 4)], 1),
        ([(2, 3, 4), (2, 3, 8)], -1),
        ([(6, 2)] * 7, 0),
        ([(1, 4, 4, 32)] + [(1, 4, 4, 8)] * 9, 3),  # a dense block: one wide input, many narrow
        ([(1, 2, 2, 1), (1, 2, 2, 64), (1, 2, 2, 3)], 3),  # a narrow first input
        ([(3, 3)], 1),
        ([(2, 0, 4), (2, 3, 4), (2, 0, 4), (2, 2, 4)], 1),  # empty inputs are never read
    ],
)
def test_concat_compute_matches_numpy(shapes, axis):
    import tvm
    from tvm import relax

    from inferx_edge.compiler.cuda.concat import legalize_concat

    mod = relax.transform.LegalizeOps({"relax.concat": legalize_concat})(_concat_module(shapes, axis))
    vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    rng = np.random.default_rng(len(shapes))
    arrays = [rng.standard_normal(s).astype("float32") for s in shapes]
    got = vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    np.testing.assert_array_equal(got, np.concatenate(arrays, axis))


def _depths(expr, depth: int = 0) -> dict[str, int]:
    """Per input of a concatenation's element expression: how many tests pick it."""
    if expr.op.name.endswith("if_then_else"):
        return _depths(expr.args[1], depth + 1) | _depths(expr.args[2], depth + 1)
    return {expr.args[0].op.name: depth}  # a tensor read


def test_search_tree_splits_by_size():
    """A dense block's concatenation (one 256-wide input, 24 of 32): the wide input is picked after two
    tests, every narrow one after five (TVM's chain: up to 24)."""
    from tvm import te

    from inferx_edge.compiler.cuda.concat import concat_compute

    xs = [te.placeholder((2, 256), "float16", "x0")]
    xs += [te.placeholder((2, 32), "float16", f"x{i}") for i in range(1, 25)]
    depths = _depths(concat_compute(xs, 1).op.body[0])
    assert depths == {"x0": 2} | {f"x{i}": 5 for i in range(1, 25)}
    # equal widths: a balanced tree
    depths = _depths(concat_compute([te.placeholder((4, 8), "float32", f"y{i}") for i in range(8)], 1).op.body[0])
    assert set(depths.values()) == {3}


@needs_nvrtc
@pytest.mark.parametrize("target", ["jetson-orin", "h200"])
def test_dense_block_concat_loads_vectors(target):
    """A DenseNet-style concatenation of fp16 inputs with BatchNorm, ReLU and int8 quantize fused in:
    each thread loads 4 channels of one input at once (``half4``), chosen by one test per vector;
    TVM's own concatenate made the thread load them one by one, each through the whole chain."""
    from tvm import relax

    chans = [64] + [32] * 6

    def epilogue(y):
        y = relax.op.astype(y, "float32")
        y = relax.op.nn.relu(
            relax.op.add(relax.op.multiply(y, relax.const(np.float32(0.5))), relax.const(np.float32(0.1)))
        )
        return relax.op.astype(relax.op.clip(relax.op.round(y), -128, 127), "int8")

    mod = _concat_module([(8, 14, 14, c) for c in chans], 3, "float16", epilogue)
    kernel = kernel_source(target, mod).split("__global__")[-1]
    loads = re.findall(r"\*\(half4\*\)\((x\d+)_ptr", kernel)
    assert sorted(set(loads)) == [f"x{i}" for i in range(len(chans))]
    # one vector load per input and vector, no per-element copies: 12 bytes a vector, so a thread
    # takes four vectors (100,352 vectors: 98 blocks of 256 threads x 4)
    assert len(loads) == 4 * len(chans)
    assert not re.search(r"x\d+_ptr\[", kernel)  # no scalar reads of the inputs
    assert len(re.findall(r"\*\(int\*\)\(compute\w*_ptr", kernel)) == 4  # 4 int8 stored at once


def test_concat_compute_with_symbolic_extents():
    """Batch and one input's width symbolic: the tree splits by count and the values still match."""
    import tvm
    from tvm import relax, tirx

    from inferx_edge.compiler.cuda.concat import legalize_concat

    n, m = tirx.Var("n", "int64"), tirx.Var("m", "int64")
    bb = relax.BlockBuilder()
    xs = [relax.Var(k, relax.TensorType([n, w], "float32")) for k, w in (("a", 3), ("b", m), ("c", 2))]
    with bb.function("main", xs):
        with bb.dataflow():
            out = bb.emit_output(relax.op.concat(xs, axis=1))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps({"relax.concat": legalize_concat})(bb.get())
    vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal((4, w)).astype("float32") for w in (3, 5, 2)]
    got = vm["main"](*[tvm.runtime.tensor(a) for a in arrays]).numpy()
    np.testing.assert_array_equal(got, np.concatenate(arrays, 1))


def test_unroll_splits_only_whole_blocks():
    from inferx_edge.compiler.cuda.rules.vectorized_elementwise import _unroll_for

    assert _unroll_for(256 * 12, 4) == 4
    assert _unroll_for(256 * 6, 4) == 2  # 6 runs of 256 vectors: pairs, not fours
    assert _unroll_for(256 * 3, 4) == 1
    assert _unroll_for(256 * 8, 1) == 1


@needs_nvrtc
def test_unrolled_concat_takes_four_vectors_per_thread(monkeypatch):
    """With 4 vectors per thread (the default where a vector moves under 16 bytes) the dense-block kernel
    still picks each input per vector (half4 loads, int stores); with 1, one vector per thread."""
    from tvm import relax

    from inferx_edge.compiler.cuda.rules import vectorized_elementwise

    chans = [64] + [32] * 6

    def epilogue(y):
        y = relax.op.nn.relu(relax.op.astype(y, "float32"))
        return relax.op.astype(relax.op.clip(relax.op.round(y), -128, 127), "int8")

    mod = _concat_module([(8, 16, 16, c) for c in chans], 3, "float16", epilogue)  # 131,072 vectors
    monkeypatch.setattr(vectorized_elementwise, "CHUNK_MAJOR", False)  # vectors in output order
    kernels = {}
    for unroll in (1, 4):
        monkeypatch.setattr(vectorized_elementwise, "UNROLL", unroll)
        kernels[unroll] = kernel_source("h200", mod).split("__global__")[-1]
    for unroll, kernel in kernels.items():
        loads = re.findall(r"\*\(half4\*\)\((x\d+)_ptr", kernel)
        assert len(loads) == unroll * len(chans)
        assert len(re.findall(r"\*\(int\*\)\(compute\w*_ptr", kernel)) == unroll
        assert not re.search(r"x\d+_ptr\[", kernel)
    # the int8 output: a block stores 4 runs of 256 vectors, 1,024 elements apart
    stores = re.findall(r"\*\(int\*\)\(compute\w*_ptr \+ (.*)\) = ", kernels[4])
    assert all("((int)blockIdx.x) * 4096)" in at for at in stores)
    offsets = sorted(int(m.group(1)) if (m := re.search(r" \+ (\d+)\)$", at)) else 0 for at in stores)
    assert offsets == [0, 1024, 2048, 3072]


@needs_nvrtc
@pytest.mark.parametrize("chans", [[64] + [32] * 6, [96, 32, 64]])
def test_chunk_major_concat_picks_inputs_per_block(monkeypatch, chans):
    """With ``CHUNK_MAJOR`` a concatenation's vectors run input by input (32-channel runs outermost): the test
    picking the input reads only the block index, each thread still loads 4 channels at once and
    stores 4 int8. (The values: ``benchmarks/gpu_elementwise.py`` checks the kernels against numpy on a
    GPU.)"""
    from tvm import relax

    from inferx_edge.compiler.cuda.rules import vectorized_elementwise

    def epilogue(y):
        y = relax.op.nn.relu(relax.op.astype(y, "float32"))
        return relax.op.astype(relax.op.clip(relax.op.round(y), -128, 127), "int8")

    mod = _concat_module([(8, 16, 16, c) for c in chans], 3, "float16", epilogue)
    monkeypatch.setattr(vectorized_elementwise, "CHUNK_MAJOR", True)
    kernel = kernel_source("h200", mod).split("__global__")[-1]
    conditions = re.findall(r"if \((.*)\) \{", kernel)
    assert len(conditions) == 4 * (len(chans) - 1)  # per input boundary and vector of a thread
    assert all("threadIdx" not in c and "blockIdx.x" in c for c in conditions)
    loads = re.findall(r"\*\(half4\*\)\((x\d+)_ptr", kernel)
    assert sorted(set(loads)) == [f"x{i}" for i in range(len(chans))]
    assert not re.search(r"x\d+_ptr\[", kernel)
    assert len(re.findall(r"\*\(int\*\)\(compute\w*_ptr", kernel)) == 4
    # switched off, the tests read the thread index again (vectors in output order)
    monkeypatch.setattr(vectorized_elementwise, "CHUNK_MAJOR", False)
    kernel = kernel_source("h200", mod).split("__global__")[-1]
    assert any("threadIdx" in c for c in re.findall(r"if \((.*)\) \{", kernel))


def test_concat_chunk_is_the_gcd_of_the_boundaries():
    """The run width: the gcd of the innermost extent and every boundary an ``axis < start`` test names;
    the extent itself where nothing is tested on that axis (a concatenation along another axis)."""
    from tvm import s_tir, te

    from inferx_edge.compiler.cuda.concat import concat_compute
    from inferx_edge.compiler.cuda.rules.vectorized_elementwise import _concat_chunk

    def chunk(widths, axis=3):
        shapes = [(2, 4, 4, w) if axis == 3 else (2, w, 4, 8) for w in widths]
        ts = [te.placeholder(s, "float16", f"x{i}") for i, s in enumerate(shapes)]
        out = concat_compute(ts, axis)
        func = te.create_prim_func([*ts, out])
        sch = s_tir.Schedule(func)
        block = sch.get(sch.get_sblock(out.op.name))
        return _concat_chunk(block, int(out.shape[-1]))

    assert chunk([64] + [32] * 5) == 32
    assert chunk([96, 32, 64]) == 32
    assert chunk([12, 8]) == 4
    assert chunk([16, 16], axis=1) == 8  # concatenated along another axis: the whole last axis


@needs_nvrtc
def test_vectors_moving_16_bytes_or_more_stay_one_per_thread():
    """An fp16 add (two 8-byte loads, one 8-byte store a vector) keeps one vector per thread; the same
    add stored as int8 (20 bytes) too; an fp16 -> int8 quantize (12 bytes) takes four."""
    from tvm import relax

    def module(out_dtype, inputs):
        bb = relax.BlockBuilder()
        xs = [relax.Var(f"x{i}", relax.TensorType([8, 32, 32, 64], "float16")) for i in range(inputs)]
        with bb.function("main", xs):
            with bb.dataflow():
                y = xs[0] if inputs == 1 else relax.op.add(xs[0], xs[1])
                if out_dtype == "int8":
                    y = relax.op.clip(relax.op.round(relax.op.astype(y, "float32")), -128, 127)
                out = bb.emit_output(relax.op.astype(relax.op.nn.relu(y), out_dtype))
            bb.emit_func_output(out)
        return bb.get()

    def vector_loads(mod):
        kernel = kernel_source("h200", mod).split("__global__")[-1]
        return len(re.findall(r"\*\(uint2\*\)\(x0_ptr|\*\(half4\*\)\(x0_ptr", kernel))

    assert vector_loads(module("float16", 2)) == 1
    assert vector_loads(module("int8", 2)) == 1
    assert vector_loads(module("int8", 1)) == 4
