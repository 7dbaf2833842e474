"""Replay recorded telemetry (JSON lines of :class:`Sample` fields): tests, and re-running a governor
over a trace captured on a device. Each ``read()`` returns the next sample; past the end it raises,
as a backend that stopped answering would."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from inferx_edge.runtime.telemetry.base import Sample, TelemetryError


class ReplayBackend:
    name = "replay"

    def __init__(self, samples: Iterable[Sample | dict] | str | Path) -> None:
        if isinstance(samples, str | Path):
            samples = [json.loads(line) for line in Path(samples).read_text().splitlines() if line.strip()]
        self.samples = [
            s if isinstance(s, Sample) else Sample(**{**s, "throttle": tuple(s.get("throttle", ()))}) for s in samples
        ]
        self.i = 0

    def read(self) -> Sample:
        if self.i >= len(self.samples):
            raise TelemetryError("replay trace exhausted (telemetry lost)")
        s = self.samples[self.i]
        self.i += 1
        return s

    def close(self) -> None:
        pass
