"""Prometheus metrics of the server: Triton's names and meanings where Triton has them, inferx_edge's
own for power, energy, the governor and the queue.

Triton's counters are exposed under their exact names (``nv_inference_count``, not ``..._total``), as
Triton does, so its dashboards and prometheus-adapter rules work unchanged; durations are cumulative
microseconds. Latency histograms carry ``model``, ``version`` and ``input_size`` (request rows,
rounded up to a power of two to bound the label's values), with log-spaced buckets for a heatmap.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import Metric

#: Triton's metric names this server exports (meaning as in Triton's metrics documentation)
TRITON_METRICS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
)

#: ``reason`` label of nv_inference_request_failure (Triton's values)
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

#: request latency buckets (seconds): 50 us .. ~52 s, factor 2
LATENCY_BUCKETS = tuple(50e-6 * 2**i for i in range(21))


def size_label(rows: int) -> str:
    return str(1 << max(rows - 1, 0).bit_length())


class ServerMetrics:
    """Thread-safe accumulators plus a collector that exposes them (:attr:`registry`)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._counters: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
        self._gauges: dict[str, dict[tuple, float]] = defaultdict(dict)
        self.latency = Histogram(
            "inferx_request_latency_seconds",
            "End-to-end request latency (queue + compute + response) by model version and request size",
            ["model", "version", "input_size"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_rows = Histogram(
            "inferx_batch_rows",
            "Rows of real requests per executed batch (the rest of the compiled batch is padding)",
            ["model", "version", "device"],
            buckets=tuple(2**i for i in range(13)),
            registry=self.registry,
        )
        # device -> (owner, read_counter or None): one model version reports each device's energy
        self._energy_owner: dict[str, tuple[object, object]] = {}
        self._energy_base: dict[str, float] = {}
        self.registry.register(self)

    def claim_energy(self, device: str, owner, read_counter=None) -> bool:
        """Make ``owner`` the one reporting ``device``'s energy unless another already does. With
        ``read_counter`` (the hardware's cumulative joules, e.g. NVML's) the metric is read live at each
        scrape; without, the owner adds each window's integrated energy."""
        with self._lock:
            if device in self._energy_owner:
                return self._energy_owner[device][0] is owner
            self._energy_owner[device] = (owner, read_counter)
            if read_counter is not None and device not in self._energy_base:
                try:
                    self._energy_base[device] = float(read_counter())
                except Exception:  # noqa: BLE001 - a sensor that fails now is treated as window-based
                    self._energy_owner[device] = (owner, None)
            self._counters["inferx_energy_joules_total"][(device,)] += 0.0
            return True

    def release_energy(self, owner) -> None:
        with self._lock:
            for d in [d for d, (o, _) in self._energy_owner.items() if o is owner]:
                _, counter = self._energy_owner.pop(d)
                if counter is not None and d in self._energy_base:  # freeze the total at its last value
                    try:
                        self._counters["inferx_energy_joules_total"][(d,)] = float(counter()) - self._energy_base.pop(d)
                    except Exception:  # noqa: BLE001
                        pass

    def counts_windows(self, device: str, owner) -> bool:
        """Whether ``owner`` adds window energy for ``device`` (it owns it and it has no live counter)."""
        with self._lock:
            o = self._energy_owner.get(device)
            return o is not None and o[0] is owner and o[1] is None

    def add(self, name: str, labels: tuple, value: float = 1.0) -> None:
        with self._lock:
            self._counters[name][labels] += value

    def put(self, name: str, labels: tuple, total: float) -> None:
        """Set a counter to a running total kept elsewhere (the governor's switches and probe time)."""
        with self._lock:
            self._counters[name][labels] = total

    def set(self, name: str, labels: tuple, value: float) -> None:
        with self._lock:
            self._gauges[name][labels] = value

    def start_series(self, model: str, version: str) -> None:
        """Zero every per-version counter, as Triton does, so rates exist before the first failure."""
        labels = (model, version)
        for name in TRITON_METRICS:
            if name == "nv_inference_request_failure":
                for reason in FAILURE_REASONS:
                    self.add(name, (*labels, reason), 0.0)
            else:
                self.add(name, labels, 0.0)

    def forget(self, model: str, version: str) -> None:
        """Drop an unloaded version's gauges (its counters stay: they are cumulative)."""
        with self._lock:
            for series in self._gauges.values():
                for k in [k for k in series if k[:2] == (model, version)]:
                    del series[k]

    # counter/gauge name -> (type, help, label names)
    SPEC = {
        "nv_inference_request_success": ("counter", "Number of successful inference requests", ("model", "version")),
        "nv_inference_request_failure": (
            "counter",
            "Number of failed inference requests, by reason",
            ("model", "version", "reason"),
        ),
        "nv_inference_count": ("counter", "Number of inferences performed (request rows)", ("model", "version")),
        "nv_inference_exec_count": ("counter", "Number of model executions (batches)", ("model", "version")),
        "nv_inference_request_duration_us": (
            "counter",
            "Cumulative end-to-end inference request handling time (us)",
            ("model", "version"),
        ),
        "nv_inference_queue_duration_us": (
            "counter",
            "Cumulative time requests spend waiting in the scheduling queue (us)",
            ("model", "version"),
        ),
        "nv_inference_compute_infer_duration_us": (
            "counter",
            "Cumulative compute time of requests (their share of the batches they ran in, us)",
            ("model", "version"),
        ),
        "inferx_energy_joules_total": ("counter", "Energy the device drew, from its telemetry (J)", ("device",)),
        "inferx_governor_switches_total": ("counter", "Operating-point switches", ("model", "version")),
        "inferx_governor_probe_seconds_total": (
            "counter",
            "Device time spent re-measuring variants that are not running",
            ("model", "version"),
        ),
        "inferx_power_watts": ("gauge", "Device power over the last governor window (W)", ("device",)),
        "inferx_device_busy_ratio": ("gauge", "Share of the last window the device ran batches", ("device",)),
        "inferx_joules_per_inference": (
            "gauge",
            "Energy per inference over the last governor window (J)",
            ("model", "version"),
        ),
        "inferx_arrival_rate": ("gauge", "Inferences per second arriving over the last window", ("model", "version")),
        "inferx_governor_variant": (
            "gauge",
            "1 for the operating point the governor runs, 0 for the others",
            ("model", "version", "variant"),
        ),
        "inferx_queue_depth": ("gauge", "Requests waiting in the queue", ("model", "version")),
        "inferx_model_ready": ("gauge", "1 when the model version serves requests", ("model", "version")),
    }

    def collect(self):
        with self._lock:
            live = [(d, c) for d, (_, c) in self._energy_owner.items() if c is not None and d in self._energy_base]
        for device, counter in live:
            try:
                total = float(counter()) - self._energy_base[device]
            except Exception:  # noqa: BLE001 - keep the last total when a read fails
                continue
            with self._lock:
                if total >= self._counters["inferx_energy_joules_total"][(device,)]:  # monotonic
                    self._counters["inferx_energy_joules_total"][(device,)] = total
        with self._lock:
            counters = {k: dict(v) for k, v in self._counters.items()}
            gauges = {k: dict(v) for k, v in self._gauges.items()}
        for name, (kind, doc, labels) in self.SPEC.items():
            series = counters.get(name, {}) if kind == "counter" else gauges.get(name, {})
            m = Metric(name, doc, kind)
            sample_name = name  # Triton's counters carry no _total suffix; ours are named with it
            for values, value in sorted(series.items()):
                m.add_sample(sample_name, dict(zip(labels, values)), value)
            yield m
