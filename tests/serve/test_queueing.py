"""The governor's queueing model against a simulated batching queue, and the rate estimate it decides
on: p99 of batch-1/8/64 points within a factor of the simulated one across loads (the earlier M/D/1
form overstated batched points 3-20x), Poisson noise ignored, a change of load followed at once."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from inferx_edge.serve.queueing import RateEstimate, p99_seconds

#: compiled variants (rows, seconds): a GPU-like ladder where bigger batches cost more but serve faster
LADDER = {1: 0.001, 8: 0.0025, 64: 0.012}
DELAY = 0.002


def _ladder(batch):
    sizes = [b for b in sorted(LADDER) if b < batch] + [batch]
    return [(min(b, batch), LADDER[b], SimpleNamespace(name=f"b{b}")) for b in sizes]


def _simulated_p99(lam, batch, seconds=60.0, seed=0):
    """FIFO on one device: a batch starts when the device is free and either ``batch`` requests wait or
    the oldest has waited DELAY; it takes every waiting request up to ``batch`` and runs on the smallest
    variant holding them (what serve's batcher does)."""
    rng = np.random.default_rng(seed)
    a = np.sort(rng.uniform(0, seconds, rng.poisson(lam * seconds)))
    sizes = sorted(LADDER)
    lat = np.empty(len(a))
    i, free = 0, 0.0
    while i < len(a):
        full_at = a[i + batch - 1] if i + batch - 1 < len(a) else math.inf
        start = max(free, min(a[i] + DELAY, full_at))
        j = min(i + batch, int(np.searchsorted(a, start, side="right")))
        free = start + LADDER[next(b for b in sizes if b >= j - i)]
        lat[i:j] = free - a[i:j]
        i = j
    return float(np.percentile(lat[len(lat) // 10 :], 99))


@pytest.mark.parametrize("batch", [1, 8, 64])
@pytest.mark.parametrize("load", [0.1, 0.5, 0.85])
def test_p99_model_tracks_the_simulated_batching_queue(batch, load):
    lam = load * batch / LADDER[batch]
    model, busy, _ = p99_seconds(lam, batch, _ladder(batch), DELAY)
    sim = _simulated_p99(lam, batch)
    assert 0.5 <= model / sim <= 2.0, (model, sim, busy)


def test_a_point_past_its_capacity_is_saturated():
    lam = 1.01 * 64 / LADDER[64]
    assert p99_seconds(lam, 64, _ladder(64), DELAY)[0] == math.inf


def test_rate_estimate_ignores_poisson_noise_and_follows_a_change_at_once():
    rng = np.random.default_rng(1)
    est = RateEstimate()
    window = 0.25
    seen = [est.update(rng.poisson(1000 * window), window) for _ in range(400)]
    assert max(abs(x - 1000) for x in seen[20:]) < 100  # raw windows stray by up to +-20 %
    raw = [rng.poisson(1000 * window) / window for _ in range(400)]
    assert np.std(seen[20:]) < np.std(raw) / 2
    assert est.update(5000 * window, window) == pytest.approx(5000)  # a burst: the window's rate, at once
    assert est.update(40 * window, window) == pytest.approx(40)  # and its end
