"""The governor live inside the server: every window it reads telemetry, the arrival rate, queue and
request latency, and picks the operating point (precision x target batch size) the batcher forms
batches for; per batch it routes to the device whose measured latency/energy is best under the policy
(finish time alone when a device has no power sensor). A pinned variant (``--variant``) runs every
batch, padded: the static baseline the governor is measured against.

Operating points are the compiled (precision, batch) pairs. A point is judged *at the live load* by a
small queueing model fed only by measurements (:mod:`inferx_edge.serve.queueing`: which variant runs,
utilisation, p99, power and J/frame), so a point that is not running can be compared with the one that
is. Without a power sensor a device's "watts" are its busy fraction (P_idle 0, P_active 1): J/frame is
then device-seconds per frame, and the decision log says so.

The arrival rate a decision uses is not the raw window's: a window's count is Poisson noise around the
rate (+-10 % at 100 requests), and deciding on it flaps between neighbouring points. The estimate
(:class:`RateEstimate`) follows a smoothed rate and jumps to the window's rate only when the count is
out of the noise (4 standard deviations): up at once, so a burst is met in one window, and down at
once when traffic falls away. Rows still queued at the end of a window count as extra demand, to be
served within the next window, so a backlog makes the governor pick a point that drains it; and a
queue past :meth:`LiveGovernor.backlog_alarm_rows` wakes the governor at once (the batcher checks it
on every request) rather than at the window's end.

The running point's p99 is replaced by the measured window's when the window has enough requests (and
did not begin with a backlog, and the point is not saturated); its J/frame by measured power over the
estimated rate. The FPS floor of ``min-energy`` is compared with the live demand: a point must sustain
min(floor, 1.2*lambda). Points are re-probed every ``reprobe_s`` (a short back-to-back run on an idle
worker; its time and energy are counted in metrics), so a profile never goes stale for long.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from dataclasses import dataclass

import numpy as np

from inferx_edge.runtime.governor import (
    Governor,
    LatencySLO,
    MaxThroughputUnderPowerCap,
    MinEnergyAboveFps,
    VariantStats,
    make_policy,
)
from inferx_edge.runtime.telemetry.base import MAX_PLAUSIBLE_W, EnergyMeter
from inferx_edge.serve.batcher import DeviceSlot
from inferx_edge.serve.probe import learn_power, measure_idle_power, measure_variant
from inferx_edge.serve.queueing import SATURATED_MS, Point, RateEstimate, predict
from inferx_edge.serve.routing import pick_device, slot_power


@dataclass(frozen=True)
class GovernorOptions:
    """``policy`` with its limit (``power_cap_w`` / ``fps_floor`` / ``p99_ms``); ``window_s`` between
    decisions; ``dwell_s`` and ``hysteresis`` against flapping; ``probe_s`` of back-to-back runs per
    probe; ``reprobe_s`` between re-probes of a variant (0: never); ``fixed``: pin one operating point
    (name), the governor then only measures."""

    policy: str = "max-throughput"
    power_cap_w: float | None = None
    fps_floor: float | None = None
    p99_ms: float | None = None
    window_s: float = 1.0
    dwell_s: float = 5.0
    hysteresis: float = 0.05
    probe_s: float = 0.3
    reprobe_s: float = 120.0
    fixed: str | None = None

    def limit(self) -> float:
        value = {"max-throughput": self.power_cap_w, "min-energy": self.fps_floor, "latency-slo": self.p99_ms}[
            self.policy
        ]
        if value is None:
            if self.policy == "max-throughput":
                return MAX_PLAUSIBLE_W  # no cap
            flag = {"min-energy": "--fps-floor", "latency-slo": "--p99"}[self.policy]
            from inferx_edge.errors import UsageError

            raise UsageError(f"--policy {self.policy} needs {flag}")
        return value


class LiveGovernor:
    """Plan, route and decide for one model version's device slots."""

    def __init__(self, slots: list[DeviceSlot], options: GovernorOptions, max_queue_delay_s: float, log=None):
        self.slots = slots
        self.options = options
        self.delay = max_queue_delay_s
        self.policy_name = options.policy
        self.limit = options.limit()
        seen: dict[tuple, Point] = {}
        for s in slots:
            mode = getattr(s, "power_mode", None)  # slots of one device in several power modes (the twin)
            for v in sorted(s.variants.values(), key=lambda v: (v.precision, v.batch)):
                name = v.name if mode is None else f"{v.name}@{mode}"
                seen.setdefault((v.precision, v.batch, mode), Point(name, v.precision, v.batch, mode))
        self.points = {p.name: p for p in seen.values()}
        if options.fixed is not None:
            from inferx_edge.errors import check_choice

            check_choice("variant", options.fixed, sorted(self.points))
        self._log = log
        self.lock = threading.Lock()
        self.current = options.fixed or next(iter(self.points))
        self.gov: Governor | None = None
        self._gov_decisions: list[dict] = []  # what self.gov decided, read after each decide()
        self.switches = 0
        self.probe_s_total = 0.0
        self.energy_note = ""
        # window accumulators (reset every tick)
        self._latencies: list[float] = []
        self._frames = 0
        self._window_start = time.monotonic()
        self._meters: dict[str, EnergyMeter] = {}
        self._busy_mark = {s.label: 0.0 for s in slots}
        self._variant_busy: dict[tuple[str, str], float] = {}
        self.rate = RateEstimate()
        self._queued_before = 0  # rows queued when the window being judged began
        self._settle = False  # a backlog alarm moved to the fastest point: the next decision ignores dwell
        self.alarm_rows = math.inf  # backlog_alarm_rows() of the current point, kept for the batcher
        self.p99_gap_ms = 0.0  # measured p99 above the model's, added to every prediction (_learn_p99_gap)

    # -- measurements ---------------------------------------------------------------------------------
    def probe_all(self) -> None:
        """Startup: idle power per device, then every variant on every device (blocking)."""
        for s in self.slots:
            s.idle_w = self._idle_power(s)
        for s in self.slots:
            for v in s.variants.values():
                self._probe(s, v.name)

    def _idle_power(self, slot: DeviceSlot) -> float | None:
        return measure_idle_power(slot, max(0.2, self.options.probe_s))

    def _probe(self, slot: DeviceSlot, name: str) -> None:
        self.probe_s_total += measure_variant(slot, name, self.options.probe_s)

    def observe_batch(self, slot: DeviceSlot, variant, seconds: float | None) -> None:
        if seconds is None:
            return
        with self.lock:
            key = (slot.label, variant.name)
            self._variant_busy[key] = self._variant_busy.get(key, 0.0) + seconds

    def observe_request(self, latency_s: float, rows: int) -> None:
        with self.lock:
            self._latencies.append(latency_s)
            self._frames += rows

    # -- the batcher's questions ----------------------------------------------------------------------
    def plan(self) -> tuple[str, int]:
        p = self.points[self.current]
        return p.precision, p.batch

    @property
    def current_mode(self) -> str | None:
        """The power mode of the current point (None where slots have no power modes)."""
        return self.points[self.current].mode

    def route(self, rows: int, precision: str):
        now = time.monotonic()
        slot, v = self._pick(rows, precision, now)
        slot.busy_until = max(now, slot.busy_until) + (slot.timing[v.name].seconds or 0.0)
        return slot, v

    def _pick(self, rows: int, precision: str, now: float):
        mode = self.current_mode
        slots = [s for s in self.slots if mode is None or getattr(s, "power_mode", None) == mode]
        if self.options.fixed:  # a pinned variant runs every batch, padded (the static baseline)
            name = self.points[self.options.fixed].name.split("@")[0]
            return next((s, s.variants[name]) for s in slots if name in s.variants)
        return pick_device(slots, rows, precision, now, self.policy_name, self.limit, self.delay)

    def backlog_alarm_rows(self) -> float:
        """Queued rows past which the server should not wait for the window's end to decide: what the
        current point serves in half the p99 limit (``latency-slo``) or in half a window (the other
        policies), at least one full batch. A burst that outruns the current point trips it within
        milliseconds, instead of queueing for the rest of the window."""
        p = self.points[self.current]
        stats = self.predict(p, 1.0)
        if stats is None:
            return math.inf
        horizon = self.limit / 2e3 if self.policy_name == "latency-slo" else self.options.window_s / 2
        return max(float(p.batch), stats.fps * horizon)

    # -- the model of a point at the live load ----------------------------------------------------------
    def predict(self, point: Point, lam: float) -> VariantStats | None:
        """The point's stats at arrival rate ``lam`` (:func:`~inferx_edge.serve.queueing.predict`)."""
        return predict(point, lam, self.slots, self.delay, slot_power)

    # -- one window ----------------------------------------------------------------------------------
    def start_window(self) -> None:
        self._window_start = time.monotonic()
        for s in self.slots:
            self._busy_mark[s.label] = s.busy_s
            if s.telemetry is not None:
                m = EnergyMeter(s.telemetry, interval_s=0.05)
                m.start()
                self._meters[s.label] = m

    def tick(self, arrived_rows: int, queued_rows: int = 0, alarm: bool = False) -> dict:
        """Close the window (``arrived_rows`` came in during it, ``queued_rows`` still wait at its end;
        ``alarm``: closed early by the batcher's backlog alarm), decide, open the next; returns the
        window's measurements (the server exports them as metrics)."""
        now = time.monotonic()
        dt = max(now - self._window_start, 1e-6)
        with self.lock:
            latencies, frames, vbusy = self._latencies, self._frames, self._variant_busy
            self._latencies, self._frames, self._variant_busy = [], 0, {}
        lam = arrived_rows / dt
        devices = {}
        for s in self.slots:
            busy = s.busy_s - self._busy_mark[s.label]
            meter = self._meters.pop(s.label, None)
            w = meter.stop() if meter else None
            devices[s.label] = {
                "busy_fraction": min(busy / dt, 1.0),
                "watts": w["avg_w"] if w else None,
                "energy_j": w["energy_j"] if w else None,
                "telemetry": (w["invalid"] or w["method"]) if w else "none",
            }
            learn_power(s, devices[s.label], vbusy)
        measured_p99 = float(np.percentile(latencies, 99) * 1e3) if len(latencies) >= 20 else None
        energies = [d["energy_j"] for d in devices.values()]
        joules = sum(energies) if energies and all(e is not None for e in energies) else None
        window = {
            "seconds": dt,
            "arrival_fps": lam,
            "queued_rows": queued_rows,
            "alarm": alarm,
            "served_fps": frames / dt,
            "p99_ms": measured_p99,
            "requests": len(latencies),
            "energy_j": joules,
            "j_per_frame": joules / frames if joules is not None and frames else None,
            "devices": devices,
        }
        self.decide(now, lam, window)
        self.start_window()
        return window

    def _learn_p99_gap(self, gap_ms: float) -> None:
        """The running point's measured p99 above the model's: latency the device model cannot see
        (request parsing, the event loop, copies, a busy host), smoothed over windows. Added to every
        point's prediction, so a point is not preferred for escaping a delay all of them share."""
        gap = max(0.0, gap_ms)
        self.p99_gap_ms = gap if self.p99_gap_ms == 0.0 else 0.5 * self.p99_gap_ms + 0.5 * gap

    def _policy(self, lam: float):
        if self.policy_name == "min-energy":
            return MinEnergyAboveFps(max(min(self.limit, 1.2 * lam), 1e-6))
        if self.policy_name == "latency-slo":
            return LatencySLO(self.limit)
        return MaxThroughputUnderPowerCap(self.limit)

    def decide(self, now: float, lam: float, window: dict) -> None:
        """Judge every point at the demand the window shows and pick one (logged); ``lam``: the window's
        arrival rate (rows/s), smoothed by :class:`RateEstimate`; ``window``: the measurements that
        replace the running point's predictions (its ``queued_rows`` add to the demand)."""
        seconds = window.get("seconds") or self.options.window_s
        rate = self.rate.update(lam * seconds, seconds)
        queued = window.get("queued_rows", 0)
        backlog = max(0, queued - self.points[self.current].batch)  # beyond the batch being formed
        demand = rate + backlog / self.options.window_s
        window["demand_fps"] = demand
        window["p99_unmodelled_ms"] = self.p99_gap_ms
        queued_before, self._queued_before = self._queued_before, queued
        table = {}
        for p in self.points.values():
            stats = self.predict(p, rate)
            if stats is not None and demand > rate:  # feasibility at the demand, cost at the arrival rate
                stats = dataclasses.replace(stats, p99_ms=self.predict(p, demand).p99_ms)
            if stats is not None:
                table[p.name] = stats
        if not table:
            return
        cur = table.get(self.current)
        if cur is not None and window["requests"]:
            # a point that cannot keep up with the demand stays so: the requests a window served do not
            # show the queue growing behind them
            # requests after a backlog (a burst met by the previous point) measure that point, not this
            saturated = cur.p99_ms >= SATURATED_MS
            clean = queued_before <= self.points[self.current].batch
            measured = window["p99_ms"] is not None and clean and not saturated
            gap = self.p99_gap_ms
            if measured:
                self._learn_p99_gap(window["p99_ms"] - cur.p99_ms)
                # rivals pay at least what this window showed: a smoothed gap that lags a rising delay
                # would make every rival look better than the point that just measured it
                gap = max(self.p99_gap_ms, window["p99_ms"] - cur.p99_ms)
            for name, st in table.items():  # what the device model does not see applies to every point
                if name != self.current and st.p99_ms < SATURATED_MS and gap > 0:
                    table[name] = dataclasses.replace(st, p99_ms=st.p99_ms + gap)
            p99 = window["p99_ms"] if measured else cur.p99_ms + self.p99_gap_ms
            # measured power over the estimated rate: the window's own frame count is Poisson noise that
            # would make the running point look better or worse than its rivals by chance
            energy = window.get("energy_j")
            jpf = energy / seconds / max(rate, 1e-3) if energy is not None else cur.j_per_frame
            table[self.current] = VariantStats(cur.name, cur.fps, cur.watts, jpf, p99, cur.batch, cur.precision)
        no_power = [s.label for s in self.slots if s.idle_w is None]
        self.energy_note = (
            f"energy proxy on {', '.join(no_power)}: device-busy seconds per frame (no power telemetry)"
            if no_power
            else ""
        )
        if self.options.fixed:
            self._emit(now, self.current, "fixed operating point (--variant)", table, window)
            return
        policy = self._policy(demand)
        if self.gov is None:
            self.gov = Governor(
                make_policy(self.policy_name, self.limit),
                table,
                start=self.current if self.current in table else None,
                hysteresis=self.options.hysteresis,
                min_dwell_s=self.options.dwell_s,
                log=self._gov_decisions.append,
            )
        gov = self.gov
        gov.policy = policy  # the min-energy floor follows the live demand
        for stats in table.values():
            gov.variants.add(stats.name)
            gov.observe(stats)
        before = self.current
        self._gov_decisions.clear()
        if window.get("alarm") and self.policy_name != "max-throughput":
            # the queue outgrew the running point: go to the most capacity at once (the rate estimate is
            # only a few milliseconds old), and let the next window's decision step down without dwell
            choice = max(table.values(), key=lambda st: (st.fps, -st.j_per_frame)).name
            reason = f"backlog alarm: {queued} rows queued; the point with the most capacity until the rate is known"
            if choice != gov.current:
                gov.current, gov.since = choice, now
            self._settle = True
        else:
            if self._settle:
                gov.since, self._settle = -math.inf, False
            choice = gov.decide(now)
            reason = self._gov_decisions[-1]["reason"] if self._gov_decisions else ""
        with self.lock:
            self.current = choice
            if choice != before:
                self.switches += 1
        self.alarm_rows = self.backlog_alarm_rows()
        self._emit(now, choice, reason, table, window, before)

    def _emit(self, now, choice, reason, table, window, before=None) -> None:
        if self._log is None:
            return
        self._log(
            {
                "t": time.time(),
                "policy": self.policy_name,
                "limit": self.limit,
                "from": before if before is not None else choice,
                "choice": choice,
                "reason": reason,
                "energy_note": self.energy_note,
                "window": window,
                "points": {k: _round(v.__dict__) for k, v in table.items()},
            }
        )

    def reprobe_due(self) -> list[tuple[DeviceSlot, str]]:
        """Variants whose last measurement is older than ``reprobe_s`` (not the ones running now)."""
        if not self.options.reprobe_s:
            return []
        now = time.monotonic()
        due = [
            (s, name)
            for s in self.slots
            for name, t in s.timing.items()
            if now - t.measured_at > self.options.reprobe_s
        ]
        due.sort(key=lambda x: x[0].timing[x[1]].measured_at)
        return due[:1]

    def probe_later(self, batcher, slot: DeviceSlot, name: str) -> None:
        slot.timing[name].measured_at = time.monotonic()  # not asked again while queued
        batcher.run_on_worker(slot, lambda: self._probe(slot, name))


def _round(d: dict) -> dict:
    return {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in d.items()}
