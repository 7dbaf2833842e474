"""The on-device runtime: input checks, target checks, CLI run, and that it never loads the compiler."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from inferx_edge.errors import InputError, TargetMismatchError
from inferx_edge.package import open_artifact, read_manifest, write_artifact
from inferx_edge.runtime import Engine
from tests.helpers import REPO, build_quietly, cli, cli_in_process, retarget_artifact


def _image(batch=1, dtype=np.float32):
    return np.random.default_rng(0).random((batch, 1, 28, 28)).astype(dtype)


def test_run_matches_onnxruntime(default_artifact):
    ort = pytest.importorskip("onnxruntime")
    from inferx_edge.models import DEFAULT_MODEL

    x = _image()
    sess = ort.InferenceSession(str(DEFAULT_MODEL), providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, {"image": x})
    with Engine(default_artifact) as engine:
        np.testing.assert_allclose(engine.run(x)["logits"], want, atol=1e-4, rtol=0)
        stats = engine.benchmark(x, warmup=1, repeat=5)
    assert stats.count == 5 and stats.min_ms <= stats.p50_ms <= stats.max_ms


@pytest.mark.parametrize(
    "inputs,msg",
    [
        (_image(batch=2), "must have shape 1x1x28x28, got 2x1x28x28"),
        (np.zeros((1, 28, 28), np.float32), "must have shape 1x1x28x28, got 1x28x28"),
        (_image(dtype=np.float64), "must be float32, got float64"),
        ({"img": _image()}, r"missing \['image'\], unknown \['img'\]"),
    ],
)
def test_bad_inputs_are_refused(default_artifact, inputs, msg):
    with Engine(default_artifact) as engine, pytest.raises(InputError, match=msg):
        engine.run(inputs)


def test_cli_run_writes_output_and_refuses_bad_input(default_artifact, tmp_path):
    x = _image()
    np.save(tmp_path / "x.npy", x)
    r = cli("run", default_artifact, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npy", "--repeat", "3")
    assert r.returncode == 0, r.stderr
    assert "latency over 3 runs: p50" in r.stdout
    with Engine(default_artifact) as engine:
        np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), engine.run(x)["logits"])

    np.save(tmp_path / "bad.npy", _image(batch=3))
    r = cli("run", default_artifact, "--input", f"image={tmp_path / 'bad.npy'}", "--output", tmp_path / "z.npy")
    assert r.returncode == 6 and "must have shape 1x1x28x28, got 3x1x28x28" in r.stderr
    assert not (tmp_path / "z.npy").exists()

    r = cli("run", default_artifact, "--input", tmp_path / "nope.npy")
    assert r.returncode == 2 and "input file not found" in r.stderr


def test_aarch64_artifact_refused_on_x86(arm64_artifact):
    if read_manifest(arm64_artifact).target["host_triple"].startswith(__import__("platform").machine()):
        pytest.skip("this host is aarch64")
    with open_artifact(arm64_artifact) as art:
        lib = art.member(art.manifest.variant().library)
        assert lib.read_bytes()[18:20] == (183).to_bytes(2, "little")  # EM_AARCH64
    with pytest.raises(
        TargetMismatchError, match=r"built for target 'arm64-cpu' \(aarch64-linux-gnu\); this machine is x86_64"
    ):
        Engine(arm64_artifact)
    r = cli("run", arm64_artifact)
    assert r.returncode == 5 and "aarch64" in r.stderr


def test_gpu_artifact_refused_without_matching_gpu(default_artifact, tmp_path):
    bad = retarget_artifact(
        default_artifact, tmp_path / "orin.ixa", name="jetson-agx-orin-64gb", device="cuda", cuda_arch="sm_87"
    )
    # without a driver: TVM's CUDA runtime cannot load; with the build's libcuda stub loaded: no GPU
    with pytest.raises(TargetMismatchError, match="CUDA runtime cannot be loaded|no CUDA GPU 0 is visible"):
        Engine(bad)


def test_library_architecture_must_match_manifest(default_artifact, arm64_artifact, tmp_path):
    """An aarch64 library inside an artifact that claims x86_64 is caught from the ELF header."""
    m = read_manifest(default_artifact)
    arm = read_manifest(arm64_artifact)
    import dataclasses

    with open_artifact(default_artifact) as art, open_artifact(arm64_artifact) as arm_art:
        members = {n: art.member(n) for n in m.files}
        members[m.variant().library] = arm_art.member(arm.variant().library)
        write_artifact(tmp_path / "mixed.ixa", dataclasses.replace(m), members)
    with pytest.raises(TargetMismatchError, match="contains aarch64 code but the manifest says x86_64"):
        Engine(tmp_path / "mixed.ixa")


def test_tvm_version_mismatch_is_refused(default_artifact, tmp_path):
    import dataclasses

    m = read_manifest(default_artifact)
    with open_artifact(default_artifact) as art:
        write_artifact(
            tmp_path / "old.ixa", dataclasses.replace(m, tvm_version="0.19.0"), {n: art.member(n) for n in m.files}
        )
    with pytest.raises(TargetMismatchError, match="compiled with TVM 0.19.0"):
        Engine(tmp_path / "old.ixa")


def test_runtime_never_loads_the_compiler(default_artifact):
    code = f"""
import sys, json, numpy as np
from inferx_edge.runtime import Engine
with Engine({str(default_artifact)!r}) as e:
    y = e.run(np.zeros((1, 1, 28, 28), np.float32))["logits"]
