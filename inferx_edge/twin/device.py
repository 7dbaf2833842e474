"""A twin board that speaks the device's interfaces: a sysfs tree, ``/etc/nvpmodel.conf`` and an
``nvpmodel`` command in a directory, kept up to date as *simulated* time runs.

    twin = TwinDevice(get_board("jetson-agx-orin-64gb"), root)   # materialises root/
    JetsonSysfsBackend(root, clock=twin.clock)                   # the unmodified reader
    set_power_mode(1, allowed=True, nvpmodel=twin.nvpmodel, root=root)   # the unmodified control path
    twin.advance(0.5, gpu_util=0.8)                              # simulated seconds, no sleeping

The tree holds what inferx_edge reads on a Jetson: INA3221 hwmon rails (``in*_label``, ``in*_input``
mV, ``curr*_input`` mA) [dt], the GPU's devfreq (``cur_freq``, ``max_freq``, ``available_frequencies``,
Hz) and ``load`` (per mille), the EMC cap (JetPack 6 path ``sys/kernel/nvpmodel_clk_cap/emc``), CPU
``online`` and ``cpufreq/scaling_max_freq``. The ``nvpmodel`` script answers ``-q`` from the twin's
state and records ``-m ID`` as a request; the twin applies a request when time next advances, its
clocks taking effect after the published actuation delays (GPU 5 ms, EMC 8 ms, CPU 1 ms) and the
core hot-plug (*assumption* 20 ms per core; inference runs on at the old clocks meanwhile).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from inferx_edge.twin.boards import CPU_DELAY_S, EMC_DELAY_S, GPU_DELAY_S, HOTPLUG_S_PER_CPU, Board, PowerMode
from inferx_edge.twin.power import PowerBreakdown, module_power, rail_split

INA_DIR = "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
DEVFREQ_DIR = "sys/class/devfreq/17000000.gpu"
GPU_LOAD = "sys/devices/platform/17000000.gpu/load"
EMC_CAP = "sys/kernel/nvpmodel_clk_cap/emc"
RAIL_MV = {"VDD_IN": 5000, "VIN_SYS_5V0": 5000, "VDD_GPU_SOC": 5000, "VDD_CPU_CV": 5000}  # bus voltages [dt: 5 V input]


class SimClock:
    """Simulated seconds since the twin started (a time source for backends; never sleeps)."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


@dataclass
class _Pending:
    mode: PowerMode
    effective_at: float


_NVPMODEL_SCRIPT = """#!{python}
# nvpmodel of an inferx_edge twin: -q answers from the twin's state, -m ID records a request
import json, sys
state_path = {state!r}
with open(state_path) as f:
    state = json.load(f)
args = sys.argv[1:]
if args[:1] == ["-q"]:
    print("NV Power Mode: " + state["mode_name"])
    print(state["mode_id"])
    sys.exit(0)
if args[:1] == ["-m"] and len(args) >= 2:
    ids = [m["id"] for m in state["modes"]]
    try:
        want = int(args[1])
    except ValueError:
        want = None
    if want not in ids:
        print("NVPM ERROR: invalid mode " + args[1], file=sys.stderr)
        sys.exit(1)
    with open(state_path.replace("state.json", "requests.jsonl"), "a") as f:
        f.write(json.dumps({{"mode_id": want}}) + "\\n")
    sys.exit(0)
print("usage: nvpmodel -q | -m ID", file=sys.stderr)
sys.exit(2)
"""


