"""INT8 quantization: calibration observers and symmetric int8 schemes (Relax rewrites come with the
quantize stage; see the INT8 issue)."""

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
