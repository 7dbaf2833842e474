"""Telemetry samples, the backend interface, probing, and energy over a window."""

from __future__ import annotations

import threading
import time
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


class EnergyMeter:
    """Energy over a window: the hardware counter's delta when there is one, else power integrated over
    samples taken by a background thread every ``interval_s`` (trapezoid rule)."""

    def __init__(self, backend: TelemetryBackend, interval_s: float = 0.05) -> None:
        self.backend = backend
        self.interval_s = interval_s
        self._samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._samples = [self.backend.read()]
        self._stop.clear()
        if self._samples[0].energy_j is None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._samples.append(self.backend.read())
            except TelemetryError:
                self._samples.append(Sample(time.time(), None))

    def stop(self) -> dict:
        """``{"seconds", "energy_j", "avg_w", "method", "partial", "lost"}``; energy None when telemetry failed."""
        self._stop.set()
        if self._thread:
            self._thread.join()
        last = self.backend.read()
        first = self._samples[0]
        seconds = last.t - first.t
        samples = [*self._samples, last]
        if first.energy_j is not None and last.energy_j is not None:
            energy, method = last.energy_j - first.energy_j, "energy counter"
        else:
            pts = [(s.t, s.power_w) for s in samples if s.power_w is not None]
            lost = len(samples) - len(pts)
            if len(pts) < 2 or lost > len(samples) // 2:
                return {
                    "seconds": seconds,
                    "energy_j": None,
                    "avg_w": None,
                    "method": "power samples",
                    "partial": first.partial,
                    "lost": lost,
                }
            energy = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:]))
            method = f"power samples ({len(pts)}, trapezoid)"
        return {
            "seconds": seconds,
            "energy_j": energy,
            "avg_w": energy / seconds if seconds > 0 else None,
            "method": method,
            "partial": first.partial,
            "lost": 0,
        }
