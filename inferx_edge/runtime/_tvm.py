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
