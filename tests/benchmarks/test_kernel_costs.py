"""benchmarks/kernel_costs.py: per-call launches and compulsory traffic, compared across commits."""

from __future__ import annotations

import json
import shutil

import pytest


def _doc(kernels: dict) -> dict:
    return {"kernels": {n: {"flops": 1e9, "bytes": b, "calls": c, "rule": "R"} for n, (b, c) in kernels.items()}}


def test_totals_count_every_launch_and_the_comparison_names_what_changed():
    from benchmarks.kernel_costs import compare, summary

    before = summary(_doc({"conv": (2_000_000, 3), "cast": (1_000_000, 3)}))
    after = summary(_doc({"conv_cast": (1_500_000, 3)}))
    assert (before["launches"], before["traffic_MB"], before["GFLOP"]) == (6, 9.0, 6.0)
    c = compare(after, before)
    assert c["before"]["traffic_MB"] == 9.0 and c["traffic_ratio"] == 0.5
    assert c["only_before_MB"] == {"conv": 6.0, "cast": 3.0} and c["only_after_MB"] == {"conv_cast": 4.5}


def test_a_model_runs_through_kernel_profile_and_a_missing_one_is_named(tmp_path, monkeypatch, capsys):
    """The embedded default model as a zoo entry: one record with its launches and traffic; a model not
    exported is an argparse error naming the export command, before anything runs."""
    import benchmarks._record as record
    from benchmarks.kernel_costs import main
    from inferx_edge.models import DEFAULT_MODEL

    zoo = tmp_path / "zoo" / "fmnist"
    zoo.mkdir(parents=True)
    shutil.copy(DEFAULT_MODEL, zoo / "model.onnx")
    (zoo / "export.json").write_text(json.dumps({"inputs": {"image": [1, 1, 28, 28]}}))
    monkeypatch.setattr(record, "RESULTS", tmp_path / "results")
    args = ["--zoo-dir", str(tmp_path / "zoo"), "--precision", "fp32", "--batch", "2", "--name", "kc"]
    with pytest.raises(SystemExit):
        main(["--models", "fmnist,not_exported", *args])
    assert "benchmarks.zoo_export --models not_exported" in capsys.readouterr().err
    assert main(["--models", "fmnist", *args]) == 0
    rec = json.loads((tmp_path / "results" / "kc.json").read_text())
    row = rec["models"]["fmnist"]
    assert row["launches"] >= row["kernels"] >= 3 and row["traffic_MB"] > 0
    assert rec["git_commit"] and rec["target"] == "h200" and rec["batch"] == 2
