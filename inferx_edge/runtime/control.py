"""Control knobs: Jetson power mode (``nvpmodel -m``) and NVML power limit. Opt-in only.

Nothing in inferx_edge calls these unless the user asked (``profile --allow-power-mode-change``).
Each needs root, refuses otherwise, and :class:`PowerModeSweep` restores the mode it found.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from inferx_edge.errors import ControlError, UsageError  # noqa: F401  (ControlError re-exported)
from inferx_edge.runtime.telemetry.jetson import current_power_mode, power_modes


def _require(allowed: bool, what: str) -> None:
    if not allowed:
        raise UsageError(f"{what} changes device settings; it is never done by default (pass the explicit opt-in flag)")
    if os.geteuid() != 0:
        raise ControlError(f"{what} needs root privileges")


def set_power_mode(mode_id: int, *, allowed: bool, nvpmodel: str | None = None, root: str = "/") -> None:
    """Switch the Jetson power mode (``nvpmodel -m ID``); the ID must exist in /etc/nvpmodel.conf."""
    _require(allowed, "changing the Jetson power mode")
    modes, _ = power_modes(root)
    if modes and mode_id not in {m.id for m in modes}:
        raise UsageError(
            f"unknown power mode {mode_id}; this device has {', '.join(f'{m.id}:{m.name}' for m in modes)}"
        )
    exe = nvpmodel or shutil.which("nvpmodel")
    if not exe:
        raise ControlError("nvpmodel not found: not a Jetson, or L4T tools missing")
    r = subprocess.run([exe, "-m", str(mode_id)], input="NO\n", capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise ControlError(f"nvpmodel -m {mode_id} failed: {(r.stderr or r.stdout).strip()[-300:]}")


class PowerModeSweep:
    """Context manager: yields a setter, restores the starting mode on exit (even on error)."""

    def __init__(self, *, allowed: bool, nvpmodel: str | None = None, root: str = "/") -> None:
        self.allowed, self.nvpmodel, self.root = allowed, nvpmodel, root

    def __enter__(self):
        _require(self.allowed, "sweeping Jetson power modes")
        self.start = current_power_mode(self.nvpmodel)
        if self.start is None:
            raise ControlError("cannot read the current power mode (nvpmodel -q)")
        return lambda mode_id: set_power_mode(mode_id, allowed=True, nvpmodel=self.nvpmodel, root=self.root)

    def __exit__(self, *exc) -> None:
        set_power_mode(self.start.id, allowed=True, nvpmodel=self.nvpmodel, root=self.root)


def set_nvml_power_limit(watts: float, *, allowed: bool, index: int = 0) -> None:
    """Set an NVIDIA GPU's power limit (NVML). Never used by default; needs root."""
    _require(allowed, "changing the GPU power limit")
    import pynvml

    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(index)
    lo, hi = pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h)
    if not lo / 1000 <= watts <= hi / 1000:
        raise UsageError(f"power limit {watts} W outside this GPU's range {lo / 1000:.0f}-{hi / 1000:.0f} W")
    pynvml.nvmlDeviceSetPowerManagementLimit(h, int(watts * 1000))
