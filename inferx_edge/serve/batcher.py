"""The dynamic batcher of one served model version: a bounded request queue, batch formation up to the
governor's batch size within ``max_queue_delay``, per-batch routing to a device, padding to a compiled
batch size, and results scattered back to each request.

Threads: one scheduler forms batches; each device (an :class:`~inferx_edge.runtime.Engine`) has worker
threads that copy a batch together, run it and scatter the outputs. A request larger than a batch is
split across batches and reassembled; a request only ever fails on its own problem (validation happens
before it is queued) or with the batch it ran in (an engine error: every request of that batch fails).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from inferx_edge.package import Variant
from inferx_edge.runtime.engine import Engine
from inferx_edge.serve.signature import Signature


class Overloaded(Exception):
    """The queue is full: the client should retry after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RequestTimeout(Exception):
    """The request waited past its deadline before a batch took it."""


class EngineFailure(Exception):
    """The device or engine failed while running the batch this request was in."""


class Unavailable(Exception):
    """The model version is draining or stopped and takes no new requests."""


@dataclass
class Request:
    """One inference request: ``arrays`` in the model's input order, ``rows`` along the batch axis."""

    arrays: list[np.ndarray]
    rows: int
    arrival: float
    deadline: float
    on_done: Callable[[Request], None]
    outputs: list[np.ndarray] | None = None
    error: BaseException | None = None
    started: float | None = None  # first batch start (queue time ends)
    compute_s: float = 0.0
    rows_done: int = 0
    taken: int = 0  # rows handed to batches so far
    cancelled: bool = False
    finished: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            if self.finished:
                return
            self.finished, self.error = True, exc
        self.on_done(self)


@dataclass
class Slice:
    request: Request
    start: int
    stop: int


@dataclass
class VariantTiming:
    """Running estimate of one variant's execution on one device (EWMA of seconds per batch) and of its
    active power (watts while it runs; None until telemetry measured it)."""

    seconds: float | None = None
    active_w: float | None = None
    measured_at: float = -math.inf  # monotonic time of the last probe or run

    def update(self, seconds: float, now: float, alpha: float = 0.2) -> None:
        self.seconds = seconds if self.seconds is None else (1 - alpha) * self.seconds + alpha * seconds
        self.measured_at = now


class DeviceSlot:
    """One engine (one device) with its worker threads and per-variant timings."""

    def __init__(self, engine: Engine, label: str, telemetry=None, workers: int = 1) -> None:
        self.engine = engine
        self.label = label
        self.telemetry = telemetry
        self.variants = {v.name: v for v in engine.manifest.variants}
        self.timing = {name: VariantTiming() for name in self.variants}
        self.idle_w: float | None = None
        self.busy_until = 0.0
        self.busy_s = 0.0  # seconds spent running batches (the governor reads and resets deltas)
        self.workers = workers
        self.lock = threading.Lock()

    def variant_for(self, precision: str | None, rows: int) -> Variant | None:
        """The smallest compiled variant of ``precision`` (None: any) holding ``rows`` rows (None if there
        is none)."""
        fits = [v for v in self.variants.values() if precision in (None, v.precision) and v.batch >= rows]
        return min(fits, key=lambda v: v.batch) if fits else None


@dataclass
class BatchOptions:
    """How batches form. ``max_queue_delay_s``: the longest the oldest request waits for a batch to fill;
    ``max_queue_size``: requests queued before new ones get 503; ``timeout_s``: a request not started
    by then fails with 504; ``max_request_rows``: rows one request may carry."""

    max_queue_delay_s: float = 0.002
    max_queue_size: int = 256
    timeout_s: float = 30.0
    max_request_rows: int = 4096
    allow_nonfinite: bool = False


