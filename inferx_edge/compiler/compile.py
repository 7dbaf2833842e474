"""Compiling one variant ahead of time for a target and exporting its shared library.

The Relax VM program itself is compiled to native code (``exec_mode="compiled"``), so a variant is one
self-contained shared library plus a weights file; nothing is compiled on the device. CUDA kernels are
compiled on the build host by the toolkit matching the device (:mod:`inferx_edge.compiler.cuda`).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from inferx_edge.compiler.variant import PreparedVariant
from inferx_edge.errors import BuildError
from inferx_edge.targets import TargetSpec
from inferx_edge.targets.registry import HOST_CPU


def host_mcpu() -> str:
    """What :data:`HOST_CPU` builds for: this x86-64 machine's ISA level (``x86-64-v3``, ``-v4``: every
    CPU of that level runs the code), not its exact microarchitecture (see :mod:`inferx_edge.targets.cpu`)."""
    from inferx_edge.runtime.compat import cpu_flags
    from inferx_edge.targets.cpu import isa_level

    return isa_level(cpu_flags()) if platform.machine() in ("x86_64", "AMD64") else "x86-64-v2"


def resolve_tvm_target(spec: TargetSpec):
    """The ``tvm.target.Target`` for ``spec``, with :data:`HOST_CPU` replaced by this machine's ISA level."""
    import tvm

    def fill(d: dict[str, Any]) -> dict[str, Any]:
        d = dict(d)
        if d.get("mcpu") == HOST_CPU:
            d["mcpu"] = host_mcpu()
            d.setdefault("num-cores", os.cpu_count() or 1)
        if isinstance(d.get("host"), dict):
            d["host"] = fill(d["host"])
        return d

    return tvm.target.Target(fill(spec.tvm_target))


def linker(spec: TargetSpec):
    """``fcompile`` for ``export_library``: the target's cross compiler when the build host differs."""
    if spec.cross_compiler is None or platform.machine() == spec.host_arch:
        return None
    if shutil.which(spec.cross_compiler) is None:
        raise BuildError(
            f"target '{spec.name}' needs the cross compiler '{spec.cross_compiler}', not found on PATH; "
            f"install it (Debian/Ubuntu: apt-get install g++-aarch64-linux-gnu)"
        )
    from tvm.support import cc

    return cc.cross_compiler(spec.cross_compiler)


def cpu_features(target) -> list[str]:
    """The CPU instruction-set extensions the host code of ``target`` may use (/proc/cpuinfo names)."""
    import tvm

    from inferx_edge.targets.cpu import required_features

    host = target.host if target.host is not None else target
    if str(host.kind.name) != "llvm" or "x86_64" not in str(host.attrs.get("mtriple", "x86_64")):
        return []
    return required_features(tvm.target.codegen.llvm_get_cpu_features(host))


def relax_pipeline(spec: TargetSpec, target):
    """The Relax pipeline for ``spec``: ours for CUDA (:mod:`inferx_edge.compiler.cuda.pipeline`) and
    for CPUs (TVM's default with default schedules for untuned kernels, :mod:`inferx_edge.compiler.cpu`)."""
    if not spec.is_cuda:
        from inferx_edge.compiler.cpu import cpu_pipeline

        return cpu_pipeline(target)
    from inferx_edge.compiler.cuda import cuda_pipeline

    return cuda_pipeline(target, sm_count=spec.sm_count)


def pass_config(cuda_graph: bool = False, async_copy: bool = False):
    """The PassContext a variant compiles under. ``async_copy``: shared-memory copies in pipeline stages
    marked asynchronous become ``cp.async`` (CUDA sm_80+; only loops our schedules annotate)."""
    import tvm

    return tvm.transform.PassContext(
        config={"relax.backend.use_cuda_graph": bool(cuda_graph), "tirx.use_async_copy": bool(async_copy)}
    )


def compile_kernel(
    func, spec: TargetSpec, target, cuda_code: str = "cubin", cuda_options=None, async_copy: bool = True
):
    """One scheduled CUDA kernel (a PrimFunc) compiled alone for ``spec`` (TVM ``target``) with the
    device compiler and source patches a build uses, exported as ``main``; cp.async where the
    schedule asks for it only with ``async_copy``."""
    import tvm

    from inferx_edge.compiler.cuda import device_compiler

    one = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
    with device_compiler(spec, cuda_code, cuda_options), target, pass_config(async_copy=async_copy):
        return tvm.compile(one, target=target)


#: Oldest JetPack whose driver supports a given CUDA version (6.0: CUDA 12.2; 6.1/6.2: 12.6; 7: 13.0).
_MIN_JETPACK = {"12.0": "6.0", "12.2": "6.0", "12.6": "6.1", "13.0": "7.0"}


