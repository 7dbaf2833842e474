"""The build stage: a build stopped by SIGTERM leaves no scratch directory, no partial artifact and no
compile worker behind, scratch left by a process killed outright is swept by the next one, and
variants compiled in worker processes are the ones the build's own process compiles."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from inferx_edge.errors import UsageError
from inferx_edge.package.scratch import make_scratch, sweep
from tests.helpers import REPO, build_quietly


def _scratch(kind: str, pid: int | None = None) -> list[Path]:
    tmp = Path(tempfile.gettempdir())
    return [
        p
        for p in tmp.glob(f"inferx_edge-{kind}-{pid or ''}*")
        if pid is None or p.name.startswith(f"inferx_edge-{kind}-{pid}-")
    ]


def _start_build(out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "inferx_edge", "build", "--no-tuning", "-o", str(out), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(proc: subprocess.Popen, ready, what: str):
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if found := ready():
            return found
        time.sleep(0.05)
    raise AssertionError(f"the build never {what}")


def _sigterm_leaves_nothing(proc: subprocess.Popen, out: Path) -> None:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "interrupted" in err and "Traceback" not in err, (proc.returncode, err[-3000:])
    assert not _scratch("build", proc.pid)
    assert not out.exists() and not list(out.parent.glob("*.part"))


def test_sigterm_mid_build_cleans_up(tmp_path):
    # several variants (int8 calibrates first): the build runs for many seconds, so the signal lands
    # mid-build rather than after the artifact is written (one fp32 variant took ~2 s)
    out = tmp_path / "a.ixa"
    proc = _start_build(out, "--precision", "fp32,int8", "--batch-sizes", "1,4,16,64", "--jobs", "1")
    _wait_for(proc, lambda: _scratch("build", proc.pid), "created its scratch directory")
    _sigterm_leaves_nothing(proc, out)


def test_scratch_of_a_dead_process_is_swept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    stale = tmp_path / f"inferx_edge-build-{pid}-abc"
    stale.mkdir()
    (stale / "big.so").write_bytes(b"x" * 1000)
    mine = make_scratch("build", base=tmp_path)
    assert not stale.exists() and mine.exists()
    assert sweep("build", base=tmp_path) == []  # our own (live) scratch stays
    os.rmdir(mine)


@pytest.mark.slow  # 12-90 s on a 2-core host: kept under 15 min by default; run with -m slow
def test_tune_minutes_tunes_then_builds_with_the_records(tmp_path):
    from tests.helpers import cli, make_mlp

    mlp = make_mlp(tmp_path / "mlp.onnx")
    out = tmp_path / "m.ixa"
    r = cli("build", "--model", mlp, "--tune-minutes", "0.1", "--tuning-logs", tmp_path / "tl", "-o", out)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "tuning fp32 batch 16" in r.stdout and "kernels tuned" in r.stdout
    from inferx_edge.runtime import Engine

    with Engine(out) as engine:
        assert engine.variant.tuned
    r = cli("build", "--model", mlp, "--tune-minutes", "1", "--no-tuning", "-o", out)
    assert r.returncode == 2 and "contradict" in r.stderr


def test_tune_minutes_searches_tiles_for_cuda_tensor_core_variants_unless_told(tmp_path):
    from inferx_edge.build import BuildOptions, tune_search_for
    from inferx_edge.errors import UsageError
    from inferx_edge.targets import get_target

    def opts(**kw):
        return BuildOptions(model=tmp_path / "m.onnx", target="h200", output=tmp_path / "m.ixa", tune_minutes=1, **kw)

    h200, cpu = get_target("h200"), get_target("x86-cpu")
    assert [tune_search_for(opts(), h200, p) for p in ("int8", "fp16", "mixed", "fp32")] == [
        "tiles", "tiles", "tiles", "metaschedule",
    ]  # fmt: skip
    assert tune_search_for(opts(), cpu, "int8") == "metaschedule"
    assert tune_search_for(opts(tune_search="metaschedule"), h200, "int8") == "metaschedule"
    with pytest.raises(UsageError, match="--tune-minutes"):
        BuildOptions(model=tmp_path / "m.onnx", target="h200", output=tmp_path / "m.ixa", tune_search="tiles")


def _variant_entries(path: Path) -> list[dict]:
    from inferx_edge.package import read_manifest

    return [dataclasses.asdict(v) for v in read_manifest(path).variants]


def test_variants_compiled_in_worker_processes_match_one_after_the_other(tmp_path):
    """--jobs 2: the same variants, weights files and outputs as compiling them in the build's own process."""
    from inferx_edge.package import open_artifact, read_manifest
    from inferx_edge.runtime import Engine

    opts = {"precisions": ("fp32", "int8"), "batch_sizes": (1, 4), "tuning": False}
    one = build_quietly(tmp_path / "one.ixa", jobs=1, **opts)
    two = build_quietly(tmp_path / "two.ixa", jobs=2, **opts)
    assert _variant_entries(one) == _variant_entries(two)
    assert [v["weights"] for v in _variant_entries(two)] == ["weights/fp32.npz"] * 2 + ["weights/int8.npz"] * 2
    with open_artifact(one) as a, open_artifact(two) as b:
        for member in ("weights/fp32.npz", "weights/int8.npz"):
            assert a.member(member).read_bytes() == b.member(member).read_bytes()
    assert read_manifest(two).build["compile_s"] > 0
    x = np.random.default_rng(0).random((4, 1, 28, 28), dtype=np.float32)
    with Engine(one) as e1, Engine(two) as e2:
        for v in ("fp32-b4", "int8-b4"):
            np.testing.assert_array_equal(e1.run_arrays(v, [x])[0], e2.run_arrays(v, [x])[0])


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _compile_workers(pid: int) -> list[int]:
    workers = []
    for child in _children(pid):
        try:
            if "spawn_main" in Path(f"/proc/{child}/cmdline").read_text():
                workers.append(child)
        except OSError:  # gone meanwhile
            pass
    return workers


