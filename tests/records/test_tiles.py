"""The tile record file: tile keys, reading, legacy names, records build applies."""

from __future__ import annotations

import json

from inferx_edge.compiler.cuda import DEFAULT_TILE
from tests.helpers import fused, needs_nvrtc, nhwc_conv, quantized_conv


def test_kernels_differing_only_in_scales_or_names_share_a_tile_key():
    from inferx_edge.compiler.tuning import tile_groups

    (a,) = tile_groups(fused(quantized_conv(0.01)))
    (b,) = tile_groups(fused(quantized_conv(0.37, weight="onnx__Conv_566")))
    (c,) = tile_groups(fused(quantized_conv(0.01, k=1)))
    assert a.key == b.key != c.key
    assert a.extents == [8 * 14 * 14, 128, 9 * 128] and a.input_padded and not c.input_padded


def _record(work_dir, mod, best: str, extents=None):
    from inferx_edge.compiler.tuning import tile_groups
    from inferx_edge.records.tiles import FORMAT, TILES_FILE

    (g,) = tile_groups(mod)
    rec = {"kernels": g.kernels, "extents": extents or g.extents, "default": DEFAULT_TILE.text(), "us": {best: 1.0}}
    work_dir.mkdir(parents=True, exist_ok=True)
    (work_dir / TILES_FILE).write_text(json.dumps({"format": FORMAT, "groups": {g.key: rec | {"best": best}}}))


@needs_nvrtc
def test_tile_groups_know_whether_the_weight_runs_along_k():
    """OHWI conv weights do (16-byte weight-load candidates); a classifier weight transposed in the
    graph reaches its GEMM as [K, J] and does not."""
    from inferx_edge.compiler.tuning import tile_groups
    from tests.helpers import int8_matmul_module

    (conv,) = tile_groups(fused(quantized_conv(0.01)))
    (fc,) = tile_groups(fused(int8_matmul_module(64, 1000, 2048)))
    assert conv.weights_along_k and not fc.weights_along_k and fc.extents == [64, 1000, 2048]

    (half,) = tile_groups(fused(nhwc_conv(8, 14, 14, 128, 128, 3, 1, 1, "float16")))
    assert conv.int8 and fc.int8 and not half.int8  # fp16 groups get no 8-warp tiles


def test_build_gives_each_kernel_its_recorded_tile(tmp_path):
    import tvm

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cuda import TILE_ATTR, cuda_pipeline
    from inferx_edge.compiler.tensor_intrinsics import import_tensor_intrinsics
    from inferx_edge.compiler.tuning import apply_tuning
    from inferx_edge.targets import get_target

    import_tensor_intrinsics()
    spec = get_target("h200")
    target = resolve_tvm_target(spec)
    recorded = "2x1.2x2.k8.v16.async.mma"  # 32 x 64, far from the rule's 64 x 128 pick for this shape
    _record(tmp_path, fused(quantized_conv(0.01)), recorded)
    mod, tuned, tiled, _ = apply_tuning(quantized_conv(0.5, weight="onnx__Conv_1"), target, tmp_path)
    assert (tuned, tiled) == (0, 1)
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and TILE_ATTR in f.attrs]
    assert func.attrs[TILE_ATTR] == recorded
    with target:
        scheduled = cuda_pipeline(target, sm_count=spec.sm_count)(mod)
    (script,) = [f.script() for _, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert 'T.thread_binding(T.int64(2), thread="blockIdx.y")' in script  # 128 output channels / 64
    assert "software_pipeline_async_stages" in script
    # a record for other extents (a different model's kernel with the same key cannot be) is ignored
    _record(tmp_path, fused(quantized_conv(0.01)), recorded, extents=[1, 2, 3])
    assert apply_tuning(quantized_conv(0.5), target, tmp_path)[2] == 0


def test_legacy_tile_file_is_read_and_replaced_by_the_next_save(tmp_path):
    from inferx_edge.records.tiles import FORMAT, LEGACY_TILES_FILE, TILES_FILE, has_tiles, load_tiles, save_tiles

    data = {"format": FORMAT, "groups": {"k": {"best": DEFAULT_TILE.text(), "extents": [1, 2, 3]}}}
    (tmp_path / LEGACY_TILES_FILE).write_text(json.dumps(data))
    assert has_tiles(tmp_path) and load_tiles(tmp_path) == data
    save_tiles(tmp_path, data)
    assert (tmp_path / TILES_FILE).exists() and not (tmp_path / LEGACY_TILES_FILE).exists()
    assert load_tiles(tmp_path) == data
