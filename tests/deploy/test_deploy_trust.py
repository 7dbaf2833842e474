"""deploy verifies before it switches, keeps a rollback history, refuses hostile destinations, leaves
no process behind when killed, and fails cleanly on a full disk, a file or a directory in the way."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferx_edge.deploy import deploy, install, parse_destination, rollback
from inferx_edge.deploy.transports import DeployError
from inferx_edge.errors import ArtifactError, UsageError
from inferx_edge.package import read_manifest
from tests.helpers import REPO, build_quietly, cli

QUIET = {"log": lambda *a: None}


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """Four different artifacts (batch 1..4) to walk a history with."""
    d = tmp_path_factory.mktemp("rel")
    return [build_quietly(d / f"b{b}.ixa", input_shapes={"image": (b, 1, 28, 28)}) for b in (1, 2, 3, 4)]


def _history(dest: Path) -> list[str]:
    return json.loads((dest / "history.json").read_text())


def test_history_keeps_the_last_n_and_a_failed_deploy_pushes_none_out(releases, tmp_path):
    dest = tmp_path / "dev"
    names = [deploy(a, str(dest), selftest=False, keep=3, **QUIET).installed for a in releases[:3]]
    assert _history(dest) == names[::-1]
    with pytest.raises(DeployError, match="self-test failed"):
        deploy(releases[3], str(dest), python="false", keep=3, **QUIET)
    assert _history(dest) == names[::-1] and os.readlink(dest / "current") == names[2]
    assert sorted(os.listdir(dest / "releases")) == sorted(Path(n).name for n in names)  # the failed one removed
    r = deploy(releases[3], str(dest), selftest=False, keep=3, **QUIET)
    assert _history(dest) == [r.installed, names[2], names[1]] and not (dest / names[0]).exists()
    assert any("removed 1 release" in n for n in r.notes)
    rollback(str(dest), selftest=False, **QUIET)
    assert os.readlink(dest / "current") == names[2] and _history(dest)[:2] == [names[2], r.installed]


def test_a_tampered_artifact_never_becomes_current_even_on_a_fresh_destination(releases, tmp_path, monkeypatch):
    dest = tmp_path / "fresh"
    tampered = tmp_path / "t.ixa"
    data = bytearray(releases[0].read_bytes())
    data[len(data) // 2] ^= 0xFF
    tampered.write_bytes(bytes(data))
    with pytest.raises(ArtifactError):
        deploy(tampered, str(dest), **QUIET)  # refused on this machine: nothing sent
    assert not dest.exists()
    # the device checks too: with the host check out of the way, the device refuses before the switch
    monkeypatch.setattr(install, "verify_artifact", lambda *a, **k: (read_manifest(releases[0]), _Unsigned()))
    with pytest.raises(DeployError, match="failed verification on the device"):
        deploy(tampered, str(dest), **QUIET)
    assert not (dest / "current").exists() and os.listdir(dest / "releases") == []


class _Unsigned:
    def line(self):
        return "unsigned"


def test_hostile_and_odd_destinations(releases, tmp_path):
    for bad in ("ssh://-oProxyCommand=touch${IFS}x@host/dir", "ssh://user@-oProxyCommand=x/dir"):
        with pytest.raises(UsageError, match="would be read as an option"):
            parse_destination(bad)
    t = parse_destination("ssh://nvidia@orin:2222/opt/my models/#1")
    assert str(t.root) == "/opt/my models/#1" and t.port == 2222  # taken literally, quoted remotely
    assert t._argv("true")[-3:] == ["--", "nvidia@orin", "true"]  # '--' before the host
    as_file = tmp_path / "afile"
    as_file.write_text("x")
    r = cli("deploy", releases[0], "--to", as_file, "--no-selftest")
    assert r.returncode == 7 and "is a file, not a directory" in r.stderr and as_file.read_text() == "x"
    dest = tmp_path / "dircur"
    (dest / "current").mkdir(parents=True)
    r = cli("deploy", releases[0], "--to", dest, "--no-selftest")
    assert r.returncode == 7 and "is a directory, not a link" in r.stderr
    r = cli("deploy", "--rollback", "--to", tmp_path / "nothing", "--no-selftest")
    assert r.returncode == 7 and "nothing to roll back to" in r.stderr


def test_a_full_disk_installs_nothing(releases, tmp_path, monkeypatch):
    dest = tmp_path / "dev"
    first = deploy(releases[0], str(dest), selftest=False, **QUIET)

    def enospc(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("shutil.copyfile", enospc)
    with pytest.raises(DeployError, match="the disk is full"):
        deploy(releases[1], str(dest), selftest=False, **QUIET)
    assert os.readlink(dest / "current") == first.installed
    assert not [f for f in os.listdir(dest / "releases") if f.endswith(".part")]


def test_killing_deploy_during_the_self_test_leaves_no_process(releases, tmp_path):
    fake = tmp_path / "fakepython"
    pidfile = tmp_path / "selftest.pid"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 60\n")
    fake.chmod(0o755)
    dest = tmp_path / "dev"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "inferx_edge",
            "deploy",
            str(releases[0]),
            "--to",
            str(dest),
            "--remote-python",
            str(fake),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 60
    while not pidfile.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert pidfile.exists(), proc.communicate(timeout=10)
    child = int(pidfile.read_text())
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode != 0
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    assert not (dest / "current").exists()  # the interrupted install did not stay current
