"""benchmarks/zoo.py: models exported on the spot land in the zoo cache, whole or not at all."""

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
