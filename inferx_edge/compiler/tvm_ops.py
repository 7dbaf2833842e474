"""Operator attributes TVM 0.27 lacks, set once per process before anything is scheduled."""

from __future__ import annotations


def vectorizable_nearbyint() -> None:
    """Let TVM vectorize ``nearbyint`` (what Relax ``round`` becomes: the rounding step of every int8
    quantize). It lacks the ``TVectorizable`` attribute that ``round``, ``floor`` and ``exp`` carry, so
    TVM scalarized every loop holding one: each CUDA int8 conv epilogue stored one byte at a time
    (ResNet-50's layer-1 residual convs took twice the time of the same conv writing int32). CUDA
    emits a vector call as one ``nearbyintf`` per lane, LLVM as ``llvm.nearbyint`` on the vector.
    Called by every path that schedules or builds kernels (build, tune and its builder workers), so
    a kernel compiles the same way whichever ran first in the process. Idempotent."""
    import tvm

    op = tvm.ir.Op.get("tirx.nearbyint")
    if not op.get_attr("TVectorizable"):
        op.set_attr("TVectorizable", True)
