"""Power and clock telemetry behind one interface: NVML, Jetson INA3221 sysfs, jtop, CPU RAPL, and replay.

Every backend is optional and probed safely (:func:`probe` returns the first that works, or None).
Read-only: nothing here changes clocks, power limits or power modes.
"""

from inferx_edge.runtime.telemetry.base import EnergyMeter, Sample, TelemetryBackend, TelemetryError
from inferx_edge.runtime.telemetry.probe import probe

__all__ = ["EnergyMeter", "Sample", "TelemetryBackend", "TelemetryError", "probe"]
