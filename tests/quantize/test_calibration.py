"""Calibration observers and int8 weight quantization against direct numpy computations."""

from __future__ import annotations

import numpy as np
import pytest

from inferx_edge.errors import InputError, UsageError
from inferx_edge.quantize import (
    EntropyObserver,
    MinMaxObserver,
    MSEObserver,
    PercentileObserver,
    check_calibration_batch,
    make_observer,
    quantize_per_channel,
    quantize_per_tensor,
)
from inferx_edge.quantize.calibration import _quantized

RNG = np.random.default_rng(0)


def _batches(data, n=8):
    return np.array_split(data, n)


def test_minmax_and_percentile_match_numpy():
    data = RNG.standard_normal(200_000).astype(np.float32)
    mm, pc = MinMaxObserver(), PercentileObserver(99.9)
    for b in _batches(data):  # growing ranges force re-binning of the histogram
        mm.update(b)
        pc.update(b)
    assert mm.threshold() == pytest.approx(float(np.abs(data).max()))
    want = float(np.percentile(np.abs(data), 99.9))
    assert pc.threshold() == pytest.approx(want, abs=3 * pc.width)


def _mse(data, t):
    q, s = quantize_per_tensor(np.clip(data, -t, t), t)
    return float(np.mean((data - q.astype(np.float64) * s) ** 2))


def test_mse_threshold_is_near_the_brute_force_optimum():
    data = np.concatenate([RNG.standard_normal(100_000), RNG.standard_normal(50) * 20]).astype(np.float32)
    obs = MSEObserver()
    for b in _batches(RNG.permutation(data)):
        obs.update(b)
    t = obs.threshold()
    grid = np.linspace(0.5, np.abs(data).max(), 400)
    best = min(grid, key=lambda g: _mse(data, g))
    assert _mse(data, t) <= _mse(data, best) * 1.05


def test_entropy_clips_outliers_and_keeps_the_bulk():
    data = np.concatenate([RNG.standard_normal(200_000), RNG.standard_normal(20) * 50]).astype(np.float32)
    obs = EntropyObserver()
    for b in _batches(RNG.permutation(data)):
        obs.update(b)
    t = obs.threshold()
    amax = float(np.abs(data).max())
    assert 2.0 < t < amax / 4
    # the bulk keeps its resolution: much smaller error on |x| < 4 than with min-max's scale
    bulk = data[np.abs(data) < 4]
    assert _mse(bulk, t) < _mse(bulk, amax) / 10


@pytest.mark.parametrize("bins", [128, 129, 200, 1023, 2048])
def test_entropy_candidate_is_each_groups_mass_spread_over_its_nonempty_bins(bins):
    hist = RNG.integers(0, 50, bins).astype(np.float64) * (RNG.random(bins) < 0.6)  # empty bins and groups
    hist[: bins // 3] = 0
    want = np.zeros(bins)
    for g in np.array_split(np.arange(bins), 128):
        nz = hist[g] > 0
        if nz.any():
            want[g[nz]] = hist[g].sum() / nz.sum()
    np.testing.assert_allclose(_quantized(hist, 128), want, rtol=1e-12, atol=0)
    assert _quantized(hist, 128).sum() == pytest.approx(hist.sum())


def test_uniform_data_keeps_nearly_the_full_range():
    data = RNG.uniform(-1, 1, 100_000).astype(np.float32)
    for obs in (EntropyObserver(), MSEObserver(), PercentileObserver(99.99)):
        obs.update(data)
        assert obs.threshold() > 0.85


def test_per_channel_weights_reconstruct_within_half_a_step():
    w = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32) * RNG.uniform(0.01, 3, (16, 1, 1, 1)).astype(np.float32)
    w[5] = 0  # an all-zero channel
    q, scales = quantize_per_channel(w, axis=0)
    assert q.dtype == np.int8 and q.min() >= -127 and q.max() <= 127
    assert scales.shape == (16,) and scales[5] == 1.0 and not q[5].any()
    err = np.abs(w - q.astype(np.float32) * scales[:, None, None, None])
    assert (err <= scales[:, None, None, None] / 2 + 1e-7).all()
    # each nonzero channel uses its full range
    assert (np.abs(q).reshape(16, -1).max(axis=1)[np.arange(16) != 5] == 127).all()
    # dense weights [out, in] quantized along axis 0 as well
    q2, s2 = quantize_per_channel(RNG.standard_normal((4, 7)), axis=-2)
    assert s2.shape == (4,)


