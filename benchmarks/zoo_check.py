"""fp32 correctness of the zoo through both frontends: each model imported from ONNX and from its
``torch.export`` program, built fp32 for this CPU (untuned), run on the exporter's seeded inputs and
compared with torch's float64 output of the same network.

    python -m benchmarks.zoo_check [--models a,b] [--zoo-dir ~/.cache/inferx_edge/zoo] [--name N]

Writes ``benchmarks/results/zoo_check_<target>.json`` (+ ``.md``): per model and frontend, the build
time, the largest element error relative to the output's largest magnitude, the relative L2 error, or
the error text when the import/build failed. Goal: <= 1e-4 relative.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._record import versions, write_record
from benchmarks.zoo_models import select

FRONTENDS = {"onnx": "model.onnx", "torch.export": "model.pt2"}


def check(name: str, d: Path, frontend: str, target: str, tmp: Path) -> dict:
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.runtime import Engine

    ref = np.load(d / "ref.npz")
    inputs = {k[3:]: ref[k] for k in ref.files if k.startswith("in:")}
    outputs = [ref[k] for k in ref.files if k.startswith("out:")]
    row: dict = {"model": name, "frontend": frontend}
    path = d / FRONTENDS[frontend]
    if not path.exists():
        export = json.loads((d / "export.json").read_text()) if (d / "export.json").exists() else {}
        return row | {"error": f"no {path.name}: {export.get('torch_export', 'not exported')}"}
    art = tmp / f"{name}-{frontend}.ixa"
    t0 = time.time()
    try:
        build_artifact(
            BuildOptions(
                model=path,
                target=target,
                output=art,
                input_shapes={k: v.shape for k, v in inputs.items()} if frontend == "onnx" else {},
                tuning=False,
                force=True,
            ),
            log=lambda *a: None,
        )
    except Exception as exc:  # the record names the failure
        return row | {"error": f"{type(exc).__name__}: {exc}"[:800], "build_s": round(time.time() - t0, 1)}
    row["build_s"] = round(time.time() - t0, 1)
    with Engine(art, trust=False) as eng:
        got = eng.run(inputs if len(inputs) > 1 else next(iter(inputs.values())))
        names = [o.name for o in eng.variant.outputs]
    errs = []
    for n, r in zip(names, outputs, strict=False):
        g = np.asarray(got[n], np.float64).reshape(r.shape)
        errs.append(
            {
                "max_rel": float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-30)),
                "l2_rel": float(np.linalg.norm(g - r) / max(np.linalg.norm(r), 1e-30)),
            }
        )
    row["max_rel_error"] = max(e["max_rel"] for e in errs)
    row["l2_rel_error"] = max(e["l2_rel"] for e in errs)
    row["within_1e-4"] = row["max_rel_error"] <= 1e-4
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None)
    ap.add_argument("--zoo-dir", type=Path, default=Path.home() / ".cache/inferx_edge/zoo")
    ap.add_argument("--target", default="x86-cpu")
    ap.add_argument("--frontends", default=",".join(FRONTENDS))
    ap.add_argument("--name", default=None, help="record name (default zoo_check_<target>)")
    args = ap.parse_args(argv)
    rows: list[dict] = []
    name = args.name or f"zoo_check_{args.target}"
    with tempfile.TemporaryDirectory() as tmp:
        for m in select(args.models):
            for fe in args.frontends.split(","):
                row = check(m.name, args.zoo_dir / m.name, fe, args.target, Path(tmp))
                rows.append(row)
                print(json.dumps(row)[:400], flush=True)
                rec = write_record(
                    name,
                    {
                        "target": args.target,
                        "what": "fp32 build vs torch float64 on the exporter's seeded inputs (batch 2)",
                        "versions": versions("apache-tvm", "torch", "onnx", "inferx_edge"),
                        "results": rows,
                    },
                )
                rec.with_suffix(".md").write_text(markdown(rows, args.target))


def markdown(rows: list[dict], target: str) -> str:
    out = [
        f"# Zoo fp32 correctness on {target} (vs torch float64)",
        "",
        "| model | frontend | build s | max rel. error | L2 rel. error | within 1e-4 | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            out.append(
                f"| {r['model']} | {r['frontend']} | {r.get('build_s', '-')} | - | - | no | {r['error'][:200]} |"
            )
        else:
            out.append(
                f"| {r['model']} | {r['frontend']} | {r['build_s']} | {r['max_rel_error']:.1e} | "
                f"{r['l2_rel_error']:.1e} | {'yes' if r['within_1e-4'] else 'no'} | |"
            )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
