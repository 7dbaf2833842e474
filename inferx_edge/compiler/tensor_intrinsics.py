"""Import ``tvm.s_tir.tensor_intrin`` in seconds instead of a minute.

Each TVMScript ``prim_func`` decorator calls ``inspect.stack()``; during an import the stack holds
``<frozen importlib...>`` frames, and for each of them ``inspect.getmodule`` scans all of
``sys.modules`` (24 M ``hasattr`` calls for the whole package, ~60 s on 2 cores). Those frames have no
module, so answering None for ``<...>`` filenames is exact and makes the import ~6x faster.
"""

from __future__ import annotations

import contextlib
import inspect
import sys


@contextlib.contextmanager
def _fast_getmodule():
    original = inspect.getmodule

    def getmodule(obj, _filename=None):
        if _filename is not None and _filename.startswith("<"):
            return None
        return original(obj, _filename)

    inspect.getmodule = getmodule
    try:
        yield
    finally:
        inspect.getmodule = original


def import_tensor_intrinsics() -> None:
    """Register TVM's tensor intrinsics (needed by MetaSchedule's tensor-core and dot-product rules)."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    with _fast_getmodule():
        import tvm.s_tir.tensor_intrin  # noqa: F401
