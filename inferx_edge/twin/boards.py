"""Jetson Orin boards as the twin models them: power modes, clocks, SMs, memory bandwidth, INA3221 rails.

Every figure names its source. ``[nvpmodel]``: NVIDIA's nvpmodel .conf files for each module
(``nvpmodel_p3701_0000.conf`` AGX Orin 64 GB, ``_p3701_0004`` AGX Orin 32 GB, ``_p3767_0000`` Orin NX
16 GB, ``_p3767_0003`` Orin Nano 8 GB; as shipped in LineageOS/android_device_nvidia_concord). ``[dq]``:
deviceQuery on AGX Orin 64 GB (16 SMs, 1300 MHz; mistral.rs issue 867). ``[ds]``: NVIDIA module data
sheets (memory bandwidth, GPU maxima), marked *assumption* where the collected sources do not carry
the figure. ``[dt]``: INA3221 channels in the upstream device trees (tegra234-p3701.dtsi,
tegra234-p3767.dtsi). ``[kang]``: clock actuation delays 1 / 5 / 8 ms for CPU / GPU / EMC (Kang 2026,
arXiv 2606.16106). The collected figures are in ``docs/twin.md``.

Names are the target registry's (``python -m inferx_edge targets``); mode IDs and names are the
nvpmodel tables', so the twin's ``/etc/nvpmodel.conf`` is parsed by the same code as a device's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from inferx_edge.errors import check_choice

#: every TPC of the GA10B GPU holds 2 SMs [dq: 8 TPC = 16 SM on AGX Orin 64 GB]
SMS_PER_TPC = 2
#: clock actuation delays after a request, seconds [kang]
CPU_DELAY_S, GPU_DELAY_S, EMC_DELAY_S = 0.001, 0.005, 0.008
#: nvpmodel also hot-plugs CPU cores. No source gives the switch's cost; *assumption*: 20 ms per core
#: brought on- or offline, during which inference keeps running at the old clocks.
HOTPLUG_S_PER_CPU = 0.020


@dataclass(frozen=True)
class PowerMode:
    """One nvpmodel mode. ``None`` caps are "uncapped" (the hardware maximum) [nvpmodel: -1 / 0]."""

    id: int
    name: str
    cpus: int
    cpu_max_mhz: float | None
    gpu_max_mhz: float | None
    tpcs: int
    emc_max_mhz: float | None


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    cpus: int
    cpu_mhz: float  # hardware maximum
    tpcs: int
    gpu_mhz: float  # hardware maximum
    emc_mhz: float  # hardware maximum
    mem_gbps: float  # DRAM bandwidth at emc_mhz
    modes: tuple[PowerMode, ...]
    default_mode: int
    rails: tuple[str, ...]  # INA3221 channel labels [dt]
    total_rail: str | None  # the module-input rail, when the board has one
    #: module power at idle in the default mode, W (calibration anchor; see twin.power)
    idle_w: float
    gpu_ladder_mhz: tuple[float, ...] = field(default=())

    @property
    def sms(self) -> int:
        return self.tpcs * SMS_PER_TPC

    def mode(self, mode_id: int) -> PowerMode:
        for m in self.modes:
            if m.id == mode_id:
                return m
        check_choice("power mode", str(mode_id), [str(m.id) for m in self.modes])
        raise AssertionError  # unreachable: check_choice raised

    def clocks(self, mode: PowerMode) -> dict:
        """The clocks and units a mode runs with under load (devfreq goes to the cap)."""
        return {
            "cpus": mode.cpus,
            "cpu_mhz": mode.cpu_max_mhz or self.cpu_mhz,
            "gpu_mhz": mode.gpu_max_mhz or self.gpu_mhz,
            "sms": mode.tpcs * SMS_PER_TPC,
            "emc_mhz": mode.emc_max_mhz or self.emc_mhz,
        }

    def mem_gbps_at(self, emc_mhz: float) -> float:
        """DRAM bandwidth scales with the EMC clock."""
        return self.mem_gbps * emc_mhz / self.emc_mhz

    def nvpmodel_conf(self) -> str:
        """An ``/etc/nvpmodel.conf`` in NVIDIA's format (the parts inferx_edge and nvpmodel -q read)."""
        lines = [f"# {self.description}: twin of inferx_edge (inferx_edge.twin.boards)"]
        for m in self.modes:
            lines += [
                f"< POWER_MODEL ID={m.id} NAME={m.name} >",
                f"CPU_ONLINE CORE_COUNT {m.cpus}",
                f"CPU_A78_0 MAX_FREQ {int((m.cpu_max_mhz or -0.001) * 1000)}",
                "GPU_POWER_CONTROL_ENABLE GPU_PWR_CNTL_EN on",
                f"GPU MAX_FREQ {int((m.gpu_max_mhz or -0.000001) * 1e6)}",
                f"GPU_TPC TPC_COUNT {m.tpcs}",
                f"EMC MAX_FREQ {int((m.emc_max_mhz or 0) * 1e6)}",
            ]
        lines.append(f"< PM_CONFIG DEFAULT={self.default_mode} >")
        return "\n".join(lines) + "\n"


def _ladder(top: float, step: float = 102.0) -> tuple[float, ...]:
    """GPU devfreq steps of ~102 MHz up to the maximum [ORIN-FACTS 3.1: "114.75...1300.5 MHz in ~102 MHz
    steps"; the exact table is per board, *assumption*: multiples of 102 MHz plus the maximum]."""
    steps = []
    f = step
    while f < top:
        steps.append(round(f, 2))
        f += step
    return tuple(steps + [top])


