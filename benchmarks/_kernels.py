"""Compiling one kernel (a legalized, fused PrimFunc) with a chosen list of dlight rules, as the kernel
benchmarks compare schedules."""

from __future__ import annotations

from contextlib import contextmanager

#: how int8 variants' short float depthwise/grouped sums may accumulate (:func:`depthwise_sums`)
DEPTHWISE_SUMS = ("fp16", "fp32")


@contextmanager
def depthwise_sums(dtype: str):
    """Within: int8 variants' short float depthwise/grouped sums accumulate in ``dtype`` -- "fp16" (as
    build does, :data:`~inferx_edge.compiler.passes.fp16_depthwise.HALF_ACCUMULATION_MAX`) or "fp32"."""
    import importlib

    if dtype not in DEPTHWISE_SUMS:
        raise ValueError(f"depthwise sums {dtype!r}; valid: {', '.join(DEPTHWISE_SUMS)}")
    module = importlib.import_module("inferx_edge.compiler.passes.fp16_depthwise")
    default = module.HALF_ACCUMULATION_MAX
    module.HALF_ACCUMULATION_MAX = default if dtype == "fp16" else 0
    try:
        yield
    finally:
        module.HALF_ACCUMULATION_MAX = default


def compile_with_rules(func, target: str, rules: list, async_copy: bool = False):
    """``func`` scheduled by the first of ``rules`` that takes it and compiled for ``target`` (cubin;
    cp.async where the schedule asks for it only with ``async_copy``, as builds compile), with the
    operator fixes every build applies."""
    import tvm
    from tvm.s_tir import dlight as dl

    from inferx_edge.compiler.compile import compile_kernel, resolve_tvm_target
    from inferx_edge.compiler.tvm_ops import tvm_op_fixes
    from inferx_edge.targets import get_target

    tvm_op_fixes()
    spec = get_target(target)
    tvm_target = resolve_tvm_target(spec)
    with tvm_target:
        mod = dl.ApplyDefaultSchedule(*rules)(tvm.IRModule({"main": func}))
    return compile_kernel(mod["main"], spec, tvm_target, async_copy=async_copy)


def check_and_time(lib, dev, inputs: list, outputs: list, refs: list) -> tuple[float, float]:
    """Run ``lib``'s ``main`` once on device tensors ``inputs`` into ``outputs``: (the largest absolute
    error against the numpy references ``refs``, the median of 5 x 20 timed calls in microseconds)."""
    import numpy as np

    lib["main"](*inputs, *outputs)
    err = max(float(np.abs(o.numpy().astype(np.float64) - r).max()) for o, r in zip(outputs, refs))
    timer = lib.mod.time_evaluator("main", dev, number=20, repeat=5, min_repeat_ms=50)
    return err, float(np.median(timer(*inputs, *outputs).results)) * 1e6


def add_speed(row: dict, schedules: tuple, moved: int) -> dict:
    """``row`` (timed ``"<schedule> us"`` per schedule, the first the new one) with the bytes moved, the
    first schedule's GB/s and its speedup over the second."""
    row["bytes moved"] = int(moved)
    row[f"GB/s {schedules[0]}"] = moved / row[f"{schedules[0]} us"] / 1e3
    row["speedup"] = row[f"{schedules[1]} us"] / row[f"{schedules[0]} us"]
    return row


def compare_schedules(
    row: dict, schedules: tuple, compile_one, dev, host: list, refs: list, out_dtype: str = "float32"
):
    """``row`` with each schedule's ``"<schedule> max abs error"`` and ``"<schedule> us"``
    (:func:`check_and_time` of ``compile_one(schedule)`` on the numpy inputs ``host``, outputs of
    ``out_dtype`` shaped like the float64 references ``refs``), then :func:`add_speed` with the inputs'
    and outputs' bytes: the first schedule is the new one."""
    import numpy as np
    import tvm

    inputs = [tvm.runtime.tensor(a, dev) for a in host]
    zeros = [np.zeros(r.shape, out_dtype) for r in refs]
    outputs = [tvm.runtime.tensor(z, dev) for z in zeros]
    for schedule in schedules:
        err, us = check_and_time(compile_one(schedule), dev, inputs, outputs, refs)
        row[f"{schedule} max abs error"], row[f"{schedule} us"] = err, us
    return add_speed(row, schedules, sum(a.nbytes for a in host) + sum(z.nbytes for z in zeros))
