"""CPU package energy from Linux powercap / Intel RAPL (also AMD's RAPL on Zen), read-only.

``/sys/class/powercap/intel-rapl:N/energy_uj`` is a per-package counter in microjoules that wraps at
``max_energy_range_uj``; this backend sums the packages and unwraps each, so its ``energy_j`` only
grows. The counters are root-readable on most distributions (since 2020): as another user the backend
is unavailable, and says so.
"""

from __future__ import annotations

import time
from pathlib import Path

from inferx_edge.runtime.telemetry.base import Sample, TelemetryError

POWERCAP = Path("/sys/class/powercap")


class RAPLBackend:
    name = "rapl"

    def __init__(self, root: Path = POWERCAP) -> None:
        # packages only (intel-rapl:0), not their sub-zones (intel-rapl:0:0, counted inside the package)
        self.zones = sorted(p for p in Path(root).glob("intel-rapl:*") if p.name.count(":") == 1)
        if not self.zones:
            raise TelemetryError(f"no RAPL package zones under {root} (not an x86 Linux host, or powercap off)")
        self.device = " + ".join(self._read_text(z / "name", "package") for z in self.zones)
        try:
            self._ranges = [int(self._read_text(z / "max_energy_range_uj", "0")) or 2**32 for z in self.zones]
            self._last = [self._raw(z) for z in self.zones]
        except PermissionError as exc:
            raise TelemetryError(f"RAPL counters are not readable by this user ({exc.filename}); run as root") from exc
        self._total_uj = 0

    @staticmethod
    def _read_text(path: Path, default: str) -> str:
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            return default

    @staticmethod
    def _raw(zone: Path) -> int:
        try:
            return int((zone / "energy_uj").read_text())
        except ValueError as exc:
            raise TelemetryError(f"{zone / 'energy_uj'} is not a number") from exc

    def read(self) -> Sample:
        t = time.time()
        try:
            raws = [self._raw(z) for z in self.zones]
        except OSError as exc:
            raise TelemetryError(f"RAPL read failed: {exc}") from exc
        for i, raw in enumerate(raws):
            self._total_uj += (raw - self._last[i]) % self._ranges[i]  # one wrap between reads at most
            self._last[i] = raw
        return Sample(t, None, self._total_uj / 1e6, partial=True)  # CPU packages only, not the board

    def close(self) -> None:
        pass
