"""The power/throughput governor: picks which variant runs from measured windows.

Policies (each a plain object; registry :data:`POLICIES`):

- ``max-throughput``: highest FPS whose measured power is under a cap;
- ``min-energy``: lowest J/frame whose FPS is above a floor;
- ``latency-slo``: lowest J/frame whose p99 latency is within an SLO.

Decisions use the latest measured window per variant (seeded from a profile), switch only when the
winner beats the current variant by ``hysteresis`` and the current one has run ``min_dwell_s`` (a
variant that breaks its constraint is left at once, for one that meets it or comes closer to it by
``hysteresis``), and hold the last variant that met the constraint
when telemetry disappears. Every decision is logged with its inputs. Nothing here touches clocks,
power limits or power modes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from inferx_edge.errors import UsageError, check_choice
from inferx_edge.runtime.telemetry.base import MAX_PLAUSIBLE_W


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

    def problem(self, max_watts: float = MAX_PLAUSIBLE_W) -> str | None:
        """Why this window cannot be used (NaN, negative or implausible numbers), or None."""
        for field_name in ("fps", "p99_ms", "watts", "j_per_frame"):
            v = getattr(self, field_name)
            if v is None and field_name in ("watts", "j_per_frame"):
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                return f"{field_name} = {v!r} is not a finite non-negative number"
        if self.watts is not None and self.watts > max_watts:
            return f"watts = {self.watts:g} is above the plausible maximum {max_watts:g} W for this device"
        return None


class Policy(Protocol):
    name: str

    def feasible(self, s: VariantStats) -> bool: ...

    def score(self, s: VariantStats) -> float: ...  # lower is better

    def fallback(self, s: VariantStats) -> float | tuple: ...  # lower is closer to feasible


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
        # the lowest p99; among points that cannot keep up at all (equal, saturated p99), the fastest
        return s.p99_ms, -s.fps

    def describe(self):
        return f"minimum J/frame with p99 <= {self.p99_ms:g} ms"


POLICIES = {"max-throughput": MaxThroughputUnderPowerCap, "min-energy": MinEnergyAboveFps, "latency-slo": LatencySLO}


def make_policy(name: str, value: float) -> Policy:
    check_choice("policy", name, POLICIES)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UsageError(f"the {name} policy needs a positive limit, got {value!r}")
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
    max_watts : readings above this are rejected as garbage (:data:`MAX_PLAUSIBLE_W`).

    Windows with NaN, negative or implausible numbers are rejected (logged as a ``rejected`` decision,
    not used); a variant name the governor was not given is refused. :meth:`step` reads a window
    through a callable and never raises: a telemetry backend that fails or stops answering makes it
    hold the last safe variant.
    """

    def __init__(
        self,
        policy: Policy,
        priors: dict[str, VariantStats],
        start: str | None = None,
        hysteresis: float = 0.05,
        min_dwell_s: float = 10.0,
        log=None,
        max_watts: float = MAX_PLAUSIBLE_W,
    ) -> None:
        if not priors:
            raise UsageError("the governor needs at least one variant")
        self.policy = policy
        self.max_watts = max_watts
        self.rejected: list[dict] = []
        self.table = {}
        for name, stats in priors.items():
            problem = stats.problem(max_watts)
            if problem is None:
                self.table[name] = stats
            else:
                self.rejected.append({"variant": name, "reason": problem, "source": "prior"})
        if not self.table:
            raise UsageError(f"the governor has no usable prior for any variant: {self.rejected}")
        self.variants = set(priors)
        if start is not None:
            check_choice("variant", start, sorted(self.variants))
        self.current = start if start in self.table else choose(policy, self.table)[0]
        self.hysteresis = hysteresis
        self.min_dwell_s = min_dwell_s
        self.since = -math.inf
        self.last_safe = self.current if policy.feasible(self.table[self.current]) else None
        self.decisions: list[dict] = []
        self._log = log or self.decisions.append

    def observe(self, stats: VariantStats) -> bool:
        """Record a measured window of one variant; False (and logged, not used) when it is garbage."""
        check_choice("variant", stats.name, sorted(self.variants))
        problem = stats.problem(self.max_watts)
        if problem is not None:
            self.rejected.append({"variant": stats.name, "reason": problem, "source": "window"})
            return False
        self.table[stats.name] = stats
        if stats.name == self.current and self.policy.feasible(stats):
            self.last_safe = stats.name
        return True

    def step(self, t: float, read_window) -> str:
        """One governor tick: ``read_window()`` returns the current variant's window (or None when there
        is none yet); any exception from it, or a garbage window, counts as lost telemetry. Never raises
        for telemetry faults."""
        try:
            window = read_window()
            ok = window is None or self.observe(window)
        except UsageError:
            raise  # a programming error (an unknown variant), not a telemetry fault
        except Exception as exc:  # noqa: BLE001 - any backend failure holds the safe variant
            self.rejected.append({"variant": self.current, "reason": f"telemetry failed: {exc}", "source": "backend"})
            ok = False
        return self.decide(t, telemetry_ok=ok)

    def _safe_hold(self) -> tuple[str, str]:
        if self.last_safe:
            return self.last_safe, f"holding last safe variant {self.last_safe}"
        best, ok = choose(self.policy, self.table)
        if ok:
            return best, f"no safe history: {best} met the constraint in its last valid window"
        return best, f"no safe history and nothing met the constraint: {best}, the closest to it"

    def decide(self, t: float, telemetry_ok: bool = True) -> str:
        """Choose the variant for the next window; logs and returns it."""
        inputs = {k: asdict(v) for k, v in self.table.items()}
        if not telemetry_ok:
            hold, why = self._safe_hold()
            return self._record(t, hold, f"telemetry lost: {why}", inputs)
        best, ok = choose(self.policy, self.table)
        cur = self.table[self.current]
        if best == self.current:
            return self._record(
                t, best, "current is the policy's pick" + ("" if ok else " (constraint unmet by all)"), inputs
            )
        if not self.policy.feasible(cur):
            if ok or _closer(self.policy.fallback(self.table[best]), self.policy.fallback(cur), self.hysteresis):
                return self._record(t, best, f"{self.current} breaks the constraint ({self.policy.describe()})", inputs)
            # nothing meets it: moving to a variant only predicted to be as close would chase noise
            return self._record(
                t, self.current, f"nothing meets the constraint ({self.policy.describe()}): holding the closest", inputs
            )
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


def _closer(challenger, current, hysteresis: float) -> bool:
    """Whether fallback key ``challenger`` is closer to the constraint than ``current`` by more than
    ``hysteresis`` (keys: a number, or a tuple compared first by its first element, then the rest)."""
    a = challenger if isinstance(challenger, tuple) else (challenger,)
    b = current if isinstance(current, tuple) else (current,)
    if a[0] < b[0] - hysteresis * abs(b[0]):
        return True
    return a[0] <= b[0] and a[1:] < b[1:]


def jsonl_logger(path):
    """A ``log`` for :class:`Governor` appending one JSON line per decision."""

    def log(d: dict) -> None:
        with open(path, "a") as f:
            f.write(json.dumps(d) + "\n")

    return log
