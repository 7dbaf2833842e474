"""The base install (``pip install inferx_edge``, no extras) runs every command's --help and the
headline path on a tiny model: tune, build, run. In a fresh virtualenv, as a new user gets it."""

from __future__ import annotations

import subprocess
import sys
import venv

import pytest

from inferx_edge.__main__ import COMMANDS
from tests.helpers import REPO, make_mlp


@pytest.fixture(scope="module")
def base_python(tmp_path_factory):
    d = tmp_path_factory.mktemp("basevenv")
    venv.create(d / "venv", with_pip=True)
    python = d / "venv" / "bin" / "python"
    r = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(REPO)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return python


def _run(python, *args, cwd):
    return subprocess.run(
        [str(python), "-m", "inferx_edge", *map(str, args)], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def test_every_command_answers_help_on_the_base_install(base_python, tmp_path):
    for command in COMMANDS:
        r = _run(base_python, command, "--help", cwd=tmp_path)
        assert r.returncode == 0, (command, r.stderr[-1500:])


def test_tune_build_run_on_the_base_install(base_python, tmp_path):
    mlp = make_mlp(tmp_path / "mlp.onnx")
    r = _run(
        base_python,
        "tune",
        "--model",
        mlp,
        "--trials",
        "4",
        "--per-iter",
        "4",
        "--tuning-logs",
        tmp_path / "tl",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "4 trials" in r.stdout
    r = _run(
        base_python, "build", "--model", mlp, "--tuning-logs", tmp_path / "tl", "-o", tmp_path / "m.ixa", cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr[-2000:]
    r = _run(base_python, "run", tmp_path / "m.ixa", "--repeat", "2", cwd=tmp_path)
    assert r.returncode == 0 and "latency over 2 runs" in r.stdout, r.stderr[-2000:]
    r = _run(base_python, "serve", tmp_path / "m.ixa", cwd=tmp_path)  # the HTTP stack is an extra
    assert r.returncode == 2 and "pip install 'inferx_edge[serve]'" in r.stderr, r.stderr[-2000:]
    assert sys.executable != str(base_python)
