"""Benchmark records name the versions they ran with, also for packages put on the path without
installing (the GPU host's TVM bundle)."""

from __future__ import annotations

from importlib import metadata

from benchmarks._record import versions


def test_versions_from_metadata_or_the_module(tmp_path, monkeypatch):
    pkg = tmp_path / "bundled_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('__version__ = "1.2.3"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    got = versions("numpy", "bundled-pkg", "no-such-package-here")
    assert got["numpy"] == metadata.version("numpy")
    assert got["bundled-pkg"] == "1.2.3 (no metadata)"
    assert got["no-such-package-here"] == "not installed" and "python" in got
