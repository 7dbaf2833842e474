"""jetson-stats (jtop) as a telemetry backend.

jetson-stats is AGPL-3.0 and importing it switches multiprocessing to the fork start method, so it is
imported here, lazily, only when this backend is chosen, and never by anything else in inferx_edge.
"""

from __future__ import annotations

import time

from inferx_edge.runtime.telemetry.base import Sample, TelemetryError


class JtopBackend:
    name = "jtop"

    def __init__(self) -> None:
        try:
            from jtop import jtop  # noqa: PLC0415  (lazy by design, see module docstring)
        except ImportError as exc:
            raise TelemetryError("jtop backend needs jetson-stats (pip install 'inferx_edge[jetson]')") from exc
        self._jtop = jtop()
        self._jtop.start()
        if not self._jtop.ok():
            raise TelemetryError("jtop service is not running (systemctl status jtop.service)")

    def read(self) -> Sample:
        power = self._jtop.power or {}
        tot = power.get("tot", {})
        rails = {k: v.get("power", 0) / 1000 for k, v in power.get("rail", {}).items()}
        gpu = (self._jtop.gpu or {}).get("gpu", {}).get("status", {})
        return Sample(
            time.time(),
            tot.get("power", 0) / 1000 if tot else None,
            None,
            "VDD_IN" not in rails,
            gpu.get("load"),
            None,
            None,
            rails,
        )

    def close(self) -> None:
        self._jtop.close()
