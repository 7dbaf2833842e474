"""List the targets inferx_edge builds for, with their TVM target, toolchain and power modes."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the full registry as JSON")
    p.add_argument(
        "--toolkits",
        action="store_true",
        help="also find the CUDA compilers on this host (NVRTC per CUDA major, probed; nvcc) and say which builds use",
    )


def run(args: argparse.Namespace) -> int:
    from inferx_edge.targets import TARGETS

    toolkits = _toolkits() if args.toolkits else None
    if args.json:
        body = {name: spec.summary() for name, spec in TARGETS.items()}
        print(json.dumps(body | ({"cuda_toolkits": toolkits} if toolkits else {}), indent=2))
        return 0
    if toolkits:
        for major, t in toolkits.items():
            print(f"CUDA {major}: {'uses ' + t['chosen'] if t['chosen'] else 'no usable compiler'}")
            for lib, why in t["rejected"]:
                print(f"  rejected {lib}: {why}")
        print()
    rows = [("NAME", "DEVICE", "TVM TARGET", "HOST TRIPLE", "CROSS COMPILER", "CUDA", "MEM GiB", "POWER MODES")]
    for spec in TARGETS.values():
        t = spec.tvm_target
        host = t.get("host", t)
        tvm_desc = f"cuda {t['arch']} + llvm {host.get('mcpu', 'generic')}" if spec.is_cuda else f"llvm {t['mcpu']}"
        modes = ", ".join(f"{m.id}:{m.name}" for m in spec.power_modes) or "-"
        name = spec.name + (f" ({', '.join(spec.aliases)})" if spec.aliases else "")
        rows.append(
            (
                name,
                spec.device,
                tvm_desc,
                spec.host_triple,
                spec.cross_compiler or "-",
                f"{spec.cuda_arch} ({spec.sm_count} SMs)"
                if spec.cuda_arch and spec.sm_count
                else spec.cuda_arch or "-",
                f"{spec.memory_gib:g}" if spec.memory_gib else "-",
                modes,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(
        "\n<host>: the build machine's CPU, detected at build time. Power modes are NVIDIA's documented "
        "nvpmodel IDs; on a device the runtime reads /etc/nvpmodel.conf."
    )
    return 0


def _toolkits() -> dict:
    """Per CUDA major a target can need: the compiler builds use, and what was rejected and why."""
    from inferx_edge.compiler.cuda.toolkit import discover_nvrtc, find_nvcc

    out = {}
    for major in ("12", "13"):
        found = discover_nvrtc(int(major))
        nvcc = find_nvcc(int(major))
        chosen = (
            f"NVRTC {found.usable[0].version_str} ({found.usable[0].library})"
            if found.usable
            else f"nvcc {nvcc.version_str} ({nvcc.path})"
            if nvcc
            else None
        )
        out[major] = {"chosen": chosen, "rejected": [list(r) for r in found.rejected]}
    return out
