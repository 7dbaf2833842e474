"""Checking GPU schedules without a GPU: a scheduled kernel runs on the CPU with its thread loops made
serial (the same iterations, shared and per-thread buffers included) and is compared with its
unscheduled kernel on random inputs. This checks what a schedule computes, not how a GPU runs it
(races, missing barriers and tensor-core intrinsics are out of its reach: kernels using mma are
skipped). The sm_90a wgmma rewrite's epilogues are checked with a plain-loop GEMM in place of the wgmma
main loop (:func:`check_wgmma_epilogues`)."""

from __future__ import annotations

import re

import numpy as np

_THREAD_LOOP = re.compile(r'T\.thread_binding\(([^,]+), thread="[^"]+"\)')
_TENSOR_CORES = re.compile(r"tvm_mma_sync|ptx_mma|ptx_legacy\.mma\(|mma_sync|ptx_ldmatrix|T\.ptx_")


def run_serially_on_cpu(func, *arrays) -> list[np.ndarray]:
    """Run a GPU-scheduled PrimFunc on the CPU with its thread loops made serial. ``arrays``: every
    parameter, outputs last; returns all of them after the call."""
    import tvm

    return _run_on_cpu(tvm.script.from_source(_THREAD_LOOP.sub(r"T.serial(\1)", func.script())), arrays)


def _run_on_cpu(func, arrays) -> list[np.ndarray]:
    """``func`` compiled for this CPU and called on copies of ``arrays`` (every parameter); all of them
    after the call."""
    import tvm

    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), "llvm")
    args = [tvm.runtime.tensor(a) for a in arrays]
    lib["main"](*args)
    return [a.numpy() for a in args]


def _random(shape: list[int], dtype: str, rng) -> np.ndarray:
    if dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100) + 1, shape).astype(dtype)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    return rng.standard_normal(shape).astype(dtype)


def _arguments(func, seed: int):
    """``(params, the ones it writes, arrays)``: seeded random inputs and zeroed outputs for ``func``."""
    script = func.script()
    params = list(func.params)
    written = [p for p in params if f"T.writes({p.name}[" in script or f"T.writes({p.name})" in script]
    rng = np.random.default_rng(seed)
    arrays = [
        np.zeros([int(d) for d in p.shape], str(p.dtype))
        if p in written
        else _random([int(d) for d in p.shape], str(p.dtype), rng)
        for p in params
    ]
    return params, written, arrays


def check_kernel(unscheduled, scheduled, seed: int = 0) -> float:
    """The largest difference between ``scheduled`` (run serially on the CPU) and ``unscheduled``
    (compiled for the CPU as is) on the same random inputs, relative to the largest output magnitude
    (at least 1); the outputs are the parameters the kernel writes. Integer outputs (quantized
    activations) may differ by one unit: a float sum the schedule reassociates can round either way."""
    params, written, arrays = _arguments(unscheduled, seed)
    got = run_serially_on_cpu(scheduled, *arrays)
    # a float sum reassociated by the schedule may round to the neighbouring integer
    return _worst_difference(params, written, got, _run_on_cpu(unscheduled, arrays), integer_slack=1.0)


def _worst_difference(params, written, got, want, integer_slack: float = 0.0) -> float:
    """The largest difference over the written parameters, relative to each one's largest expected
    magnitude (at least 1); integer outputs may differ by ``integer_slack`` for free."""
    worst = 0.0
    for i, p in enumerate(params):
        if p in written:
            expected = want[i].astype(np.float64)
            diff = float(np.abs(got[i].astype(np.float64) - expected).max())
            if str(p.dtype).startswith(("int", "uint")):
                diff = max(0.0, diff - integer_slack)
            worst = max(worst, diff / max(1.0, float(np.abs(expected).max())))
    return worst


def check_module(unscheduled_mod, scheduled_mod, max_elements: int = 1 << 24, only: str | None = None):
    """Yield ``(kernel, rule, relative difference or None, why skipped)`` for every PrimFunc scheduled
    in ``scheduled_mod`` that ``unscheduled_mod`` has under the same name."""
    import tvm

    from inferx_edge.compiler.guarded_schedule import schedule_rule

    for gv, func in scheduled_mod.functions_items():
        name = gv.name_hint
        if not isinstance(func, tvm.tirx.PrimFunc) or (only and only not in name):
            continue
        try:
            plain = unscheduled_mod[name]
        except (KeyError, ValueError, tvm.error.TVMError):
            continue
        rule = schedule_rule(func)
        if _TENSOR_CORES.search(func.script()):
            yield name, rule, None, "tensor cores (not runnable on a CPU)"
            continue
        shapes = [[int(d) for d in p.shape] for p in plain.params if hasattr(p, "shape")]
        if sum(int(np.prod(s)) for s in shapes) > max_elements:
            yield name, rule, None, f"over {max_elements} elements"
            continue
        try:
            diff = check_kernel(plain, func)
        except Exception as exc:  # noqa: BLE001 - e.g. a scope the CPU codegen has no device for
            lines = str(exc).strip().splitlines()
            yield name, rule, None, f"not runnable on a CPU: {type(exc).__name__}: {lines[-1] if lines else ''}"[:160]
            continue
        yield name, rule, diff, None


def check_wgmma_epilogues(unscheduled_mod, max_macs: int = 1 << 31, only: str | None = None):
    """Yield ``(kernel, relative difference or None, why skipped)`` for every kernel of
    ``unscheduled_mod`` the sm_90a wgmma rewrite takes (at any size: the SM-count gate aside, so a
    batch-1 module checks what a batch-64 build rewrites): the rewritten kernel with a plain-loop GEMM
    in place of wgmma's main loop (:func:`~inferx_edge.compiler.cuda.wgmma_epilogue.loop_body`) against
    the kernel as fused, on the same random inputs, on this CPU. What it checks is the epilogue the
    rewrite evaluates on the accumulator; the main loop itself needs the GPU."""
    import tvm

    from inferx_edge.compiler.cuda.device_compiler import CudaOptions
    from inferx_edge.compiler.cuda.rules.wgmma_matmul import rule_tile
    from inferx_edge.compiler.cuda.wgmma_epilogue import loop_body, wgmma_kernel_for

    tile = rule_tile(CudaOptions.from_env())
    for gv, func in unscheduled_mod.functions_items():
        name = gv.name_hint
        if not isinstance(func, tvm.tirx.PrimFunc) or (only and only not in name):
            continue
        sizes = {}

        def body(shape, a, b, store, sizes=sizes):
            sizes["macs"] = shape.m * shape.n * shape.k
            return loop_body(shape, a, b, store)

        rewritten, _why = wgmma_kernel_for(func, body=body, **tile)
        if rewritten is None:
            continue
        if sizes["macs"] > max_macs:
            yield name, None, f"{sizes['macs']:.2e} multiply-adds, over {max_macs:.2e}"
            continue
        yield name, _compare_on_cpu(func, rewritten.without_attr("tirx.is_scheduled")), None


def _compare_on_cpu(reference, candidate, seed: int = 0) -> float:
    """The largest difference between two kernels of the same parameters compiled for this CPU, on the
    same random inputs, relative to the largest output magnitude (at least 1)."""
    params, written, arrays = _arguments(reference, seed)
    return _worst_difference(params, written, _run_on_cpu(candidate, arrays), _run_on_cpu(reference, arrays))
