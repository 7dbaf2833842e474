"""What the twin simulates: traces (arrival rates per window), the cost of each operating point in each
power mode, and the queue that batches and serves requests (see :mod:`inferx_edge.twin.simulate`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from inferx_edge.twin.boards import Board, PowerMode
from inferx_edge.twin.latency import LatencyModel
from inferx_edge.twin.power import module_power

#: service-time jitter (lognormal sigma): the governor's profile is the mean, not the truth
JITTER = 0.03


# -- traces -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trace:
    name: str
    rates: np.ndarray  # arrivals per second, one per window
    window_s: float = 1.0

    @property
    def seconds(self) -> float:
        return len(self.rates) * self.window_s


def refine(trace: Trace, windows_per_s: int) -> Trace:
    """The same trace in shorter windows: the governor decides every window (``serve --window``)."""
    return Trace(trace.name, np.repeat(trace.rates, windows_per_s), trace.window_s / windows_per_s)


def steady(rate: float, seconds: int, name: str | None = None) -> Trace:
    return Trace(name or f"steady-{rate:.0f}", np.full(seconds, float(rate)))


def diurnal(low: float, high: float, seconds: int) -> Trace:
    """One day compressed into ``seconds``: a raised cosine from ``low`` (night) to ``high`` (afternoon)."""
    t = np.arange(seconds) / seconds
    return Trace("diurnal", low + (high - low) * 0.5 * (1 - np.cos(2 * np.pi * t)))


def bursty(on_rate: float, off_rate: float, on_s: int, off_s: int, seconds: int) -> Trace:
    """Camera traffic: motion bursts at ``on_rate`` for ``on_s`` seconds, then ``off_rate``."""
    period = on_s + off_s
    return Trace("bursty", np.array([on_rate if (i % period) < on_s else off_rate for i in range(seconds)], float))


def step(levels: list[float], each_s: int) -> Trace:
    return Trace("step", np.repeat(np.asarray(levels, float), each_s))


# -- what a point costs -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    name: str
    precision: str
    batch: int
    latency: LatencyModel


@dataclass
class ModeTable:
    """Each variant's predicted run in each mode (ms, utilisations) and the mode's power figures."""

    board: Board
    variants: list[Variant]
    runs: dict[tuple[str, int], dict] = field(default_factory=dict)  # (variant, mode id) -> LatencyModel.on

    def __post_init__(self):
        for v in self.variants:
            for m in self.board.modes:
                self.runs[(v.name, m.id)] = v.latency.on(self.board, m)

    def service_s(self, variant: str, mode: PowerMode) -> float:
        return self.runs[(variant, mode.id)]["ms"] / 1e3

    def active_w(self, variant: str, mode: PowerMode) -> float:
        r = self.runs[(variant, mode.id)]
        return module_power(self.board, mode, gpu_activity(r), _cpu_util(r), r["mem_util"]).total_w

    def idle_w(self, mode: PowerMode) -> float:
        return module_power(self.board, mode, 0, 0.02, 0).total_w

    def variant_for(self, precision: str, rows: int) -> Variant | None:
        fits = [v for v in self.variants if v.precision == precision and v.batch >= rows]
        return min(fits, key=lambda v: v.batch) if fits else None


#: a GPU stalled on memory draws this fraction of the dynamic power of one computing flat out (the
#: calibration anchors are compute stress tests). *assumption*, no published Orin figure.
MEMORY_STALL_POWER = 0.4
#: SMs left idle by a kernel with a small grid still draw this fraction (clock tree, leakage at the
#: mode's voltage). *assumption*
IDLE_SM_POWER = 0.3


def gpu_activity(run: dict) -> float:
    """The GPU's power-weighted activity while the run lasts: its busy share, scaled by the share of SMs
    its kernels keep busy (idle ones at :data:`IDLE_SM_POWER`) and with the memory-bound part at
    :data:`MEMORY_STALL_POWER`."""
    sms = IDLE_SM_POWER + (1.0 - IDLE_SM_POWER) * run.get("sm_activity", 1.0)
    return run["gpu_util"] * sms * (1.0 - (1.0 - MEMORY_STALL_POWER) * run["mem_util"])


def _cpu_util(run: dict) -> float:
    """One host thread busy while the host part runs, out of the online cores (the VM is single-threaded)."""
    return run["host_ms"] / run["ms"] if run["ms"] else 0.0


@dataclass(frozen=True)
class OpPoint:
    precision: str
    batch: int
    mode: int

    def label(self, board: Board) -> str:
        return f"{self.precision}-b{self.batch}@{board.mode(self.mode).name}"


# -- the queue -------------------------------------------------------------------------------------
class Queue:
    """Batch formation and FIFO service across windows (state carried between them)."""

    def __init__(self, table: ModeTable, delay_s: float, rng: np.random.Generator):
        self.table, self.delay, self.rng = table, delay_s, rng
        self.pending = np.empty(0)  # arrivals not yet in a closed batch
        self.free_at = 0.0  # when the GPU finishes its last batch
        self.carry = np.zeros(3)  # GPU, memory, CPU work (s) started but not yet accounted to a window

    def window(self, arrivals: np.ndarray, t_end: float, point: OpPoint, mode: PowerMode):
        """Serve the batches that start before ``t_end``; returns per-request latencies (s) of their
        requests, the busy seconds and the busy-weighted GPU, memory and CPU utilisations.

        A batch starts when the GPU is free and either ``batch`` requests wait or the oldest has waited
        ``max_queue_delay`` (the batcher holds a short batch that long for more rows); it takes every
        waiting request up to ``batch``."""
        a = np.concatenate([self.pending, arrivals])
        n, i, b = len(a), 0, point.batch
        free = self.free_at
        jitter = np.exp(self.rng.normal(0.0, JITTER, max(n, 1)) - JITTER**2 / 2).tolist()
        names = [None] + [self.table.variant_for(point.precision, r).name for r in range(1, b + 1)]
        base = [0.0] + [self.table.service_s(names[r], mode) for r in range(1, b + 1)]
        al = a.tolist()
        delay = self.delay
        bounds, finishes, services, row_counts = [], [], [], []
        searchsorted = np.searchsorted
        while i < n:
            full_at = al[i + b - 1] if i + b - 1 < n else math.inf
            start = max(free, min(al[i] + delay, full_at))
            if start >= t_end:
                break
            j = min(i + b, int(searchsorted(a, start, side="right")))
            rows = j - i
            service = base[rows] * jitter[i]
            free = start + service
            bounds.append(j)
            finishes.append(free)
            services.append(service)
            row_counts.append(rows)
            i = j
        self.pending = a[i:]
        self.free_at = free
        if not bounds:
            return np.empty(0), 0.0, 0.0, 0.0, 0.0
        rows = np.asarray(row_counts)
        lat = np.repeat(np.asarray(finishes), rows) - a[:i]
        services = np.asarray(services)
        busy = float(services.sum())
        gpu = mem = cpu = 0.0
        for r in np.unique(rows):
            run = self.table.runs[(names[r], mode.id)]
            sec = float(services[rows == r].sum())
            gpu += sec * gpu_activity(run)
            mem += sec * run["mem_util"]
            cpu += sec * _cpu_util(run)
        return lat, busy, gpu, mem, cpu


def arrivals_for(trace: Trace, seed: int) -> list[np.ndarray]:
    """Poisson arrivals per window (sorted absolute times)."""
    rng = np.random.default_rng(seed)
    out = []
    for k, rate in enumerate(trace.rates):
        t0 = k * trace.window_s
        cnt = rng.poisson(rate * trace.window_s)
        out.append(np.sort(t0 + rng.uniform(0, trace.window_s, cnt)))
    return out


# -- what a run measured -------------------------------------------------------------------------
@dataclass
class RunResult:
    policy: str
    requests: int
    energy_j: float
    misses: int
    miss_bursts: int
    longest_burst: int
    p99_ms: float
    mode_switches: int
    point_switches: int
    timeline: list[dict]

    @property
    def j_per_inference(self) -> float:
        return self.energy_j / max(self.requests, 1)

    @property
    def miss_rate(self) -> float:
        return self.misses / max(self.requests, 1)

    def summary(self) -> dict:
        return {
            "policy": self.policy,
            "requests": self.requests,
            "energy_j": self.energy_j,
            "j_per_inference": self.j_per_inference,
            "deadline_misses": self.misses,
            "miss_rate": self.miss_rate,
            "miss_bursts": self.miss_bursts,
            "longest_burst": self.longest_burst,
            "p99_ms": self.p99_ms,
            "mode_switches": self.mode_switches,
            "point_switches": self.point_switches,
        }


def _bursts(missed: np.ndarray) -> tuple[int, int]:
    if not missed.any():
        return 0, 0
    m = missed.astype(np.int8)
    starts = np.flatnonzero(np.diff(np.concatenate([[0], m])) == 1)
    ends = np.flatnonzero(np.diff(np.concatenate([m, [0]])) == -1)
    return len(starts), int((ends - starts + 1).max())
