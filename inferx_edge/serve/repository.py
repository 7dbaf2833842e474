"""What the server serves: model versions loaded from artifacts, the model repository that finds them,
and hot reload when a deployment's ``current`` changes.

``serve`` takes artifact files and/or directories:

- ``model.ixa [more.ixa ...]``: artifacts of the same model (e.g. one per device: ``A_gpu.ixa A_cpu.ixa``)
  serve one model, batches routed between their devices;
- a deployment directory (``deploy`` writes ``current -> releases/...``): one model, hot-reloaded;
- a directory of deployment directories (or of artifacts): several models side by side.

A model's name is the manifest's model name; its version the first 12 hex digits of the artifact's
sha256 (the name ``deploy`` gives releases), so a version names exactly one build.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from inferx_edge.errors import ArtifactError, UsageError
from inferx_edge.package import read_manifest
from inferx_edge.serve.batcher import Batcher, BatchOptions, DeviceSlot
from inferx_edge.serve.live import GovernorOptions, LiveGovernor
from inferx_edge.serve.metrics import ServerMetrics
from inferx_edge.serve.signature import Signature


@dataclass(frozen=True)
class Source:
    """Where one model comes from: artifact files, or a deployment directory whose ``current`` is read."""

    artifacts: tuple[Path, ...] = ()
    deployment: Path | None = None

    def resolve(self) -> tuple[Path, ...]:
        if self.deployment is None:
            return self.artifacts
        link = self.deployment / "current"
        if not link.exists():
            raise ArtifactError(f"{self.deployment} has no 'current' release (deploy an artifact there first)")
        return (link.resolve(),)


def discover(paths: list[Path]) -> dict[str, Source]:
    """Sources by model name from the command line's files and directories."""
    if not paths:
        raise UsageError("serve needs at least one artifact or model directory")
    by_model: dict[str, list[Path]] = {}
    deployments: dict[str, Path] = {}

    def add_artifact(p: Path) -> None:
        by_model.setdefault(read_manifest(p).model["name"], []).append(p)

    def add_deployment(d: Path) -> None:
        name = read_manifest((d / "current").resolve()).model["name"]
        if name in deployments or name in by_model:
            raise UsageError(f"model '{name}' is served twice ({d} and {deployments.get(name) or by_model[name][0]})")
        deployments[name] = d

    for p in paths:
        if p.is_file():
            add_artifact(p)
        elif p.is_dir() and (p / "current").exists():
            add_deployment(p)
        elif p.is_dir():
            children = sorted(p.iterdir())
            found = False
            for c in children:
                if c.is_dir() and (c / "current").exists():
                    add_deployment(c)
                    found = True
                elif c.is_file() and c.suffix == ".ixa":
                    add_artifact(c)
                    found = True
            if not found:
                raise UsageError(
                    f"{p} holds no artifact (*.ixa), no deployment ('current' link) and no directory of them"
                )
        else:
            raise UsageError(f"{p} does not exist")
    clash = sorted(set(by_model) & set(deployments))
    if clash:
        raise UsageError(f"model(s) {clash} come both from artifact files and a deployment directory")
    sources = {n: Source(artifacts=tuple(ps)) for n, ps in by_model.items()}
    sources.update({n: Source(deployment=d) for n, d in deployments.items()})
    return sources


