"""Checks that an artifact can run here: CPU architecture, library ELF machine, GPU, TVM version."""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path
from typing import Any

from inferx_edge.errors import TargetMismatchError
from inferx_edge.package.elf import elf_machine


def host_arch() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def check_host(target: dict[str, Any], library: Path) -> None:
    """Refuse a library whose CPU architecture is not this machine's, before trying to load it."""
    want = target["host_triple"].split("-")[0]
    here = host_arch()
    if want != here:
        raise TargetMismatchError(
            f"artifact was built for target '{target['name']}' ({target['host_triple']}); this machine is "
            f"{here}. Build it for this machine instead (e.g. --target "
            f"{'x86-cpu' if here == 'x86_64' else 'arm64-cpu'}) or run it on a {want} device"
        )
    need = target.get("cpu_features") or []
    have = cpu_flags() if here == "x86_64" else None
    missing = sorted(set(need) - have) if have is not None else []
    if missing:
        raise TargetMismatchError(
            f"this CPU lacks {', '.join(missing)}, which the code of artifact '{target['name']}' uses (built for "
            f"{target.get('tvm_target', {}).get('mcpu', 'another CPU')}); it would die with an illegal instruction. "
            f"Rebuild it on a machine of this CPU's level (python -m inferx_edge build --target x86-cpu)"
        )
    got = elf_machine(library)
    if got != here:
        raise TargetMismatchError(
            f"library {library.name} contains {got} code but the manifest says {want}: the artifact is inconsistent"
        )


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str] | None:
    """This machine's CPU flags (Linux /proc/cpuinfo), or None when they cannot be read."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def check_tvm_version(built_with: str, runtime_version: str) -> None:
    """The VM executable format is only stable within a TVM minor release."""
    if built_with.split(".")[:2] != runtime_version.split(".")[:2]:
        raise TargetMismatchError(
            f"artifact was compiled with TVM {built_with} but this runtime has TVM {runtime_version}; "
            f"install apache-tvm=={built_with} on the device or rebuild the artifact"
        )


def driver_cuda_version() -> tuple[int, int] | None:
    """The CUDA version the installed driver supports (``cuDriverGetVersion``), or None without a driver."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
        version = ctypes.c_int()
        if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return version.value // 1000, (version.value % 1000) // 10


def check_cuda_device(tvm, target: dict[str, Any], device_id: int) -> None:
    """Refuse CUDA code the GPU here cannot run: no GPU, another architecture, or too old a driver.

    A cubin runs only on its own SM version; PTX for ``compute_XX`` is JIT-compiled by the driver for
    any GPU of SM XX or newer.
    """
    dev = tvm.cuda(device_id)
    if not dev.exist:
        raise TargetMismatchError(
            f"artifact was built for target '{target['name']}' ({target['cuda_arch']}) but no CUDA GPU "
            f"{device_id} is visible here (no driver, or CUDA_VISIBLE_DEVICES hides it)"
        )
    want = int(target["cuda_arch"].removeprefix("sm_").rstrip("a"))
    have = int(dev.compute_version.replace(".", ""))
    ptx = target.get("cuda_code") == "ptx"
    if (ptx and have < want) or (not ptx and have != want):
        raise TargetMismatchError(
            f"artifact holds {'PTX for compute' if ptx else 'cubins for sm'}_{want} ({target['name']}) but GPU "
            f"{device_id} ({dev.device_name}) is sm_{have}"
            + ("" if ptx else "; rebuild for this GPU, or with --cuda-code ptx for same-or-newer GPUs")
        )
    need = target.get("min_driver_cuda")
    have_driver = driver_cuda_version()
    if need and have_driver and have_driver < tuple(int(x) for x in need.split(".")[:2]):
        raise TargetMismatchError(
            f"artifact's device code ({target.get('cuda_toolkit')}) needs a driver for CUDA {need} or newer; "
            f"this driver supports CUDA {have_driver[0]}.{have_driver[1]}"
            + (f" (JetPack {target['min_jetpack']} or newer on Jetson)" if target.get("min_jetpack") else "")
        )
