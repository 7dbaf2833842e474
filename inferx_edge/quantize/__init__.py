"""INT8 quantization: calibration observers and symmetric int8 schemes (``calibration.py``), the Relax
rewrite of conv2d / matmul to int8 x int8 -> int32 compute (``rewrite.py``), per-layer sensitivity and
mixed int8/fp32 precision under an accuracy budget (``mixed.py``), and the plans ``quantize`` writes and
``build`` applies (``driver.py``). QDQ ONNX models are read in ``inferx_edge.frontend.qdq``."""

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