_AGX_RAILS = ("VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0")  # [dt] p3701: no VDD_IN rail
_NX_RAILS = ("VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC")  # [dt] p3767

BOARDS: dict[str, Board] = {
    b.name: b
    for b in (
        Board(
            name="jetson-agx-orin-64gb",
            description="Jetson AGX Orin 64GB (p3701-0000)",
            cpus=12,
            cpu_mhz=2201.6,  # [ORIN-FACTS 3.1: CPU up to 2201.6 MHz]
            tpcs=8,  # [nvpmodel: 2048 cores = 8 TPC; dq 16 SMs]
            gpu_mhz=1300.5,  # [dq 1300 MHz; sweeps top step 1300.5]
            emc_mhz=3199.0,  # [nvpmodel sweeps: EMC {204, 665.6, 2133, 3199}]
            mem_gbps=204.8,  # [ds] 256-bit LPDDR5 at 6400 MT/s
            modes=(  # [nvpmodel_p3701_0000.conf, default 2]
                PowerMode(0, "MAXN", 12, None, None, 8, None),
                PowerMode(1, "MODE_15W", 4, 1113.6, 408.0, 3, 2133.0),
                PowerMode(2, "MODE_30W", 8, 1728.0, 612.0, 4, None),
                PowerMode(3, "MODE_50W", 12, 1497.6, 816.0, 8, None),
            ),
            default_mode=2,
            rails=_AGX_RAILS,
            total_rail=None,
            idle_w=6.5,  # [MLPerf v3.0 Orin MaxQ spl.txt: idle before the run ~6.5-8 W wall]
            gpu_ladder_mhz=_ladder(1300.5),
        ),
        Board(
            name="jetson-agx-orin-32gb",
            description="Jetson AGX Orin 32GB (p3701-0004)",
            cpus=8,
            cpu_mhz=2201.6,
            tpcs=7,  # [nvpmodel: 1792 cores = 7 TPC]
            gpu_mhz=930.75,  # [ds] *assumption*: the 32 GB module's GPU maximum, 930 MHz
            emc_mhz=3199.0,
            mem_gbps=204.8,  # [ds]
            modes=(  # [nvpmodel_p3701_0004.conf, default 2]
                PowerMode(0, "MAXN", 8, None, None, 7, None),
                PowerMode(1, "MODE_15W", 4, 1113.6, 408.0, 3, 2133.0),
                PowerMode(2, "MODE_30W", 8, 1728.0, 612.0, 4, None),
                PowerMode(3, "MODE_40W", 8, 1497.6, 816.0, 7, None),
            ),
            default_mode=2,
            rails=_AGX_RAILS,
            total_rail=None,
            idle_w=6.0,  # *assumption*: the 64 GB idle less 4 cores and one TPC
            gpu_ladder_mhz=_ladder(930.75),
        ),
        Board(
            name="jetson-orin-nx-16gb",
            description="Jetson Orin NX 16GB (p3767-0000)",
            cpus=8,
            cpu_mhz=1984.0,  # [ds] *assumption*: Orin NX CPU maximum 2.0 GHz
            tpcs=4,  # [nvpmodel: 1024 cores = 4 TPC]
            gpu_mhz=918.0,  # [ds] *assumption*: Orin NX 16 GB GPU maximum 918 MHz
            emc_mhz=3199.0,
            mem_gbps=102.4,  # [ds] 128-bit LPDDR5
            modes=(  # [nvpmodel_p3767_0000.conf, default 2]
                PowerMode(0, "MAXN", 8, None, None, 4, None),
                PowerMode(1, "10W", 4, 1190.4, 612.0, 2, 2133.0),
                PowerMode(2, "15W", 4, 1651.2, 612.0, 2, None),
                PowerMode(3, "25W", 8, 1497.6, 408.0, 4, None),
            ),
            default_mode=2,
            rails=_NX_RAILS,
            total_rail="VDD_IN",
            idle_w=4.5,  # *assumption*: between the Nano's and the AGX's
            gpu_ladder_mhz=_ladder(918.0),
        ),
        Board(
            name="jetson-orin-nano-8gb",
            description="Jetson Orin Nano 8GB (p3767-0003)",
            cpus=6,
            cpu_mhz=1510.4,  # [ds] Orin Nano CPU maximum 1.5 GHz
            tpcs=4,  # [nvpmodel: 1024 cores = 4 TPC]
            gpu_mhz=625.0,  # [ds: Orin Nano datasheet, max GPU 625 MHz]
            emc_mhz=2133.0,  # [ds] LPDDR5 at 4266 MT/s
            mem_gbps=68.0,  # [ORIN-FACTS 3.1: 68 GB/s (102 GB/s "super")]
            modes=(  # [nvpmodel_p3767_0003.conf, default 0]
                PowerMode(0, "15W", 6, None, None, 4, None),
                PowerMode(1, "7W", 4, 960.0, 408.0, 2, 2133.0),
            ),
            default_mode=0,
            rails=_NX_RAILS,
            total_rail="VDD_IN",
            idle_w=4.0,  # *assumption*: Orin Nano Super idle 5.2 W at the wall (picocluster), less the PSU
            gpu_ladder_mhz=_ladder(625.0),
        ),
    )
}

#: target registry aliases the twin accepts
ALIASES = {"jetson-orin": "jetson-agx-orin-64gb", "agx-orin": "jetson-agx-orin-64gb"}


def get_board(name: str) -> Board:
    name = ALIASES.get(name, name)
    check_choice("twin board", name, sorted(BOARDS))
    return BOARDS[name]