def cuda_requirements(cuda: dict[str, Any]) -> dict[str, Any]:
    """What the device must have for this device code: driver CUDA version, JetPack for Jetsons."""
    version = cuda["toolkit"].split()[-1]
    major = int(version.split(".")[0])
    # cubins load on any driver of the same major version (minor version compatibility); PTX needs a
    # driver at least as new as the compiler that wrote it.
    min_cuda = f"{major}.0" if cuda["code"] == "cubin" else version
    return {
        "cuda_code": cuda["code"],
        "cuda_code_arch": cuda["arch"],
        "cuda_toolkit": cuda["toolkit"],
        "min_driver_cuda": min_cuda,
        "min_jetpack": _MIN_JETPACK.get(min_cuda),
    }


def plain(obj: Any) -> Any:
    """TVM containers (Map, Array, String, IntImm) to JSON-ready Python values."""
    if isinstance(obj, (str, bool, int, float)) or obj is None:
        return obj if not isinstance(obj, str) else str(obj)
    if hasattr(obj, "items"):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) or hasattr(obj, "__len__") and hasattr(obj, "__getitem__"):
        return [plain(v) for v in obj]
    if hasattr(obj, "value"):
        return obj.value
    return str(obj)


def toolchain_versions(spec: TargetSpec) -> dict[str, str]:
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    cxx = spec.cross_compiler if spec.cross_compiler and platform.machine() != spec.host_arch else "g++"
    try:
        versions["cxx"] = subprocess.run(
            [cxx, "--version"], capture_output=True, text=True, timeout=30
        ).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        versions["cxx"] = "unknown"
    return versions