class Batcher:
    """Queue, scheduler and workers of one model version.

    ``plan()`` (from the governor) says which precision and target batch size to form now;
    ``route(rows, precision)`` picks the device slot and variant for a formed batch; ``observer``
    receives ``(slot, variant, rows, seconds)`` after every batch (seconds None: it failed).
    """

    def __init__(
        self,
        signature: Signature,
        slots: list[DeviceSlot],
        options: BatchOptions,
        plan,
        route,
        observer,
        backlog_alarm: Callable[[], float] | None = None,
        on_backlog: Callable[[], None] | None = None,
    ):
        self.signature = signature
        self.backlog_alarm = backlog_alarm
        self.on_backlog = on_backlog
        self._queued = 0  # rows accepted and not yet in a batch
        self.slots = slots
        self.options = options
        self.plan = plan
        self.route = route
        self.observer = observer
        self._queue: deque[Request] = deque()
        self._cv = threading.Condition()
        self._accepting = True
        self._stopping = False
        self.arrived_rows = 0
        self.arrived_requests = 0
        self._inboxes = {s.label: deque() for s in slots}
        self._slot_cv = threading.Condition()
        self._threads = [threading.Thread(target=self._schedule, name="inferx-batcher", daemon=True)]
        for s in slots:
            for i in range(s.workers):
                self._threads.append(
                    threading.Thread(target=self._work, args=(s,), name=f"inferx-{s.label}-{i}", daemon=True)
                )
        for t in self._threads:
            t.start()

    # -- intake -------------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def queued_rows(self) -> int:
        """Rows accepted and not yet in a batch."""
        return self._queued

    def submit(self, arrays: list[np.ndarray], rows: int, on_done: Callable[[Request], None]) -> Request:
        now = time.monotonic()
        with self._cv:
            if not self._accepting:
                raise Unavailable("model version is draining; it takes no new requests")
            if len(self._queue) >= self.options.max_queue_size:
                raise Overloaded(
                    f"queue full ({self.options.max_queue_size} requests waiting; --max-queue-size)",
                    self._retry_after(),
                )
            r = Request(arrays, rows, now, now + self.options.timeout_s, on_done)
            self._queue.append(r)
            self.arrived_rows += rows
            self.arrived_requests += 1
            self._queued += rows
            alarm = self.backlog_alarm is not None and self._queued > self.backlog_alarm()
            self._cv.notify()
        if alarm and self.on_backlog is not None:
            self.on_backlog()  # the governor decides now, not at its window's end
        return r

    def _retry_after(self) -> float:
        rows = sum(r.rows - r.taken for r in self._queue)
        per_row = min(
            (t.seconds / s.variants[n].batch for s in self.slots for n, t in s.timing.items() if t.seconds),
            default=0.01,
        )
        return max(1.0, rows * per_row)

    # -- batch formation ------------------------------------------------------------------------------
    def _wait_for_capacity(self) -> bool:
        """Block until some device can take a batch (at most one waiting per worker); False when stopping
        with nothing queued (a draining batcher still runs every request it accepted)."""
        with self._slot_cv:
            while True:
                if any(len(self._inboxes[s.label]) < s.workers for s in self.slots):
                    return True
                if self._stopping and not self._queue:
                    return False
                self._slot_cv.wait(0.05)

    def _schedule(self) -> None:
        while True:
            if not self._wait_for_capacity():
                return
            with self._cv:
                while not self._queue and not self._stopping:
                    self._cv.wait(0.05)
                if not self._queue:
                    return  # stopping and drained
                precision, target = self.plan()
                oldest = self._queue[0]
                fill_by = oldest.arrival + self.options.max_queue_delay_s
                while self._rows_queued(target) < target and not self._stopping:
                    left = fill_by - time.monotonic()
                    if left <= 0:
                        break
                    self._cv.wait(left)
                slices = self._take(target)
            if slices:
                self._dispatch(slices, precision)

    def _rows_queued(self, cap: int) -> int:
        n = 0
        for r in self._queue:
            n += r.rows - r.taken
            if n >= cap:
                break
        return n

    def _take(self, target: int) -> list[Slice]:
        now = time.monotonic()
        slices, rows = [], 0
        while self._queue and rows < target:
            r = self._queue[0]
            if r.cancelled or r.finished:
                self._queue.popleft()
                self._queued -= r.rows - r.taken
                continue
            if now > r.deadline and r.taken == 0:
                self._queue.popleft()
                self._queued -= r.rows
                r.fail(
                    RequestTimeout(
                        f"request waited {now - r.arrival:.3f} s, past its {self.options.timeout_s:g} s timeout"
                    )
                )
                continue
            n = min(r.rows - r.taken, target - rows)
            slices.append(Slice(r, r.taken, r.taken + n))
            r.taken += n
            rows += n
            self._queued -= n
            if r.taken == r.rows:
                self._queue.popleft()
        return slices

    def _dispatch(self, slices: list[Slice], precision: str) -> None:
        rows = sum(s.stop - s.start for s in slices)
        slot, variant = self.route(rows, precision)
        with self._slot_cv:
            self._inboxes[slot.label].append((variant, slices, rows))
            self._slot_cv.notify_all()

    # -- execution ------------------------------------------------------------------------------------
    def _work(self, slot: DeviceSlot) -> None:
        inbox = self._inboxes[slot.label]
        while True:
            with self._slot_cv:
                while not inbox and not (self._stopping and self._idle_scheduler()):
                    self._slot_cv.wait(0.05)
                if not inbox:
                    return
                variant, slices, rows = inbox.popleft()
                self._slot_cv.notify_all()
            if callable(variant):  # a probe (the governor measuring a variant not in use)
                variant()
                continue
            self._run(slot, variant, slices, rows)

    def _idle_scheduler(self) -> bool:
        return not self._threads[0].is_alive()

    def _run(self, slot: DeviceSlot, variant: Variant, slices: list[Slice], rows: int) -> None:
        t_start = time.monotonic()
        for s in slices:
            if s.request.started is None:
                s.request.started = t_start
        try:
            arrays = self._assemble(slices, variant, rows)
            t0 = time.perf_counter()
            try:
                outs = slot.engine.run_arrays(variant.name, arrays)
            finally:
                seconds = time.perf_counter() - t0
                with slot.lock:
                    slot.busy_s += seconds
        except Exception as exc:  # noqa: BLE001 - a device/engine error fails this batch only
            err = EngineFailure(f"{slot.label} failed running variant '{variant.name}': {exc}")
            for s in slices:
                s.request.fail(err)
            self.observer(slot, variant, rows, None)
            return
        slot.timing[variant.name].update(seconds, time.monotonic())
        self._scatter(slices, outs, seconds / max(len(slices), 1))
        self.observer(slot, variant, rows, seconds)

    def _assemble(self, slices: list[Slice], variant: Variant, rows: int) -> list[np.ndarray]:
        if not self.signature.batchable:
            return [np.ascontiguousarray(a) for a in slices[0].request.arrays]
        if len(slices) == 1 and rows == variant.batch:
            s = slices[0]
            return [np.ascontiguousarray(a[s.start : s.stop]) for a in s.request.arrays]
        out = []
        for i in range(len(self.signature.inputs)):
            first = slices[0].request.arrays[i]
            buf = np.zeros((variant.batch, *first.shape[1:]), dtype=first.dtype)  # padding rows are zeros
            at = 0
            for s in slices:
                n = s.stop - s.start
                buf[at : at + n] = s.request.arrays[i][s.start : s.stop]
                at += n
            out.append(buf)
        return out

    def _scatter(self, slices: list[Slice], outs: list[np.ndarray], compute_share: float) -> None:
        at = 0
        for s in slices:
            r, n = s.request, s.stop - s.start
            with r.lock:
                if r.finished:
                    at += n
                    continue
                if not self.signature.batchable:
                    r.outputs = outs
                else:
                    if r.outputs is None:
                        r.outputs = [np.empty((r.rows, *o.shape[1:]), dtype=o.dtype) for o in outs]
                    for dst, o in zip(r.outputs, outs):
                        dst[s.start : s.stop] = o[at : at + n]
                r.rows_done += n
                r.compute_s += compute_share
                done = r.rows_done >= r.rows
                if done:
                    r.finished = True
            at += n
            if done:
                r.on_done(r)

    # -- probing and shutdown ---------------------------------------------------------------------------
    def run_on_worker(self, slot: DeviceSlot, fn: Callable[[], None]) -> None:
        """Queue ``fn`` to run on one of ``slot``'s workers between batches (a governor probe)."""
        with self._slot_cv:
            self._inboxes[slot.label].append((fn, [], 0))
            self._slot_cv.notify_all()

    def stop_accepting(self) -> None:
        with self._cv:
            self._accepting = False

    def drain(self, timeout_s: float | None = None) -> bool:
        """Stop taking requests, finish every queued one, stop the threads; True when all finished."""
        self.stop_accepting()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        leftover = list(self._queue)
        for r in leftover:
            r.fail(Unavailable("server stopped before the request ran"))
        return not leftover and not any(t.is_alive() for t in self._threads)
