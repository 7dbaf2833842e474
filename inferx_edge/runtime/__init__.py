"""On-device runtime: loads an artifact and runs it with the TVM *runtime* only.

Imports nothing of the compiler: ``tvm`` is loaded with ``TVM_USE_RUNTIME_LIB=1`` (libtvm_runtime.so,
no libtvm_compiler.so, no ``tvm.relax``) unless the process already imported the full TVM, as a host
that builds and then runs does. A device needs numpy, apache-tvm(-ffi) and this package.
"""

from inferx_edge.runtime.engine import Engine, LatencyStats

__all__ = ["Engine", "LatencyStats"]
