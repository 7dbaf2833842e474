"""Host CPUs: x86-64 ISA levels, the features an artifact's code needs, and which tuned CPUs are close.

``x86-cpu`` builds for the build host's *ISA level* (``x86-64-v2/v3/v4``, LLVM's generic CPUs of those
feature sets) rather than its exact microarchitecture: the artifact runs on every CPU of that level,
and AVX-512 is used only when the build host has it. The manifest lists the CPU features the code may
use (:func:`required_features`; the runtime reads ``/proc/cpuinfo`` to check them) so a device without them refuses the artifact instead of dying with
SIGILL. Tuning databases stay keyed by exact microarchitecture; one tuned on another CPU of the same
level is applied when no exact one exists (:data:`SAME_LEVEL`).
"""

from __future__ import annotations

#: /proc/cpuinfo flags each level needs (cumulative), after the x86-64 psABI levels
X86_LEVELS: dict[str, frozenset[str]] = {}
_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
X86_LEVELS = {"x86-64-v4": _V4, "x86-64-v3": _V3, "x86-64-v2": _V2}

#: LLVM CPU names by ISA level: a database tuned on one of them is the fallback for the others
SAME_LEVEL: dict[str, tuple[str, ...]] = {
    "x86-64-v4": (
        "znver4", "znver5", "sapphirerapids", "emeraldrapids", "graniterapids", "icelake-server",
        "icelake-client", "tigerlake", "rocketlake", "cascadelake", "cooperlake", "skylake-avx512",
    ),
    "x86-64-v3": (
        "znver3", "znver2", "znver1", "alderlake", "raptorlake", "meteorlake", "skylake", "broadwell", "haswell",
    ),
}  # fmt: skip

#: LLVM target feature -> /proc/cpuinfo flag, for the instruction-set extensions code can use
_LLVM_TO_CPUINFO = {
    "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2", "popcnt": "popcnt", "cx16": "cx16",
    "sahf": "lahf_lm", "avx": "avx", "avx2": "avx2", "bmi": "bmi1", "bmi2": "bmi2", "f16c": "f16c", "fma": "fma",
    "lzcnt": "abm", "movbe": "movbe", "xsave": "xsave", "avx512f": "avx512f", "avx512bw": "avx512bw",
    "avx512cd": "avx512cd", "avx512dq": "avx512dq", "avx512vl": "avx512vl", "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16", "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2",
    "avx512ifma": "avx512ifma", "avx512fp16": "avx512_fp16", "avxvnni": "avx_vnni", "vpclmulqdq": "vpclmulqdq",
    "gfni": "gfni", "vaes": "vaes", "aes": "aes", "pclmul": "pclmulqdq", "sha": "sha_ni", "adx": "adx",
}  # fmt: skip


def isa_level(flags: frozenset[str] | None) -> str:
    """The highest x86-64 level ``flags`` satisfy ("x86-64" when not even v2, or unknown)."""
    if flags is None:
        return "x86-64-v2"  # cannot tell: the portable choice
    for level, need in X86_LEVELS.items():
        if need <= flags:
            return level
    return "x86-64"


def required_features(llvm_features) -> list[str]:
    """The /proc/cpuinfo flags of the instruction-set extensions in an LLVM feature set."""
    return sorted({_LLVM_TO_CPUINFO[f] for f in llvm_features if f in _LLVM_TO_CPUINFO})


def same_level_cpus(cpu: str) -> tuple[str, ...]:
    """Other LLVM CPU names of ``cpu``'s ISA level (empty when the level is not listed)."""
    for cpus in SAME_LEVEL.values():
        if cpu in cpus:
            return tuple(c for c in cpus if c != cpu)
    return ()
