"""Telemetry backends without hardware: a fake Orin sysfs tree, nvpmodel parsing, replay, energy meters."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from inferx_edge.runtime.telemetry import EnergyMeter, Sample, TelemetryError, probe
from inferx_edge.runtime.telemetry.jetson import (
    JetsonSysfsBackend,
    current_power_mode,
    parse_nvpmodel_conf,
    power_modes,
)
from inferx_edge.runtime.telemetry.replay import ReplayBackend

# Rails as JetPack 6 exposes them (labels per NVIDIA's Orin power-monitoring docs).
AGX_ORIN = {
    "1-0040": [("VDD_GPU_SOC", 1200, 5000), ("VDD_CPU_CV", 400, 5000), ("VIN_SYS_5V0", 600, 5000)],
    "1-0041": [("NC", 0, 0), ("VDDQ_VDD2_1V8AO", 300, 5000), ("NC", 0, 0)],
}
ORIN_NX = {"1-0040": [("VDD_IN", 1500, 5000), ("VDD_CPU_GPU_CV", 600, 5000), ("VDD_SOC", 300, 5000)]}

NVPMODEL_CONF = """
< POWER_MODEL ID=0 NAME=MAXN >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=1 NAME=MODE_15W >
CPU_ONLINE CORE_0 1
< POWER_MODEL ID=2 NAME=MODE_30W >
< POWER_MODEL ID=3 NAME=MODE_50W >
< PM_CONFIG DEFAULT=3 >
"""


def make_tree(root: Path, chips: dict, gpu_load: int = 420, gpu_hz: int = 918000000) -> Path:
    for chip, chans in chips.items():
        d = root / "sys/bus/i2c/drivers/ina3221" / chip / "hwmon/hwmon3"
        d.mkdir(parents=True)
        for i, (label, ma, mv) in enumerate(chans, 1):
            (d / f"in{i}_label").write_text(label + "\n")
            if label != "NC":
                (d / f"curr{i}_input").write_text(f"{ma}\n")
                (d / f"in{i}_input").write_text(f"{mv}\n")
    gpu = root / "sys/devices/platform/bus@0/17000000.gpu"
    gpu.mkdir(parents=True)
    (gpu / "load").write_text(f"{gpu_load}\n")
    dev = root / "sys/class/devfreq/17000000.gpu"
    dev.mkdir(parents=True)
    (dev / "name").write_text("17000000.gpu\n")
    (dev / "cur_freq").write_text(f"{gpu_hz}\n")
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/nvpmodel.conf").write_text(NVPMODEL_CONF)
    return root


def test_agx_orin_sums_rails_and_marks_partial(tmp_path):
    b = JetsonSysfsBackend(make_tree(tmp_path, AGX_ORIN))
    s = b.read()
    assert s.partial is True  # no module-input rail on AGX Orin
    assert set(s.rails_w) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"}  # NC skipped
    assert s.power_w == pytest.approx(6.0 + 2.0 + 3.0 + 1.5)
    assert s.gpu_util == pytest.approx(42.0) and s.gpu_mhz == pytest.approx(918.0)
    assert s.energy_j is None


def test_orin_nx_uses_vdd_in(tmp_path):
    s = JetsonSysfsBackend(make_tree(tmp_path, ORIN_NX)).read()
    assert s.partial is False and s.power_w == pytest.approx(7.5)


def test_missing_rails_and_vanishing_files(tmp_path):
    with pytest.raises(TelemetryError, match="no INA3221 power rails"):
        JetsonSysfsBackend(tmp_path)
    root = make_tree(tmp_path / "t", ORIN_NX)
    b = JetsonSysfsBackend(root)
    next(root.glob("sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon3/curr1_input")).unlink()
    with pytest.raises(TelemetryError, match="reading INA3221 rails failed"):
        b.read()


def test_nvpmodel_conf_and_query(tmp_path):
    modes, default = parse_nvpmodel_conf(NVPMODEL_CONF)
    assert [(m.id, m.name) for m in modes] == [(0, "MAXN"), (1, "MODE_15W"), (2, "MODE_30W"), (3, "MODE_50W")]
    assert default == 3
    root = make_tree(tmp_path, ORIN_NX)
    assert len(power_modes(root)[0]) == 4 and power_modes(tmp_path / "none") == ([], None)
    fake = tmp_path / "nvpmodel"
    fake.write_text("#!/bin/sh\necho 'NV Power Mode: MODE_30W'\necho 2\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    mode = current_power_mode(str(fake))
    assert (mode.id, mode.name) == (2, "MODE_30W")
    assert current_power_mode(str(tmp_path / "missing")) is None


def test_energy_meter_integrates_power_without_a_counter(tmp_path):
    b = JetsonSysfsBackend(make_tree(tmp_path, ORIN_NX))  # constant 7.5 W
    m = EnergyMeter(b, interval_s=0.01)
    m.start()
    time.sleep(0.3)
    r = m.stop()
    assert r["method"].startswith("power samples") and r["avg_w"] == pytest.approx(7.5, rel=1e-6)
    assert r["energy_j"] == pytest.approx(7.5 * r["seconds"], rel=1e-6)


def test_energy_meter_prefers_the_counter():
    meter = EnergyMeter(ReplayBackend([Sample(0.0, 100.0, 1000.0), Sample(2.0, 300.0, 1400.0)]))
    meter.start()  # reads the first sample; stop() reads the second
    out = meter.stop()
    assert out["method"] == "energy counter" and out["energy_j"] == 400.0 and out["avg_w"] == 200.0


def test_replay_exhaustion_is_telemetry_loss(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"t": 0, "power_w": 5.0}\n{"t": 1, "power_w": 6.0}\n')
    b = ReplayBackend(path)
    assert b.read().power_w == 5.0 and b.read().power_w == 6.0
    with pytest.raises(TelemetryError, match="telemetry lost"):
        b.read()


def test_probe_is_safe_without_hardware(monkeypatch):
    monkeypatch.setitem(os.environ, "PATH", os.environ.get("PATH", ""))
    backend = probe()  # no NVML GPU, no Jetson rails here: None, no exception
    assert backend is None or backend.name in ("nvml", "jetson-sysfs", "jtop")
    with pytest.raises(TelemetryError, match="unknown telemetry backend 'tpu'"):
        probe("tpu")


def test_jtop_is_imported_lazily():
    import subprocess
    import sys

    code = (
        "import sys, multiprocessing as mp; import inferx_edge.runtime.telemetry as t; "
        "from inferx_edge.runtime.telemetry import probe; probe(); "
        "print('jtop' in sys.modules, mp.get_start_method(allow_none=True))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "False"


@pytest.mark.parametrize(
    "samples,why",
    [
        ([Sample(0.0, 100.0, 1000.0), Sample(2.0, 300.0, 400.0)], "went backwards"),  # counter reset
        ([Sample(0.0, 100.0, 1000.0), Sample(2.0, 300.0, 9e9)], "implausible average"),
        ([Sample(5.0, float("nan")), Sample(4.0, 100.0)], None),  # time going backwards: dropped
    ],
)
def test_energy_meter_rejects_garbage(samples, why):
    meter = EnergyMeter(ReplayBackend(samples), interval_s=10)
    meter.start()
    out = meter.stop()
    assert out["energy_j"] is None and (why is None or why in out["invalid"])


def test_energy_meter_survives_a_backend_that_raises():
    class Broken:
        name = "broken"

        def read(self):
            raise RuntimeError("i2c bus error")

        def close(self):
            pass

    meter = EnergyMeter(Broken(), interval_s=0.01)
    meter.start()
    time.sleep(0.05)
    out = meter.stop()
    assert out["energy_j"] is None and "failed" in out["invalid"] and meter.rejected


def test_rapl_backend_on_a_fake_powercap_tree_unwraps_its_counters(tmp_path):
    from inferx_edge.runtime.telemetry.rapl import RAPLBackend

    for zone, start in (("intel-rapl:0", 999_000_000), ("intel-rapl:1", 5_000_000)):
        z = tmp_path / zone
        z.mkdir()
        (z / "name").write_text("package-0\n")
        (z / "max_energy_range_uj").write_text("1000000000\n")  # wraps at 1000 J
        (z / "energy_uj").write_text(f"{start}\n")
    (tmp_path / "intel-rapl:0:0").mkdir()  # a sub-zone (core): not counted twice
    (tmp_path / "intel-rapl:0:0" / "energy_uj").write_text("123\n")
    b = RAPLBackend(tmp_path)
    first = b.read()
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("2000000\n")  # wrapped: +3 J
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("6000000\n")  # +1 J
    second = b.read()
    assert second.energy_j - first.energy_j == pytest.approx(4.0) and second.partial
    with pytest.raises(TelemetryError, match="no RAPL package zones"):
        RAPLBackend(tmp_path / "none")


def test_jetpack5_gpu_load_path_is_read(tmp_path):
    """JetPack 5 exposes the GPU load at /sys/devices/17000000.ga10b/load (no bus@0)."""
    root = make_tree(tmp_path, ORIN_NX)
    (root / "sys/devices/platform/bus@0/17000000.gpu/load").unlink()
    jp5 = root / "sys/devices/17000000.ga10b"
    jp5.mkdir(parents=True)
    (jp5 / "load").write_text("250\n")
    assert JetsonSysfsBackend(root).read().gpu_util == pytest.approx(25.0)
