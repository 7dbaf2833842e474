"""benchmarks/zoo.py: models exported on the spot land in the zoo cache, whole or not at all; its table."""

from __future__ import annotations

import pytest


def test_an_export_lands_in_the_cache_and_an_interrupted_one_leaves_nothing(tmp_path, monkeypatch):
    import benchmarks.zoo_export as zoo_export
    from benchmarks.zoo import model_dir

    calls = []

    def export_one(spec, out_dir, batch):
        calls.append(spec.name)
        (out_dir / "model.onnx").write_text("onnx")  # written first, as the real export does
        if len(calls) == 1:
            raise KeyboardInterrupt  # cut before calibration data and references
        (out_dir / "calib.npz").write_text("calib")

    monkeypatch.setattr(zoo_export, "export_one", export_one)
    cache, out = tmp_path / "zoo", tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        model_dir("resnet18", cache, out)
    assert not (cache / "resnet18").exists() and list(cache.iterdir()) == []  # no half-written model
    d = model_dir("resnet18", cache, out)
    assert d == cache / "resnet18" and (d / "calib.npz").exists() and list(cache.iterdir()) == [d]
    assert model_dir("resnet18", cache, out) == d and len(calls) == 2  # found, not exported again


def test_the_table_names_the_gpu_that_ran_code_built_for_another_target():
    from benchmarks.zoo import markdown

    row = {"model": "m", "system": "inferx-int8", "batch": 1, "img_s": 10.0, "p50_ms": 1.0, "rel_error_vs_fp32": 0.1}
    record = {"results": [row], "systems": ["inferx-int8"], "target": "h200", "build_only": False, "builds": []}
    assert markdown(record).startswith("# Zoo on h200\n")
    ran = markdown(record | {"device": "NVIDIA H100 80GB HBM3"})
    assert ran.startswith("# Zoo on h200 (run on NVIDIA H100 80GB HBM3)\n") and "| m | inferx-int8 | 1 |" in ran