def test_int8_matmul_with_per_channel_scales_is_exact_in_int32():
    """int8 x int8 -> int32 accumulation equals the float64 product of the quantized values exactly."""
    x = RNG.standard_normal((32, 64)).astype(np.float32)
    w = RNG.standard_normal((16, 64)).astype(np.float32)
    xq, xs = quantize_per_tensor(x, float(np.abs(x).max()))
    wq, ws = quantize_per_channel(w, axis=0)
    acc = xq.astype(np.int32) @ wq.astype(np.int32).T
    ref = xq.astype(np.float64) @ wq.astype(np.float64).T
    assert acc.dtype == np.int32 and np.array_equal(acc, ref.astype(np.int64))
    y = acc * (xs * ws[None, :])
    assert np.abs(y - x @ w.T).max() < 0.05 * np.abs(x @ w.T).max()


@pytest.mark.parametrize(
    "data,msg",
    [
        (np.zeros((0, 3), np.float32), "is empty"),
        (np.array([[1.0, np.nan, 2.0]], np.float32), "1 NaN/Inf"),
        (np.array([[np.inf, 1.0, 2.0]], np.float32), "NaN/Inf"),
        (np.zeros((2, 4), np.float32), r"shape 2x4, expected \?x3"),
        (np.zeros((2, 3), np.float64), "is float64, the model input is float32"),
    ],
)
def test_bad_calibration_data(data, msg):
    with pytest.raises(InputError, match=msg):
        check_calibration_batch(data, "image", shape=(None, 3), dtype="float32")


def test_observer_registry_and_empty_observer():
    assert isinstance(make_observer("entropy"), EntropyObserver)
    with pytest.raises(UsageError, match="unknown calibration method 'kl'; valid: minmax, percentile, entropy, mse"):
        make_observer("kl")
    with pytest.raises(UsageError, match="seen no data"):
        MSEObserver().threshold()
    with pytest.raises(UsageError, match="percentile must be"):
        PercentileObserver(0)


def test_bad_calibration_data_exits_6_naming_the_problem(tmp_path, capsys):
    from tests.helpers import cli_in_process

    d = tmp_path / "mixed"
    d.mkdir()
    np.save(d / "a.npy", np.zeros((4, 1, 28, 28), np.float32))
    np.save(d / "b.npy", np.zeros((4, 1, 14, 14), np.float32))
    (tmp_path / "empty.npy").write_bytes(b"")
    np.save(tmp_path / "scalar.npy", np.float32(3))
    np.savez(tmp_path / "none.npz")
    cases = [
        (d, "disagree on the sample shape"),
        (tmp_path / "empty.npy", "cannot read calibration file"),
        (tmp_path / "scalar.npy", "single number"),
        (tmp_path / "none.npz", "no arrays"),
    ]
    for calib, msg in cases:
        code, err = cli_in_process("quantize", "--precision", "int8", "--calib", calib, "-o", tmp_path / "p.json", capsys=capsys)  # fmt: skip
        assert code == 6 and msg in err and "Traceback" not in err, (calib, err)


def test_a_model_with_a_fixed_batch_calibrates_on_n_samples(tmp_path):
    """(N, C, H, W) calibration data for a model fixed at batch 1 is split into model-sized batches."""
    from tests.helpers import make_convnet

    model = make_convnet(tmp_path / "fixed.onnx", batch=1)
    calib = tmp_path / "calib.npy"
    np.save(calib, np.random.default_rng(0).random((24, 3, 16, 16), dtype=np.float32))
    from inferx_edge.frontend import import_model
    from inferx_edge.quantize.driver import QuantOptions, make_plan

    plan = make_plan(
        model, {}, import_model(model), "int8", QuantOptions(calib=calib, calib_method="minmax"), log=lambda *a: None
    )
    assert plan.calibration_samples == 24 and plan.amax