def artifact_version(paths: tuple[Path, ...]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()[:12]


@dataclass
class ServeOptions:
    """Everything that shapes how models are served (the ``serve`` command's flags)."""

    batch: BatchOptions = field(default_factory=BatchOptions)
    governor: GovernorOptions = field(default_factory=GovernorOptions)
    telemetry: str = "auto"  # auto | none | nvml | rapl | jetson-sysfs | jtop | replay:FILE
    trust: object = None
    device_id: int = 0
    workers_per_gpu: int = 2
    probe: bool = True


def open_telemetry(spec: str, device: str, device_id: int):
    """The telemetry backend for one engine's device, or None (telemetry is optional)."""
    from inferx_edge.runtime.telemetry import probe
    from inferx_edge.runtime.telemetry.replay import ReplayBackend

    if spec == "none":
        return None
    if spec.startswith("replay:"):
        return ReplayBackend(spec.split(":", 1)[1])
    if spec == "auto":
        if device == "cuda":
            for name, kw in (("nvml", {"index": device_id}), ("jetson-sysfs", {})):
                try:
                    return probe(name, **kw)
                except Exception:  # noqa: BLE001 - no such sensor here
                    continue
            return None
        try:
            return probe("rapl")
        except Exception:  # noqa: BLE001
            return None
    # a named sensor belongs to one kind of device: a GPU's sensor on a CPU engine (or RAPL on a GPU
    # engine) would attribute another device's power to it
    gpu_sensors = ("nvml", "jetson-sysfs", "jtop")
    if (spec in gpu_sensors) != (device == "cuda"):
        return None
    return probe(spec, **({"index": device_id} if spec == "nvml" else {}))


#: the shortest time between two decisions the batcher's backlog alarm asks for
ALARM_GAP_S = 0.025


class ModelVersion:
    """One version of one model, loaded on its devices, batching and governed."""

    def __init__(self, name: str, paths: tuple[Path, ...], options: ServeOptions, metrics: ServerMetrics, log=None):
        from inferx_edge.runtime import Engine

        self.name = name
        self.version = artifact_version(paths)
        self.metrics = metrics
        self.options = options
        self.state = "loading"
        self.engines = []
        try:
            slots = []
            for p in paths:
                eng = Engine(p, preload=True, trust=options.trust, allow_nonfinite=True, device_id=options.device_id)
                self.engines.append(eng)
                device = eng.manifest.target["device"]
                label = f"cuda:{options.device_id}" if device == "cuda" else "cpu"
                if any(s.label == label for s in slots):
                    label = f"{label}#{len(slots)}"
                # a replay trace stands for one device's sensor: the first engine's
                spec = "none" if options.telemetry.startswith("replay:") and slots else options.telemetry
                tele = open_telemetry(spec, device, options.device_id)
                workers = options.workers_per_gpu if device == "cuda" else 1
                slots.append(DeviceSlot(eng, label, tele, workers))
            variants = [v for e in self.engines for v in e.manifest.variants]
            try:
                self.signature = Signature(variants)
            except ValueError as exc:
                raise ArtifactError(f"model '{name}': {exc}") from exc
            self.slots = slots
            self.governor = LiveGovernor(slots, options.governor, options.batch.max_queue_delay_s, log=log)
            if options.probe:
                self.governor.probe_all()
            else:
                for s in slots:
                    for t in s.timing.values():
                        t.seconds = t.seconds or 1e-3
            self.governor.decide(time.monotonic(), 0.0, _empty_window())
            self._stop = threading.Event()
            self._wake = threading.Event()  # the batcher's backlog alarm, or stop
            self.batcher = Batcher(
                self.signature,
                slots,
                options.batch,
                self.governor.plan,
                self.governor.route,
                self._observe,
                backlog_alarm=lambda: self.governor.alarm_rows,
                on_backlog=self._wake.set,
            )
        except BaseException:
            for e in self.engines:
                e.close()
            raise
        self.governor.start_window()
        self._thread = threading.Thread(target=self._govern, name=f"inferx-governor-{name}", daemon=True)
        self._thread.start()
        for s in self.slots:
            if s.telemetry is not None:
                metrics.claim_energy(s.label, self, _energy_counter(s.telemetry))
        self.state = "ready"
        metrics.start_series(name, self.version)
        metrics.set("inferx_model_ready", (name, self.version), 1)

    @property
    def labels(self) -> tuple[str, str]:
        return self.name, self.version

    def _observe(self, slot, variant, rows, seconds) -> None:
        self.governor.observe_batch(slot, variant, seconds)
        if seconds is not None:
            self.metrics.add("nv_inference_exec_count", self.labels)
            self.metrics.batch_rows.labels(self.name, self.version, slot.label).observe(rows)

    def _govern(self) -> None:
        last_rows = self.batcher.arrived_rows
        window_s = self.options.governor.window_s
        last_tick = time.monotonic()
        while True:
            alarm = self._wake.wait(window_s)
            # alarms decide at most every 25 ms (or ten times a window): a queue that stays past the
            # alarm (a point that cannot keep up) must not turn the governor into a busy loop
            early = last_tick + min(window_s / 10, ALARM_GAP_S) - time.monotonic()
            if alarm and early > 0:
                self._stop.wait(early)
            self._wake.clear()
            if self._stop.is_set():
                return
            last_tick = time.monotonic()
            rows = self.batcher.arrived_rows
            window = self.governor.tick(rows - last_rows, self.batcher.queued_rows, alarm=alarm)
            last_rows = rows
            self._export(window)
            for slot, name in self.governor.reprobe_due():
                self.governor.probe_later(self.batcher, slot, name)

    def _export(self, window: dict) -> None:
        m, labels = self.metrics, self.labels
        for dev, d in window["devices"].items():
            if d["energy_j"] is not None and m.counts_windows(dev, self):
                m.add("inferx_energy_joules_total", (dev,), d["energy_j"])
            if d["watts"] is not None:
                m.set("inferx_power_watts", (dev,), d["watts"])
            m.set("inferx_device_busy_ratio", (dev,), d["busy_fraction"])
        if window["j_per_frame"] is not None:
            m.set("inferx_joules_per_inference", labels, window["j_per_frame"])
        m.set("inferx_arrival_rate", labels, window["arrival_fps"])
        gov = self.governor
        for p in gov.points:
            m.set("inferx_governor_variant", (*labels, p), 1.0 if p == gov.current else 0.0)
        m.put("inferx_governor_switches_total", labels, gov.switches)
        m.put("inferx_governor_probe_seconds_total", labels, gov.probe_s_total)

    def submit(self, arrays: dict, on_done: Callable):
        ordered, rows = self.signature.check(
            arrays, self.options.batch.allow_nonfinite, self.options.batch.max_request_rows
        )
        return self.batcher.submit(ordered, rows, on_done)

    def drain(self, timeout_s: float | None = None) -> bool:
        """Finish accepted requests, then unload (engines closed, metrics of this version retired)."""
        self.state = "draining"
        self.metrics.set("inferx_model_ready", self.labels, 0)
        ok = self.batcher.drain(timeout_s)
        self._stop.set()
        self._wake.set()
        self._thread.join(5)
        for e in self.engines:
            e.close()
        for s in self.slots:
            if s.telemetry is not None:
                try:
                    s.telemetry.close()
                except Exception:  # noqa: BLE001
                    pass
        self.state = "unloaded"
        self.metrics.release_energy(self)
        self.metrics.forget(*self.labels)
        return ok


def _energy_counter(backend):
    """A reader of the backend's cumulative energy counter (NVML has one), or None."""
    try:
        if backend.read().energy_j is None:
            return None
    except Exception:  # noqa: BLE001
        return None

    def read() -> float:
        e = backend.read().energy_j
        if e is None:
            raise ValueError("energy counter unavailable")
        return e

    return read


def _empty_window() -> dict:
    return {"requests": 0, "p99_ms": None, "j_per_frame": None, "devices": {}}


class Repository:
    """The served models; a watcher swaps in a deployment's new ``current`` (hot reload): the new
    version loads and takes new requests, the old one drains its accepted requests, then unloads."""

    def __init__(self, sources: dict[str, Source], options: ServeOptions, metrics: ServerMetrics, log=None):
        self.sources = sources
        self.options = options
        self.metrics = metrics
        self._log = log
        self.lock = threading.Lock()
        self.models: dict[str, ModelVersion] = {}
        self.draining: list[ModelVersion] = []
        self._seen: dict[str, tuple[Path, ...]] = {}
        for name, src in sources.items():
            paths = src.resolve()
            self.models[name] = ModelVersion(name, paths, options, metrics, self._logger(name))
            self._seen[name] = paths
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def _logger(self, name: str):
        if self._log is None:
            return None
        return lambda d: self._log({"model": name, **d})

    def get(self, name: str, version: str | None = None) -> ModelVersion | None:
        with self.lock:
            m = self.models.get(name)
            if m is not None and (version is None or m.version == version):
                return m
            if version is not None:
                for d in self.draining:
                    if d.name == name and d.version == version and d.state == "draining":
                        return d
        return None

    def watch(self, interval_s: float = 2.0) -> None:
        self._watcher = threading.Thread(target=self._watch, args=(interval_s,), name="inferx-reload", daemon=True)
        self._watcher.start()

    def _watch(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.reload_once()

    def reload_once(self) -> list[str]:
        """Load every deployment whose ``current`` moved; returns the models reloaded."""
        done = []
        for name, src in self.sources.items():
            if src.deployment is None:
                continue
            try:
                paths = src.resolve()
            except ArtifactError:  # 'current' missing for a moment (or removed): keep serving what runs
                continue
            if paths == self._seen.get(name):
                continue
            self._seen[name] = paths
            try:
                new = ModelVersion(name, paths, self.options, self.metrics, self._logger(name))
            except Exception as exc:  # noqa: BLE001 - a bad release must not take the served one down
                if self._log:
                    self._log({"model": name, "event": "reload failed", "error": str(exc)})
                continue
            with self.lock:
                old = self.models.get(name)
                self.models[name] = new
                if old is not None:
                    self.draining.append(old)
            if old is not None:
                threading.Thread(target=self._retire, args=(old,), daemon=True).start()
            if self._log:
                self._log({"model": name, "event": "reloaded", "version": new.version, "previous": old and old.version})
            done.append(name)
        return done

    def _retire(self, old: ModelVersion) -> None:
        old.drain(self.options.batch.timeout_s + 5)
        with self.lock:
            if old in self.draining:
                self.draining.remove(old)

    def close(self, timeout_s: float | None = None) -> bool:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(5)
        ok = True
        for m in [*self.models.values(), *self.draining]:
            ok = m.drain(timeout_s) and ok
        return ok
