"""Import TVM's runtime without its compiler."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path


def cpu_thread_budget() -> int:
    """Physical cores this process may run on: CPUs in its affinity mask, counted once per core
    (Linux ``thread_siblings_list``), capped by a cgroup CPU quota (containers, Kubernetes limits)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return max(1, (os.cpu_count() or 2) // 2)
    cores = set()
    for cpu in cpus:
        try:
            cores.add(Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip())
        except OSError:  # no topology exposed: count CPUs
            cores.add(str(cpu))
    budget = len(cores)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            budget = min(budget, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, budget)


def set_default_cpu_threads() -> str:
    """Give TVM's CPU thread pool one worker per physical core (:func:`cpu_thread_budget`) unless
    ``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS`` is set; returns the setting in words. TVM's own default
    halves the logical CPU count on x86 (it assumes 2-way SMT): on a 2-core host without SMT that left
    one thread (embedded model, tuned: batch 64 2.10 -> 1.04 ms, batch 1 0.052 -> 0.034 ms). TVM reads
    the variable when its pool first runs, so this is called before anything executes on the CPU."""
    for key in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(key):
            return f"{key}={os.environ[key]} (set by the user)"
    os.environ["TVM_NUM_THREADS"] = str(cpu_thread_budget())
    return f"TVM_NUM_THREADS={os.environ['TVM_NUM_THREADS']} (one per physical core)"


def import_tvm_runtime():
    """Return the ``tvm`` module, loaded runtime-only unless a full TVM is already in this process."""
    set_default_cpu_threads()
    if "tvm" not in sys.modules:
        # TVM_USE_RUNTIME_LIB: load libtvm_runtime.so only. TVM_FFI_DISABLE_TORCH_C_DLPACK: tvm_ffi would
        # otherwise import torch when installed (seconds of start-up, and it may try to build an extension).
        settings = {"TVM_USE_RUNTIME_LIB": "1", "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1"}
        previous = {k: os.environ.get(k) for k in settings}
        os.environ.update(settings)
        try:
            import tvm  # noqa: F401
            import tvm.runtime.vm  # noqa: F401
        finally:
            # Only this import is runtime-only: child processes (a build, a tuner) get the full TVM.
            for key, value in previous.items():
                if value is None:
                    del os.environ[key]
                else:
                    os.environ[key] = value
    import tvm
    import tvm.runtime.vm  # noqa: F401

    return tvm


def tvm_lib_dir():
    """The directory holding the loaded ``libtvm_runtime.so`` (and its backend sidecars)."""
    from tvm.base import _LOADED_LIBS

    return Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent


def load_tvm_cuda_library() -> None:
    """Load ``libtvm_runtime_cuda.so`` if it is not loaded yet; raises OSError/RuntimeError if it cannot."""
    from tvm.base import _LOADED_LIBS
    from tvm_ffi.libinfo import load_lib_ctypes

    if "tvm_runtime_cuda" not in _LOADED_LIBS:
        _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
            package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[tvm_lib_dir()], mode="RTLD_LOCAL"
        )


def load_cuda_backend(tvm) -> None:
    """Load TVM's CUDA runtime (``libtvm_runtime_cuda.so``), which runtime-only mode leaves out.

    It links the NVIDIA driver (``libcuda.so.1``) and the CUDA runtime TVM was built with (apache-tvm
    0.27 wheels: ``libcudart.so.13``); when either is missing CUDA artifacts cannot run here.
    """
    from inferx_edge.errors import TargetMismatchError

    try:
        load_tvm_cuda_library()
    except (OSError, RuntimeError) as exc:
        raise TargetMismatchError(
            f"this artifact runs on a CUDA GPU, but TVM's CUDA runtime cannot be loaded here ({exc}): it needs "
            f"the NVIDIA driver (libcuda.so.1) and the CUDA runtime apache-tvm {tvm.__version__} links "
            f"(libcudart.so.13)"
        ) from exc