def build_record(spec: TargetSpec, infos: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's ``build`` entry: host, command line, toolchain, total compile time."""
    import sys

    return {
        "host": f"{platform.node()} {platform.machine()}",
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "toolchain": toolchain_versions(spec),
        "compile_s": round(sum(i["compile_s"] for i in infos), 3),
    }


def target_record(spec: TargetSpec, info: dict[str, Any]) -> dict[str, Any]:
    """The manifest's ``target`` entry from the first variant's compile record: the registry entry, the
    resolved TVM target, the CPU features the host code uses, the CUDA driver/JetPack it needs."""
    record = spec.summary() | {"tvm_target": info["tvm_target"]}
    if info["cpu_features"]:
        record["cpu_features"] = info["cpu_features"]
    if info["cuda"]:
        record |= cuda_requirements(info["cuda"])
    return record


def new_manifest(spec: TargetSpec, infos: list[dict[str, Any]], model: dict[str, Any], variants: list) -> Any:
    """The manifest of a build (``files`` are filled in by ``write_artifact``); the first variant is the default."""
    import datetime as _dt

    import tvm

    from inferx_edge import __version__
    from inferx_edge.package import Manifest

    return Manifest(
        inferx_edge_version=__version__,
        tvm_version=tvm.__version__,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        model=model,
        target=target_record(spec, infos[0]),
        variants=tuple(variants),
        default_variant=variants[0].name,
        files={},
        build=build_record(spec, infos),
    )


def export_library(executable, spec: TargetSpec, out_path: Path) -> str:
    """Link ``executable`` into the shared library at ``out_path`` (the target's cross compiler when
    the build host differs); returns the linker used (the cross compiler's name or ``"host"``)."""
    fcompile = linker(spec)
    try:
        if fcompile is None:
            executable.export_library(str(out_path))
        else:
            executable.export_library(str(out_path), fcompile=fcompile)
    except Exception as exc:
        raise BuildError(f"linking the {spec.name} library failed: {exc}") from exc
    return spec.cross_compiler if fcompile is not None else "host"


def compile_variant(
    prepared: PreparedVariant,
    spec: TargetSpec,
    out_path: Path,
    *,
    name: str = "model",
    target=None,
    cuda_code: str = "cubin",
    cuda_graph: bool = True,
    cuda_options=None,
) -> dict[str, Any]:
    """Compile ``prepared.mod`` for ``spec`` and export the shared library to ``out_path``.

    ``target`` is the resolved TVM target (:func:`resolve_tvm_target`; resolved here when None).
    ``cuda_options`` (:class:`~inferx_edge.compiler.cuda.CudaOptions`) picks the device compiler and
    the CUDA source patches; default: from the environment. Returns the build record of the variant.
    """
    from tvm import relax

    from inferx_edge.compiler.cuda import device_compiler
    from inferx_edge.compiler.guarded_schedule import FallbackLog, skip_rules

    target = target or resolve_tvm_target(spec)
    t0 = time.perf_counter()
    cuda_graph = cuda_graph and spec.is_cuda
    skipped: dict[str, set[str]] = {}  # kernel -> rules whose schedule of it failed code generation
    codegen_fallbacks: list[dict[str, str]] = []
    for attempt in range(1 + MAX_CODEGEN_RETRIES):
        cuda_ctx = device_compiler(spec, cuda_code, cuda_options) if spec.is_cuda else contextlib.nullcontext(None)
        try:
            with (
                FallbackLog() as fallbacks,
                skip_rules(skipped),
                cuda_ctx as cuda_record,
                target,
                pass_config(cuda_graph, async_copy=spec.is_cuda),
            ):
                pipeline = relax_pipeline(spec, target)
                executable = relax.build(prepared.mod, target, relax_pipeline=pipeline, exec_mode="compiled")
            break
        except BuildError:
            raise
        except Exception as exc:  # TVMError from any pass or codegen
            failed = (
                uncompilable_kernels(prepared.mod, spec, target, cuda_code, cuda_options, skipped)
                if spec.is_cuda
                else {}
            )
            if not failed:
                raise BuildError(f"compiling {name} for {spec.name} failed: {type(exc).__name__}: {exc}") from exc
            if attempt == MAX_CODEGEN_RETRIES or any(rule == LAST_RULE for rule, _ in failed.values()):
                which = "; ".join(f"kernel {k} (scheduled by {rule}): {err}" for k, (rule, err) in failed.items())
                raise BuildError(f"compiling {name} for {spec.name} failed: {which}") from exc
            for kernel, (rule, error) in failed.items():
                skipped.setdefault(kernel, set()).add(rule)
                codegen_fallbacks.append({"kernel": kernel, "rule": rule, "error": f"code generation: {error}"})
    if spec.is_cuda and not cuda_record["kernels_modules"]:
        raise BuildError(f"no CUDA kernels were compiled ahead of time for {spec.name}; refusing to ship CUDA source")
    t1 = time.perf_counter()
    used_linker = export_library(executable, spec, out_path)
    return {
        "tvm_target": plain(target.export()),
        "cpu_features": cpu_features(target),
        "compile_s": round(t1 - t0, 3),
        "link_s": round(time.perf_counter() - t1, 3),
        "linker": used_linker,
        "cuda": cuda_record,
        "cuda_graph": cuda_graph,
        "conv_layout": prepared.layout.conv,
        "attention": prepared.layout.attention,
        "schedule_fallbacks": codegen_fallbacks + fallbacks.entries,
    }


#: compilations a variant may retry after a kernel's schedule failed code generation (each retry hands
#: every kernel found failing to its next rule: a specialised rule, dlight's Fallback, then GridFallback)
MAX_CODEGEN_RETRIES = 3

#: the rule every CUDA kernel ends with (``rules/grid_fallback.py``: dlight's generic schedule on a 2-D
#: grid, or Fallback's own): a kernel it cannot compile has no next rule
LAST_RULE = "GridFallback"


def uncompilable_kernels(
    mod, spec: TargetSpec, target, cuda_code: str, cuda_options, skipped: dict[str, set[str]]
) -> dict[str, tuple[str, str]]:
    """After a CUDA compilation failed: each kernel of ``mod`` (a variant's Relax module), scheduled as
    the build schedules it (``skipped`` rules left out), compiled alone; {kernel: (the rule that
    scheduled it, the error)} for those that fail. Empty when none does (the failure is elsewhere)."""
    import tvm

    from inferx_edge.compiler.guarded_schedule import FallbackLog, schedule_rule, skip_rules

    with FallbackLog(), skip_rules(skipped), target, pass_config(async_copy=True):
        try:
            scheduled = relax_pipeline(spec, target)(mod)
        except Exception:  # noqa: BLE001 - the failure is not one kernel's code generation
            return {}
    failed = {}
    for gv, func in scheduled.functions_items():
        rule = schedule_rule(func) if isinstance(func, tvm.tirx.PrimFunc) else None
        if rule is None:
            continue
        try:
            compile_kernel(func, spec, target, cuda_code, cuda_options)
        except Exception as exc:  # noqa: BLE001 - this kernel's schedule does not compile: the next rule's may
            failed[gv.name_hint] = (rule, f"{type(exc).__name__}: {error_summary(str(exc))}"[:300])
    return failed


def error_summary(text: str) -> str:
    """The line of a compiler's error text that says what went wrong: the first compiler diagnostic
    (``kernels.cu(203): error: too many arguments in function call``), else the last line with words
    in it (NVRTC ends its log with the offending source line and a caret line under it)."""
    lines = [ln.strip() for ln in text.strip().splitlines()]
    for ln in lines:
        if re.search(r"\berror\b\s*:", ln) and not ln.lower().startswith(("traceback", "runtimeerror", "tvmerror")):
            return ln
    worded = [ln for ln in lines if re.search(r"[A-Za-z]{2}", ln)]
    return worded[-1] if worded else ""
