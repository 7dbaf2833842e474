"""Verify an artifact (member checksums, safe paths) and print its manifest."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from inferx_edge.cli._common import add_trust_argument


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("artifact", type=Path)
    p.add_argument("--json", action="store_true", help="print the whole manifest as JSON")
    add_trust_argument(p)


def run(args: argparse.Namespace) -> int:
    from inferx_edge.package.bundle import verify_artifact

    m, provenance = verify_artifact(args.artifact, trust=args.trust)
    if args.json:
        print(json.dumps(asdict(m) | {"provenance": asdict(provenance)}, indent=2))
        return 0
    t = m.target
    print(f"{args.artifact}: verified ({len(m.files)} members, sha256 ok)")
    print(f"  {provenance.line()}")
    print(f"  model    {m.model['name']} ({m.model['format']}, sha256 {m.model['sha256'][:16]})")
    print(
        f"  target   {t['name']} ({t['device']}, {t['host_triple']}{', ' + t['cuda_arch'] if t.get('cuda_arch') else ''})"
    )
    print(f"  built    {m.created} by inferx_edge {m.inferx_edge_version}, TVM {m.tvm_version}")
    for v in m.variants:
        mark = "*" if v.name == m.default_variant else " "
        print(f"  {mark}variant {v.name}: {v.precision}, batch {v.batch}")
        for s in v.inputs:
            print(f"      in  {s.describe()}")
        for s in v.outputs:
            print(f"      out {s.describe()}")
    return 0
