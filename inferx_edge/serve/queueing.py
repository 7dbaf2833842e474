"""The queueing model the live governor judges operating points with (pure: measurements in, predicted
capacity, p99, power and J/frame out)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferx_edge.runtime.governor import VariantStats


@dataclass(frozen=True)
class Point:
    """An operating point: a (precision, batch) the batcher forms, and on a board with power modes the
    mode it runs in (``mode``: the ``power_mode`` of the device slots measured in that mode)."""

    name: str
    precision: str
    batch: int
    mode: str | None = None


def predict(point: Point, lam: float, slots, delay: float, power) -> VariantStats | None:
    """``point`` judged at arrival rate ``lam`` (rows/s) on the device slot where its full batch runs
    fastest: the model of :mod:`inferx_edge.serve.live`'s docstring. ``delay`` is the batcher's
    max_queue_delay (s); ``power(slot, variant)`` gives (idle, active) watts. None when the point's
    full batch has not been measured on any device."""
    best = None
    for s in slots:
        if point.mode is not None and getattr(s, "power_mode", None) != point.mode:
            continue
        full = s.variant_for(point.precision, point.batch)
        if full is None or full.batch != point.batch or s.timing[full.name].seconds is None:
            continue
        if best is None or s.timing[full.name].seconds < best[0].timing[best[1].name].seconds:
            best = (s, full)
    if best is None:
        return None
    slot, full = best
    lam = max(lam, 1e-3)
    b = point.batch
    l_full = slot.timing[full.name].seconds
    w = min(delay, (b - 1) / lam)
    r = min(float(b), 1.0 + lam * w)
    c = slot.variant_for(point.precision, math.ceil(r)) or full
    l_c = slot.timing[c.name].seconds or l_full
    u = lam * l_c / r
    if u >= 1.0:  # saturated: batches fill up
        r, c, l_c = float(b), full, l_full
        w = (b - 1) / lam
        u = lam * l_c / r
    p99 = math.inf if u >= 1.0 else w + l_c + 2 * l_c * u / (1 - u)
    idle, active = power(slot, c.name)
    watts = idle + min(u, 1.0) * (active - idle)
    return VariantStats(
        name=point.name,
        fps=b / l_full,
        watts=watts,
        j_per_frame=watts / lam,
        p99_ms=min(p99 * 1e3, 1e12),
        batch=b,
        precision=point.precision,
    )
