"""Shared fixtures: builds cached per test session and a TVM RPC tracker + server on 127.0.0.1 (the
tiny models and helpers themselves are in tests/helpers.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tvm  # noqa: F401

from tests.helpers import REPO, free_port  # noqa: F401  (REPO for tests that import it from here)

# The test process is a build host: TVM is loaded with its compiler here, before an in-process Engine
# could load it runtime-only (TVM_USE_RUNTIME_LIB), which breaks compiler use later in the same run
# (test order decided whether it worked). Runtime-only loading is tested in a subprocess (test_runtime).


@pytest.fixture(autouse=True, scope="session")
def _no_machine_trust_store(tmp_path_factory):
    """Tests never pick up this machine's trust store (~/.config/inferx_edge/trusted): each that needs
    one makes its own."""
    os.environ["INFERX_TRUST_DIR"] = str(tmp_path_factory.mktemp("no-trust") / "absent")


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("inferx")


@pytest.fixture(scope="session")
def default_artifact(workdir) -> Path:
    """The embedded model built for this host's CPU, once per session."""
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.models import DEFAULT_MODEL
    from inferx_edge.targets import host_target_name

    out = workdir / "default.ixa"
    build_artifact(BuildOptions(model=DEFAULT_MODEL, target=host_target_name(), output=out), log=lambda *a: None)
    return out


@pytest.fixture(scope="session")
def arm64_artifact(workdir) -> Path:
    """The embedded model cross-compiled for arm64-cpu (needs aarch64-linux-gnu-g++)."""
    if shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip("aarch64-linux-gnu-g++ not installed (apt-get install g++-aarch64-linux-gnu)")
    from inferx_edge.build import BuildOptions, build_artifact
    from inferx_edge.models import DEFAULT_MODEL

    out = workdir / "arm64.ixa"
    build_artifact(BuildOptions(model=DEFAULT_MODEL, target="arm64-cpu", output=out), log=lambda *a: None)
    return out


# --- TVM RPC tracker + server on 127.0.0.1 ----------------------------------------------------------


def _registered(port: int, key: str) -> bool:
    """Whether the RPC tracker on 127.0.0.1:``port`` lists a server under ``key``."""
    import tvm.rpc

    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) != 0:
            return False  # not up yet (connect_tracker would retry for a minute)
    try:
        servers = tvm.rpc.connect_tracker("127.0.0.1", port).summary().get("server_info", [])
    except (RuntimeError, OSError, ValueError):
        return False
    return any(info.get("key") == key for info in servers)


@pytest.fixture(scope="session")
def rpc_tracker():
    pytest.importorskip("tornado")
    port, server_port = free_port(), free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    tracker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tvm.exec.rpc_tracker",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--port-end",
            str(port + 1),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    procs = [tracker]
    try:
        deadline = time.time() + 60
        # started next to the tracker, not after it: each process takes 5-9 s to import TVM, and the
        # server retries the tracker every 5 s until it answers
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tvm.exec.rpc_server",
                "--tracker",
                f"127.0.0.1:{port}",
                "--key",
                "testdev",
                "--host",
                "127.0.0.1",
                "--port",
                str(server_port),
                "--port-end",
                str(server_port + 1),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        procs.append(server)
        while time.time() < deadline:
            if _registered(port, "server:testdev"):  # asked from here: a query process imports TVM (~5 s)
                break
            time.sleep(0.3)
        else:
            pytest.skip("RPC server did not register with the tracker in 60 s")
        yield port
    finally:
        for p in procs:  # the server forks popen workers: end the whole process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """A tiny random Llama checkpoint (Hugging Face layout, byte-level tokenizer, ChatML template)."""
    pytest.importorskip("transformers")
    from tests.llm_fixtures import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def _tiny_llm_build(tiny_llama, tmp_path_factory, precisions) -> Path:
    from inferx_edge.llm.build import LLMBuildOptions, build_llm_artifact

    out = tmp_path_factory.mktemp("llm-art") / "tiny.ixa"
    build_llm_artifact(LLMBuildOptions(model=tiny_llama, target="x86-cpu", output=out, precisions=precisions), log=lambda s: None)  # fmt: skip
    return out


@pytest.fixture(scope="session")
def tiny_llm_fp32_artifact(tiny_llama, tmp_path_factory):
    """``tiny_llama`` built for this CPU, variant fp32 (about 8 s on a 2-core host; each xdist worker
    that needs it builds its own)."""
    return _tiny_llm_build(tiny_llama, tmp_path_factory, ("fp32",))


@pytest.fixture(scope="session")
def tiny_llm_quantized_artifact(tiny_llama, tmp_path_factory):
    """``tiny_llama`` built for this CPU, variants int8, q4 and q4_1 in one artifact (about 35 s; one
    test uses it, so one worker builds it)."""
    return _tiny_llm_build(tiny_llama, tmp_path_factory, ("int8", "q4", "q4_1"))
