"""Engine: a verified artifact loaded onto a device, ready to run any of its variants."""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferx_edge.errors import ArtifactError, InputError
from inferx_edge.package import ExtractedArtifact, Manifest, TensorSpec, Variant, open_artifact
from inferx_edge.runtime import compat
from inferx_edge.runtime._tvm import import_tvm_runtime, load_cuda_backend


@dataclass(frozen=True)
class LatencyStats:
    """Wall-clock latency of repeated synchronous runs, in milliseconds."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    min_ms: float
    max_ms: float

    @classmethod
    def from_seconds(cls, samples: list[float]) -> LatencyStats:
        ms = np.asarray(samples, dtype=np.float64) * 1e3
        p50, p90, p99 = np.percentile(ms, [50, 90, 99])
        return cls(len(ms), float(ms.mean()), float(p50), float(p90), float(p99), float(ms.min()), float(ms.max()))

    def line(self) -> str:
        return (
            f"latency over {self.count} runs: p50 {self.p50_ms:.3f} ms, p90 {self.p90_ms:.3f} ms, "
            f"p99 {self.p99_ms:.3f} ms, mean {self.mean_ms:.3f} ms, min {self.min_ms:.3f} ms"
        )


def open_device(tvm, extracted: ExtractedArtifact, variant: str | None, device_id: int, path: Path, trust):
    """Check that the artifact belongs on this machine (TVM version; for CUDA artifacts the host code,
    the CUDA runtime and the GPU) and return the TVM device its variants run on."""
    manifest = extracted.manifest
    compat.check_tvm_version(manifest.tvm_version, tvm.__version__)
    target = manifest.target
    if target["device"] != "cuda":
        return tvm.cpu(0)
    compat.check_host(target, extracted.member(manifest.variant(variant).library))
    load_cuda_backend(tvm, near=path, trust=trust)
    compat.check_cuda_device(tvm, target, device_id)
    return tvm.cuda(device_id)


class LoadedVariant:
    """One variant's library on ``device`` as a Relax VM, with its weights in ``params`` order;
    ``main`` is its entry function (None: the caller picks functions from ``vm``)."""

    def __init__(self, tvm, variant: Variant, extracted: ExtractedArtifact, device, entry: str | None = "main") -> None:
        self.variant = variant
        library = extracted.member(variant.library)
        compat.check_host(extracted.manifest.target, library)
        try:
            self.module = tvm.runtime.load_module(str(library))
            self.vm = tvm.runtime.vm.VirtualMachine(self.module, device)
        except Exception as exc:  # a TVM error here means a library this runtime cannot load
            raise ArtifactError(f"cannot load library of variant '{variant.name}': {exc}") from exc
        self.main = self.vm[entry] if entry else None
        self.params = []
        if variant.weights:
            with np.load(extracted.member(variant.weights), allow_pickle=False) as npz:
                missing = [p for p in variant.params if p not in npz.files]
                if missing:
                    raise ArtifactError(f"weights of variant '{variant.name}' lack {missing[:5]}")
                self.params = [tvm.runtime.tensor(npz[p], device) for p in variant.params]


def time_calls(call, sync, warmup: int = 5, repeat: int = 50, min_seconds: float = 0.0) -> LatencyStats:
    """Time ``call`` followed by ``sync`` (wait for the device): ``warmup`` untimed calls, then at least
    ``repeat`` timed ones, more until ``min_seconds`` have passed."""
    for _ in range(warmup):
        call()
    sync()
    samples: list[float] = []
    start = time.perf_counter()
    while len(samples) < repeat or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        call()
        sync()
        samples.append(time.perf_counter() - t0)
    return LatencyStats.from_seconds(samples)


class Engine:
    """Load an artifact, check it belongs on this machine, and run it.

    Parameters
    ----------
    path : the artifact file.
    variant : which variant to make current (default: the manifest's default).
    device_id : GPU index for CUDA artifacts.
    preload : load every variant now (switching is then free) instead of on first use.
    trust : trust store (a ``.pub`` file or a directory of them); default ``$INFERX_TRUST_DIR`` or
        ``~/.config/inferx_edge/trusted/`` when it exists, False for none. With a trust store an
        unsigned or wrongly signed artifact is refused before anything is extracted or loaded.
    allow_nonfinite : accept NaN/Inf in float inputs (by default :meth:`run` refuses them: a network
        turns them into confident-looking outputs).

    An Engine may be shared between threads: :meth:`run`, :meth:`benchmark`, :meth:`select` and
    :meth:`close` are serialized by one lock (a variant's buffers and CUDA graph are not re-entrant), so
    a run always uses one variant from start to end. The extracted artifact is removed by :meth:`close`,
    or when the Engine is garbage-collected or the process exits.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        variant: str | None = None,
        device_id: int = 0,
        preload: bool = False,
        trust=None,
        allow_nonfinite: bool = False,
    ) -> None:
        self._tvm = import_tvm_runtime()
        self.path = Path(path)
        self.allow_nonfinite = allow_nonfinite
        self._lock = threading.RLock()
        self._extracted = open_artifact(self.path, trust=trust)
        self._finalizer = weakref.finalize(self, self._extracted.close)
        try:
            manifest = self._extracted.manifest
            self.device = open_device(self._tvm, self._extracted, variant, device_id, self.path, trust)
            self._loaded: dict[str, LoadedVariant] = {}
            self._current = self._load(manifest.variant(variant).name)
            if preload:
                for v in manifest.variants:
                    self._load(v.name)
        except BaseException:
            self._extracted.close()
            raise

    @property
    def manifest(self) -> Manifest:
        return self._extracted.manifest

    @property
    def variant(self) -> Variant:
        return self._current.variant

    def runtime_lines(self) -> list[str]:
        """What this process loaded to run the artifact: the TVM runtime, and for CUDA artifacts which
        ``libtvm_runtime_cuda.so`` (the wheel's or the CUDA 12 build) and why."""
        from inferx_edge.runtime import _tvm

        mode = "runtime only" if "tvm.relax" not in sys.modules else "with its compiler"
        lines = [f"TVM {self._tvm.__version__} ({mode}) from {_tvm.tvm_lib_dir()}"]
        choice = _tvm.cuda_runtime_choice
        if self.manifest.target["device"] == "cuda" and choice:
            lines.append(f"CUDA runtime {choice['library']}: {choice['why']}")
            if choice.get("cudart"):
                lines.append(f"CUDA 12 runtime library {choice['cudart']}")
        return lines

    @property
    def provenance(self):
        """Who signed the artifact and whether it was verified (:class:`~inferx_edge.package.bundle.Provenance`)."""
        return self._extracted.provenance

    def _load(self, name: str) -> LoadedVariant:
        with self._lock:
            if name not in self._loaded:
                self._loaded[name] = LoadedVariant(self._tvm, self.manifest.variant(name), self._extracted, self.device)
            return self._loaded[name]

    def select(self, name: str) -> Variant:
        """Make ``name`` the variant :meth:`run` uses (loads it on first use). An unknown name is an
        :class:`ArtifactError` listing the variants."""
        with self._lock:
            self._current = self._load(name)
            return self._current.variant

    def check_inputs(self, inputs: np.ndarray | Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """Match ``inputs`` to the current variant's signature; return them in order. Raises InputError."""
        specs = self.variant.inputs
        if not isinstance(inputs, Mapping):
            if len(specs) != 1:
                raise InputError(
                    f"model has {len(specs)} inputs ({', '.join(s.name for s in specs)}); pass them by name"
                )
            inputs = {specs[0].name: inputs}
        unknown = sorted(set(inputs) - {s.name for s in specs})
        missing = [s.name for s in specs if s.name not in inputs]
        if unknown or missing:
            raise InputError(
                f"inputs do not match the model: missing {missing}, unknown {unknown}; expected "
                + ", ".join(s.describe() for s in specs)
            )
        arrays = [_check_one(spec, np.asarray(inputs[spec.name])) for spec in specs]
        if not self.allow_nonfinite:
            for spec, a in zip(specs, arrays):
                check_finite(spec.name, a)
        return arrays

    def run(self, inputs: np.ndarray | Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the current variant once; returns outputs by name as numpy arrays."""
        with self._lock:
            arrays = self.check_inputs(inputs)
            out = self._invoke([self._tvm.runtime.tensor(a, self.device) for a in arrays])
            return self._outputs(out)

    def run_arrays(self, variant: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run ``variant`` on ``arrays`` already matched to its inputs (in order, right dtype and shape,
        finite: a server validates each request before it joins a batch) without making it current;
        returns the outputs in the manifest's order. Loads the variant on first use."""
        with self._lock:
            loaded = self._load(variant)
            out = loaded.main(*[self._tvm.runtime.tensor(a, self.device) for a in arrays], *loaded.params)
            return _results(out, loaded.variant)

    def _invoke(self, tensors: list):
        return self._current.main(*tensors, *self._current.params)

    def _outputs(self, out) -> dict[str, np.ndarray]:
        return {spec.name: r for spec, r in zip(self.variant.outputs, _results(out, self.variant))}

    def benchmark(
        self, inputs: np.ndarray | Mapping[str, np.ndarray], warmup: int = 5, repeat: int = 50, min_seconds: float = 0.0
    ) -> LatencyStats:
        """Time synchronous runs with inputs already on the device: ``warmup`` untimed, then at least
        ``repeat`` timed (more until ``min_seconds`` have passed)."""
        with self._lock:
            tensors = [self._tvm.runtime.tensor(a, self.device) for a in self.check_inputs(inputs)]
            return time_calls(lambda: self._invoke(tensors), self.device.sync, warmup, repeat, min_seconds)

    def close(self) -> None:
        with self._lock:
            self._loaded.clear()
            self._finalizer()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _results(out, variant: Variant) -> list[np.ndarray]:
    """A VM call's result (one tensor or a tuple) as numpy arrays, as many as the manifest lists."""
    results = list(out) if not hasattr(out, "numpy") else [out]
    if len(results) != len(variant.outputs):
        raise ArtifactError(f"library returned {len(results)} outputs, manifest lists {len(variant.outputs)}")
    return [r.numpy() for r in results]


def check_finite(name: str, array: np.ndarray) -> None:
    """Refuse NaN/Inf in a float input, with the count. One sum decides (NaN/Inf anywhere makes it
    non-finite; float32 accumulation is ~2.4x faster than float64 on a 38 MB batch, and a finite input
    whose sum overflows only costs the exact count below); counted only when the sum is not finite."""
    if array.dtype.kind != "f" or array.size == 0:
        return
    if np.isfinite(array.sum(dtype=np.float32 if array.itemsize <= 4 else None)):
        return
    bad = int(np.count_nonzero(~np.isfinite(array)))
    if bad:
        raise InputError(
            f"input '{name}' holds {bad} NaN/Inf value{'s' if bad != 1 else ''} of {array.size}; "
            f"fix the input, or accept it with --allow-nonfinite (Engine(allow_nonfinite=True))"
        )


def _check_one(spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    if str(array.dtype) != spec.dtype:
        raise InputError(
            f"input '{spec.name}' must be {spec.dtype}, got {array.dtype} (convert it, e.g. x.astype('{spec.dtype}'))"
        )
    ok = len(array.shape) == len(spec.shape) and all(d is None or d == s for d, s in zip(spec.shape, array.shape))
    if not ok:
        want = "x".join("?" if d is None else str(d) for d in spec.shape)
        got = "x".join(str(s) for s in array.shape) or "scalar"
        raise InputError(f"input '{spec.name}' must have shape {want}, got {got}")
    return np.asarray(array, order="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
