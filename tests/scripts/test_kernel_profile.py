"""scripts/kernel_profile.py: per-kernel times of the module build compiles, on this CPU."""

from __future__ import annotations

import json
import subprocess
import sys

from inferx_edge.models import DEFAULT_MODEL
from inferx_edge.targets import host_target_name
from tests.helpers import REPO


def test_kernel_profile_lists_every_kernel_of_the_tuned_build(tmp_path):
    out = tmp_path / "profile.json"
    r = subprocess.run(
        [sys.executable, REPO / "scripts" / "kernel_profile.py", "--model", DEFAULT_MODEL, "--target",
         host_target_name(), "--runs", "5", "--json", out],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rec = json.loads(out.read_text())
    kernels = {k["kernel"]: k for k in rec["kernels"]}
    convs = [k for name, k in kernels.items() if "conv2d" in name]
    assert len(convs) == 3 and all(k["calls_per_run"] == 1 and k["ms_per_run"] > 0 for k in convs)
    # the committed database for this CPU (if there is one) tunes every conv; else none is tuned
    assert len({k["tuned"] for k in convs}) == 1
    assert rec["instrumented_sum_ms"] > 0 and "end to end" in r.stdout
    # the record says which code and software it measured
    assert rec["git_commit"] and rec["versions"]["inferx_edge"] and "kernel_profile.py" in rec["command"]


def test_tuning_root_looks_the_database_up_elsewhere(tmp_path):
    """``--tuning-root`` (the tuning_logs/ of a benchmark run): an empty one tunes nothing, and says so."""
    out = tmp_path / "profile.json"
    r = subprocess.run(
        [sys.executable, REPO / "scripts" / "kernel_profile.py", "--model", DEFAULT_MODEL, "--target",
         host_target_name(), "--runs", "2", "--tuning-root", tmp_path / "empty", "--json", out],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert f"no tuning database for this model, shapes and precision under {tmp_path / 'empty'}" in r.stdout
    convs = [k for k in json.loads(out.read_text())["kernels"] if "conv2d" in k["kernel"]]
    assert len(convs) == 3 and not any(k["tuned"] for k in convs)


def test_costs_only_names_the_rule_that_scheduled_each_gpu_kernel_without_a_gpu(tmp_path):
    out = tmp_path / "costs.json"
    r = subprocess.run(
        [sys.executable, REPO / "scripts" / "kernel_profile.py", "--model", DEFAULT_MODEL, "--target", "h200",
         "--costs-only", "--no-tuning", "--json", out],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    kernels = json.loads(out.read_text())["kernels"]
    assert kernels and all(k["rule"] for k in kernels.values())  # every CUDA kernel went through a rule
    assert "schedule rules: " in r.stdout
    assert all(k["blocks"] >= 1 and 1 <= k["threads"] <= 1024 for k in kernels.values())  # launch grids
    assert all(k["calls"] >= 1 for k in kernels.values())  # launches per call: every kernel runs
    launches, moved = sum(k["calls"] for k in kernels.values()), sum(k["calls"] * k["bytes"] for k in kernels.values())
    assert f"per call: {launches} launches, {moved / 1e6:.0f} MB" in r.stdout


def test_call_counts_counts_each_launch_of_a_shared_kernel():
    """Two identical adds share one PrimFunc after legalization: it is launched twice per call."""
    from tvm import relax

    from inferx_edge.compiler.relax_rewrite import call_counts

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4], "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(x, x))
            z = bb.emit(relax.op.add(y, y))
            out = bb.emit_output(relax.op.multiply(z, z))
        bb.emit_func_output(out)
    assert call_counts(relax.transform.LegalizeOps()(bb.get())) == {"add": 2, "multiply": 1}


def test_few_block_kernels_are_those_a_few_sms_walk():
    sys.path.insert(0, str(REPO / "scripts"))
    from kernel_profile import few_block_kernels, launch_grid

    text = (
        'for b in T.thread_binding(T.int64(2), thread="blockIdx.x"):\n'
        ' for t in T.thread_binding(16, thread="threadIdx.x"):\n'
        '  for u in T.thread_binding(T.int64(16), thread="threadIdx.y"):\n'
        '   for v in T.thread_binding(T.int64(16), thread="threadIdx.y"):'
    )
    assert launch_grid(text) == {"blocks": 2, "threads": 256}
    assert launch_grid("for i in range(4):") == {}
    kernels = {
        "pool": {"blocks": 2, "threads": 256, "bytes": 1_600_000},  # 2 SMs walk 1.6 MB
        "wide": {"blocks": 400, "threads": 256, "bytes": 100_000_000},
        "tiny": {"blocks": 1, "threads": 32, "bytes": 4_000},
        "cpu": {"bytes": 1_000_000},  # no grid
    }
    assert few_block_kernels(kernels, 132) == ["pool"]
    assert few_block_kernels(kernels, None) == []
