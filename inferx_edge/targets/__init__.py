"""Target registry: what each supported device is and how to compile for it (no TVM import here)."""

from inferx_edge.targets.registry import (
    TARGETS,
    PowerMode,
    TargetSpec,
    get_target,
    host_target_name,
)

__all__ = ["TARGETS", "PowerMode", "TargetSpec", "get_target", "host_target_name"]