class TwinDevice:
    """One simulated board under ``root`` (see the module docstring)."""

    def __init__(
        self,
        board: Board,
        root: str | os.PathLike,
        mode_id: int | None = None,
        clock: SimClock | None = None,
        publish: bool = True,
    ):
        """``publish``: keep the tree up to date as time advances (off for runs nobody reads)."""
        self.board = board
        self.publish = publish
        self._written: dict[str, str] = {}
        self.root = Path(root)
        self.clock = clock or SimClock()
        self.mode = board.mode(board.default_mode if mode_id is None else mode_id)
        self.pending: _Pending | None = None
        self.switches: list[dict] = []  # every applied mode switch (time requested, effective, from, to)
        self.energy_j = 0.0
        self.last_power = module_power(board, self.mode, 0, 0, 0)
        self._materialise()

    # -- the tree ---------------------------------------------------------------------------------
    @property
    def nvpmodel(self) -> str:
        return str(self.root / "usr/sbin/nvpmodel")

    def _write(self, rel: str, value) -> None:
        text = f"{value}\n"
        if self._written.get(rel) == text:
            return
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)  # readers never see a half-written value
        self._written[rel] = text

    def _materialise(self) -> None:
        b = self.board
        (self.root / "etc").mkdir(parents=True, exist_ok=True)
        (self.root / "etc/nvpmodel.conf").write_text(b.nvpmodel_conf())
        for i, label in enumerate(b.rails, start=1):
            self._write(f"{INA_DIR}/in{i}_label", label)
        self._write(f"{INA_DIR}/name", "ina3221")
        self._write(f"{DEVFREQ_DIR}/name", "17000000.gpu")
        self._write(f"{DEVFREQ_DIR}/available_frequencies", " ".join(str(int(f * 1e6)) for f in b.gpu_ladder_mhz))
        self._write(f"{DEVFREQ_DIR}/min_freq", int(b.gpu_ladder_mhz[0] * 1e6))
        self._write(f"{DEVFREQ_DIR}/governor", "nvhost_podgov")
        script = self.root / "usr/sbin/nvpmodel"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(
            _NVPMODEL_SCRIPT.format(python=sys.executable, state=str(self.root / "run/nvpmodel/state.json"))
        )
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        (self.root / "run/nvpmodel").mkdir(parents=True, exist_ok=True)
        self._publish(0.0, module_power(b, self.mode, 0, 0, 0))

    def _publish(self, gpu_util: float, power: PowerBreakdown) -> None:
        b, c = self.board, self.board.clocks(self.mode)
        for i, label in enumerate(b.rails, start=1):
            watts = rail_split(b, power)[label]
            mv = RAIL_MV.get(label, 5000)
            self._write(f"{INA_DIR}/in{i}_input", mv)
            self._write(f"{INA_DIR}/curr{i}_input", int(round(watts * 1e6 / mv)))  # mA
        self._write(f"{DEVFREQ_DIR}/cur_freq", int(c["gpu_mhz"] * 1e6))
        self._write(f"{DEVFREQ_DIR}/max_freq", int(c["gpu_mhz"] * 1e6))
        self._write(GPU_LOAD, int(round(min(max(gpu_util, 0.0), 1.0) * 1000)))
        self._write(EMC_CAP, int(c["emc_mhz"] * 1e6))
        for cpu in range(b.cpus):
            base = f"sys/devices/system/cpu/cpu{cpu}"
            self._write(f"{base}/online", 1 if cpu < c["cpus"] else 0)
            self._write(f"{base}/cpufreq/scaling_max_freq", int(c["cpu_mhz"] * 1000))
        state = {
            "mode_id": self.mode.id,
            "mode_name": self.mode.name,
            "modes": [{"id": m.id, "name": m.name} for m in b.modes],
        }
        self._write("run/nvpmodel/state.json", json.dumps(state))

    # -- time -------------------------------------------------------------------------------------
    def switch_delay(self, old: PowerMode, new: PowerMode) -> float:
        """Seconds from ``nvpmodel -m`` until the new mode's clocks hold: the slowest clock's actuation
        delay plus the core hot-plug."""
        delays = [CPU_DELAY_S]
        if (old.gpu_max_mhz, old.tpcs) != (new.gpu_max_mhz, new.tpcs):
            delays.append(GPU_DELAY_S)
        if old.emc_max_mhz != new.emc_max_mhz:
            delays.append(EMC_DELAY_S)
        return max(delays) + HOTPLUG_S_PER_CPU * abs(old.cpus - new.cpus)

    def next_switch(self) -> float | None:
        """When the requested mode change takes effect (simulated s), None when none is pending."""
        self._take_requests()
        return self.pending.effective_at if self.pending else None

    def _take_requests(self) -> None:
        path = self.root / "run/nvpmodel/requests.jsonl"
        if not path.exists():
            return
        lines = path.read_text().splitlines()
        path.unlink()
        for line in lines:
            want = self.board.mode(json.loads(line)["mode_id"])
            base = self.pending.mode if self.pending else self.mode
            if want.id == base.id:
                continue
            self.pending = _Pending(want, self.clock.t + self.switch_delay(self.mode, want))
            self.switches.append(
                {
                    "requested_s": self.clock.t,
                    "effective_s": self.pending.effective_at,
                    "from": self.mode.name,
                    "to": want.name,
                }
            )

    def request_mode(self, mode_id: int) -> None:
        """What ``nvpmodel -m`` does (for callers that do not go through the command)."""
        path = self.root / "run/nvpmodel/requests.jsonl"
        with open(path, "a") as f:
            f.write(json.dumps({"mode_id": self.board.mode(mode_id).id}) + "\n")

    def advance(
        self, seconds: float, gpu_util: float = 0.0, cpu_util: float = 0.05, mem_util: float | None = None
    ) -> float:
        """Run ``seconds`` of simulated time at these utilisations; returns the energy used (J). A pending
        mode switch takes effect at its time within the interval."""
        self._take_requests()
        mem_util = gpu_util * 0.5 if mem_util is None else mem_util
        t_end = self.clock.t + seconds
        parts = [0.0, 0.0, 0.0, 0.0]  # joules: idle, gpu, cpu, memory
        while True:
            if self.pending and self.pending.effective_at <= self.clock.t:
                self.mode, self.pending = self.pending.mode, None
            stop = t_end
            if self.pending and self.pending.effective_at < t_end:
                stop = self.pending.effective_at
            p = module_power(self.board, self.mode, gpu_util, cpu_util, mem_util)
            dt = stop - self.clock.t
            for i, w in enumerate((p.idle_w, p.gpu_w, p.cpu_w, p.mem_w)):
                parts[i] += w * dt
            self.clock.t = stop
            if stop >= t_end:
                break
        if self.pending and self.pending.effective_at <= self.clock.t:
            self.mode, self.pending = self.pending.mode, None
        energy = sum(parts)
        self.energy_j += energy
        if seconds > 0:  # the rails show the interval's average (INA3221 averages its samples)
            self.last_power = PowerBreakdown(*(j / seconds for j in parts))
        if self.publish:
            self._publish(gpu_util, self.last_power)
        return energy
