"""Import TVM's runtime without its compiler."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from inferx_edge.errors import ArtifactError
from inferx_edge.runtime.compat import driver_cuda_version


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
        # TVM_USE_RUNTIME_LIB: load libtvm_runtime.so only. TVM_FFI_DISABLE_TORCH_C_DLPACK: no torch DLPack
        # extension (tvm_ffi builds one on first use where torch is loaded; _tvm_ffi_import keeps torch out).
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


#: CUDA runtime major the apache-tvm wheel's libtvm_runtime_cuda.so links (0.27 wheels: libcudart.so.13)
WHEEL_CUDART_MAJOR = 13
#: a libtvm_runtime_cuda.so to use instead of the wheel's ("wheel": always the wheel's)
CUDA_RUNTIME_ENV = "INFERX_CUDA_RUNTIME"
#: directory searched for ``<arch>/libtvm_runtime_cuda.so`` built for CUDA 12 (deploy installs it there)
CUDA_RUNTIME_DIR_ENV = "INFERX_CUDA_RUNTIME_DIR"

#: which CUDA runtime library this process loaded and why (None until a CUDA backend is loaded)
cuda_runtime_choice: dict | None = None


def cuda_runtime_dirs(near: Path | None = None) -> list[Path]:
    """Where a CUDA 12 ``<arch>/libtvm_runtime_cuda.so`` is looked for: ``$INFERX_CUDA_RUNTIME_DIR``, the
    deployment the artifact ``near`` belongs to (``deploy`` installs it as ``ROOT/cuda12-runtime``),
    then ``~/.local/share/inferx_edge/cuda12-runtime``."""
    dirs = []
    if os.environ.get(CUDA_RUNTIME_DIR_ENV):
        dirs.append(Path(os.environ[CUDA_RUNTIME_DIR_ENV]))
    if near is not None:
        release = Path(near).resolve().parent  # ROOT/releases/x.ixa (current resolved) or ROOT/x.ixa
        dirs += [release.parent / "cuda12-runtime", release / "cuda12-runtime"]
    dirs.append(
        Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "inferx_edge" / "cuda12-runtime"
    )
    return dirs


def installed_cudart_major() -> int:
    """The CUDA runtime major the installed TVM's ``libtvm_runtime_cuda.so`` links: the apache-tvm
    wheel's links ``libcudart.so.13``; a TVM built on a Jetson against JetPack's CUDA links 12."""
    from inferx_edge.package.elf import cudart_major

    try:
        return cudart_major(tvm_lib_dir() / "libtvm_runtime_cuda.so") or WHEEL_CUDART_MAJOR
    except (OSError, KeyError, ArtifactError):
        return WHEEL_CUDART_MAJOR


def choose_cuda_runtime(near: Path | None = None, trust=None) -> dict:
    """Which ``libtvm_runtime_cuda.so`` to load: ``{"path": None (the installed TVM's) or a Path, "why": ...}``.

    ``INFERX_CUDA_RUNTIME=PATH`` (or ``wheel``) decides; otherwise the installed TVM's library when its
    CUDA runtime major is at most the driver's (a device whose TVM already works is left alone), else
    the CUDA 12 build found under :func:`cuda_runtime_dirs`; its absence is an error saying how to get
    it. A chosen CUDA 12 build is checked first (:func:`verify_cuda_runtime`, with ``trust``)."""
    from inferx_edge.errors import TargetMismatchError

    forced = os.environ.get(CUDA_RUNTIME_ENV)
    if forced == "wheel":
        return {"path": None, "why": f"the installed TVM's ({CUDA_RUNTIME_ENV}=wheel)"}
    driver = driver_cuda_version()
    if forced:
        path = Path(forced)
        if not path.is_file():
            raise TargetMismatchError(f"{CUDA_RUNTIME_ENV}={forced}: no such file")
        return {"path": path, "why": f"{CUDA_RUNTIME_ENV}", **verify_cuda_runtime(path, driver, trust)}
    installed = installed_cudart_major()
    if driver is None or driver[0] >= installed:
        why = f"the installed TVM's (libcudart.so.{installed}" + (f", driver CUDA {_v(driver)})" if driver else ")")
        return {"path": None, "why": why}
    arch = os.uname().machine
    for d in cuda_runtime_dirs(near):
        candidate = d / arch / "libtvm_runtime_cuda.so"
        if candidate.is_file():
            return {
                "path": candidate,
                "why": f"driver CUDA {_v(driver)} is older than the installed TVM's CUDA {installed}",
                **verify_cuda_runtime(candidate, driver, trust),
            }
    raise TargetMismatchError(
        f"this device's driver supports CUDA {_v(driver)}, but TVM's CUDA runtime installed here needs CUDA "
        f"{installed} (libcudart.so.{installed}); install the CUDA 12 runtime "
        f"(deploy installs it with the artifact; or python -m inferx_edge cuda-runtime --arch {arch} on a build "
        f"host, then copy <out>/{arch}/ to {cuda_runtime_dirs()[-1]}/{arch}/; or set {CUDA_RUNTIME_ENV}=PATH)"
    )


def verify_cuda_runtime(lib: Path, driver: tuple[int, int] | None, trust=None) -> dict:
    """Check a CUDA 12 build of ``libtvm_runtime_cuda.so`` before it is loaded; returns what was checked.

    - its CPU architecture is this machine's, and its CUDA runtime major is at most the driver's;
    - when its ``build.json`` is beside it, the library's sha256 matches the one recorded there;
    - with a trust store (``trust``: a ``.pub`` file or directory, None for the default store, False for
      none) ``build.json`` must be signed (``build.json.sig``) by a trusted key: a device that refuses
      unsigned artifacts refuses unsigned native code too.
    Any failure is a :class:`~inferx_edge.errors.TargetMismatchError` (exit 5) naming it."""
    from inferx_edge.errors import TargetMismatchError
    from inferx_edge.package.elf import cudart_major, elf_machine
    from inferx_edge.package.native import check_library_record

    try:
        machine = elf_machine(lib)
        major = cudart_major(lib)
    except (OSError, ArtifactError) as exc:
        raise TargetMismatchError(f"CUDA runtime {lib} is not a usable library: {exc}") from exc
    if machine != os.uname().machine:
        raise TargetMismatchError(f"CUDA runtime {lib} is built for {machine}, this machine is {os.uname().machine}")
    if major is None:
        raise TargetMismatchError(f"CUDA runtime {lib} does not link a CUDA runtime (libcudart.so.N): not TVM's")
    if driver is not None and major > driver[0]:
        raise TargetMismatchError(
            f"CUDA runtime {lib} links libcudart.so.{major}, but this device's driver supports CUDA {_v(driver)}; "
            f"use a build against CUDA {driver[0]} (python -m inferx_edge cuda-runtime)"
        )
    try:
        return {"cudart_major": major, **check_library_record(lib, trust)}
    except ArtifactError as exc:
        raise TargetMismatchError(f"CUDA runtime refused: {exc}") from exc


def _v(version: tuple[int, int] | None) -> str:
    return "?" if version is None else f"{version[0]}.{version[1]}"


def _preload_cudart12(plugin: Path) -> str:
    """Load ``libcudart.so.12`` globally before the plugin: next to it, the system's, or PyPI's wheel."""
    import ctypes

    candidates = [plugin.parent / "libcudart.so.12", "libcudart.so.12"]
    try:
        import nvidia.cuda_runtime

        candidates.append(Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib" / "libcudart.so.12")
    except ImportError:
        pass
    errors = []
    for c in candidates:
        if isinstance(c, Path) and not c.exists():
            continue
        try:
            ctypes.CDLL(str(c), mode=ctypes.RTLD_GLOBAL)
            return str(c)
        except OSError as exc:
            errors.append(str(exc))
    raise OSError(f"libcudart.so.12 not found (JetPack's CUDA, or pip install nvidia-cuda-runtime-cu12): {errors}")


def load_tvm_cuda_library(choice: dict | None = None) -> None:
    """Load ``libtvm_runtime_cuda.so`` if it is not loaded yet: the wheel's, or the library ``choice``
    (from :func:`choose_cuda_runtime`) names; raises OSError/RuntimeError if it cannot. A build loads the
    wheel's for code generation whatever the driver: only running artifacts needs a matching CUDA."""
    import ctypes

    global cuda_runtime_choice
    from tvm.base import _LOADED_LIBS
    from tvm_ffi.libinfo import load_lib_ctypes

    if "tvm_runtime_cuda" in _LOADED_LIBS:
        return
    choice = choice or {"path": None, "why": "the wheel's"}
    if choice["path"] is None:
        _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
            package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[tvm_lib_dir()], mode="RTLD_LOCAL"
        )
        choice["library"] = str(tvm_lib_dir() / "libtvm_runtime_cuda.so")
    else:
        choice["cudart"] = _preload_cudart12(choice["path"])
        _LOADED_LIBS["tvm_runtime_cuda"] = ctypes.CDLL(str(choice["path"]), mode=ctypes.RTLD_LOCAL)
        choice["library"] = str(choice["path"])
    cuda_runtime_choice = choice


def load_cuda_backend(tvm, near: Path | None = None, trust=None) -> None:
    """Load TVM's CUDA runtime (``libtvm_runtime_cuda.so``), which runtime-only mode leaves out.

    It links the NVIDIA driver (``libcuda.so.1``) and a CUDA runtime: the wheel's links
    ``libcudart.so.13``; on a CUDA 12 driver (JetPack 6) the CUDA 12 build is chosen
    (:func:`choose_cuda_runtime`). When either is missing CUDA artifacts cannot run here.
    """
    from inferx_edge.errors import TargetMismatchError

    try:
        load_tvm_cuda_library(choose_cuda_runtime(near, trust))
    except TargetMismatchError:
        raise
    except (OSError, RuntimeError) as exc:
        raise TargetMismatchError(
            f"this artifact runs on a CUDA GPU, but TVM's CUDA runtime cannot be loaded here ({exc}): it needs "
            f"the NVIDIA driver (libcuda.so.1) and the CUDA runtime it was built for (the apache-tvm "
            f"{tvm.__version__} wheel's: libcudart.so.{WHEEL_CUDART_MAJOR}; the CUDA 12 build: libcudart.so.12)"
        ) from exc
