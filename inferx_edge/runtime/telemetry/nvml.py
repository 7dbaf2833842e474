"""NVML (datacenter GPUs): energy counter, power, clocks, temperature, utilization, throttle reasons.

Read-only. ``nvmlDeviceGetTotalEnergyConsumption`` is the energy source (mJ; on datacenter GPUs it updates about every 100 ms); ``nvmlDeviceGetPowerUsage`` is a ~1 s average, reported for reference only.
"""

from __future__ import annotations

import time

from inferx_edge.runtime.telemetry.base import Sample, TelemetryError

_THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "app_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}


class NVMLBackend:
    name = "nvml"

    def __init__(self, index: int = 0) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise TelemetryError("NVML backend needs nvidia-ml-py (pip install 'inferx_edge[nvml]')") from exc
        try:
            pynvml.nvmlInit()
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.device = pynvml.nvmlDeviceGetName(self.handle)
            self.driver = pynvml.nvmlSystemGetDriverVersion()
            self.power_limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1000
            self.max_sm_mhz = pynvml.nvmlDeviceGetMaxClockInfo(self.handle, pynvml.NVML_CLOCK_SM)
        except pynvml.NVMLError as exc:
            raise TelemetryError(f"NVML unavailable: {exc}") from exc
        self.nvml = pynvml

    def read(self) -> Sample:
        n, h = self.nvml, self.handle
        try:
            energy = n.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0
            power = n.nvmlDeviceGetPowerUsage(h) / 1000.0
            util = n.nvmlDeviceGetUtilizationRates(h).gpu
            mhz = n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)
            temp = n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
            reasons = n.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        except n.NVMLError as exc:
            raise TelemetryError(f"NVML read failed: {exc}") from exc
        throttle = tuple(v for bit, v in _THROTTLE_BITS.items() if reasons & bit)
        return Sample(time.time(), power, energy, False, float(util), float(mhz), float(temp), {}, throttle)

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass
