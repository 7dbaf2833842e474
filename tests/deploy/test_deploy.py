"""deploy: atomic installs with rollback to a directory and to a real OpenSSH server, and TVM RPC.

The sshd and the RPC tracker/server are real processes on 127.0.0.1, started and stopped here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inferx_edge.deploy import deploy, rollback
from inferx_edge.deploy.transports import DeployError, LocalTransport, SSHTransport
from inferx_edge.errors import UsageError
from tests.helpers import REPO, cli, free_port

QUIET = {"log": lambda *a: None}


def _state(root: Path) -> tuple[str | None, str | None, list[str]]:
    link = lambda p: os.readlink(p) if os.path.islink(p) else None  # noqa: E731
    return link(root / "current"), link(root / "previous"), sorted(os.listdir(root / "releases"))


@pytest.fixture(scope="module")
def second_artifact(tmp_path_factory) -> Path:
    """A second, different artifact (batch 2) to install over the first."""
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.models import DEFAULT_MODEL
    from inferx_edge.targets import host_target_name

    out = tmp_path_factory.mktemp("second") / "b2.ixa"
    build_artifact(
        BuildOptions(
            model=DEFAULT_MODEL, target=host_target_name(), output=out, input_shapes={"image": (2, 1, 28, 28)}
        ),
        **QUIET,
    )
    return out


def test_local_install_previous_and_rollback(default_artifact, second_artifact, tmp_path):
    dest = tmp_path / "device"
    r1 = deploy(default_artifact, str(dest), repeat=2, **QUIET)
    assert "latency over 2 runs" in r1.selftest and r1.previous is None
    cur1, _, rel = _state(dest)
    assert cur1 == r1.installed and len(rel) == 1
    r2 = deploy(second_artifact, str(dest), selftest=False, **QUIET)
    cur2, prev2, rel = _state(dest)
    assert (cur2, prev2) == (r2.installed, cur1) and len(rel) == 2
    r3 = rollback(str(dest), selftest=False, **QUIET)
    assert _state(dest)[:2] == (cur1, cur2) and r3.installed == cur1
    # reinstalling the same artifact is idempotent and keeps previous
    deploy(default_artifact, str(dest), selftest=False, **QUIET)
    assert _state(dest)[:2] == (cur1, cur2)


def test_local_interrupted_upload_installs_nothing(default_artifact, second_artifact, tmp_path, monkeypatch):
    dest = tmp_path / "device"
    deploy(default_artifact, str(dest), selftest=False, **QUIET)
    before = _state(dest)

    def half_then_die(self, local, remote):
        Path(remote).write_bytes(Path(local).read_bytes()[:1000])
        raise KeyboardInterrupt  # Ctrl-C mid-upload

    monkeypatch.setattr(LocalTransport, "put", half_then_die)
    with pytest.raises(KeyboardInterrupt):
        deploy(second_artifact, str(dest), **QUIET)
    assert _state(dest) == before  # no .part left, current untouched


def test_local_checksum_mismatch_installs_nothing(default_artifact, second_artifact, tmp_path, monkeypatch):
    dest = tmp_path / "device"
    deploy(default_artifact, str(dest), selftest=False, **QUIET)
    before = _state(dest)
    real_put = LocalTransport.put

    def corrupting_put(self, local, remote):
        real_put(self, local, remote)
        with open(remote, "r+b") as f:
            f.seek(500)
            f.write(b"\x00\xff")

    monkeypatch.setattr(LocalTransport, "put", corrupting_put)
    with pytest.raises(DeployError, match="checksum mismatch after upload"):
        deploy(second_artifact, str(dest), **QUIET)
    assert _state(dest) == before


def test_failed_selftest_restores_previous(default_artifact, second_artifact, tmp_path):
    dest = tmp_path / "device"
    first = deploy(default_artifact, str(dest), selftest=False, **QUIET)
    with pytest.raises(DeployError, match=f"self-test failed.*current restored to {first.installed}"):
        deploy(second_artifact, str(dest), python="false", **QUIET)
    assert _state(dest)[0] == first.installed


def test_deploy_cli_errors(default_artifact, tmp_path):
    r = cli("deploy", default_artifact, "--to", "ftp://host/x")
    assert r.returncode == 2 and "unsupported destination scheme 'ftp://'" in r.stderr
    r = cli("deploy", "--rollback", "--to", tmp_path / "empty", "--no-selftest")
    assert r.returncode == 7 and "nothing to roll back to" in r.stderr
    r = cli("deploy", tmp_path / "missing.ixa", "--to", tmp_path / "d")
    assert r.returncode == 2 and "artifact not found" in r.stderr


# --- a real OpenSSH server on 127.0.0.1 -------------------------------------------------------------


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    if not (Path("/usr/sbin/sshd").exists() and shutil.which("ssh") and shutil.which("ssh-keygen")):
        pytest.skip("openssh-server/client not installed")
    d = tmp_path_factory.mktemp("sshd")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host_key")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "client_key")], check=True)
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    os.chmod(d / "authorized_keys", 0o600)
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nAuthorizedKeysFile {d / 'authorized_keys'}\n"
        f"PasswordAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin yes\nStrictModes no\nUsePAM no\n"
        f"PidFile {d / 'sshd.pid'}\nSetEnv PYTHONPATH={REPO}\n"
        f"AcceptEnv *\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    proc = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    opts = [
        "-i",
        str(d / "client_key"),
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
    ]
    user = os.environ.get("USER") or __import__("getpass").getuser()
    for _ in range(50):
        r = subprocess.run(["ssh", *opts, "-p", str(port), f"{user}@127.0.0.1", "true"], capture_output=True)
        if r.returncode == 0:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.skip(f"sshd did not come up: {proc.stdout.read(2000) if proc.stdout else ''}")
    yield {"url": f"ssh://{user}@127.0.0.1:{port}", "opts": opts}
    proc.terminate()
    proc.wait(timeout=10)


def test_ssh_install_selftest_and_rollback(sshd, default_artifact, second_artifact, tmp_path):
    root = tmp_path / "jetson"
    dest = f"{sshd['url']}{root}"
    python = sys.executable
    r1 = deploy(default_artifact, dest, python=python, repeat=2, ssh_options=sshd["opts"], **QUIET)
    assert "latency over 2 runs" in r1.selftest and "ran current variant fp32-b1" in r1.selftest
    r2 = deploy(second_artifact, dest, selftest=False, python=python, ssh_options=sshd["opts"], **QUIET)
    assert _state(root)[:2] == (r2.installed, r1.installed)
    rollback(dest, selftest=False, ssh_options=sshd["opts"], **QUIET)
    assert _state(root)[:2] == (r1.installed, r2.installed)
    r = cli("deploy", "--rollback", "--to", dest, "--no-selftest", *(f"--ssh-option={o}" for o in sshd["opts"]))
    assert r.returncode == 0, r.stderr
    assert _state(root)[0] == r2.installed


def test_ssh_interrupted_and_corrupted_uploads(sshd, default_artifact, second_artifact, tmp_path, monkeypatch):
    root = tmp_path / "jetson"
    dest = f"{sshd['url']}{root}"
    deploy(default_artifact, dest, selftest=False, python=sys.executable, ssh_options=sshd["opts"], **QUIET)
    before = _state(root)
    real_put = SSHTransport.put

    def truncated_then_dropped(self, local, remote):
        part = tmp_path / "half.ixa"
        part.write_bytes(Path(local).read_bytes()[:4096])
        real_put(self, part, remote)  # a real, partial scp
        raise DeployError("upload failed (exit 255): connection reset")

    monkeypatch.setattr(SSHTransport, "put", truncated_then_dropped)
    with pytest.raises(DeployError, match="connection reset"):
        deploy(second_artifact, dest, python=sys.executable, ssh_options=sshd["opts"], **QUIET)
    assert _state(root) == before

    def corrupted(self, local, remote):
        bad = tmp_path / "bad.ixa"
        data = bytearray(Path(local).read_bytes())
        data[len(data) // 2] ^= 0xFF
        bad.write_bytes(bytes(data))
        real_put(self, bad, remote)

    monkeypatch.setattr(SSHTransport, "put", corrupted)
    with pytest.raises(DeployError, match="checksum mismatch after upload"):
        deploy(second_artifact, dest, python=sys.executable, ssh_options=sshd["opts"], **QUIET)
    assert _state(root) == before


def test_rpc_deploy_uploads_loads_and_runs(rpc_tracker, default_artifact):
    r = cli("deploy", default_artifact, "--to", f"rpc://127.0.0.1:{rpc_tracker}/testdev", "--repeat", "3")
    assert r.returncode == 0, r.stderr
    assert "ran fp32-b1 on rpc device 'testdev' (cpu): outputs [[1, 10]]" in r.stdout
    assert "nothing was installed permanently" in r.stdout


def test_ssh_paths_with_spaces_and_hash_install_where_asked(sshd, default_artifact, tmp_path):
    root = tmp_path / "my models" / "#1 cam"
    dest = f"{sshd['url']}{root}"
    r = deploy(default_artifact, dest, python=sys.executable, repeat=1, ssh_options=sshd["opts"], **QUIET)
    assert "latency over 1 runs" in r.selftest
    assert _state(root)[0] == r.installed and (root / r.installed).exists()


def _orin_with_runtime(default_artifact, tmp_path, sign_key=None):
    """A Jetson (aarch64 + sm_87) copy of ``default_artifact`` and a stand-in CUDA 12 runtime directory
    with its build record: (artifact, runtime dir, library)."""
    import json as _json

    from inferx_edge.package.bundle import sha256_file
    from tests.helpers import retarget_artifact

    orin = retarget_artifact(
        default_artifact,
        tmp_path / "orin.ixa",
        name="jetson-agx-orin-64gb",
        device="cuda",
        cuda_arch="sm_87",
        min_jetpack="6.0",
        host_triple="aarch64-linux-gnu",
        sign_key=sign_key,
    )
    runtime = tmp_path / "cuda12-runtime"
    (runtime / "aarch64").mkdir(parents=True)
    lib = runtime / "aarch64" / "libtvm_runtime_cuda.so"
    lib.write_bytes(b"\x7fELF stand-in for the CUDA 12 build")
    (runtime / "aarch64" / "build.json").write_text(_json.dumps({"sha256": sha256_file(lib), "cuda_version": 12060}))
    return orin, runtime, lib


def test_jetson_deploy_installs_the_cuda12_runtime_once(default_artifact, tmp_path):
    orin, runtime, lib = _orin_with_runtime(default_artifact, tmp_path)
    root = tmp_path / "orin-dev"
    r1 = deploy(orin, str(root), selftest=False, cuda_runtime=runtime, **QUIET)
    installed = root / "cuda12-runtime" / "aarch64" / "libtvm_runtime_cuda.so"
    assert installed.read_bytes() == lib.read_bytes() and any("installed the CUDA 12 runtime" in n for n in r1.notes)
    assert not list((root / "cuda12-runtime" / "aarch64").glob(".*.part"))
    r2 = deploy(orin, str(root), selftest=False, cuda_runtime=runtime, **QUIET)
    assert not any("CUDA 12" in n for n in r2.notes)  # identical copy there: left alone
    # the device's runtime finds it next to the release
    from inferx_edge.runtime import _tvm

    assert root / "cuda12-runtime" in _tvm.cuda_runtime_dirs(near=root / "current")
    lib.write_bytes(b"tampered")
    with pytest.raises(DeployError, match="does not match the sha256"):
        deploy(orin, str(root), selftest=False, cuda_runtime=runtime, **QUIET)
    with pytest.raises(UsageError, match="no aarch64/libtvm_runtime_cuda.so"):
        deploy(orin, str(root), selftest=False, cuda_runtime=tmp_path / "none", **QUIET)


def test_jetson_deploy_builds_the_cuda12_runtime_when_none_was_built(default_artifact, tmp_path, monkeypatch):
    """One command: with no CUDA 12 runtime built, deploy builds it (signed with --sign), then installs
    it; a build that fails, or a trust store without a key to sign with, installs nothing at all."""
    import json as _json

    from inferx_edge.deploy import cuda12_runtime
    from inferx_edge.errors import BuildError
    from inferx_edge.package.bundle import sha256_file
    from inferx_edge.package.signing import generate_keypair, sign_manifest

    key, pub, fp = generate_keypair(tmp_path / "keys")
    orin, _, _ = _orin_with_runtime(default_artifact, tmp_path, sign_key=key)
    home = tmp_path / "data" / "cuda12-runtime"
    monkeypatch.setattr(cuda12_runtime, "default_out", lambda: home)
    calls = []

    def fake_build(arch, out, *, sign=None, log=print, **kw):  # the real build: tests/deploy/test_cuda12_runtime.py
        calls.append((arch, out, sign))
        (out / arch).mkdir(parents=True, exist_ok=True)
        lib = out / arch / "libtvm_runtime_cuda.so"
        lib.write_bytes(b"\x7fELF built by deploy")
        record = out / arch / "build.json"
        record.write_text(_json.dumps({"sha256": sha256_file(lib), "cuda_version": 12060}))
        if sign is not None:
            (out / arch / "build.json.sig").write_bytes(sign_manifest(record.read_bytes(), sign, "build.json"))
        return {}

    def failing_build(arch, out, **kw):
        raise BuildError("aarch64-linux-gnu-g++ not found (apt install g++-aarch64-linux-gnu)")

    monkeypatch.setattr(cuda12_runtime, "build", failing_build)
    dev = tmp_path / "orin-dev"
    with pytest.raises(DeployError, match="building the CUDA 12 runtime for aarch64 failed.*apt install"):
        deploy(orin, str(dev), selftest=False, trust=False, **QUIET)
    assert not dev.exists() or not any(dev.iterdir())  # nothing uploaded
    monkeypatch.setattr(cuda12_runtime, "build", fake_build)
    with pytest.raises(DeployError, match="requires signed native code: deploy with --sign KEY"):
        deploy(orin, str(dev), selftest=False, trust=pub, **QUIET)
    assert not calls and (not dev.exists() or not any(dev.iterdir()))
    r = deploy(orin, str(dev), selftest=False, trust=pub, sign=key, **QUIET)
    assert calls == [("aarch64", home, key)]
    assert any("built the CUDA 12 runtime" in n for n in r.notes)
    there = dev / "cuda12-runtime" / "aarch64"
    assert (there / "libtvm_runtime_cuda.so").read_bytes() == b"\x7fELF built by deploy"
    assert (there / "build.json.sig").is_file()
    r2 = deploy(orin, str(dev), selftest=False, trust=pub, sign=key, **QUIET)  # built once, installed once
    assert len(calls) == 1 and not any("CUDA 12" in n for n in r2.notes)


def test_jetson_deploy_ships_a_signed_cuda12_runtime_and_leaves_a_working_device_alone(
    default_artifact, tmp_path, monkeypatch
):
    from inferx_edge.deploy.transports import LocalTransport
    from inferx_edge.package.signing import generate_keypair, sign_manifest

    key, pub, _ = generate_keypair(tmp_path / "keys")
    orin, runtime, lib = _orin_with_runtime(default_artifact, tmp_path, sign_key=key)
    record = runtime / "aarch64" / "build.json"
    root = tmp_path / "orin-dev"
    with pytest.raises(DeployError, match="not signed, and the trust store"):
        deploy(orin, str(root), selftest=False, cuda_runtime=runtime, trust=pub, **QUIET)
    assert not (root / "cuda12-runtime" / "aarch64" / "libtvm_runtime_cuda.so").exists()
    (runtime / "aarch64" / "build.json.sig").write_bytes(sign_manifest(record.read_bytes(), key, "build.json"))
    r = deploy(orin, str(root), selftest=False, cuda_runtime=runtime, trust=pub, **QUIET)
    there = root / "cuda12-runtime" / "aarch64"
    assert any("installed the CUDA 12 runtime" in n for n in r.notes)
    assert (there / "build.json.sig").read_bytes() == (runtime / "aarch64" / "build.json.sig").read_bytes()
    # a device whose own TVM runs on its driver (TVM built on the Jetson, or a CUDA 13 driver) gets nothing
    monkeypatch.setattr(
        LocalTransport,
        "cuda_status",
        lambda self, python: {"arch": "aarch64", "driver_cuda": [12, 6], "installed_cudart": 12, "works": True},
    )
    fresh = tmp_path / "jetson-with-own-tvm"
    logs = []
    deploy(orin, str(fresh), selftest=False, cuda_runtime=runtime, trust=pub, log=logs.append)
    assert not (fresh / "cuda12-runtime").exists()
    assert any("runs on its driver" in line for line in logs)
