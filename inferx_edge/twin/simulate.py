"""Trace-driven runs of a model's variants on a twin board, under the policies the governor is judged by.

A *point* is (precision, target batch, power mode). Requests arrive as a Poisson process whose rate
follows a trace (one rate per 1 s window). Batches close when they hold the target batch or their
oldest request has waited ``max_queue_delay``; a batch of r rows runs on the smallest compiled variant
holding r rows (zero-padded, as ``serve``'s batcher does), FIFO on one GPU; its service time is the
twin's latency of that variant in the current mode (:mod:`inferx_edge.twin.latency`) with multiplicative
jitter (lognormal, 3 %: the governor's profile is the mean, not the truth). Module power is the twin's
(:mod:`inferx_edge.twin.power`) at the window's GPU, CPU and memory utilisation, integrated by the
:class:`~inferx_edge.twin.device.TwinDevice`, whose rails the real ``JetsonSysfsBackend`` reads.

Policies, all on the same arrivals (same seed):

- ``maxn-fastest``: the board's fastest mode and the highest-throughput point, always;
- ``best-static``: the one (point, mode) with the least energy per inference over the whole trace among
  those within the deadline budget (hindsight);
- ``oracle``: per interval (``oracle_interval_s``), the (point, mode) with the least energy within the
  deadline budget in that interval, each interval simulated on its own from an empty queue (hindsight);
- ``governor``: :class:`~inferx_edge.serve.live.LiveGovernor`, the code ``serve`` runs, over one device
  slot per power mode, fed each window with the arrival rate, the measured p99 and the energy read from
  the twin's INA3221 rails by ``JetsonSysfsBackend``; a change of mode goes through
  ``runtime.control.set_power_mode`` and the twin's ``nvpmodel`` (applied after the switch delay).

Deadline misses: a request slower than the SLO. Reported: the miss rate, the number of bursts (runs of
consecutive missed requests) and the longest burst.
"""

from __future__ import annotations

import math
import tempfile

import numpy as np

from inferx_edge.twin.boards import Board
from inferx_edge.twin.device import TwinDevice
from inferx_edge.twin.workload import (  # noqa: F401  (re-exported: the simulation's vocabulary)
    JITTER,
    ModeTable,
    OpPoint,
    Queue,
    RunResult,
    Trace,
    Variant,
    _bursts,
    _cpu_util,
    arrivals_for,
    bursty,
    diurnal,
    gpu_activity,
    refine,
    steady,
    step,
)


