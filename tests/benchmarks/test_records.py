"""Benchmark records name the versions they ran with, also for packages put on the path without
installing (the GPU host's TVM bundle), and the commit of a tree parked for the GPU host."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

from benchmarks._record import versions

ROOT = Path(__file__).resolve().parents[2]


def test_versions_from_metadata_or_the_module(tmp_path, monkeypatch):
    pkg = tmp_path / "bundled_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('__version__ = "1.2.3"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    got = versions("numpy", "bundled-pkg", "no-such-package-here")
    assert got["numpy"] == metadata.version("numpy")
    assert got["bundled-pkg"] == "1.2.3 (no metadata)"
    assert got["no-such-package-here"] == "not installed" and "python" in got


def test_a_tree_parked_for_the_gpu_host_records_the_commit_it_was_parked_at(tmp_path, monkeypatch):
    """park_for_device.sh writes the commit; records written in the parked tree name it (the GPU host's
    copy of .git need not follow the checkout) and restore leaves nothing behind."""
    import shutil
    import subprocess

    repo = tmp_path / "repo"
    for d in ("scripts", "benchmarks/results", "tests", "tuning_logs", "docs"):
        (repo / d).mkdir(parents=True)
    shutil.copy(ROOT / "scripts/park_for_device.sh", repo / "scripts")
    for f in ("tests/t.py", "tuning_logs/db.json", "benchmarks/results/r.json", "docs/d.md", "benchmarks/README.md"):
        (repo / f).write_text("x\n")

    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.email=a@b", "-c", "user.name=n", "commit", "-qm", "c")
    env = {**os.environ, "INFERX_PARK_DIR": str(tmp_path / "store")}
    script = ["bash", str(repo / "scripts/park_for_device.sh")]
    subprocess.run([*script, "park"], cwd=repo, env=env, check=True, capture_output=True)
    parked = (repo / "benchmarks/results/.parked_commit").read_text().split()
    assert parked == [git("rev-parse", "HEAD"), "clean"] and not (repo / "tests").exists()
    assert not (repo / "docs").exists() and not (repo / "benchmarks/README.md").exists()
    import benchmarks._record as record

    monkeypatch.setattr(record, "RESULTS", repo / "benchmarks/results")
    assert record.git_commit() == (parked[0], False)
    subprocess.run([*script, "restore"], cwd=repo, env=env, check=True, capture_output=True)
    assert not git("status", "--porcelain")  # every file back, the marker gone
