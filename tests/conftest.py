"""Shared fixtures: tiny ONNX models built in code, and builds cached per test session."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tvm  # noqa: F401
from onnx import TensorProto, helper, numpy_helper

# The test process is a build host: TVM is loaded with its compiler here, before an in-process Engine
# could load it runtime-only (TVM_USE_RUNTIME_LIB), which breaks compiler use later in the same run
# (test order decided whether it worked). Runtime-only loading is tested in a subprocess (test_runtime).

REPO = Path(__file__).resolve().parent.parent


def write_onnx(path: Path, nodes, inputs: dict, outputs: dict, inits, name: str = "g") -> Path:
    """An opset-13 float ONNX model from ``nodes``, ``{name: shape}`` inputs/outputs and initializers."""

    def infos(io):
        return [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in io.items()]

    graph = helper.make_graph(nodes, name, infos(inputs), infos(outputs), inits)
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString())
    return path


def make_convnet(path: Path, seed: int = 0, batch: int | str = "N") -> Path:
    """Conv -> BatchNorm -> Relu -> MaxPool -> Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Softmax."""
    rng = np.random.default_rng(seed)

    def init(name, *shape, scale=0.3):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)

    inits = [
        init("w1", 8, 3, 3, 3),
        init("b1", 8),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "bn_s"),
        init("bn_b", 8),
        init("bn_m", 8, scale=0.1),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "bn_v"),
        init("w2", 16, 8, 3, 3),
        init("fc_w", 5, 16),
        init("fc_b", 5),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"]),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [batch, 5])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def make_two_io(path: Path) -> Path:
    """Two inputs (float32 and int64 index-free), two outputs: MatMul+Add+Tanh and Concat/Mul."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((6, 4)).astype(np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["a", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["s"]),
        helper.make_node("Tanh", ["s"], ["out_t"]),
        helper.make_node("Concat", ["a", "a"], ["cat"], axis=1),
        helper.make_node("Mul", ["cat", "cat"], ["out_sq"]),
    ]
    graph = helper.make_graph(
        nodes,
        "two_io",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["B", 6]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["B", 4]),
        ],
        [
            helper.make_tensor_value_info("out_t", TensorProto.FLOAT, ["B", 4]),
            helper.make_tensor_value_info("out_sq", TensorProto.FLOAT, ["B", 12]),
        ],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())
    return path


def cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m inferx_edge ARGS`` in a subprocess, capturing output."""
    return subprocess.run(
        [sys.executable, "-m", "inferx_edge", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- TVM RPC tracker + server on 127.0.0.1 ----------------------------------------------------------


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
        while time.time() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
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
            r = subprocess.run(
                [sys.executable, "-m", "tvm.exec.query_rpc_tracker", "--host", "127.0.0.1", "--port", str(port)],
                capture_output=True,
                text=True,
            )
            if "server:testdev" in r.stdout:
                break
            time.sleep(1)
        else:
            pytest.skip("RPC server did not register with the tracker in 60 s")
        yield port
    finally:
        for p in procs:  # the server forks popen workers: end the whole process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
