"""Matrix-vector kernels on this CPU: dlight's CPU GEMV rule against the project's default schedule
(``compiler/cpu/default_schedule.py``; ``inferx-tile``: its register-tile schedule with the row-dot
schedule of ``compiler/cpu/row_dot.py`` turned off), compile time and run time, numpy (BLAS) as the peer.

    python -m benchmarks.cpu_gemv_rule [--shapes 1000x512,...] [--rules ...] [--timeout 120] [--name NAME]

Each (rows x reduction) kernel ``o[i] = sum_r a[i, r] * w[r]`` is scheduled by one rule and compiled
in a child process (killed after ``--timeout`` seconds: dlight's schedule can take LLVM minutes), its
result checked against numpy, then timed over 50 calls. The record keeps every time and the ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

#: classifier heads (1000 outputs), a 1-channel 1x1 conv over 128 x 128 / 32 x 32 maps (DPT's depth
#: head), dense layers whose outputs are multiples of 128, and a square one
SHAPES = ("1000x512", "2000x32", "16384x32", "1024x32", "2048x512", "4096x4096")
RULES = ("dlight-gemv", "inferx-default", "inferx-tile")

_CHILD = r"""
import json, sys, time
import numpy as np
import tvm
from tvm import te
from tvm.s_tir import dlight as dl
from inferx_edge.compiler.compile import resolve_tvm_target
from inferx_edge.compiler.cpu.default_schedule import CPUDefaultSchedule, _as_dlight_rule
from inferx_edge.targets import get_target

rows, red, rule = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
if rule == "inferx-tile":
    import inferx_edge.compiler.cpu.row_dot as row_dot
    row_dot.row_dot_schedule = lambda *a: None
a, w = te.placeholder((rows, red), name="a"), te.placeholder((red,), name="w")
r = te.reduce_axis((0, red), name="r")
func = te.create_prim_func([a, w, te.compute((rows,), lambda i: te.sum(a[i, r] * w[r], axis=r), name="o")])
target = resolve_tvm_target(get_target("x86-cpu"))
with target:
    sch = (dl.cpu.GEMV() if rule == "dlight-gemv" else _as_dlight_rule(CPUDefaultSchedule())).apply(func, target, False)
t0 = time.perf_counter()
lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}), target=target)
compile_s = time.perf_counter() - t0
rng = np.random.default_rng(0)
A, W = rng.standard_normal((rows, red)).astype("float32"), rng.standard_normal(red).astype("float32")
args = [tvm.runtime.tensor(A), tvm.runtime.tensor(W), tvm.runtime.tensor(np.zeros(rows, "float32"))]
fn = lib["main"]
fn(*args)
err = float(np.abs(args[2].numpy() - A.astype(np.float64) @ W).max() / np.abs(A.astype(np.float64) @ W).max())
t0 = time.perf_counter()
for _ in range(50):
    fn(*args)
run_us = (time.perf_counter() - t0) / 50 * 1e6
t0 = time.perf_counter()
for _ in range(50):
    A @ W
numpy_us = (time.perf_counter() - t0) / 50 * 1e6
print(json.dumps({"compile_s": round(compile_s, 2), "run_us": round(run_us, 1), "numpy_us": round(numpy_us, 1),
                  "max_rel_error": err}))
"""


def measure(rows: int, red: int, rule: str, timeout: float) -> dict:
    try:
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, str(rows), str(red), rule],
            capture_output=True, text=True, timeout=timeout, check=True,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"error": f"not compiled within {timeout:.0f} s"}
    except subprocess.CalledProcessError as exc:
        return {"error": (exc.stderr.strip().splitlines() or ["failed"])[-1][:300]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    from benchmarks._record import versions, write_record

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help="ROWSxREDUCTION,...")
    ap.add_argument("--rules", default=",".join(RULES), help=f"of {', '.join(RULES)}")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--name", default="cpu_gemv_rule")
    args = ap.parse_args(argv)
    rows = []
    for shape in args.shapes.split(","):
        m, k = (int(v) for v in shape.split("x"))
        row = {"rows": m, "reduction": k}
        for rule in args.rules.split(","):
            row[rule] = measure(m, k, rule, args.timeout)
            print(m, k, rule, row[rule], flush=True)
        ours = row.get("inferx-default", {})
        for peer, key in (("dlight-gemv", "dlight_time_over_ours"), ("inferx-tile", "tile_time_over_ours")):
            if "run_us" in ours and "run_us" in row.get(peer, {}):
                row[key] = round(row[peer]["run_us"] / ours["run_us"], 2)
        if "run_us" in ours:
            row["ours_time_over_numpy"] = round(ours["run_us"] / ours["numpy_us"], 2)
        rows.append(row)
    path = write_record(args.name, {"versions": versions("apache-tvm", "numpy"), "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
