"""Compiling one kernel (a legalized, fused PrimFunc) with a chosen list of dlight rules, as the kernel
benchmarks compare schedules."""

from __future__ import annotations


def compile_with_rules(func, target: str, rules: list, async_copy: bool = False):
    """``func`` scheduled by the first of ``rules`` that takes it and compiled for ``target`` (cubin;
    cp.async where the schedule asks for it only with ``async_copy``, as builds compile), with the
    operator fixes every build applies."""
    import tvm
    from tvm.s_tir import dlight as dl

    from inferx_edge.compiler.compile import pass_config, resolve_tvm_target
    from inferx_edge.compiler.cuda import device_compiler
    from inferx_edge.compiler.tvm_ops import tvm_op_fixes
    from inferx_edge.targets import get_target

    tvm_op_fixes()
    spec = get_target(target)
    tvm_target = resolve_tvm_target(spec)
    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    with tvm_target:
        mod = dl.ApplyDefaultSchedule(*rules)(mod)
    with device_compiler(spec, "cubin"), tvm_target, pass_config(async_copy=async_copy):
        return tvm.compile(mod, target=tvm_target)
