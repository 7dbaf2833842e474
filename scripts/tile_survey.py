"""Tile survey: the tensor-core tile search run over zoo models, and default-tile rules scored against
every measured kernel group.

``build`` gives each tensor-core GEMM the tile :func:`~inferx_edge.compiler.cuda.tile_for` picks unless
a tuning database records one. Whether that rule is good is a measurement: the tile search
(``tune --search tiles``) times every candidate of every kernel group, the rule's pick among them, so
its databases say how far the rule is from the best tile, group by group.

On a GPU host (models exported and calibrated on the fly, as ``benchmarks/zoo.py`` does)::

    python scripts/tile_survey.py search --models vit_b_16:64,convnext_tiny:64 --minutes 2 \\
        --root $OUT/tiles --stop-after-min 8

Here, scoring today's rule on the databases it finds (``tiles.json`` and the search's flat
``*.tiles.json`` copies under each path)::

    python scripts/tile_survey.py score tuning_logs/h200 tiles_from_gpu_host/ --json tile_rule.json

How much of each model's tensor-core work the default tiles' stage depths pad along K, and how much
the tile search's least-padding candidates would (no GPU; zoo models exported and calibrated as for
``search``, or an ONNX file with ``--input-shape``)::

    python scripts/tile_survey.py padding --models resnext50_32x4d:64,regnet_y_800mf:64 \
        --zoo-dir ~/.cache/inferx_edge/zoo --json k_padding.json

From the search's printed log alone (when the databases did not come back from the GPU host)::

    python scripts/tile_survey.py log search.log --json benchmarks/results/tile_survey_h100.json

Per group it reports the rule's tile and its time against the recorded default (the rule when the
search ran) and the best candidate; over all groups the geometric mean of rule/best and the summed
kernel time (each group's time times its kernel count), the rule against the recorded default.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: the SM count the survey's GPUs have (H100 SXM and H200: 132); the rule depends on it
SM_COUNT = 132


def search(args) -> int:
    from benchmarks.zoo import calibration, model_dir
    from benchmarks.zoo_models import spec_of

    stop = time.time() + 60 * args.stop_after_min if args.stop_after_min else math.inf
    root = Path(args.root)
    work = root.parent / "models"
    rc = 0
    for item in args.models.split(","):
        name, _, batch = item.partition(":")
        tree = root / f"{name}_b{batch or 1}"  # one database tree per model and batch
        if time.time() > stop:
            print(f"== {item}: skipped (past --stop-after-min)", flush=True)
            continue
        spec = spec_of(name)
        d = model_dir(name, Path(args.zoo_dir), work)
        calib = calibration(name, d)
        cmd = [sys.executable, "-m", "inferx_edge", "tune", "--model", str(d / "model.onnx"), "--target", args.target,
               "--precision", args.precision, "--search", "tiles", "--calib", str(calib), "--calib-method", "minmax",
               "--minutes", f"{min(args.minutes, max(0.1, (stop - time.time()) / 60)):g}",
               "--tuning-logs", str(tree)]  # fmt: skip
        for k, dims in spec.input_shapes(int(batch or 1)).items():
            cmd += ["--input-shape", f"{k}:{'x'.join(map(str, dims))}"]
        print(f"== {item}: {' '.join(cmd)}", flush=True)
        t0 = time.time()
        done = subprocess.run(cmd)
        print(f"== {item}: exit {done.returncode} after {time.time() - t0:.0f} s", flush=True)
        for n, f in enumerate(sorted(tree.rglob("tiles.json"))):  # flat copies beside the tree
            shutil.copy(f, root / f"{tree.name}{f'_{n}' if n else ''}.tiles.json")
        rc = rc or done.returncode
    return rc


def padding_rows(model: Path, shapes: dict, target: str, precision: str, calib: Path | None) -> list[dict]:
    """The tensor-core kernel groups of ``model`` as ``build`` compiles it for ``target`` / ``precision``:
    extents, GEMMs per kernel, the default tile (the candidates' first, :func:`~inferx_edge.compiler.cuda.
    tile_for` as the build calls it), K padded to its stage depth, the stage depths of the tile search's
    candidates (those that divide K, the least padded K among them), and the multiply-accumulates (as
    they are, padded by the default, padded by the least-padding candidate)."""
    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda.tile_policy import deep_stages_on, tile_candidates
    from inferx_edge.compiler.tuning import legalized_and_fused, tile_groups
    from inferx_edge.frontend import import_model
    from inferx_edge.quantize.driver import QuantOptions
    from inferx_edge.targets import get_target
    from inferx_edge.tune.driver import TuneOptions, precision_module

    spec = get_target(target)
    deep = deep_stages_on(resolve_tvm_target(spec))
    opts = TuneOptions(model=model, target=target, input_shapes=shapes, precision=precision,
                       quant=QuantOptions(calib=calib, calib_method="minmax"))  # fmt: skip
    mod = legalized_and_fused(precision_module(import_model(model, shapes), spec, opts, lambda *a: None), True,
                              spec.sm_count)  # fmt: skip
    rows = []
    for g in tile_groups(mod):
        i, j, k = g.extents
        shape = {**g.shape_options(), "input_padded": g.input_padded}
        cands = tile_candidates(g.extents, spec.sm_count, **shape, deep_stages=deep)
        tile = cands[0]  # the default, as build picks it (tile_for with these options)
        depth = 16 * tile.k_frags
        padded = -(-k // depth) * depth
        depths = sorted({16 * c.k_frags for c in cands})
        macs = g.batch * i * j * len(g.kernels)
        least = min(-(-k // d) * d for d in depths)
        rows.append({"extents": g.extents, "batch": g.batch, "int8": g.int8, "kernels": len(g.kernels),
                     "default": tile.text(), "k_padded": padded, "candidate_depths": depths,
                     "candidate_depths_dividing_k": [d for d in depths if k % d == 0],
                     "k_padded_least": least, "macs": macs * k, "macs_padded": macs * padded,
                     "macs_padded_least": macs * least})  # fmt: skip
    return rows


def padding(args) -> int:
    from benchmarks.zoo import calibration, model_dir
    from benchmarks.zoo_models import spec_of
    from inferx_edge.frontend.shapes import parse_input_shapes

    record = {}
    for item in args.models.split(","):
        name, _, batch = item.partition(":")
        if name.endswith(".onnx"):
            shapes = parse_input_shapes(args.input_shape)
            rows = padding_rows(Path(name), shapes, args.target, args.precision, None)
        else:
            d = model_dir(name, Path(args.zoo_dir), Path(args.zoo_dir))
            calib = calibration(name, d) if args.precision in ("int8", "mixed") else None
            shapes = spec_of(name).input_shapes(int(batch or 1))
            rows = padding_rows(d / "model.onnx", shapes, args.target, args.precision, calib)
        padded = [r for r in rows if r["k_padded"] != r["extents"][2]]
        total = sum(r["macs"] for r in rows) or 1
        summary = {
            "groups": len(rows),
            "groups_default_pads_k": len(padded),
            "groups_default_pads_k_with_a_dividing_candidate": sum(
                1 for r in padded if r["candidate_depths_dividing_k"]
            ),
            "groups_default_pads_k_with_a_less_padding_candidate": sum(
                1 for r in padded if r["k_padded_least"] < r["k_padded"]
            ),
            "padded_share_of_macs": round(sum(r["macs_padded"] - r["macs"] for r in rows) / total, 4),
            "padded_share_of_macs_least": round(sum(r["macs_padded_least"] - r["macs"] for r in rows) / total, 4),
        }
        print(f"== {item}: {json.dumps(summary)}")
        for r in padded:
            print(f"   {'x'.join(map(str, r['extents']))} x{r['batch']} {'int8' if r['int8'] else 'fp16'} "
                  f"({r['kernels']} kernels): {r['default']} pads K to {r['k_padded']}; the candidates' least "
                  f"{r['k_padded_least']} (depths {r['candidate_depths']})")  # fmt: skip
        record[item] = {"summary": summary, "groups": rows}
    if args.json:
        from benchmarks._record import git_commit

        out = {"command": " ".join(sys.argv), "git_commit": git_commit(), "target": args.target,
               "precision": args.precision, "models": record}  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


_GROUP_LINE = re.compile(
    r"\[\d+/\d+\] (?P<ext>[\dx]+) \((?P<n>\d+) kernels?\): (?P<best>\S+) (?P<us>[\d.]+) us, "
    r"(?P<gain>[\d.]+)x the default (?P<default>\S+)"
)


def from_log(args) -> int:
    """The groups a search printed (model, extents, kernels, best tile and time, gain over the default)
    and how many of those with K >= 256 a 128-deep tile won."""
    rows, model = [], None
    for line in Path(args.log).read_text().splitlines():
        if line.startswith("== ") and ": " in line:
            model = line[3:].split(": ", 1)[0]
        m = _GROUP_LINE.search(line)
        if m:
            best = m["best"]
            rows.append(
                {
                    "model": model,
                    "extents": [int(x) for x in m["ext"].split("x")],
                    "kernels": int(m["n"]),
                    "best": best,
                    "best_us": float(m["us"]),
                    "default": m["default"],
                    "default_over_best": float(m["gain"]),
                    "best_k_frags": _tile(best).k_frags,
                }
            )
    deep = [r for r in rows if r["extents"][2] >= 256]
    summary = {
        "groups": len(rows),
        "groups_k_ge_256": len(deep),
        "won_by_128_deep_stages": sum(1 for r in deep if r["best_k_frags"] == 8),
        "won_by_three_buffers": sum(1 for r in deep if ".async3" in r["best"]),
        "geomean_default_over_best_k_ge_256": _geomean([r["default_over_best"] for r in deep]),
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        from benchmarks._record import git_commit

        record = {"command": " ".join(sys.argv), "git_commit": git_commit(), "log": args.log, "summary": summary,
                  "groups": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


def _tile(text: str):
    from inferx_edge.compiler.cuda.tile import TileConfig

    return TileConfig.parse(text)


def _groups(paths):
    """The searched groups of every ``*tiles.json`` under each of ``paths`` (a path may also be one
    tile file, e.g. a record in benchmarks/results)."""
    for base in paths:
        seen = set()  # a database and its flat copy (search) hold the same groups
        files = [Path(base)] if Path(base).is_file() else sorted(Path(base).rglob("*tiles.json"))
        for f in files:
            data = json.loads(f.read_text())
            for key, rec in data.get("groups", {}).items():
                ident = (key, json.dumps(rec, sort_keys=True))
                if rec.get("us") and rec.get("best") and ident not in seen:
                    seen.add(ident)
                    yield f.parent, data.get("device"), key, rec


def rule_tile(rec: dict) -> str:
    """Today's default tile for a recorded group on an sm_90 GPU (its shape options where the record has
    them; records older than those options count as padded inputs)."""
    from inferx_edge.compiler.cuda.tile_policy import tile_for

    shape = rec.get("shape", {})
    opts = {k: shape[k] for k in ("weights_along_k", "int8", "batch", "input_padded") if k in shape}
    return tile_for(rec["extents"], SM_COUNT, **opts, deep_stages=True, async_copy=True).text()


def score(args) -> int:
    rows = []
    for db, device, key, rec in _groups(args.paths):
        us, n = rec["us"], len(rec.get("kernels", [])) or 1
        rule = rule_tile(rec)
        rows.append(
            {
                "database": str(db),
                "group": key,
                "extents": rec["extents"],
                "shape": rec.get("shape"),
                "kernels": n,
                "device": device,
                "best": rec["best"],
                "best_us": us[rec["best"]],
                "recorded_default": rec.get("default"),
                "recorded_default_us": us.get(rec.get("default")),
                "rule": rule,
                "rule_us": us.get(rule),
            }
        )
    scored = [r for r in rows if r["rule_us"] and r["recorded_default_us"]]
    summary = {
        "groups": len(rows),
        "groups_scored": len(scored),
        "groups_rule_not_measured": [r["group"] for r in rows if not r["rule_us"]],
        "geomean_rule_over_best": _geomean([r["rule_us"] / r["best_us"] for r in scored]),
        "geomean_recorded_default_over_best": _geomean([r["recorded_default_us"] / r["best_us"] for r in scored]),
        "kernel_us_rule": round(sum(r["rule_us"] * r["kernels"] for r in scored), 1),
        "kernel_us_recorded_default": round(sum(r["recorded_default_us"] * r["kernels"] for r in scored), 1),
        "kernel_us_best": round(sum(r["best_us"] * r["kernels"] for r in scored), 1),
        "groups_rule_slower_than_recorded_default": sum(
            1 for r in scored if r["rule_us"] > 1.02 * r["recorded_default_us"]
        ),
        "groups_rule_faster_than_recorded_default": sum(
            1 for r in scored if r["rule_us"] < r["recorded_default_us"] / 1.02
        ),
    }
    for r in rows:
        ratio = f"{r['rule_us'] / r['best_us']:.2f}x best" if r["rule_us"] else "rule's tile not measured"
        old = f"{r['recorded_default_us'] / r['best_us']:.2f}x" if r["recorded_default_us"] else "-"
        print(f"{'x'.join(map(str, r['extents'])):>20} x{r['kernels']:<3} rule {r['rule']:<34} {ratio:<24} "
              f"recorded default {old:<6} best {r['best']}")  # fmt: skip
    moved = None
    if args.compare:
        summary["compared_with"], summary["rule_change"], moved = _changed_by_rule(rows, args.compare)
    print(json.dumps(summary, indent=1))
    if args.json:
        from benchmarks._record import git_commit

        record = {
            "command": " ".join(sys.argv),
            "git_commit": git_commit(),
            "sm_count": SM_COUNT,
            "paths": args.paths,
            "summary": summary,
            "groups": rows,
        }
        if moved is not None:
            record["groups_the_rule_change_moves"] = moved
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


def _changed_by_rule(rows, previous_json: str) -> tuple[dict, dict, list[dict]]:
    """The groups whose rule tile differs from the one a previous ``score --json`` record gave (an
    earlier rule on the same databases), with both tiles measured: (that record's file and commit, a
    summary: how many got faster / slower by more than 2 %, kernel time before and after, geometric
    mean; each moved group with both times)."""
    prev = json.loads(Path(previous_json).read_text())
    before = {(r["database"], r["group"]): r for r in prev["groups"]}
    moved = []
    for r in rows:
        old = before.get((r["database"], r["group"]))
        if old and old["rule"] != r["rule"] and old["rule_us"] and r["rule_us"]:
            moved.append(
                {
                    "database": r["database"], "group": r["group"], "extents": r["extents"], "kernels": r["kernels"],
                    "previous_rule": old["rule"], "previous_rule_us": old["rule_us"],
                    "rule": r["rule"], "rule_us": r["rule_us"], "ratio": round(r["rule_us"] / old["rule_us"], 3),
                }
            )  # fmt: skip
    for m in moved:
        print(f"moved {'x'.join(map(str, m['extents'])):>20} x{m['kernels']:<3} {m['previous_rule']} "
              f"{m['previous_rule_us']} us -> {m['rule']} {m['rule_us']} us ({m['ratio']}x)")  # fmt: skip
    summary = {
        "groups_moved": len(moved),
        "faster": sum(1 for m in moved if m["ratio"] < 1 / 1.02),
        "slower": sum(1 for m in moved if m["ratio"] > 1.02),
        "kernel_us_previous_rule": round(sum(m["previous_rule_us"] * m["kernels"] for m in moved), 1),
        "kernel_us_rule": round(sum(m["rule_us"] * m["kernels"] for m in moved), 1),
        "geomean_rule_over_previous": _geomean([m["ratio"] for m in moved]),
    }
    return {"file": previous_json, "git_commit": prev.get("git_commit")}, summary, moved


def _geomean(xs):
    return round(math.exp(sum(math.log(x) for x in xs) / len(xs)), 4) if xs else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("search", help="run the tile search on zoo models (GPU host)")
    s.add_argument("--models", required=True, help="name:batch,... (zoo names, benchmarks/zoo_models.py)")
    s.add_argument("--minutes", type=float, default=2.0, help="tile search limit per model")
    s.add_argument("--stop-after-min", type=float, default=None, help="start no model after this many minutes")
    s.add_argument("--root", required=True, help="databases go to ROOT/<model>_b<batch>/<target>/...")
    s.add_argument("--zoo-dir", default="/tmp/zoo")
    s.add_argument("--target", default="h200")
    s.add_argument("--precision", default="int8")
    d = sub.add_parser("padding", help="how much K padding the default tiles' stage depths cost (no GPU)")
    d.add_argument("--models", required=True, help="name:batch,... (zoo names) or an .onnx path")
    d.add_argument("--input-shape", action="append", default=[], help="NAME:DxDx... for an .onnx path")
    d.add_argument("--zoo-dir", default="/tmp/zoo")
    d.add_argument("--target", default="h200")
    d.add_argument("--precision", default="int8")
    d.add_argument("--json", help="write the groups and the summary here")
    g = sub.add_parser("log", help="the groups a search printed, from its log")
    g.add_argument("log")
    g.add_argument("--json", help="write the groups and the summary here")
    c = sub.add_parser("score", help="score today's default-tile rule on recorded searches")
    c.add_argument("paths", nargs="+", help="tiles.json files, or directories searched for them")
    c.add_argument("--json", help="write the scored groups and the summary here")
    c.add_argument(
        "--compare", metavar="SCORE_JSON",
        help="a previous score --json record of the same databases: list the groups the rule now gives "
        "another tile, and what that changes",
    )  # fmt: skip
    args = p.parse_args(argv)
    if getattr(args, "compare", None) and not Path(args.compare).is_file():
        p.error(f"--compare {args.compare}: no such file (a previous `score --json` record)")
    return {"search": search, "score": score, "log": from_log, "padding": padding}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
