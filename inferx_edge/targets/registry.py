"""The named targets inferx_edge builds for: a plain dict of frozen specs, keyed by CLI name.

TVM 0.27 rejects CLI target strings ("llvm -mcpu=..."), so each spec carries its TVM target as a JSON
dict. Dicts rather than TVM's tags: the ``nvidia/jetson-orin-nano`` tag says ``mcpu: carmel`` (Xavier's
core) where Orin has Cortex-A78AE, and a dict in our tree cannot drift under a TVM upgrade.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from typing import Any

from inferx_edge.errors import unknown_choice

#: Placeholder in a TVM target dict replaced at build time by the build host's CPU (LLVM's name for it).
HOST_CPU = "<host>"

#: ELF ``e_machine`` and ``platform.machine()`` names for each host triple we produce code for.
TRIPLE_MACHINES = {
    "x86_64-linux-gnu": {"elf_machine": 62, "machines": ("x86_64", "amd64")},
    "aarch64-linux-gnu": {"elf_machine": 183, "machines": ("aarch64", "arm64")},
}


@dataclass(frozen=True)
class PowerMode:
    """One nvpmodel power mode as NVIDIA documents it for the module.

    Only a reference for reports and docs: on a device the runtime reads the real IDs and budgets from
    ``/etc/nvpmodel.conf``, since carrier boards and JetPack releases renumber them.
    """

    id: int
    name: str
    budget_w: float | None  # None for MAXN: no budget, limited by thermals only


@dataclass(frozen=True)
class TargetSpec:
    """Everything needed to compile for, package for, and check a device.

    Attributes
    ----------
    name : CLI name (``--target``).
    description : one line for humans.
    device : ``"cpu"`` or ``"cuda"``: where the model's kernels run.
    tvm_target : TVM target as a JSON dict; ``mcpu`` may be :data:`HOST_CPU`.
    host_triple : the triple of the CPU that loads the library.
    cross_compiler : C++ compiler that links the shared library when the build host differs
        (None: the build host's own ``g++``).
    cuda_arch : ``sm_XX`` of the GPU, or None for CPU targets.
    device_cuda : CUDA version line the device ships (JetPack 6 = CUDA 12.x); device code must be
        built by a toolkit no newer than this. None when any recent toolkit will do.
    memory_gib : memory available to the model (unified memory on Jetson).
    power_modes : documented nvpmodel modes (Jetson only).
    sm_count : the GPU's streaming multiprocessors (kernel tile choice); None for CPU targets.
    aliases : other accepted names.
    """

    name: str
    description: str
    device: str
    tvm_target: dict[str, Any]
    host_triple: str
    cross_compiler: str | None = None
    cuda_arch: str | None = None
    device_cuda: str | None = None
    memory_gib: float | None = None
    power_modes: tuple[PowerMode, ...] = ()
    aliases: tuple[str, ...] = field(default=())
    sm_count: int | None = None

    @property
    def is_cuda(self) -> bool:
        return self.device == "cuda"

    @property
    def host_arch(self) -> str:
        """``x86_64`` or ``aarch64``."""
        return self.host_triple.split("-", 1)[0]

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly description, as ``targets --json`` prints it and manifests record it."""
        return {
            "name": self.name,
            "description": self.description,
            "device": self.device,
            "tvm_target": self.tvm_target,
            "host_triple": self.host_triple,
            "cross_compiler": self.cross_compiler,
            "cuda_arch": self.cuda_arch,
            "device_cuda": self.device_cuda,
            "memory_gib": self.memory_gib,
            "power_modes": [vars(m) for m in self.power_modes],
            "aliases": list(self.aliases),
        }


def _cuda(arch: str, host: dict[str, Any], **limits: Any) -> dict[str, Any]:
    return {
        "kind": "cuda",
        "arch": arch,
        "max_threads_per_block": 1024,
        "max_num_threads": 1024,
        "thread_warp_size": 32,
        "registers_per_block": 65536,
        "max_shared_memory_per_block": 49152,
        **limits,
        "host": host,
    }


def _a78(cores: int) -> dict[str, Any]:
    # Orin's CPU is the Cortex-A78AE; LLVM schedules it as cortex-a78 (same core, lock-step aside).
    return {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "cortex-a78", "num-cores": cores}


_X86_HOST = {"kind": "llvm", "mtriple": "x86_64-linux-gnu"}
_JETPACK6_CUDA = "12.6"  # JetPack 6.1/6.2 (L4T r36.4) ship CUDA 12.6; 6.0 ships 12.2 (cubins still load)
_AARCH64_GXX = "aarch64-linux-gnu-g++"


def _orin(
    name: str, desc: str, cores: int, mem: float, modes: tuple[PowerMode, ...], sms: int, aliases=()
) -> TargetSpec:
    return TargetSpec(
        name=name,
        description=desc,
        device="cuda",
        tvm_target=_cuda("sm_87", _a78(cores)),
        host_triple="aarch64-linux-gnu",
        cross_compiler=_AARCH64_GXX,
        cuda_arch="sm_87",
        device_cuda=_JETPACK6_CUDA,
        memory_gib=mem,
        power_modes=modes,
        aliases=aliases,
        sm_count=sms,
    )


_TARGET_LIST = [
    _orin(
        "jetson-agx-orin-64gb",
        "Jetson AGX Orin 64GB: 2048-core Ampere GPU, 12x Cortex-A78AE",
        12,
        64,
        (PowerMode(0, "MAXN", None), PowerMode(1, "15W", 15), PowerMode(2, "30W", 30), PowerMode(3, "50W", 50)),
        16,
        aliases=("jetson-orin", "agx-orin"),
    ),
    _orin(
        "jetson-agx-orin-32gb",
        "Jetson AGX Orin 32GB: 1792-core Ampere GPU, 8x Cortex-A78AE",
        8,
        32,
        (PowerMode(0, "MAXN", None), PowerMode(1, "15W", 15), PowerMode(2, "30W", 30), PowerMode(3, "40W", 40)),
        14,
    ),
    _orin(
        "jetson-orin-nx-16gb",
        "Jetson Orin NX 16GB: 1024-core Ampere GPU, 8x Cortex-A78AE",
        8,
        16,
        (PowerMode(0, "MAXN", None), PowerMode(1, "10W", 10), PowerMode(2, "15W", 15), PowerMode(3, "25W", 25)),
        8,
    ),
    _orin(
        "jetson-orin-nano-8gb",
        "Jetson Orin Nano 8GB: 1024-core Ampere GPU, 6x Cortex-A78AE",
        6,
        8,
        (PowerMode(0, "15W", 15), PowerMode(1, "7W", 7)),
        8,
    ),
    TargetSpec(
        "a100",
        "NVIDIA A100 (sm_80) on an x86-64 host",
        "cuda",
        _cuda("sm_80", _X86_HOST, l2_cache_size_bytes=41943040),
        "x86_64-linux-gnu",
        cuda_arch="sm_80",
        memory_gib=80,
        sm_count=108,
    ),
    TargetSpec(
        "h100",
        "NVIDIA H100 SXM (sm_90a) on an x86-64 host",
        "cuda",
        _cuda("sm_90a", _X86_HOST, l2_cache_size_bytes=52428800),
        "x86_64-linux-gnu",
        cuda_arch="sm_90a",
        memory_gib=80,
        sm_count=132,
    ),
    TargetSpec(
        "h200",
        "NVIDIA H200 (sm_90a, same die as H100, 141 GB HBM3e) on an x86-64 host",
        "cuda",
        _cuda("sm_90a", _X86_HOST, l2_cache_size_bytes=52428800),
        "x86_64-linux-gnu",
        cuda_arch="sm_90a",
        memory_gib=141,
        sm_count=132,
    ),
    TargetSpec(
        "x86-cpu",
        "this x86-64 host's CPU (LLVM, tuned to the build host's microarchitecture)",
        "cpu",
        {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": HOST_CPU},
        "x86_64-linux-gnu",
    ),
    TargetSpec(
        "arm64-cpu",
        "64-bit Arm CPU, Cortex-A78 (Orin's CPU cluster, no GPU)",
        "cpu",
        _a78(8),
        "aarch64-linux-gnu",
        cross_compiler=_AARCH64_GXX,
    ),
]

#: Registry: CLI name -> spec. Aliases resolve through :func:`get_target`.
TARGETS: dict[str, TargetSpec] = {}
for _spec in _TARGET_LIST:
    if _spec.name in TARGETS:
        raise RuntimeError(f"duplicate target {_spec.name}")
    TARGETS[_spec.name] = _spec
_ALIASES = {alias: spec.name for spec in _TARGET_LIST for alias in spec.aliases}


def get_target(name: str) -> TargetSpec:
    """Look a target up by name or alias; an unknown name raises a did-you-mean :class:`UsageError`."""
    key = _ALIASES.get(name, name)
    if key in TARGETS:
        return TARGETS[key]
    raise unknown_choice("target", name, [*TARGETS, *_ALIASES])


def host_target_name() -> str:
    """The CPU target matching the machine we run on (the default of ``build``/``evaluate``)."""
    machine = platform.machine().lower()
    for spec in _TARGET_LIST:
        if spec.device == "cpu" and machine in TRIPLE_MACHINES[spec.host_triple]["machines"]:
            return spec.name
    raise unknown_choice("host machine", machine, ["x86_64", "aarch64"])