class Simulation:
    """One board, one model's variants, one trace, one SLO (see the module docstring)."""

    def __init__(
        self,
        board: Board,
        variants: list[Variant],
        trace: Trace,
        slo_ms: float,
        max_queue_delay_s: float = 0.002,
        seed: int = 0,
        oracle_interval_s: float = 60.0,
        miss_budget: float = 0.01,
    ):
        self.board, self.trace, self.slo_s = board, trace, slo_ms / 1e3
        self.table = ModeTable(board, variants)
        self.delay, self.seed = max_queue_delay_s, seed
        self.oracle_interval_s, self.miss_budget = oracle_interval_s, miss_budget
        self.arrivals = arrivals_for(trace, seed)
        precisions = sorted({v.precision for v in variants})
        batches = sorted({v.batch for v in variants})
        self.points = [OpPoint(p, b, m.id) for p in precisions for b in batches for m in board.modes]

    # -- one fixed schedule of points --------------------------------------------------------------
    def run_schedule(
        self,
        name: str,
        choose,
        windows: range | None = None,
        device: TwinDevice | None = None,
        steps: int = 1,
    ) -> RunResult:
        """Run windows with ``choose(k, last_step) -> OpPoint`` deciding the point of each of a window's
        ``steps`` equal steps (``last_step``: the previous step's measurements, None at first)."""
        windows = windows if windows is not None else range(len(self.arrivals))
        rng = np.random.default_rng(self.seed + 1)
        q = Queue(self.table, self.delay, rng)
        own_device = device is None
        tmp = tempfile.TemporaryDirectory() if own_device else None
        dev = device or TwinDevice(self.board, tmp.name, publish=False)
        w = self.trace.window_s
        dev.clock.t = windows.start * w
        q.free_at = dev.clock.t
        lat_all, timeline, last = [], [], None
        point_switches, current = 0, None
        try:
            for k in windows:
                arrivals = self.arrivals[k]
                record = {"k": k, "arrivals": len(arrivals), "energy_j": 0.0, "busy": 0.0, "mode": dev.mode.name}
                window_lats = []
                for j in range(steps):
                    point = choose(k, last)
                    if current is not None and point != current:
                        point_switches += 1
                    current = point
                    if dev.mode.id != point.mode and (dev.pending is None or dev.pending.mode.id != point.mode):
                        dev.request_mode(point.mode)
                    t_end = k * w + (j + 1) * w / steps
                    n = int(np.searchsorted(arrivals, t_end)) if j + 1 < steps else len(arrivals)
                    step_arrivals, arrivals = arrivals[:n], arrivals[n:]
                    t0 = dev.clock.t
                    lat, busy, energy = self._step(q, dev, step_arrivals, t_end, point)
                    window_lats.append(lat)
                    record["energy_j"] += energy
                    record["busy"] += busy / w
                    record["point"] = point
                    last = {
                        "k": k,
                        "seconds": t_end - t0,
                        "arrivals": len(step_arrivals),
                        "served": len(lat),
                        "queued": len(q.pending),
                        "latencies": lat,
                        "p99_ms": float(np.percentile(lat, 99) * 1e3) if len(lat) >= 20 else None,
                        "energy_j": energy,
                        "point": point,
                    }
                lat = np.concatenate(window_lats)
                lat_all.append(lat)
                record["served"] = len(lat)
                record["p99_ms"] = float(np.percentile(lat, 99) * 1e3) if len(lat) >= 20 else None
                timeline.append(record)
        finally:
            if tmp is not None:
                tmp.cleanup()
        lat = np.concatenate(lat_all) if lat_all else np.empty(0)
        missed = lat > self.slo_s
        bursts, longest = _bursts(missed)
        return RunResult(
            name,
            len(lat),
            float(sum(x["energy_j"] for x in timeline)),
            int(missed.sum()),
            bursts,
            longest,
            float(np.percentile(lat, 99) * 1e3) if len(lat) else 0.0,
            len(dev.switches),
            point_switches,
            timeline,
        )

    def _step(self, q: Queue, dev: TwinDevice, arrivals: np.ndarray, t_end: float, point: OpPoint):
        """Serve ``arrivals`` up to ``t_end`` and advance the device; (latencies, busy s, joules). Batches
        run at the clocks in force when they start: a mode switch taking effect inside splits the step."""
        cut = [t for t in [dev.next_switch()] if t is not None and dev.clock.t < t < t_end]
        energy, busy, lats = 0.0, 0.0, []
        for end in [*cut, t_end]:
            n = int(np.searchsorted(arrivals, end))
            lat, b, *work = q.window(arrivals[:n], end, point, dev.mode)
            arrivals = arrivals[n:]
            span = end - dev.clock.t
            # a batch's work counts where it runs: what outlasts this span (a run longer than a step, a
            # backlog) carries over to the next
            work = np.asarray(work) + q.carry
            done = np.minimum(work, span)
            q.carry = work - done
            gpu, mem, cpu = done / span
            energy += dev.advance(span, gpu_util=gpu, cpu_util=cpu, mem_util=mem)
            busy += b
            lats.append(lat)
        return np.concatenate(lats), busy, energy

    def fastest_point(self) -> OpPoint:
        """The fastest mode (most SMs x clock) and the highest-throughput point in it."""
        fast = max(
            self.board.modes, key=lambda m: (self.board.clocks(m)["sms"] * self.board.clocks(m)["gpu_mhz"], m.cpus)
        )
        best = max(
            (p for p in self.points if p.mode == fast.id),
            key=lambda p: p.batch / self.table.service_s(self.table.variant_for(p.precision, p.batch).name, fast),
        )
        return best

    def maxn_fastest(self) -> RunResult:
        p = self.fastest_point()
        return self.run_schedule("maxn-fastest", lambda k, last: p)

    def candidates(self) -> list[OpPoint]:
        """Points the hindsight policies need to try: a point is left out when another in the same mode
        with the same target batch runs every batch size at least as fast (and so, at the same
        utilisation, no less efficiently): e.g. fp16 where int8 is faster at every size."""
        times = {
            p: [
                self.table.service_s(self.table.variant_for(p.precision, r).name, self.board.mode(p.mode))
                for r in range(1, p.batch + 1)
            ]
            for p in self.points
        }

        def dominates(q: OpPoint, p: OpPoint) -> bool:
            return (
                (q.mode, q.batch) == (p.mode, p.batch)
                and times[q] != times[p]
                and all(x <= y for x, y in zip(times[q], times[p]))
            )

        return [p for p in self.points if not any(dominates(q, p) for q in self.points)]

    def best_static(self, mode: int | None = None, name: str = "best-static") -> RunResult:
        """The least-energy single point within the miss budget (only points in ``mode`` when given)."""
        points = [p for p in self.candidates() if mode is None or p.mode == mode]
        runs = [self.run_schedule(f"static {p.label(self.board)}", lambda k, last, p=p: p) for p in points]
        ok = [r for r in runs if r.miss_rate <= self.miss_budget]
        pick = min(ok or runs, key=lambda r: r.j_per_inference if ok else r.miss_rate)
        pick.policy = f"{name} (" + pick.policy.removeprefix("static ") + ")"
        return pick

    def maxn_best(self) -> RunResult:
        """The fastest mode with its best point in hindsight: what the power mode alone is worth."""
        return self.best_static(self.fastest_point().mode, "maxn-best")

    def oracle(self) -> RunResult:
        """Per interval, the least-energy point within the miss budget (each interval from an empty queue)."""
        n = len(self.arrivals)
        per = max(1, int(round(self.oracle_interval_s / self.trace.window_s)))
        schedule: list[OpPoint] = []
        for start in range(0, n, per):
            window = range(start, min(start + per, n))
            best = None
            for p in self.candidates():
                r = self.run_schedule("probe", lambda k, last, p=p: p, window)
                key = (
                    r.miss_rate > self.miss_budget,
                    r.miss_rate if r.miss_rate > self.miss_budget else r.j_per_inference,
                )
                if best is None or key < best[0]:
                    best = (key, p)
            schedule += [best[1]] * len(window)
        result = self.run_schedule("oracle", lambda k, last: schedule[k])
        return result

    def governor(
        self,
        policy: str = "latency-slo",
        dwell_s: float = 5.0,
        hysteresis: float = 0.05,
        log=None,
        steps: int = 10,
    ) -> RunResult:
        """``serve``'s LiveGovernor deciding every window on twin telemetry (see the module docstring).
        The queue is checked ``steps`` times a window: past the governor's backlog alarm it decides at
        once, as ``serve``'s batcher wakes it."""
        from inferx_edge.runtime.control import set_power_mode
        from inferx_edge.runtime.telemetry.jetson import JetsonSysfsBackend
        from inferx_edge.serve.live import GovernorOptions, LiveGovernor

        with tempfile.TemporaryDirectory() as tmp:
            dev = TwinDevice(self.board, tmp, mode_id=self.fastest_point().mode)
            backend = JetsonSysfsBackend(dev.root, clock=dev.clock)
            slots = self._slots()
            opts = GovernorOptions(
                policy=policy,
                p99_ms=self.slo_s * 1e3,
                window_s=self.trace.window_s,
                dwell_s=dwell_s,
                hysteresis=hysteresis,
            )
            gov = LiveGovernor(slots, opts, self.delay, log=log)
            by_label = {(p.precision, p.batch, self.board.mode(p.mode).name): p for p in self.points}
            start = self.fastest_point()
            gov.current = next(
                n
                for n, pt in gov.points.items()
                if (pt.precision, pt.batch, pt.mode) == (start.precision, start.batch, self.board.mode(start.mode).name)
            )

            acc = {"steps": 0, "seconds": 0.0, "arrivals": 0, "lat": [], "joules": 0.0}

            def choose(k, last):
                if last is not None:
                    sample = backend.read()  # the step's average power, from the twin's INA3221 rails
                    acc["steps"] += 1
                    acc["seconds"] += last["seconds"]
                    acc["arrivals"] += last["arrivals"]
                    acc["lat"].append(last["latencies"])
                    if acc["joules"] is not None and sample.power_w is not None:
                        acc["joules"] += sample.power_w * last["seconds"]
                    else:
                        acc["joules"] = None
                    # serve decides at each window's end, and at once when the queue outgrows the alarm
                    alarm = acc["steps"] < steps and last["queued"] > gov.alarm_rows
                    if acc["steps"] >= steps or alarm:
                        lat = np.concatenate(acc["lat"])
                        joules, dt = acc["joules"], acc["seconds"]
                        window = {
                            "seconds": dt,
                            "arrival_fps": acc["arrivals"] / dt,
                            "queued_rows": last["queued"],
                            "served_fps": len(lat) / dt,
                            "p99_ms": float(np.percentile(lat, 99) * 1e3) if len(lat) >= 20 else None,
                            "requests": len(lat),
                            "energy_j": joules,
                            "j_per_frame": joules / len(lat) if joules is not None and len(lat) else None,
                            "devices": {},
                            "alarm": alarm,
                        }
                        gov.decide(dev.clock.t, window["arrival_fps"], window)
                        acc.update(steps=0, seconds=0.0, arrivals=0, lat=[], joules=0.0)
                pt = gov.points[gov.current]
                point = by_label[(pt.precision, pt.batch, pt.mode)]
                if point.mode != (dev.pending.mode.id if dev.pending else dev.mode.id):
                    set_power_mode(point.mode, allowed=True, nvpmodel=dev.nvpmodel, root=str(dev.root))
                return point

            result = self.run_schedule("governor", choose, device=dev, steps=steps)
            result.policy = f"governor ({policy})"
            return result

    def _slots(self) -> list:
        """One device slot per power mode, timed and powered from the twin's predicted profile."""
        from types import SimpleNamespace

        from inferx_edge.serve.batcher import DeviceSlot

        slots = []
        for m in self.board.modes:
            variants = [
                SimpleNamespace(name=v.name, precision=v.precision, batch=v.batch, inputs=[])
                for v in self.table.variants
            ]
            engine = SimpleNamespace(manifest=SimpleNamespace(variants=variants))
            slot = DeviceSlot(engine, f"{self.board.name}:{m.name}")
            slot.power_mode = m.name
            slot.idle_w = self.table.idle_w(m)
            for v in self.table.variants:
                t = slot.timing[v.name]
                t.seconds = self.table.service_s(v.name, m)
                t.active_w = self.table.active_w(v.name, m)
                t.measured_at = math.inf  # from the profile; never re-probed on the twin
            slots.append(slot)
        return slots


