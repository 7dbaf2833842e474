"""Jetson Orin telemetry from sysfs (INA3221 power monitors, GPU load and devfreq) and power modes
from ``/etc/nvpmodel.conf`` / ``nvpmodel -q``.

Rails: Orin NX and Nano expose the module input rail ``VDD_IN``, which is the total. AGX Orin has no
module-input rail: the total is the sum of its channels and is marked ``partial``. Every path is read
under ``root`` so tests can point it at a fake tree. Power-mode IDs and names are parsed from the
device's files, never assumed: carrier boards and JetPack releases renumber them.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from inferx_edge.runtime.telemetry.base import Sample, TelemetryError

INA_GLOB = "sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*/in*_label"
#: the GPU load file (per mille): JetPack 6 (bus@0), JetPack 5 (17000000.ga10b / .gpu), older layouts
GPU_LOAD_GLOBS = (
    "sys/devices/platform/bus@0/*.gpu/load",
    "sys/devices/platform/*.gpu/load",
    "sys/devices/17000000.ga10b/load",
    "sys/devices/17000000.gpu/load",
    "sys/devices/platform/17000000.ga10b/load",
    "sys/devices/gpu.0/load",
)
DEVFREQ_GLOB = "sys/class/devfreq/*"


@dataclass(frozen=True)
class Rail:
    label: str
    current: Path  # mA
    voltage: Path  # mV


def find_rails(root: Path) -> list[Rail]:
    rails = []
    for label_file in sorted(glob.glob(str(root / INA_GLOB))):
        label = Path(label_file).read_text().strip()
        n = re.search(r"in(\d+)_label$", label_file).group(1)
        d = Path(label_file).parent
        if label.upper() == "NC" or not (d / f"curr{n}_input").exists():
            continue
        rails.append(Rail(label, d / f"curr{n}_input", d / f"in{n}_input"))
    return rails


class JetsonSysfsBackend:
    name = "jetson-sysfs"

    def __init__(self, root: str | os.PathLike = "/", clock=time.time) -> None:
        self.root = Path(root)
        self.clock = clock  # the time stamp source (a twin passes its simulated clock)
        self.rails = find_rails(self.root)
        if not self.rails:
            raise TelemetryError(f"no INA3221 power rails under {self.root / 'sys/bus/i2c/drivers/ina3221'}")
        self.partial = not any(r.label == "VDD_IN" for r in self.rails)
        self.gpu_load = next((Path(p) for g in GPU_LOAD_GLOBS for p in glob.glob(str(self.root / g))), None)
        self.gpu_freq = None
        for d in glob.glob(str(self.root / DEVFREQ_GLOB)):
            name = (Path(d) / "name").read_text().strip() if (Path(d) / "name").exists() else Path(d).name
            if "gpu" in name or "ga10b" in name or "gpu" in Path(d).name or "ga10b" in Path(d).name:
                self.gpu_freq = Path(d) / "cur_freq"
                break

    def read(self) -> Sample:
        rails = {}
        try:
            for r in self.rails:
                rails[r.label] = int(r.current.read_text()) * int(r.voltage.read_text()) / 1e6  # mA*mV -> W
        except (OSError, ValueError) as exc:
            raise TelemetryError(f"reading INA3221 rails failed: {exc}") from exc
        total = rails["VDD_IN"] if "VDD_IN" in rails else sum(rails.values())
        load = _read_number(self.gpu_load)
        freq = _read_number(self.gpu_freq)
        return Sample(
            self.clock(),
            total,
            None,
            self.partial,
            load / 10 if load is not None else None,
            freq / 1e6 if freq is not None else None,
            None,
            rails,
        )

    def close(self) -> None:
        pass


def _read_number(path: Path | None) -> float | None:
    if path is None:
        return None
    try:
        return float(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class PowerModeInfo:
    id: int
    name: str


def parse_nvpmodel_conf(text: str) -> tuple[list[PowerModeInfo], int | None]:
    """Modes (``< POWER_MODEL ID=n NAME=x >``) and the default (``< PM_CONFIG DEFAULT=n >``)."""
    modes = [
        PowerModeInfo(int(m.group(1)), m.group(2))
        for m in re.finditer(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)\s*>", text)
    ]
    default = re.search(r"<\s*PM_CONFIG\s+DEFAULT=(\d+)\s*>", text)
    return modes, int(default.group(1)) if default else None


def power_modes(root: str | os.PathLike = "/") -> tuple[list[PowerModeInfo], int | None]:
    path = Path(root) / "etc/nvpmodel.conf"
    if not path.exists():
        return [], None
    return parse_nvpmodel_conf(path.read_text())


def current_power_mode(nvpmodel: str | None = None) -> PowerModeInfo | None:
    """``nvpmodel -q``: 'NV Power Mode: MAXN' then the ID on its own line. None without nvpmodel."""
    exe = nvpmodel or shutil.which("nvpmodel")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "-q"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    name = re.search(r"NV Power Mode:\s*(\S+)", out)
    ids = re.findall(r"^\s*(\d+)\s*$", out, re.M)
    if not name or not ids:
        return None
    return PowerModeInfo(int(ids[-1]), name.group(1))
