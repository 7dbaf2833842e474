"""Which device a formed batch runs on, when several serve one model: the one that finishes it first,
or under ``min-energy`` / ``latency-slo`` with power measured on every device, the one that adds the
least energy among those that finish within the latency slack."""

from __future__ import annotations

import math

from inferx_edge.serve.batcher import DeviceSlot


def slot_power(slot: DeviceSlot, name: str) -> tuple[float, float]:
    """(idle, active) watts of a variant on a device; the busy-fraction proxy without telemetry."""
    t = slot.timing[name]
    if slot.idle_w is None or t.active_w is None:
        return 0.0, 1.0
    return slot.idle_w, max(t.active_w, slot.idle_w)


def batch_energy(slot: DeviceSlot, name: str) -> float | None:
    """Joules a batch adds on this device above idle (None without its power measured)."""
    if slot.idle_w is None or slot.timing[name].active_w is None:
        return None
    idle, active = slot_power(slot, name)
    return (active - idle) * (slot.timing[name].seconds or math.inf)


def pick_device(slots, rows: int, precision: str, now: float, policy: str, limit: float, delay: float):
    """(slot, variant) for a batch of ``rows`` rows of ``precision`` (any precision that fits when no
    device has it at that size). ``limit``: the policy's (the p99 in ms under ``latency-slo``);
    ``delay``: the batcher's max queue delay (s)."""
    options = [(s, s.variant_for(precision, rows)) for s in slots]
    options = [(s, v) for s, v in options if v is not None]
    if not options:
        options = [(s, v) for s in slots if (v := s.variant_for(None, rows)) is not None]
    if len(options) == 1:
        return options[0]
    scored = []
    for s, v in options:
        finish = max(now, s.busy_until) + (s.timing[v.name].seconds or math.inf)
        scored.append((finish, batch_energy(s, v.name), s, v))
    soonest = min(x[0] for x in scored)
    if policy == "max-throughput" or any(x[1] is None for x in scored):
        # (a device without a power sensor: energies cannot be compared across devices)
        pick = min(scored, key=lambda x: (x[0], x[1]))
    else:
        slack = limit / 2e3 if policy == "latency-slo" else max(4 * (soonest - now), delay)
        ok = [x for x in scored if x[0] - now <= slack]
        pick = min(ok, key=lambda x: (x[1], x[0])) if ok else min(scored, key=lambda x: x[0])
    return pick[2], pick[3]
