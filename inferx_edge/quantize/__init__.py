"""INT8 quantization: calibration observers, symmetric int8 schemes, and the Relax rewrite of conv2d /
matmul to int8 x int8 -> int32 compute (``rewrite.py``). Not yet wired into ``build``/``quantize``
commands: see the INT8 issue for what remains (CLI, QDQ import, FP16/mixed budget, GPU int8)."""

from inferx_edge.quantize.calibration import (
    OBSERVERS,
    EntropyObserver,
    MinMaxObserver,
    MSEObserver,
    PercentileObserver,
    check_calibration_batch,
    make_observer,
    quantize_per_channel,
    quantize_per_tensor,
)

__all__ = [
    "OBSERVERS",
    "EntropyObserver",
    "MSEObserver",
    "MinMaxObserver",
    "PercentileObserver",
    "check_calibration_batch",
    "make_observer",
    "quantize_per_channel",
    "quantize_per_tensor",
]
