"""The tree passes ruff (lint), as pre-commit enforces locally."""

import shutil
import subprocess

import pytest

from tests.helpers import REPO


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff not installed (pip install '.[test]')")
def test_ruff_check():
    r = subprocess.run(["ruff", "check", "--quiet", "."], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
