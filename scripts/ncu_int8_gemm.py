"""One 4096^3 int8 GEMM workload, three warm launches, for Nsight Compute to profile (GPU host).

    ncu --target-processes all --launch-skip 2 --launch-count 1 -k regex:main_kernel \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \\
        --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \\
        python3 scripts/ncu_int8_gemm.py tvm 2x4.2x4.k8.v16.a8.w16.async3.mma
    ncu ... (without -k) python3 scripts/ncu_int8_gemm.py cublaslt

``tvm TILE`` launches the tile as ``tune --search tiles`` compiles it (checked exactly against torch);
``cublaslt`` launches ``torch._int_mm``. ncu locks the clocks to base for its replays, so read its
durations as ratios. Outputs of one run: ``benchmarks/results/ncu_h200/``.
"""

import sys
from pathlib import Path

import torch
import tvm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package beside inferx_edge
from benchmarks.gpu_int8_matmul import N, load_tile, operands, run_exact
from inferx_edge.compiler.compile import resolve_tvm_target
from inferx_edge.targets import get_target

if len(sys.argv) < 2 or sys.argv[1] not in ("tvm", "cublaslt") or (sys.argv[1] == "tvm" and len(sys.argv) != 3):
    raise SystemExit("usage: ncu_int8_gemm.py tvm TILE | cublaslt")
a, b, c, ta, tb, ref = operands(N)
if sys.argv[1] == "tvm":
    spec = get_target("h200")
    f = load_tile(spec, resolve_tvm_target(spec), sys.argv[2])
    print("exact", run_exact(f, a, b, c, ref))
    for _ in range(2):
        f(a, b, c)
    tvm.cuda(0).sync()
else:
    for _ in range(3):
        torch._int_mm(ta, tb.t())
    torch.cuda.synchronize()
