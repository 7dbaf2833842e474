"""inferx_edge: trained model to tuned, packaged library running on Jetson Orin and datacenter GPUs.

Importing this package is cheap: the compiler (TVM) is imported only by the stages that need it.
"""

__version__ = "0.1.0"

from inferx_edge import _tvm_ffi_import

_tvm_ffi_import.install()  # TVM loads 2-3 s faster: see the module
