"""The power/throughput governor: picks which variant runs from measured windows.

Policies (each a plain object; registry :data:`POLICIES`):

- ``max-throughput``: highest FPS whose measured power is under a cap;
- ``min-energy``: lowest J/frame whose FPS is above a floor;
- ``latency-slo``: lowest J/frame whose p99 latency is within an SLO.

Decisions use the latest measured window per variant (seeded from a profile), switch only when the
winner beats the current variant by ``hysteresis`` and the current one has run ``min_dwell_s`` (a
variant that breaks its constraint is left at once), and hold the last variant that met the constraint
when telemetry disappears. Every decision is logged with its inputs. Nothing here touches clocks,
power limits or power modes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from inferx_edge.errors import UsageError


@dataclass(frozen=True)
class VariantStats:
    """What one measured window (or a profile) says about a variant. None: not measured."""

    name: str
    fps: float
    watts: float | None
    j_per_frame: float | None
    p99_ms: float
    batch: int = 1
    precision: str = ""


class Policy(Protocol):
    name: str

    def feasible(self, s: VariantStats) -> bool: ...

    def score(self, s: VariantStats) -> float: ...  # lower is better

    def fallback(self, s: VariantStats) -> float: ...  # lower is closer to feasible


@dataclass(frozen=True)
class MaxThroughputUnderPowerCap:
    cap_w: float
    name: str = "max-throughput"

    def feasible(self, s):
        return s.watts is not None and s.watts <= self.cap_w

    def score(self, s):
        return -s.fps

    def fallback(self, s):
        return s.watts if s.watts is not None else math.inf

    def describe(self):
        return f"maximum FPS with power <= {self.cap_w:g} W"


@dataclass(frozen=True)
class MinEnergyAboveFps:
    fps_floor: float
    name: str = "min-energy"

    def feasible(self, s):
        return s.fps >= self.fps_floor and s.j_per_frame is not None

    def score(self, s):
        return s.j_per_frame

    def fallback(self, s):
        return -s.fps

    def describe(self):
        return f"minimum J/frame with FPS >= {self.fps_floor:g}"


@dataclass(frozen=True)
class LatencySLO:
    p99_ms: float
    name: str = "latency-slo"

    def feasible(self, s):
        return s.p99_ms <= self.p99_ms and s.j_per_frame is not None

    def score(self, s):
        return s.j_per_frame

    def fallback(self, s):
        return s.p99_ms

    def describe(self):
        return f"minimum J/frame with p99 <= {self.p99_ms:g} ms"


POLICIES = {"max-throughput": MaxThroughputUnderPowerCap, "min-energy": MinEnergyAboveFps, "latency-slo": LatencySLO}


def make_policy(name: str, value: float) -> Policy:
    if name not in POLICIES:
        raise UsageError(f"unknown policy '{name}'; valid: {', '.join(POLICIES)}")
    return POLICIES[name](value)


def choose(policy: Policy, table: dict[str, VariantStats]) -> tuple[str, bool]:
    """The policy's pick from ``table`` and whether it meets the constraint."""
    feasible = [s for s in table.values() if policy.feasible(s)]
    if feasible:
        return min(feasible, key=policy.score).name, True
    return min(table.values(), key=policy.fallback).name, False


@dataclass
class Decision:
    t: float
    policy: str
    current: str
    choice: str
    reason: str
    inputs: dict[str, Any] = field(default_factory=dict)


class Governor:
    """Stateful variant selection from measured windows.

    Parameters
    ----------
    policy : what to optimise.
    priors : stats per variant (e.g. from ``profile``), replaced by fresh measurements as they come.
    start : the variant running now (default: the policy's pick from the priors).
    hysteresis : a challenger must beat the current score by this fraction to cause a switch.
    min_dwell_s : minimum time on a variant before a switch for gain (not for a broken constraint).
    log : a callable receiving each :class:`Decision` as a dict (default: kept in ``self.decisions``).
    """

    def __init__(
        self,
        policy: Policy,
        priors: dict[str, VariantStats],
        start: str | None = None,
        hysteresis: float = 0.05,
        min_dwell_s: float = 10.0,
        log=None,
    ) -> None:
        if not priors:
            raise UsageError("the governor needs at least one variant")
        self.policy = policy
        self.table = dict(priors)
        self.current = start or choose(policy, self.table)[0]
        self.hysteresis = hysteresis
        self.min_dwell_s = min_dwell_s
        self.since = -math.inf
        self.last_safe = self.current if policy.feasible(self.table[self.current]) else None
        self.decisions: list[dict] = []
        self._log = log or self.decisions.append

    def observe(self, stats: VariantStats) -> None:
        """Record a measured window of one variant."""
        self.table[stats.name] = stats
        if stats.name == self.current and self.policy.feasible(stats):
            self.last_safe = stats.name

    def decide(self, t: float, telemetry_ok: bool = True) -> str:
        """Choose the variant for the next window; logs and returns it."""
        inputs = {k: asdict(v) for k, v in self.table.items()}
        if not telemetry_ok:
            hold = self.last_safe or self.current
            return self._record(t, hold, f"telemetry lost: holding last safe variant {hold}", inputs)
        best, ok = choose(self.policy, self.table)
        cur = self.table[self.current]
        if best == self.current:
            return self._record(
                t, best, "current is the policy's pick" + ("" if ok else " (constraint unmet by all)"), inputs
            )
        if not self.policy.feasible(cur):
            return self._record(t, best, f"{self.current} breaks the constraint ({self.policy.describe()})", inputs)
        if t - self.since < self.min_dwell_s:
            return self._record(
                t, self.current, f"dwell: {t - self.since:.1f} s < {self.min_dwell_s:g} s on current", inputs
            )
        a, b = self.policy.score(cur), self.policy.score(self.table[best])
        gain = (a - b) / abs(a) if a not in (0, math.inf) else math.inf
        if gain < self.hysteresis:
            return self._record(
                t,
                self.current,
                f"hysteresis: {best} better by {gain * 100:.1f} % < {self.hysteresis * 100:g} %",
                inputs,
            )
        return self._record(t, best, f"{best} better by {gain * 100:.1f} %", inputs)

    def _record(self, t: float, choice: str, reason: str, inputs: dict) -> str:
        if choice != self.current:
            self.since = t
        d = Decision(t, self.policy.name, self.current, choice, reason, inputs)
        self.current = choice
        self._log(asdict(d))
        return choice


def jsonl_logger(path):
    """A ``log`` for :class:`Governor` appending one JSON line per decision."""

    def log(d: dict) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(d) + "\n")

    return log
