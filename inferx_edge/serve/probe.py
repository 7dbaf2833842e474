"""What the live governor measures on a device: its idle power, a variant's latency and power in a short
back-to-back run, and power refitted from the windows of live traffic."""

from __future__ import annotations

import time

import numpy as np

from inferx_edge.runtime.telemetry.base import EnergyMeter
from inferx_edge.serve.batcher import DeviceSlot


def measure_idle_power(slot: DeviceSlot, seconds: float) -> float | None:
    """Average watts of the device doing nothing for ``seconds`` (None without telemetry)."""
    if slot.telemetry is None:
        return None
    m = EnergyMeter(slot.telemetry, interval_s=0.05)
    m.start()
    time.sleep(seconds)
    return m.stop()["avg_w"]


def measure_variant(slot: DeviceSlot, name: str, seconds: float) -> float:
    """Run variant ``name`` back to back for ``seconds`` (at least 3 runs, after one warm-up) on zeros;
    its mean latency (and average power, with telemetry) go into ``slot.timing``. Returns the seconds
    spent."""
    v = slot.variants[name]
    arrays = [np.zeros(tuple(d or 1 for d in spec.shape), dtype=spec.dtype) for spec in v.inputs]
    slot.engine.run_arrays(name, arrays)  # warm (first run loads and may capture a CUDA graph)
    meter = EnergyMeter(slot.telemetry, interval_s=0.02) if slot.telemetry is not None else None
    if meter:
        meter.start()
    t0 = time.perf_counter()
    n = 0
    while n < 3 or time.perf_counter() - t0 < seconds:
        slot.engine.run_arrays(name, arrays)
        n += 1
    elapsed = time.perf_counter() - t0
    t = slot.timing[name]
    t.seconds, t.measured_at = elapsed / n, time.monotonic()
    if meter:
        w = meter.stop()
        if w["avg_w"] is not None:
            t.active_w = w["avg_w"]
    return elapsed


def learn_power(slot: DeviceSlot, window: dict, variant_busy: dict) -> None:
    """Refit the device's idle power from an idle window, or a variant's active power from a window where
    it did nearly all the work. ``window``: the device's ``watts`` and ``busy_fraction``;
    ``variant_busy``: busy seconds per (device label, variant name)."""
    watts, u = window["watts"], window["busy_fraction"]
    if watts is None:
        return
    if u < 0.02:
        slot.idle_w = watts if slot.idle_w is None else 0.7 * slot.idle_w + 0.3 * watts
        return
    mine = {name: b for (label, name), b in variant_busy.items() if label == slot.label}
    if not mine or slot.idle_w is None or u < 0.2:
        return
    name, b = max(mine.items(), key=lambda kv: kv[1])
    if b >= 0.8 * sum(mine.values()):
        active = slot.idle_w + (watts - slot.idle_w) / u
        t = slot.timing[name]
        t.active_w = active if t.active_w is None else 0.7 * t.active_w + 0.3 * active
