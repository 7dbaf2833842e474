"""List the targets inferx_edge builds for, with their TVM target, toolchain and power modes."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the full registry as JSON")


def run(args: argparse.Namespace) -> int:
    from inferx_edge.targets import TARGETS

    if args.json:
        print(json.dumps({name: spec.summary() for name, spec in TARGETS.items()}, indent=2))
        return 0
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
