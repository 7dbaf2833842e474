"""Large elementwise kernels take 4-lane vectors, 8 where the streamed tensors are fp16 / int8
(:mod:`inferx_edge.compiler.cuda.rules.vectorized_elementwise`)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from inferx_edge.compiler.schedule_check import check_kernel
from tests.helpers import kernel_source, needs_nvrtc

_SM90 = {"kind": "cuda", "arch": "sm_90"}


def _quantize(shape, dtype: str, channel_scale: bool = True):
    """``int8(clip(round(float32(x) * s + b)))`` with per-channel float32 ``s``, ``b`` (an int8
    variant's requantize of an fp16 map), or a scalar scale without ``channel_scale``."""
    from tvm import relax

    rng = np.random.default_rng(0)
    c = shape[-1]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = relax.op.astype(x, "float32")
            if channel_scale:
                y = relax.op.multiply(y, relax.const(rng.uniform(1, 4, c).astype("float32")))
                y = relax.op.add(y, relax.const(rng.standard_normal(c).astype("float32")))
            else:
                y = relax.op.multiply(y, relax.const(np.float32(3.0)))
            out = bb.emit_output(relax.op.astype(relax.op.clip(relax.op.round(y), -128, 127), "int8"))
        bb.emit_func_output(out)
    return bb.get()


def _apply(mod):
    import tvm

    from benchmarks.gpu_layout_kernels import fused_kernel
    from inferx_edge.compiler.cuda.rules.vectorized_elementwise import vectorized_elementwise_rule

    func = fused_kernel(mod)
    sch = vectorized_elementwise_rule().apply(func, tvm.target.Target(_SM90), False)
    assert sch is not None
    return func, sch.mod["main"]


def _lanes(func) -> set[int]:
    return {int(n) for n in re.findall(r"T\.vectorized\((?:T\.int64\()?(\d+)", func.script())}


@pytest.mark.parametrize(
    ("shape", "dtype", "channel_scale", "lanes"),
    [
        ((4, 16, 16, 64), "float16", True, 8),  # fp16 in, int8 out, per-channel float32 vectors: 8
        ((4, 16, 16, 64), "float16", False, 8),
        ((4, 16, 16, 64), "float32", True, 4),  # a float32 map streamed: 16-byte loads at 4 already
        ((8, 16, 64, 12), "float16", True, 4),  # a last axis 8 does not divide: 4
    ],
)
def test_lanes_follow_the_streamed_dtypes_and_compute_the_same(shape, dtype, channel_scale, lanes):
    func, scheduled = _apply(_quantize(list(shape), dtype, channel_scale))
    assert _lanes(scheduled) == {lanes}
    assert check_kernel(func, scheduled) == 0.0


def test_a_concatenation_of_fp16_maps_picks_8_lanes_per_test():
    """Every input's width a multiple of 8: one ``< start`` test per 8-lane vector; a 4-wide input
    makes the starts multiples of 4 only, so the kernel keeps 4 lanes."""
    from tvm import relax

    def concat(widths):
        bb = relax.BlockBuilder()
        xs = [relax.Var(f"x{i}", relax.TensorType([8, 16, 16, w], "float16")) for i, w in enumerate(widths)]
        with bb.function("main", xs):
            with bb.dataflow():
                y = relax.op.astype(relax.op.concat(xs, axis=3), "float32")
                y = relax.op.multiply(y, relax.const(np.float32(2.0)))
                out = bb.emit_output(relax.op.astype(relax.op.clip(relax.op.round(y), -128, 127), "int8"))
            bb.emit_func_output(out)
        return bb.get()

    for widths, lanes in (([64, 32, 32, 32, 96], 8), ([64, 4, 28, 32, 128], 4)):
        func, scheduled = _apply(concat(widths))
        assert _lanes(scheduled) == {lanes}, widths
        assert check_kernel(func, scheduled) == 0.0


@needs_nvrtc
@pytest.mark.parametrize("target", ["jetson-orin", "h200"])
def test_fp16_to_int8_requantize_loads_16_bytes_and_stores_8(target):
    """The 8-lane kernel compiles (its float32 arithmetic in 8-lane vectors goes through
    ``fix_float8_vector_packs``): one 16-byte load of the fp16 map, one 8-byte int8 store."""
    kernel = kernel_source(target, _quantize([4, 16, 16, 64], "float16")).split("__global__")[-1]
    assert re.search(r"\*\(uint4\*\)\(x_ptr", kernel)
    assert re.search(r"\*\(int2\*\)\(\w+_ptr", kernel)
    assert not re.search(r"x_ptr\[", kernel)  # no scalar reads