def test_sigterm_stops_the_compile_workers(tmp_path):
    out = tmp_path / "a.ixa"
    proc = _start_build(out, "--precision", "fp32", "--batch-sizes", "1,4,16,64,128,256", "--jobs", "2")
    workers = _wait_for(proc, lambda: len(w := _compile_workers(proc.pid)) == 2 and w, "started two compile workers")
    time.sleep(1)  # the workers are busy importing and compiling
    _sigterm_leaves_nothing(proc, out)
    time.sleep(0.5)
    assert not [w for w in workers if Path(f"/proc/{w}").exists()], "a compile worker outlived the build"


def test_default_jobs_follow_cores_memory_and_variants(monkeypatch):
    from inferx_edge.build import BuildOptions
    from inferx_edge.build import variants as v
    from inferx_edge.runtime import _tvm

    opts = BuildOptions(model=Path("m.onnx"), target="x86-cpu", output=Path("a.ixa"))
    monkeypatch.setattr(_tvm, "cpu_thread_budget", lambda: 16)
    monkeypatch.setattr(v, "_available_memory", lambda: 64 * 2**30)
    assert [v.variant_jobs(opts, n) for n in (1, 2, 6, 20)] == [1, 2, 6, 8]  # one per two cores
    monkeypatch.setattr(v, "_available_memory", lambda: 7 * 2**30)
    assert v.variant_jobs(opts, 6) == 2  # 3 GiB each
    monkeypatch.setattr(v, "_available_memory", lambda: None)
    assert v.variant_jobs(opts, 6) == 1  # memory unknown: one at a time
    assert v.variant_jobs(BuildOptions(model=Path("m.onnx"), target="x86-cpu", output=Path("a.ixa"), jobs=5), 6) == 5
    with pytest.raises(UsageError, match="--jobs must be at least 1"):
        BuildOptions(model=Path("m.onnx"), target="x86-cpu", output=Path("a.ixa"), jobs=0)
