"""The main job end to end, as the README's first command runs it, plus CLI plumbing."""

from __future__ import annotations

import json

import pytest

from tests.helpers import cli, cli_in_process


def test_help_lists_every_command():
    r = cli("--help")
    assert r.returncode == 0
    for cmd in ("evaluate", "targets", "build", "run", "inspect"):
        assert cmd in r.stdout


def test_evaluate_default_model_end_to_end(tmp_path):
    r = cli("evaluate", "--report", tmp_path / "report.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "top-1" in r.stdout and "latency" in r.stdout
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["samples"] == 500 and report["variant"] == "fp32-b1"
    assert report["top1"] >= 0.85  # measured 0.89 on this holdout
    assert report["onnxruntime"]["top1_agreement"] == 1.0
    assert report["onnxruntime"]["max_abs_diff"] <= 1e-4
    assert (tmp_path / "build").is_dir() and list((tmp_path / "build").glob("fmnist_cnn-*.ixa"))


def test_evaluate_needs_labelled_data_for_another_model(tmp_path):
    from tests.helpers import make_convnet

    r = cli("evaluate", "--model", make_convnet(tmp_path / "c.onnx"), cwd=tmp_path)
    assert r.returncode == 2 and "--data" in r.stderr


def test_run_without_input_is_a_smoke_test(default_artifact):
    r = cli("run", default_artifact, "--repeat", "2")
    assert r.returncode == 0, r.stderr
    assert "seeded random inputs" in r.stdout and "output logits: float32[1, 10]" in r.stdout


@pytest.mark.parametrize(
    "args,code,msg",
    [
        (["run", "missing.ixa"], 2, "artifact not found"),
        (["build", "--input-shape", "image:1x1x28"], 2, "rank 4"),
        (["build", "--precision", "int3"], 2, "unknown precision 'int3'; did you mean 'int8'? valid: fp32"),
    ],
)
def test_cli_errors(tmp_path, args, code, msg, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    got, err = cli_in_process(*args, capsys=capsys)
    assert got == code, err
    assert msg in err
    assert "Traceback" not in err


def test_inspect_device_says_what_this_machine_would_load(default_artifact, tmp_path):
    import os

    from tests.helpers import retarget_artifact

    r = cli("inspect", default_artifact, "--device")
    assert r.returncode == 0 and f"this device: {os.uname().machine}" in r.stdout, r.stderr
    gpu = retarget_artifact(default_artifact, tmp_path / "gpu.ixa", name="h200", device="cuda", cuda_arch="sm_90a")
    r = cli("inspect", gpu, "--device", "--json")
    doc = json.loads(r.stdout)["device"]
    if doc["driver_cuda"] is None:  # no NVIDIA driver here: says so, exit 5, and still names the runtime
        assert r.returncode == 5 and "no NVIDIA driver" in doc["problem"]
    assert "libtvm_runtime_cuda.so" in doc["cuda_runtime"]["library"]
    other = "x86_64" if os.uname().machine == "aarch64" else "aarch64"
    foreign = retarget_artifact(default_artifact, tmp_path / "arm.ixa", host_triple=f"{other}-linux-gnu")
    r = cli("inspect", foreign, "--device")
    assert r.returncode == 5 and f"built for a {other} host" in r.stdout
