"""GPU schedules checked on the CPU: a scheduled kernel run with serial thread loops against its
unscheduled kernel (``inferx_edge.compiler.schedule_check``, ``kernel_profile.py --check-schedules``)."""

from __future__ import annotations

import re
import subprocess
import sys

from inferx_edge.models import DEFAULT_MODEL
from tests.helpers import REPO

_SM90 = {"kind": "cuda", "arch": "sm_90"}


def _dfl_softmax_kernel():
    from benchmarks.gpu_layout_kernels import dfl_softmax, fused_kernel

    return fused_kernel(dfl_softmax([1, 16, 4, 1100]))


def test_a_correct_schedule_matches_and_a_wrong_one_is_caught():
    import tvm

    from inferx_edge.compiler.cuda.rules.column_reduction import column_reduction_rule
    from inferx_edge.compiler.schedule_check import check_kernel

    plain = _dfl_softmax_kernel()
    scheduled = column_reduction_rule().apply(plain, tvm.target.Target(_SM90), False).mod["main"]
    assert check_kernel(plain, scheduled) < 1e-6
    # the same schedule with the row's sum started at 1 instead of 0: every output off
    init = re.compile(r"(T_softmax_expsum_local\[[^\]]*\] = )T\.float32\(0\.0\)")
    broken = init.sub(r"\1T.float32(1.0)", scheduled.script())
    assert broken != scheduled.script()
    assert check_kernel(plain, tvm.script.from_source(broken)) > 1e-2


def test_kernel_profile_checks_every_cuda_schedule_of_a_model_on_the_cpu():
    r = subprocess.run(
        [sys.executable, REPO / "scripts" / "kernel_profile.py", "--model", DEFAULT_MODEL, "--target", "h200",
         "--check-schedules", "--no-tuning"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert " 0 differ" in r.stdout and "kernels checked" in r.stdout
    assert "  ok  " in r.stdout
