"""Checks that an artifact can run here: CPU architecture, library ELF machine, GPU, TVM version."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from inferx_edge.errors import ArtifactError, TargetMismatchError
from inferx_edge.targets.registry import TRIPLE_MACHINES

_ELF_MACHINES = {v["elf_machine"]: k.split("-")[0] for k, v in TRIPLE_MACHINES.items()}


def elf_machine(path: Path) -> str:
    """The architecture an ELF shared library was built for (``x86_64``, ``aarch64``, or ``elf-<n>``)."""
    with open(path, "rb") as f:
        header = f.read(20)
    if len(header) < 20 or header[:4] != b"\x7fELF":
        raise ArtifactError(f"library {path.name} is not an ELF shared object")
    byteorder = "little" if header[5] == 1 else "big"
    code = int.from_bytes(header[18:20], byteorder)
    return _ELF_MACHINES.get(code, f"elf-{code}")


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
    got = elf_machine(library)
    if got != here:
        raise TargetMismatchError(
            f"library {library.name} contains {got} code but the manifest says {want}: the artifact is inconsistent"
        )


def check_tvm_version(built_with: str, runtime_version: str) -> None:
    """The VM executable format is only stable within a TVM minor release."""
    if built_with.split(".")[:2] != runtime_version.split(".")[:2]:
        raise TargetMismatchError(
            f"artifact was compiled with TVM {built_with} but this runtime has TVM {runtime_version}; "
            f"install apache-tvm=={built_with} on the device or rebuild the artifact"
        )


def check_cuda_device(tvm, target: dict[str, Any], device_id: int) -> None:
    """Refuse to run CUDA code on a machine with no such GPU or one of another architecture."""
    dev = tvm.cuda(device_id)
    if not dev.exist:
        raise TargetMismatchError(
            f"artifact was built for target '{target['name']}' ({target['cuda_arch']}) but no CUDA GPU "
            f"{device_id} is visible here (no driver, or CUDA_VISIBLE_DEVICES hides it)"
        )
    want = target["cuda_arch"].removeprefix("sm_").rstrip("a")
    have = dev.compute_version.replace(".", "")
    if want != have:
        raise TargetMismatchError(
            f"artifact was built for {target['cuda_arch']} ({target['name']}) but GPU {device_id} "
            f"({dev.device_name}) is sm_{have}"
        )
