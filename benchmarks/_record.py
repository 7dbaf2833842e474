"""Benchmark result records: one JSON per run with command, device, versions and every number."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: import names of distributions whose name differs
_MODULES = {"apache-tvm": "tvm", "nvidia-ml-py": "pynvml"}


def versions(*packages: str) -> dict[str, str]:
    """Installed versions; a package importable without distribution metadata (on the path from a
    source tree or an unpacked bundle) reports its ``__version__``, marked "(no metadata)"."""
    import importlib

    out = {"python": platform.python_version()}
    for p in packages:
        try:
            out[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            try:
                v = importlib.import_module(_MODULES.get(p, p.replace("-", "_"))).__version__
                out[p] = f"{v} (no metadata)"
            except (ImportError, AttributeError):
                out[p] = "not installed"
    return out


def gpu_driver() -> str | None:
    """The NVIDIA driver version from NVML, or None without NVML (the record then says so)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # no NVML / no driver
        return None


#: version of the record layout: 1 = command, date, host, git_commit, git_dirty, then the benchmark's own keys
SCHEMA_VERSION = 1


def git_commit() -> tuple[str | None, bool | None]:
    """The checkout's commit and whether its tracked files differ from it (None, None outside git).
    In a tree parked for the GPU host (``scripts/park_for_device.sh``), the commit parking recorded:
    the host's copy of ``.git`` need not follow the checkout, and parking itself deletes tracked
    folders."""
    root = Path(__file__).resolve().parent.parent
    parked = RESULTS / ".parked_commit"
    if parked.is_file():
        commit, _, state = parked.read_text().strip().partition(" ")
        return commit, state != "clean"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "-uno"], cwd=root, capture_output=True, text=True, timeout=10
        )
        return commit, bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None, None


def write_record(name: str, record: dict) -> Path:
    """Write ``results/<name>.json`` with the command line, the machine and the git commit filled in."""
    commit, dirty = git_commit()
    body = {
        "schema_version": SCHEMA_VERSION,
        "git_commit": commit,
        "git_dirty": dirty,
        "command": " ".join(["python", *sys.argv]),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"cpu": cpu_name(), "cores": os.cpu_count(), "machine": platform.machine()},
        **record,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


def write_gpu_record(name: str, record: dict) -> Path:
    """:func:`write_record` with the GPU's name (CUDA device 0), its driver and the TVM, torch and
    inferx_edge versions added: the kernel benchmarks' records."""
    import torch

    device = {"device": torch.cuda.get_device_name(0), "driver": gpu_driver()}
    return write_record(name, {**device, "versions": versions("apache-tvm", "torch", "inferx_edge"), **record})


def run_models(names: list[str], measure, name: str, record: dict) -> Path:
    """``measure(model) -> rows`` for each model in turn (an exception becomes that model's error row and
    the others still run); ``results/<name>.json`` (``record`` + ``results``) is rewritten after each."""
    results: list[dict] = []
    path = None
    for model in names:
        try:
            results += measure(model)
        except Exception as exc:  # recorded; the other models still run
            results.append({"model": model, "error": f"{type(exc).__name__}: {exc}"[:600]})
        print(json.dumps(results[-1]), flush=True)
        path = write_record(name, {**record, "results": results})
    return path
