"""Picking the telemetry backend this device has."""

from __future__ import annotations

from inferx_edge.runtime.telemetry.base import TelemetryBackend, TelemetryError


def probe(prefer: str | None = None, **kwargs) -> TelemetryBackend | None:
    """Open the first backend that works here (NVML, then Jetson sysfs, then jtop, then CPU RAPL), or
    ``prefer`` only.

    Returns None when none works; callers must treat telemetry as optional.
    """
    from inferx_edge.runtime.telemetry import jetson, jtop_backend, nvml, rapl

    order = {
        "nvml": nvml.NVMLBackend,
        "jetson-sysfs": jetson.JetsonSysfsBackend,
        "jtop": jtop_backend.JtopBackend,
        "rapl": rapl.RAPLBackend,
    }
    names = [prefer] if prefer else list(order)
    for name in names:
        if name not in order:
            raise TelemetryError(f"unknown telemetry backend '{name}'; valid: {', '.join(order)}")
        try:
            return order[name](**kwargs) if name == prefer else order[name]()
        except (TelemetryError, OSError, ImportError):
            if prefer:
                raise
    return None
