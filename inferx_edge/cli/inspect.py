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
    p.add_argument(
        "--device",
        action="store_true",
        help="also say what this machine would load to run it: CPU architecture, driver CUDA, which "
        "libtvm_runtime_cuda.so (the installed TVM's or the CUDA 12 build) and why; exit 5 if it cannot run here",
    )
    add_trust_argument(p)


def run(args: argparse.Namespace) -> int:
    from inferx_edge.package.bundle import verify_artifact

    m, provenance = verify_artifact(args.artifact, trust=args.trust)
    if args.json:
        doc = asdict(m) | {"provenance": asdict(provenance)}
        if args.device:
            doc["device"] = device_report(args.artifact, m, args.trust)
        print(json.dumps(doc, indent=2, default=str))
        return 0 if not args.device or doc["device"]["runs_here"] else 5
    t = m.target
    print(f"{args.artifact}: verified ({len(m.files)} members, sha256 ok)")
    print(f"  {provenance.line()}")
    print(f"  model    {m.model['name']} ({m.model['format']}, sha256 {m.model['sha256'][:16]})")
    print(
        f"  target   {t['name']} ({t['device']}, {t['host_triple']}{', ' + t['cuda_arch'] if t.get('cuda_arch') else ''})"
    )
    print(f"  built    {m.created} by inferx_edge {m.inferx_edge_version}, TVM {m.tvm_version}")
    if m.model.get("kind") == "llm":
        c = m.model["config"]
        print(
            f"  LLM      {c['architecture']}: {c['num_hidden_layers']} layers, hidden {c['hidden_size']}, "
            f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads, vocab {c['vocab_size']}, "
            f"context {c['context_length']}, {m.model['parameters'] / 1e6:.1f} M parameters"
        )
    for v in m.variants:
        mark = "*" if v.name == m.default_variant else " "
        llm = v.extra.get("llm")
        if llm:
            kinds = ", ".join(f"{n} {k}" for k, n in llm["weight_kinds"].items())
            print(f"  {mark}variant {v.name}: {llm['dtype']} activations, weights {llm['weight_bytes'] / 2**20:.1f} MiB ({kinds} matrices)")  # fmt: skip
            continue
        print(f"  {mark}variant {v.name}: {v.precision}, batch {v.batch}")
        for s in v.inputs:
            print(f"      in  {s.describe()}")
        for s in v.outputs:
            print(f"      out {s.describe()}")
    if args.device:
        report = device_report(args.artifact, m, args.trust)
        print(f"  this device: {report['machine']}, driver CUDA {report['driver_cuda'] or 'none'}")
        if "cuda_runtime" in report:
            c = report["cuda_runtime"]
            print(
                f"  CUDA runtime {c['library']}: {c['why']}"
                + (f" (signed by {c['signer']})" if c.get("signer") else "")
            )
        if not report["runs_here"]:
            print(f"  cannot run here: {report['problem']}")
            return 5
    return 0


def device_report(artifact: Path, m, trust) -> dict:
    """What this machine would load to run ``artifact``, without loading it (exit-5 problems as text)."""
    import os

    from inferx_edge.errors import TargetMismatchError
    from inferx_edge.runtime import _tvm
    from inferx_edge.runtime.compat import driver_cuda_version

    driver = driver_cuda_version()
    report = {"machine": os.uname().machine, "driver_cuda": ".".join(map(str, driver)) if driver else None}
    want = m.target["host_triple"].split("-")[0]
    if want != report["machine"]:
        return report | {"runs_here": False, "problem": f"built for a {want} host, this machine is {report['machine']}"}
    if m.target["device"] != "cuda":
        return report | {"runs_here": True}
    _tvm.import_tvm_runtime()
    try:
        choice = _tvm.choose_cuda_runtime(near=artifact, trust=trust)
    except TargetMismatchError as exc:
        return report | {"runs_here": False, "problem": str(exc)}
    library = str(choice["path"]) if choice["path"] else str(_tvm.tvm_lib_dir() / "libtvm_runtime_cuda.so")
    report["cuda_runtime"] = {**choice, "library": library}
    if driver is None:
        return report | {"runs_here": False, "problem": "no NVIDIA driver (libcuda.so.1) on this machine"}
    return report | {"runs_here": True}
