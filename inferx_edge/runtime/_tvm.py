"""Import TVM's runtime without its compiler."""

from __future__ import annotations

import os
import sys


def import_tvm_runtime():
    """Return the ``tvm`` module, loaded runtime-only unless a full TVM is already in this process."""
    if "tvm" not in sys.modules:
        previous = os.environ.get("TVM_USE_RUNTIME_LIB")
        os.environ["TVM_USE_RUNTIME_LIB"] = "1"
        try:
            import tvm  # noqa: F401
            import tvm.runtime.vm  # noqa: F401
        finally:
            # Only this import is runtime-only: child processes (a build, a tuner) get the full TVM.
            if previous is None:
                del os.environ["TVM_USE_RUNTIME_LIB"]
            else:
                os.environ["TVM_USE_RUNTIME_LIB"] = previous
    import tvm
    import tvm.runtime.vm  # noqa: F401

    return tvm