def compare(sim: Simulation, log=None) -> dict:
    """Every policy on ``sim``'s trace, with the ratios the goals are stated in."""
    policies = (sim.maxn_fastest(), sim.maxn_best(), sim.best_static(), sim.oracle(), sim.governor(log=log))
    runs = {r.policy.split(" ")[0]: r for r in policies}
    base, oracle, gov = runs["maxn-fastest"], runs["oracle"], runs["governor"]
    out = {
        "trace": sim.trace.name,
        "seconds": sim.trace.seconds,
        "slo_ms": sim.slo_s * 1e3,
        "policies": {r.policy: r.summary() for r in runs.values()},
        "governor_vs_maxn_fastest": gov.j_per_inference / base.j_per_inference - 1,
        "governor_vs_maxn_best": gov.j_per_inference / runs["maxn-best"].j_per_inference - 1,
        "governor_vs_best_static": gov.j_per_inference / runs["best-static"].j_per_inference - 1,
        "governor_vs_oracle": gov.j_per_inference / oracle.j_per_inference - 1,
        "timeline_units": "s",
        "timeline": [
            {
                "t": x["k"] * sim.trace.window_s,
                "rate": x["arrivals"] / sim.trace.window_s,
                "point": x["point"].label(sim.board),
                "p99_ms": x["p99_ms"],
                "watts": x["energy_j"] / sim.trace.window_s,
            }
            for x in gov.timeline
        ],
    }
    return out
