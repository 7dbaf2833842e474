"""inferx_edge: trained model to tuned, packaged library running on Jetson Orin and datacenter GPUs.

Importing this package is cheap: the compiler (TVM) is imported only by the stages that need it.
"""

__version__ = "0.1.0"
