"""Convolution taps that read only padding are dropped, the padding reduced so every output stays put."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


def _conv1d(x, w, pad_before, pad_after, stride, dilation):
    """A 1-D cross-correlation in float64, zero padding, as conv2d computes each spatial axis."""
    xp = np.concatenate([np.zeros(pad_before), x, np.zeros(pad_after)])
    span = dilation * (len(w) - 1) + 1
    return np.array(
        [sum(w[t] * xp[o + t * dilation] for t in range(len(w))) for o in range(0, len(xp) - span + 1, stride)]
    )


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 24),
    pads=st.tuples(st.integers(0, 40), st.integers(0, 40)),
    kernel=st.integers(1, 7),
    stride=st.integers(1, 4),
    dilation=st.integers(1, 40),
)
def test_the_shrunk_window_computes_the_same_outputs(size, pads, kernel, stride, dilation):
    from inferx_edge.compiler.passes.dead_conv_taps import live_taps

    span = dilation * (kernel - 1) + 1
    if size + sum(pads) < span:  # no output at all
        assert live_taps(size, *pads, kernel, stride, dilation) is None
        return
    rng = np.random.default_rng(size * 1000 + kernel)
    x, w = rng.standard_normal(size), rng.standard_normal(kernel)
    want = _conv1d(x, w, *pads, stride, dilation)
    # a tap is dead when zeroing it changes no output
    dead = [np.array_equal(_conv1d(x, np.where(np.arange(kernel) == t, 1.0, 0.0), *pads, stride, dilation), 0 * want)
            for t in range(kernel)]  # fmt: skip
    shrunk = live_taps(size, *pads, kernel, stride, dilation)
    if shrunk is None:
        return  # nothing to drop (or a negative pad would be needed): the conv is left as it is
    lo, hi, before, after = shrunk
    assert all(dead[:lo]) and all(dead[hi + 1 :]) and not dead[lo] and not dead[hi]
    np.testing.assert_allclose(
        _conv1d(x, w[lo : hi + 1], before, after, stride, dilation), want, rtol=1e-12, atol=1e-12
    )


def test_every_outer_tap_of_a_large_rate_is_dead_and_small_rates_keep_theirs():
    from inferx_edge.compiler.passes.dead_conv_taps import live_taps

    assert live_taps(20, 36, 36, 3, 1, 36) == (1, 1, 0, 0)  # DeepLabV3's rate 36 over a 20x20 map: a 1x1
    assert live_taps(20, 24, 24, 3, 1, 24) == (1, 1, 0, 0)
    assert live_taps(20, 12, 12, 3, 1, 12) is None  # rate 12 < 20: every tap reads some input
    assert live_taps(56, 1, 1, 3, 1, 1) is None  # an ordinary 3x3


def _aspp_branch(rate: int, hw: int, groups: int = 1):
    """One dilated 3x3 branch over a batch of any size (the batch axis symbolic)."""
    import tvm
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([tvm.tirx.Var("n", "int64"), 8, hw, hw], "float32"))
    w = relax.Var("w", relax.TensorType([8, 8 // groups, 3, 3], "float32"))
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w, padding=[rate] * 4, dilation=[rate] * 2, groups=groups))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize(
    ("rate", "hw", "groups", "kernel"), [(36, 20, 1, [1, 1]), (12, 20, 1, [3, 3]), (6, 5, 8, [1, 1])]
)
def test_the_conv_reads_only_live_taps_and_computes_the_same(rate, hw, groups, kernel):
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import bake_weight_transforms, dead_conv_taps
    from tests.helpers import main_bindings, op_of

    mod = _aspp_branch(rate, hw, groups)
    rng = np.random.default_rng(rate)
    x = rng.standard_normal((2, 8, hw, hw)).astype(np.float32)
    w = rng.standard_normal((8, 8 // groups, 3, 3)).astype(np.float32)
    baked, _names, weights = bake_weight_transforms(dead_conv_taps(mod), [w])
    convs = [v for v in main_bindings(baked).values() if op_of(v) == "relax.nn.conv2d"]
    assert len(convs) == 1 and [int(d) for d in convs[0].args[1].ty.shape.values[2:]] == kernel
    assert [int(p) for p in convs[0].attrs.padding] == ([rate] * 4 if kernel == [3, 3] else [0] * 4)

    def run(m, args):
        vm = relax.VirtualMachine(relax.build(m, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()

    np.testing.assert_allclose(run(baked, [x, *weights]), run(mod, [x, w]), rtol=1e-5, atol=1e-5)
