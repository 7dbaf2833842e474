"""Import TVM's runtime without its compiler."""

from __future__ import annotations

import os
import sys


def import_tvm_runtime():
    """Return the ``tvm`` module, loaded runtime-only unless a full TVM is already in this process."""
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
    from pathlib import Path

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
