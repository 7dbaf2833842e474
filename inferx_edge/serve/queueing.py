"""The queueing model the live governor judges operating points with (pure: measurements in, predicted
capacity, p99, power and J/frame out), and the arrival-rate estimate it is fed with.

A point (precision, target batch B) at Poisson arrival rate lambda, served FIFO on one device by the
batcher (a batch closes at B rows or when its oldest request has waited the max queue delay d, and runs
on the smallest compiled variant holding its rows):

- **Which variant runs.** The batching delay gathers r0 = 1 + lambda*min(d, (B-1)/lambda) rows, so runs
  start on the smallest variant holding r0. But once one run takes L_v seconds on a variant v, the
  lambda*L_v rows that arrive meanwhile form the next batch: if that is more than the next smaller
  variant holds, v runs again and again (a self-sustaining state that Poisson bursts eventually reach).
  The model takes the largest such v, and moves up the ladder while lambda*L_v is more than v holds.
- **Utilisation** u = lambda*L_v / C_v, C_v = min(B, rows of v): the share of v's capacity in use. At
  u >= 1 the point cannot keep up (p99 infinite).
- **p99** = w + L_v (its own run) + the residual of the run in progress when it arrives (L_v, weighted by
  the chance the device is busy) + the queue ahead: the backlog of a bulk-service queue is a reflected
  random walk with drift -(1-u)C and variance uC per run, whose tail is exponential with rate
  2(1-u)/u per row, so its 99th percentile is u/(2(1-u))*ln(100u) rows, i.e. that over C_v runs.
  w, the batching delay, only applies while the device idles between runs (lambda*L_v < r0).
  For B = 1 this is the M/D/1 tail; for large B the queue term shrinks by C_v (an earlier form, p99 =
  w + L + 2L*u/(1-u), overstated the tail of batch-8/64 points 3-20x against the simulated queue).
- **Power** = P_idle + busy*(P_active(v) - P_idle), busy = lambda*L_v / rows per run; J/frame =
  power/lambda.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferx_edge.runtime.governor import VariantStats

#: the p99 (ms) reported for a point that cannot keep up with the demand
SATURATED_MS = 1e12


@dataclass(frozen=True)
class Point:
    """An operating point: a (precision, batch) the batcher forms, and on a board with power modes the
    mode it runs in (``mode``: the ``power_mode`` of the device slots measured in that mode)."""

    name: str
    precision: str
    batch: int
    mode: str | None = None


class RateEstimate:
    """The arrival rate decisions use: an exponentially smoothed rate (time constant ``tau_s``) that
    jumps to a window's measured rate when the window's count is more than ``z`` Poisson standard
    deviations away from what the smoothed rate expects (a change of load: at z = 4 noise alone does that
    once in ~15,000 windows)."""

    def __init__(self, tau_s: float = 2.0, z: float = 4.0):
        self.tau_s, self.z = tau_s, z
        self.rate: float | None = None

    def update(self, rows: float, seconds: float) -> float:
        measured = rows / seconds
        if self.rate is None:
            self.rate = measured
            return self.rate
        expected = self.rate * seconds
        if abs(rows - expected) > self.z * math.sqrt(max(expected, 1.0)) + 1.0:
            self.rate = measured
        else:
            self.rate += min(1.0, seconds / self.tau_s) * (measured - self.rate)
        return self.rate


def _ladder(slot, precision: str, batch: int) -> list[tuple[int, float, object]]:
    """(rows it holds within the target batch, seconds, variant) for each variant the batcher can pick
    for batches of up to ``batch`` rows, smallest first; empty if one is unmeasured."""
    sizes = sorted({v.batch for v in slot.variants.values() if v.precision == precision and v.batch < batch})
    out = []
    for rows in [*sizes, batch]:
        v = slot.variant_for(precision, rows)
        if v is None or slot.timing[v.name].seconds is None:
            return []
        out.append((min(v.batch, batch), slot.timing[v.name].seconds, v))
    return out


def running_variant(ladder, lam: float, r0: float) -> int:
    """Index in ``ladder`` of the variant the batcher settles on at ``lam`` rows/s (module docstring)."""
    i = next((k for k, (rows, _, _) in enumerate(ladder) if rows >= r0), len(ladder) - 1)
    for j in range(i + 1, len(ladder)):
        if lam * ladder[j][1] > ladder[j - 1][0]:  # its runs gather more rows than the one below holds
            i = j
    while i + 1 < len(ladder) and lam * ladder[i][1] >= ladder[i][0]:
        i += 1
    return i


def p99_seconds(lam: float, batch: int, ladder, delay: float) -> tuple[float, float, object]:
    """(p99 latency, busy fraction, running variant) of a target batch at ``lam`` rows/s."""
    w0 = min(delay, (batch - 1) / lam)
    r0 = min(float(batch), 1.0 + lam * w0)
    cap, seconds, variant = ladder[running_variant(ladder, lam, r0)]
    u = lam * seconds / cap
    if u >= 1.0:
        return math.inf, 1.0, variant
    rows = max(r0, min(lam * seconds, cap))
    busy = min(1.0, lam * seconds / rows)
    w = w0 if lam * seconds < r0 else 0.0
    residual = seconds * max(0.0, 1.0 - 0.01 / busy) if busy > 0 else 0.0
    queue = seconds * u / (2.0 * (1.0 - u)) * max(0.0, math.log(100.0 * u)) / cap
    return w + seconds + residual + queue, busy, variant


def predict(point: Point, lam: float, slots, delay: float, power) -> VariantStats | None:
    """``point`` judged at arrival rate ``lam`` (rows/s) on the device slot where its full batch runs
    fastest (the module docstring's model). ``delay`` is the batcher's max_queue_delay (s);
    ``power(slot, variant)`` gives (idle, active) watts. None when the point's variants have not all
    been measured on any device."""
    best = None
    for s in slots:
        if point.mode is not None and getattr(s, "power_mode", None) != point.mode:
            continue
        full = s.variant_for(point.precision, point.batch)
        if full is None or full.batch != point.batch or s.timing[full.name].seconds is None:
            continue
        ladder = _ladder(s, point.precision, point.batch)
        if ladder and (best is None or ladder[-1][1] < best[1][-1][1]):
            best = (s, ladder)
    if best is None:
        return None
    slot, ladder = best
    lam = max(lam, 1e-3)
    p99, busy, variant = p99_seconds(lam, point.batch, ladder, delay)
    idle, active = power(slot, variant.name)
    watts = idle + busy * (active - idle)
    return VariantStats(
        name=point.name,
        fps=point.batch / ladder[-1][1],
        watts=watts,
        j_per_frame=watts / lam,
        p99_ms=min(p99 * 1e3, SATURATED_MS),
        batch=point.batch,
        precision=point.precision,
    )
