"""scripts/tile_survey.py: the default-tile rule scored against recorded tile searches, and a search's
printed log read back (no GPU: synthetic records)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "tile_survey.py"


def _run(*args):
    r = subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def test_score_compares_the_rule_with_the_recorded_default_and_the_best(tmp_path):
    from inferx_edge.compiler.cuda import tile_for

    ext = [12608, 768, 3072]  # ViT-B/16 fc2 at batch 64: the rule picks 128-deep stages, three buffers
    shape = {"input_padded": False, "weights_along_k": True, "int8": True, "batch": 1}
    rule = tile_for(ext, 132, input_padded=False, deep_stages=True, async_copy=True).text()
    old = tile_for(ext, 132).text()
    assert rule != old
    group = {"extents": ext, "shape": shape, "kernels": ["a", "b"], "default": old, "best": "x",
             "us": {old: 200.0, rule: 130.0, "x": 100.0}}  # fmt: skip
    unmeasured = {**group, "extents": [4096, 4096, 4096], "us": {"x": 50.0}}
    db = tmp_path / "h200" / "model-1"
    db.mkdir(parents=True)
    (db / "tiles.json").write_text(
        json.dumps({"format": 1, "device": "GPU", "groups": {"g1": group, "g2": unmeasured}})
    )
    (tmp_path / "model_b64.tiles.json").write_text((db / "tiles.json").read_text())  # a flat copy: counted once
    out = tmp_path / "score.json"
    _run("score", tmp_path, "--json", out)
    rec = json.loads(out.read_text())
    s = rec["summary"]
    assert s["groups"] == 2 and s["groups_scored"] == 1 and s["groups_rule_not_measured"] == ["g2"]
    assert s["geomean_rule_over_best"] == 1.3 and s["geomean_recorded_default_over_best"] == 2.0
    assert (s["kernel_us_rule"], s["kernel_us_recorded_default"], s["kernel_us_best"]) == (260.0, 400.0, 200.0)
    assert s["groups_rule_faster_than_recorded_default"] == 1
    assert rec["groups"][0]["rule"] == rule and rec["groups"][0]["device"] == "GPU"
    _run("score", db / "tiles.json", "--json", out)  # one tile file named directly
    assert json.loads(out.read_text())["summary"]["groups"] == 2

    # --compare: a previous record whose rule gave the old tile; the group moves 200 -> 130 us
    prev = json.loads(out.read_text())
    prev["groups"][0] |= {"rule": old, "rule_us": 200.0}
    (tmp_path / "prev.json").write_text(json.dumps(prev))
    _run("score", db / "tiles.json", "--compare", tmp_path / "prev.json", "--json", out)
    rec = json.loads(out.read_text())
    assert rec["summary"]["rule_change"] == {
        "groups_moved": 1, "faster": 1, "slower": 0, "kernel_us_previous_rule": 400.0, "kernel_us_rule": 260.0,
        "geomean_rule_over_previous": 0.65,
    }  # fmt: skip
    assert rec["groups_the_rule_change_moves"][0]["previous_rule"] == old


def test_log_reads_the_groups_a_search_printed(tmp_path):
    log = tmp_path / "search.log"
    log.write_text(
        "== vit_b_16:64: python -m inferx_edge tune ...\n"
        "      [1/3] 12608x3072x768 (12 kernels): 2x4.2x4.k8.v16.p16.a8.w16.async.mma 148.5 us, 1.27x the default "
        "2x4.2x4.k4.v16.a8.w16.mma  [24 s, ETA 121 s]\n"
        "      [2/3] 200704x96x64 (1 kernel): 2x2.2x4.k4.v16.a8.w16.async.mma 35.9 us, 1.01x the default "
        "2x4.2x4.k4.v16.a8.w16.mma  [84 s, ETA 7 s]\n"
        "== convnext_tiny:64: exit 0 after 112 s\n"
        "      [3/3] 12544x1024x1024 (1 kernel): 4x4.2x4.k8.v16.a8.w16.r2.async3.mma 46.6 us, 1.44x the default "
        "2x4.2x4.k4.v16.a8.w16.mma  [72 s, ETA 348 s]\n"
        "      [4/29] 3136x2048x1024 (1 kernel): 2x2.2x4.k8.v16\n"  # cut off: not a group
    )
    out = tmp_path / "log.json"
    _run("log", log, "--json", out)
    rec = json.loads(out.read_text())
    assert [g["model"] for g in rec["groups"]] == ["vit_b_16:64", "vit_b_16:64", "convnext_tiny:64"]
    assert rec["groups"][0]["extents"] == [12608, 3072, 768] and rec["groups"][0]["kernels"] == 12
    s = rec["summary"]
    assert (s["groups"], s["groups_k_ge_256"], s["won_by_128_deep_stages"], s["won_by_three_buffers"]) == (3, 2, 2, 1)
    assert s["geomean_default_over_best_k_ge_256"] == round((1.27 * 1.44) ** 0.5, 4)


def test_padding_reports_the_k_the_default_tiles_pad_and_the_candidates_that_pad_less(tmp_path):
    """fp16, h200: a plain 3x3 convolution over 16 channels (one GEMM, K = 9 x 16 = 144, which the
    default's 64-deep stages pad to 192 and a 48-deep candidate does not pad), then a grouped one of
    16-channel groups (a GEMM per group, same K: its default already has the 48-deep stages)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 16, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((64, 16, 3, 3)).astype(np.float32), "w2")
    plain = helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    grouped = helper.make_node("Conv", ["h", "w2"], ["y"], group=4, pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    graph = helper.make_graph(
        [plain, grouped], "convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16, 14, 14])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64, 14, 14])], [w1, w2],
    )  # fmt: skip
    model = tmp_path / "convs.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    out = tmp_path / "padding.json"
    r = _run("padding", "--models", model, "--input-shape", "x:2x16x14x14", "--precision", "fp16", "--json", out)
    rec = json.loads(out.read_text())
    (entry,) = rec["models"].values()
    (one,) = [g for g in entry["groups"] if g["extents"][2] == 144 and g["batch"] == 1]
    assert not one["int8"] and one["extents"][1] == 64
    assert (one["k_padded"], one["k_padded_least"]) == (192, 144) and 48 in one["candidate_depths_dividing_k"]
    assert one["macs_padded"] * 3 == one["macs"] * 4 and one["macs_padded_least"] == one["macs"]
    (per_group,) = [g for g in entry["groups"] if g["extents"][2] == 144 and g["batch"] == 4]
    assert per_group["extents"][1] == 16 and per_group["k_padded"] == 144 == per_group["k_padded_least"]
    s = entry["summary"]
    assert s["groups_default_pads_k"] >= 1 and s["groups_default_pads_k_with_a_less_padding_candidate"] >= 1
    assert "pads K to 192" in r.stdout and rec["git_commit"]