maps = open("/proc/self/maps").read()
print(json.dumps({{
    "shape": list(y.shape),
    "compiler_lib": "libtvm_compiler" in maps,
    # tvm/__init__ always imports the (pure Python) tvm.driver shim; it is inert without libtvm_compiler
    "compiler_modules": sorted(m for m in sys.modules
                               if m.split(".")[:2] in (["tvm", "relax"], ["tvm", "s_tir"], ["tvm", "topi"])),
    "inferx_modules": sorted(m for m in sys.modules if m.startswith("inferx_edge.") and
                             m.split(".")[1] in ("compiler", "frontend", "tune", "quantize")),
    "onnx": "onnx" in sys.modules,
}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["shape"] == [1, 10]
    assert report["compiler_lib"] is False
    assert report["compiler_modules"] == [] and report["inferx_modules"] == []
    # (torch may appear: apache-tvm-ffi itself imports it whenever it is installed)
    assert report["onnx"] is False


def test_cpu_threads_default_to_physical_cores_unless_the_user_chose(monkeypatch):
    from inferx_edge.runtime._tvm import cpu_thread_budget, set_default_cpu_threads

    monkeypatch.delenv("TVM_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert "one per physical core" in set_default_cpu_threads()
    assert 1 <= int(os.environ["TVM_NUM_THREADS"]) == cpu_thread_budget() <= (os.cpu_count() or 1)
    monkeypatch.setenv("TVM_NUM_THREADS", "3")
    assert "set by the user" in set_default_cpu_threads() and os.environ["TVM_NUM_THREADS"] == "3"
    monkeypatch.delenv("TVM_NUM_THREADS")
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert "OMP_NUM_THREADS=5" in set_default_cpu_threads() and "TVM_NUM_THREADS" not in os.environ


def test_nonfinite_inputs_are_refused_unless_allowed(default_artifact, tmp_path, capsys):
    x = np.zeros((1, 1, 28, 28), np.float32)
    x[0, 0, :2, :3] = np.nan
    x[0, 0, 5, 5] = np.inf
    with Engine(default_artifact) as engine:
        with pytest.raises(InputError, match="input 'image' holds 7 NaN/Inf values of 784"):
            engine.run(x)
    with Engine(default_artifact, allow_nonfinite=True) as engine:
        engine.run(x)
    np.save(tmp_path / "nan.npy", x)
    code, err = cli_in_process("run", default_artifact, "--input", tmp_path / "nan.npy", "--repeat", "0", capsys=capsys)
    assert code == 6 and "7 NaN/Inf" in err
    code, err = cli_in_process("run", default_artifact, "--input", tmp_path / "nan.npy", "--repeat", "0", "--allow-nonfinite", capsys=capsys)  # fmt: skip
    assert code == 0, err


def test_bad_run_arguments_and_input_files(default_artifact, tmp_path, capsys):
    x = tmp_path / "x.npy"
    np.save(x, np.zeros((1, 1, 28, 28), np.float32))
    (tmp_path / "empty.npy").write_bytes(b"")
    np.save(tmp_path / "scalar.npy", np.float32(1.0))
    cases = [
        (["--repeat", "-5"], 2, "--repeat must be 0 or more"),
        (["--input", x, "--input", f"image={x}"], 2, "input image given twice"),
        (["--input", tmp_path / "empty.npy"], 6, "cannot read input file"),
        (["--input", tmp_path / "scalar.npy"], 6, "got scalar"),
    ]
    for args, want, msg in cases:
        code, err = cli_in_process("run", default_artifact, *args, capsys=capsys)
        assert code == want and msg in err, (args, err)


def test_one_engine_shared_by_threads_that_run_and_switch(tmp_path):
    """select() racing run() from other threads: every call completes on one whole variant."""
    import threading

    art = build_quietly(tmp_path / "multi.ixa", precisions=("fp32", "fp16"), tuning=False)
    x = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)
    errors = []
    with Engine(art) as engine:
        want = {}
        for v in ("fp32-b1", "fp16-b1"):
            engine.select(v)
            want[v] = engine.run(x)["logits"]

        def runner():
            try:
                for _ in range(200):
                    out = engine.run(x)["logits"]
                    assert any(np.array_equal(out, w) for w in want.values())
            except Exception as exc:  # noqa: BLE001 - collected for the assertion below
                errors.append(exc)

        def switcher():
            for i in range(400):
                engine.select(("fp32-b1", "fp16-b1")[i % 2])

        threads = [threading.Thread(target=runner) for _ in range(3)] + [threading.Thread(target=switcher)]
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads as often as possible: races show up in a few hundred calls
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            sys.setswitchinterval(interval)
    assert not errors, errors[:3]


def test_an_engine_never_closed_leaves_no_scratch_directory(default_artifact):
    import gc

    engine = Engine(default_artifact)
    root = engine._extracted.root
    assert root.exists()
    del engine
    gc.collect()
    assert not root.exists()


def test_select_waits_for_a_run_in_progress(tmp_path):
    """The documented contract, made deterministic with a slow variant: no select() completes while a
    run() is in progress, so a run never mixes two variants' functions and weights."""
    import threading
    import time as _time

    art = build_quietly(tmp_path / "two.ixa", precisions=("fp32", "fp16"), tuning=False)
    x = np.zeros((1, 1, 28, 28), np.float32)
    events = []
    with Engine(art, preload=True) as engine:
        loaded = engine._current
        real = loaded.main

        def slow_main(*args):
            events.append(("run-start", _time.perf_counter()))
            _time.sleep(0.2)
            out = real(*args)
            events.append(("run-end", _time.perf_counter()))
            return out

        loaded.main = slow_main
        runner = threading.Thread(target=engine.run, args=(x,))
        runner.start()
        while not events:
            _time.sleep(0.001)
        engine.select("fp16-b1")
        events.append(("selected", _time.perf_counter()))
        runner.join()
    order = [e for e, _ in events]
    assert order == ["run-start", "run-end", "selected"], order
