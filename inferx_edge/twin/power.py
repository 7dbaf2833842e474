"""Module power of a twin board: idle + GPU rail + CPU rail + memory, calibrated on published figures.

    P = P_idle + u_gpu * k_gpu * SMs * f_gpu * V(f_gpu)^2 + u_cpu * k_cpu * cores * f_cpu * V_cpu(f_cpu)^2
        + u_mem * k_emc * f_emc

``u`` are utilisations in [0, 1]. The dynamic terms are CMOS ``C V^2 f`` with per-unit capacitance
constants fitted by least squares to the published rail powers under stress of an AGX Orin (VDD_GPU_SOC
5.2 / 7.6 / 18.4 / 40.4 W and VDD_CPU_CV 1.6 / 5.6 / 6.0 / 15.2 W in 15W / 30W / 50W / MAXN; NVIDIA
forum thread 323456, AGX Orin 32 GB), after the rail's idle share is taken off. The same constants serve
every Orin module (one GA10B GPU and A78AE CPU design). Voltage-frequency curves are not published:
*assumption* linear curves reaching 1.0 V at the top step, V = 0.45 + 0.55 f/f_max (GPU) and
0.30 + 0.70 f/f_max (CPU), their intercepts chosen by the same fit (a grid over 0.3-0.6 V; the CPU
anchors are not consistent with any monotonic curve: 30W, at a higher clock than 50W, draws less). ``k_emc`` is *assumption*: 1.5 W at full memory traffic at 3199 MHz. :func:`calibration_report`
prints every anchor with the model's error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inferx_edge.twin.boards import Board, PowerMode

#: GPU stress on VDD_GPU_SOC, W, per mode as (TPCs, GPU MHz): AGX Orin 32 GB, forum 323456. The modes are
#: named 15W / 30W / 50W / MAXN there; their settings are taken from the p3701 tables (15W 3 TPC @ 408,
#: 30W 4 @ 612, 50W 8 @ 816 — the 32 GB has 7 TPCs, so 7 — and MAXN 7 @ 1300 MHz, *assumption*: the
#: ratio 40.4 / 18.4 W needs ~1.3 GHz)
GPU_ANCHORS = ((3, 408.0, 5.2), (4, 612.0, 7.6), (7, 816.0, 18.4), (7, 1300.5, 40.4))
#: CPU stress on VDD_CPU_CV, W, as (online cores, CPU MHz), same source and modes
CPU_ANCHORS = ((4, 1113.6, 1.6), (8, 1728.0, 5.6), (8, 1497.6, 6.0), (8, 2201.6, 15.2))
#: idle share of the rails in the anchors, W (*assumption*: the SOC part of VDD_GPU_SOC ~3 W, the CV
#: part of VDD_CPU_CV ~0.3 W at idle); the fit explains only what is above
GPU_RAIL_IDLE_W, CPU_RAIL_IDLE_W = 3.0, 0.3
GPU_F_MAX, CPU_F_MAX = 1300.5, 2201.6
K_EMC_W_PER_MHZ = 1.5 / 3199.0


def v_gpu(f_mhz: float) -> float:
    return 0.45 + 0.55 * f_mhz / GPU_F_MAX


def v_cpu(f_mhz: float) -> float:
    return 0.30 + 0.70 * f_mhz / CPU_F_MAX


def _fit(anchors, units_scale, v, idle) -> tuple[float, list[tuple]]:
    x = np.array([u * units_scale * f * v(f) ** 2 for u, f, _ in anchors])
    y = np.array([w - idle for *_, w in anchors])
    k = float(x @ y / (x @ x))
    rows = [(u, f, w, idle + k * xi) for (u, f, w), xi in zip(anchors, x)]
    return k, rows


#: fitted constants (W per SM per MHz per V^2; W per core per MHz per V^2)
K_GPU, _GPU_ROWS = _fit(GPU_ANCHORS, 2, v_gpu, GPU_RAIL_IDLE_W)  # anchors in TPCs: 2 SMs each
K_CPU, _CPU_ROWS = _fit(CPU_ANCHORS, 1, v_cpu, CPU_RAIL_IDLE_W)


@dataclass(frozen=True)
class PowerBreakdown:
    idle_w: float
    gpu_w: float
    cpu_w: float
    mem_w: float

    @property
    def total_w(self) -> float:
        return self.idle_w + self.gpu_w + self.cpu_w + self.mem_w


def module_power(board: Board, mode: PowerMode, u_gpu: float, u_cpu: float, u_mem: float) -> PowerBreakdown:
    """Module power in ``mode`` at the given utilisations (each clipped to [0, 1])."""
    c = board.clocks(mode)
    u_gpu, u_cpu, u_mem = (min(max(u, 0.0), 1.0) for u in (u_gpu, u_cpu, u_mem))
    gpu = u_gpu * K_GPU * c["sms"] * c["gpu_mhz"] * v_gpu(c["gpu_mhz"]) ** 2
    cpu = u_cpu * K_CPU * c["cpus"] * c["cpu_mhz"] * v_cpu(c["cpu_mhz"]) ** 2
    mem = u_mem * K_EMC_W_PER_MHZ * c["emc_mhz"]
    # idle changes a little with the online cores (leakage): *assumption* 0.1 W per core against the
    # default mode, where ``board.idle_w`` was taken
    idle = board.idle_w + 0.1 * (c["cpus"] - board.mode(board.default_mode).cpus)
    return PowerBreakdown(idle, gpu, cpu, mem)


def rail_split(board: Board, p: PowerBreakdown) -> dict[str, float]:
    """How module power shows up on the board's INA3221 channels [dt]: AGX Orin has no module-input
    rail (VDD_GPU_SOC carries GPU + SOC + memory controller, VDD_CPU_CV the CPU, VIN_SYS_5V0 the carrier's
    5 V: *assumption* 40 % of idle); Orin NX / Nano report VDD_IN (everything) with two sub-rails."""
    if board.total_rail is None:
        sys5v = 0.4 * p.idle_w
        cpu_idle = 0.15 * p.idle_w
        return {
            "VDD_GPU_SOC": p.idle_w - sys5v - cpu_idle + p.gpu_w + p.mem_w,
            "VDD_CPU_CV": cpu_idle + p.cpu_w,
            "VIN_SYS_5V0": sys5v,
        }
    return {
        "VDD_IN": p.total_w,
        "VDD_CPU_GPU_CV": 0.3 * p.idle_w + p.gpu_w + p.cpu_w,
        "VDD_SOC": 0.35 * p.idle_w + p.mem_w,
    }


def calibration_report() -> list[str]:
    """Every published anchor next to the model's value, with the relative error."""
    lines = [f"GPU rail fit: k_gpu = {K_GPU:.3e} W/(SM MHz V^2); anchors AGX Orin 32 GB VDD_GPU_SOC under GPU stress:"]
    for tpc, f, w, got in _GPU_ROWS:
        lines.append(f"  {tpc} TPC @ {f:7.1f} MHz: published {w:5.1f} W, model {got:5.1f} W ({(got - w) / w:+.0%})")
    lines.append(f"CPU rail fit: k_cpu = {K_CPU:.3e} W/(core MHz V^2); anchors VDD_CPU_CV under CPU stress:")
    for n, f, w, got in _CPU_ROWS:
        lines.append(f"  {n} cores @ {f:7.1f} MHz: published {w:5.1f} W, model {got:5.1f} W ({(got - w) / w:+.0%})")
    return lines


def calibration_errors() -> dict[str, list[float]]:
    return {
        "gpu_rail": [(got - w) / w for *_, w, got in _GPU_ROWS],
        "cpu_rail": [(got - w) / w for *_, w, got in _CPU_ROWS],
    }
