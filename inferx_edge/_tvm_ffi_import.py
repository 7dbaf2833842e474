"""Keep TVM's import from importing torch as a side effect.

apache-tvm-ffi 0.1.14 (pinned with TVM 0.27) imports torch at the top of its package whenever torch is
installed, to dodge a symbol clash seen only on Windows, and ``tvm.relax`` imports it again for
``BasePyModule`` (PyTorch interop we do not use). That costs 2-3 s in every process that imports TVM
(the CLI, build and tuning workers, RPC servers), most of which never touch torch. While those two
modules execute, this hook makes ``import torch`` fail as if torch were missing; both treat that as
"no torch" and go on. Torch imports normally afterwards.

What TVM then lacks is its torch fast paths (``torch.dtype`` arguments to FFI calls, the DLPack C
exchange API); tensors still cross through the standard ``__dlpack__`` protocol, and the torch.export
frontend works the same (``tests/test_tvm_ffi_import.py``). Where torch is already imported when TVM
loads, nothing changes. A thread that imports torch for the first time at the very moment another one
loads TVM would get the ImportError too; ``INFERX_TVM_FFI_TORCH=1`` switches the hook off. In a
runtime-only process (no ``tvm.relax``) the finder stays on ``sys.meta_path``, answering None.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

#: modules whose top level imports torch only for optional interop
_MODULES = ("tvm_ffi", "tvm.relax.base_py_module")


class _TorchFreeFinder(importlib.abc.MetaPathFinder):
    """Finds each of :data:`_MODULES` through the regular path finder and wraps its loader; leaves
    ``sys.meta_path`` once all were found."""

    def __init__(self):
        self.pending = set(_MODULES)

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        self.pending.discard(name)
        if not self.pending:
            _uninstall()
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            blocked = "torch" not in sys.modules
            if blocked:
                sys.modules["torch"] = None  # `import torch` raises ImportError while this runs
            try:
                run(module)
            finally:
                if blocked and "torch" in sys.modules and sys.modules["torch"] is None:
                    del sys.modules["torch"]

        spec.loader.exec_module = exec_module
        return spec


_FINDER = _TorchFreeFinder()


def _uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install() -> None:
    """Put the hook first on ``sys.meta_path`` unless ``tvm_ffi`` is loaded already or the user asked
    for torch (``INFERX_TVM_FFI_TORCH=1``)."""
    if _MODULES[0] in sys.modules or os.environ.get("INFERX_TVM_FFI_TORCH") == "1" or _FINDER in sys.meta_path:
        return
    sys.meta_path.insert(0, _FINDER)
