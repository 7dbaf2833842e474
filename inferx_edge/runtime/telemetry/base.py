"""Telemetry samples, the backend interface, probing, and energy over a window."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Protocol

from inferx_edge.errors import TelemetryError  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class Sample:
    """One reading. ``power_w`` is the board/GPU power the backend sees (``partial``: a sum of rails that
    misses some consumers, e.g. AGX Orin has no module-input rail); ``energy_j`` a monotonic counter
    when the hardware has one (NVML), else None."""

    t: float
    power_w: float | None
    energy_j: float | None = None
    partial: bool = False
    gpu_util: float | None = None
    gpu_mhz: float | None = None
    temp_c: float | None = None
    rails_w: dict[str, float] = field(default_factory=dict)
    throttle: tuple[str, ...] = ()


class TelemetryBackend(Protocol):
    name: str

    def read(self) -> Sample: ...

    def close(self) -> None: ...


#: no device inferx_edge runs on draws more (an H200 board: 700 W): readings above are garbage
MAX_PLAUSIBLE_W = 2000.0


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def clean(sample: Sample, previous: Sample | None, max_w: float = MAX_PLAUSIBLE_W) -> tuple[Sample | None, list[str]]:
    """``sample`` with implausible readings removed (NaN, negative, above ``max_w``), or None when its
    time stamp is unusable (NaN, or earlier than ``previous``'s); plus what was rejected."""
    notes = []
    if not _finite(sample.t) or (previous is not None and sample.t < previous.t):
        return None, [f"time stamp {sample.t!r} not after {previous.t if previous else 'start'}: sample dropped"]
    power, energy = sample.power_w, sample.energy_j
    if power is not None and (not _finite(power) or power < 0 or power > max_w):
        notes.append(f"power {power!r} W rejected")
        power = None
    if energy is not None and (not _finite(energy) or energy < 0):
        notes.append(f"energy counter {energy!r} J rejected")
        energy = None
    extra = {}
    for key, top in (("gpu_mhz", 10_000.0), ("temp_c", 200.0)):
        v = getattr(sample, key)
        if v is not None and (not _finite(v) or v < 0 or v > top):
            notes.append(f"{key} {v!r} rejected")
            extra[key] = None
    if notes:
        from dataclasses import replace

        sample = replace(sample, power_w=power, energy_j=energy, **extra)
    return sample, notes


class EnergyMeter:
    """Energy over a window: the hardware counter's delta when there is one, else power integrated over
    samples taken by a background thread every ``interval_s`` (trapezoid rule).

    Garbage is not measured: NaN, negative or implausible readings are dropped (:func:`clean`), a time
    stamp going backwards drops its sample, a counter that goes backwards (a reset or wrap) makes the
    window invalid, and a backend that raises is a lost sample, never an exception out of the meter. An
    invalid window reports ``energy_j`` None with the reason in ``invalid``."""

    def __init__(self, backend: TelemetryBackend, interval_s: float = 0.05, max_w: float = MAX_PLAUSIBLE_W) -> None:
        self.backend = backend
        self.interval_s = interval_s
        self.max_w = max_w
        self._samples: list[Sample] = []
        self._lost = 0
        self.rejected: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> Sample | None:
        try:
            raw = self.backend.read()
        except Exception as exc:  # noqa: BLE001 - a failing backend is a lost sample
            self.rejected.append(f"read failed: {exc}")
            return None
        sample, notes = clean(raw, self._samples[-1] if self._samples else None, self.max_w)
        self.rejected += notes
        return sample

    def start(self) -> None:
        self._samples, self._lost, self.rejected = [], 0, []
        self._stop.clear()
        first = self._read()
        if first is not None:
            self._samples.append(first)
        if first is None or first.energy_j is None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            sample = self._read()
            if sample is None or sample.power_w is None:
                self._lost += 1
            if sample is not None:
                self._samples.append(sample)

    def stop(self) -> dict:
        """``{"seconds", "energy_j", "avg_w", "method", "partial", "lost", "invalid", "state"}``; energy
        None when the window is not valid (``invalid`` says why). ``state`` is the device as the window
        ended (``gpu_mhz``, ``temp_c``, ``throttle`` where the backend reads them): under load, so a
        window that ran at a lower clock than another says so."""
        self._stop.set()
        if self._thread:
            self._thread.join()
        last = self._read()
        samples = [*self._samples, *([last] if last is not None else [])]
        return self._energy(samples) | {"state": end_state(samples)}

    def _energy(self, samples: list[Sample]) -> dict:
        if len(samples) < 2:
            return _window(0.0, None, "none", False, self._lost, "too few valid samples (telemetry failed)")
        first, last = samples[0], samples[-1]
        seconds = last.t - first.t
        if first.energy_j is not None and last.energy_j is not None:
            energy = last.energy_j - first.energy_j
            if energy < 0:
                return _window(
                    seconds, None, "energy counter", first.partial, 0, "energy counter went backwards (reset)"
                )
            if seconds > 0 and energy / seconds > self.max_w:
                return _window(
                    seconds, None, "energy counter", first.partial, 0, f"implausible average {energy / seconds:.0f} W"
                )
            return _window(seconds, energy, "energy counter", first.partial, 0, None)
        pts = [(s.t, s.power_w) for s in samples if s.power_w is not None]
        lost = self._lost + (len(samples) - len(pts))
        if len(pts) < 2 or lost > len(samples) // 2:
            return _window(
                seconds, None, "power samples", first.partial, lost, f"{lost} of {len(samples)} samples lost"
            )
        energy = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:]))
        return _window(seconds, energy, f"power samples ({len(pts)}, trapezoid)", first.partial, 0, None)


def end_state(samples: list[Sample]) -> dict:
    """The clock, temperature and throttle reasons of the last sample that has each (empty without)."""
    state: dict = {}
    for s in reversed(samples):
        if "gpu_mhz" not in state and s.gpu_mhz is not None:
            state["gpu_mhz"] = s.gpu_mhz
        if "temp_c" not in state and s.temp_c is not None:
            state["temp_c"] = s.temp_c
    if samples:
        state["throttle"] = list(samples[-1].throttle)
    return state


def _window(seconds, energy, method, partial, lost, invalid) -> dict:
    return {
        "seconds": seconds,
        "energy_j": energy,
        "avg_w": energy / seconds if energy is not None and seconds > 0 else None,
        "method": method,
        "partial": partial,
        "lost": lost,
        "invalid": invalid,
    }
