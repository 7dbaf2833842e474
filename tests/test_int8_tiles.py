"""Tensor-core tile search (``tune --search tiles``): tile texts, kernel grouping, the tile
file (written as groups finish, resumed, repaired) and build applying it. Measuring needs a GPU; here a
fake one times the really compiled candidates (the H200 runs are in benchmarks/results)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from inferx_edge.compiler.cuda import DEFAULT_TILE, TILE_LADDER, TileConfig, tile_candidates
from tests.test_cross_targets import needs_nvrtc


def test_tile_text_round_trips_and_bad_text_names_the_form():
    extra = (
        replace(DEFAULT_TILE, pipeline="async", padded_vector=16),
        replace(DEFAULT_TILE, pipeline="async3", acc_pad=8, weight_vector=16),
        replace(DEFAULT_TILE, pipeline="async4", fragment_buffers=2),
    )
    for cfg in TILE_LADDER + extra + (TileConfig(),):
        assert TileConfig.parse(cfg.text()) == cfg
    assert TileConfig.parse("2x4.2x4.k4.v16.async.mma") == replace(DEFAULT_TILE, pipeline="async")
    assert TileConfig.parse("2x4.2x4.k4.v16.a8.w16.async3.mma") == replace(
        DEFAULT_TILE, pipeline="async3", acc_pad=8, weight_vector=16
    )
    for bad in (
        "2x4.2x4.k4",
        "2x4.2x4.k4.v16.mma.mma",
        "2x4.2x4.k4.v16.fast",
        "2x4.2x4.k4.v3.mma",
        "0x4.2x4.k4.v16",
        "2x4.2x4.k4.v16.a6.mma",  # accumulator rows pad by a multiple of 4 ints (16-byte epilogue loads)
        "2x4.2x4.k4.v16.a8.a8.mma",
        "2x4.2x4.k4.v16.r2.wmma",  # register double buffering is built for ldmatrix/mma.sync only
        "2x4.2x4.k4.v16.r3.mma",
        "2x4.2x4.k4.v16.async5.mma",
    ):
        with pytest.raises(ValueError, match="int8 tile"):
            TileConfig.parse(bad)


def test_candidates_start_with_the_default_and_vary_what_the_kernel_can_use():
    from inferx_edge.compiler.cuda import tile_for

    extents = (64 * 14 * 14, 256, 2304)  # ResNet-50 layer 3, 3x3, batch 64
    cands = tile_candidates(extents, 132, input_padded=True)
    assert cands[0] == tile_for(extents, 132) and len(set(cands)) == len(cands)
    assert {c.pipeline for c in cands} == {"", "async", "async3"} and {c.padded_vector for c in cands} == {4, 16}
    assert any(c.k_frags == 8 for c in cands)  # deeper stages where K allows
    assert all(c.k_frags == 8 for c in cands if c.pipeline == "async3")  # three buffers of 128-deep stages
    # every tile also with the padded accumulator tile (2-way instead of 8-way bank conflicts) and
    # 16-byte weight loads
    twins = {replace(c, acc_pad=0, weight_vector=4) for c in cands if (c.acc_pad, c.weight_vector) == (8, 16)}
    assert twins == {c for c in cands if (c.acc_pad, c.weight_vector) == (0, 4)}
    # a weight that does not run along K (a transposed classifier weight): the padded accumulator twins
    # keep 4-byte weight loads (16-byte ones would compile to the same kernel)
    kj = tile_candidates(extents, 132, input_padded=True, weights_along_k=False)
    assert {c.weight_vector for c in kj} == {4} and len(kj) == len(cands)
    assert {replace(c, weight_vector=16) for c in kj if c.acc_pad} == {c for c in cands if c.acc_pad}
    assert "async3" not in {c.pipeline for c in tile_candidates((64 * 56 * 56, 64, 576), 132)}  # K < 1024
    unpadded = tile_candidates(extents, 132, input_padded=False)
    assert {c.padded_vector for c in unpadded} == {4} and len(unpadded) < len(cands)
    # 3136 rows: 128-row tiles pad them (predicated loads: 16-byte variants), 64-row tiles do not
    ragged = tile_candidates((3136, 512, 2048), 132, input_padded=False)
    assert {16 * c.warps_i * c.frags_i for c in ragged if c.padded_vector == 16} == {128}
    # nothing smaller than a quarter of the default tile on a large GEMM
    assert all(16 * c.warps_i * c.frags_i * 16 * c.warps_j * c.frags_j >= 128 * 128 // 4 for c in cands)


def _quantized_conv(scale: float, weight: str = "w", hw: int = 14, c: int = 128, k: int = 3):
    """NHWC int8 conv -> int32 -> float scale -> int8 quantize, as the int8 variants fuse it."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([8, hw, hw, c], "int8"))
    w = relax.Var(weight, relax.TensorType([c, k, k, c], "int8"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = relax.op.nn.conv2d(
                x, w, padding=[k // 2] * 4, data_layout="NHWC", kernel_layout="OHWI", out_dtype="int32"
            )  # fmt: skip
            y = relax.op.multiply(relax.op.astype(y, "float32"), relax.const(np.float32(scale)))
            y = relax.op.astype(relax.op.clip(relax.op.round(y), -128, 127), "int8")
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return bb.get()


def _fused(mod):
    from tvm import relax

    return relax.get_pipeline("zero")(mod)


def test_large_int8_gemms_also_get_8_warp_tiles():
    """128x256 and 256x128 tiles of 8 warps (cuBLASLt's shape), pipelined, 128-deep: only for int8
    GEMMs with K >= 1024 that give every SM a block and do not pad J much."""
    cands = tile_candidates((4096, 4096, 4096), 132, input_padded=False)
    wide = [c for c in cands if c.warps_i * c.warps_j == 8]
    assert {(16 * c.warps_i * c.frags_i, 16 * c.warps_j * c.frags_j) for c in wide} == {(128, 256), (256, 128)}
    assert all(c.k_frags == 8 and c.pipeline in ("async", "async3") for c in wide) and len(set(cands)) == len(cands)
    assert {c.fragment_buffers for c in wide} == {1, 2}
    assert all(c.pipeline == "async3" and c.acc_pad for c in wide if c.fragment_buffers == 2)
    assert wide[0].text() == "2x4.4x4.k8.v16.async.mma" and "2x4.4x4.k8.v16.a8.w16.r2.async3.mma" in {
        c.text() for c in wide
    }
    eight = lambda cs: [c for c in cs if c.warps_i * c.warps_j == 8]  # noqa: E731
    assert not eight(tile_candidates((4096, 4096, 4096), 132, input_padded=False, int8=False))  # fp16: too much smem
    assert not eight(tile_candidates((4096, 4096, 512), 132, input_padded=False))  # K < 1024
    assert not eight(tile_candidates((1024, 1024, 4096), 132, input_padded=False))  # 32 blocks for 132 SMs
    assert not eight(tile_candidates((8192, 320, 2048), 132, input_padded=False))  # 320 columns padded to 384+
    # a padded convolution's 8-warp tiles also come with 16-byte predicated loads
    padded = eight(tile_candidates((64 * 28 * 28, 512, 1152), 132, input_padded=True))
    assert {c.padded_vector for c in padded} == {4, 16}


def test_kernels_differing_only_in_scales_or_names_share_a_tile_key():
    from inferx_edge.compiler.tuning import tile_groups

    (a,) = tile_groups(_fused(_quantized_conv(0.01)))
    (b,) = tile_groups(_fused(_quantized_conv(0.37, weight="onnx__Conv_566")))
    (c,) = tile_groups(_fused(_quantized_conv(0.01, k=1)))
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
    from tests.test_gpu_int8_build import _int8_matmul_module

    (conv,) = tile_groups(_fused(_quantized_conv(0.01)))
    (fc,) = tile_groups(_fused(_int8_matmul_module(64, 1000, 2048)))
    assert conv.weights_along_k and not fc.weights_along_k and fc.extents == [64, 1000, 2048]
    from benchmarks.gpu_conv_int8 import conv_module

    (half,) = tile_groups(_fused(conv_module(8, 14, 128, 128, 3, 1, "float16")))
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
    _record(tmp_path, _fused(_quantized_conv(0.01)), recorded)
    mod, tuned, tiled, _ = apply_tuning(_quantized_conv(0.5, weight="onnx__Conv_1"), target, tmp_path)
    assert (tuned, tiled) == (0, 1)
    (func,) = [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc) and TILE_ATTR in f.attrs]
    assert func.attrs[TILE_ATTR] == recorded
    with target:
        scheduled = cuda_pipeline(target, sm_count=spec.sm_count)(mod)
    (script,) = [f.script() for _, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert 'T.thread_binding(T.int64(2), thread="blockIdx.y")' in script  # 128 output channels / 64
    assert "software_pipeline_async_stages" in script
    # a record for other extents (a different model's kernel with the same key cannot be) is ignored
    _record(tmp_path, _fused(_quantized_conv(0.01)), recorded, extents=[1, 2, 3])
    assert apply_tuning(_quantized_conv(0.5), target, tmp_path)[2] == 0


class FakeGPU:
    """Times candidates without a GPU: the n-th measured takes 100 - n us; the third returns different
    outputs; ``stop_at`` raises KeyboardInterrupt at that measurement."""

    name = "fake"

    def __init__(self, stop_at: int | None = None):
        self.calls, self.stop_at = 0, stop_at

    def measure(self, path, host_args, repeat, min_repeat_ms):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        after = [a.copy() for a in host_args]
        if self.calls == 3:
            after[-1] = after[-1] + np.ones_like(after[-1])
        return (100 - self.calls) * 1e-6, after

    def close(self):
        pass


@needs_nvrtc
def test_search_records_the_fastest_correct_tile_and_resumes(tmp_path):
    from inferx_edge.compiler.tuning import tile_groups
    from inferx_edge.records.tiles import KERNEL_VERSION, TILES_FILE, load_tiles
    from inferx_edge.targets import get_target
    from inferx_edge.tune.tiles import search_tiles

    spec = get_target("h200")
    mod = _fused(_quantized_conv(0.01))
    mod2 = _fused(_quantized_conv(0.01, k=1))
    # two groups in one module: the 3x3 and the 1x1 conv
    mod["conv1x1"] = next(f for gv, f in mod2.functions_items() if gv.name_hint != "main")
    # measured most work (I*J*K) first: the 3x3 conv, then the 1x1 (the module holds them the other way)
    (g1, g3) = tile_groups(mod)
    assert (g3.extents[2], g1.extents[2]) == (9 * 128, 128)
    # interrupted while measuring the second group: the first is kept
    n3 = len(tile_candidates(g3.extents, spec.sm_count, g3.input_padded))
    with pytest.raises(KeyboardInterrupt):
        search_tiles(mod, spec, tmp_path, gpu=FakeGPU(stop_at=n3 + 2), workers=2, log=lambda *a: None)
    groups = load_tiles(tmp_path)["groups"]
    assert list(groups) == [g3.key]
    rec = groups[g3.key]
    assert rec["default"] == tile_candidates(g3.extents, spec.sm_count)[0].text()
    assert "outputs differ" in " ".join(rec["errors"].values())
    assert rec["best"] == min(rec["us"], key=rec["us"].get) and len(rec["us"]) == n3 - 1
    # the next run measures only the missing group; a third one measures nothing
    lines = []
    summary = search_tiles(mod, spec, tmp_path, gpu=FakeGPU(), workers=2, log=lines.append)
    assert summary.measured_now == 1 and set(load_tiles(tmp_path)["groups"]) == {g3.key, g1.key}
    assert "1 recorded" in lines[0] and any("[1/1]" in x and "ETA" in x for x in lines)  # progress per group
    assert all(r["best_us"] for r in summary.groups)
    assert search_tiles(mod, spec, tmp_path, gpu=FakeGPU(), log=lambda *a: None).measured_now == 0
    # candidates a newer release adds (here: two forgotten by the record) are measured alone, with the
    # default again as the reference; the record keeps the others' timings
    data = load_tiles(tmp_path)
    rec = data["groups"][g1.key]
    order = [c.text() for c in tile_candidates(g1.extents, spec.sm_count, g1.input_padded)]
    dropped = [t for t in order[1:] if t in rec["us"]][:2]  # in the order they are measured
    kept = {t: us for t, us in rec["us"].items() if t not in dropped}
    data["groups"][g1.key] = {**rec, "us": kept}
    (tmp_path / TILES_FILE).write_text(json.dumps(data))
    gpu, lines = FakeGPU(), []
    assert search_tiles(mod, spec, tmp_path, gpu=gpu, workers=2, log=lines.append).measured_now == 1
    assert gpu.calls == 3 and "1 recorded ones only for candidates added since" in lines[0]
    after = load_tiles(tmp_path)["groups"][g1.key]  # FakeGPU's third run (the second new one) differs
    assert dropped[0] in after["us"] and "outputs differ" in after["errors"][dropped[1]]
    assert all(after["us"][t] == us for t, us in kept.items() if t != rec["default"])
    assert after["best"] == min(after["us"], key=after["us"].get)
    # a group timed with older kernels (no kernel_version: before the cp.async rewrite) is measured
    # again in full, the other is left alone
    data = load_tiles(tmp_path)
    assert {r["kernel_version"] for r in data["groups"].values()} == {KERNEL_VERSION}
    del data["groups"][g1.key]["kernel_version"]
    (tmp_path / TILES_FILE).write_text(json.dumps(data))
    gpu, lines = FakeGPU(), []
    assert search_tiles(mod, spec, tmp_path, gpu=gpu, workers=2, log=lines.append).measured_now == 1
    assert gpu.calls == len(order) and "1 timed with older kernels" in lines[0]
    assert load_tiles(tmp_path)["groups"][g1.key]["kernel_version"] == KERNEL_VERSION
    # a corrupt file is moved aside with a warning, not fatal, and measured again
    (tmp_path / TILES_FILE).write_text('{"format": 1, "groups": {')
    warnings = []
    assert load_tiles(tmp_path, warn=warnings.append, repair=False) == {} and warnings  # build: only reads
    assert (tmp_path / TILES_FILE).exists()
    assert load_tiles(tmp_path, warn=warnings.append) == {} and len(warnings) == 2
    assert (tmp_path / (TILES_FILE + ".corrupt")).exists()


def test_tile_search_needs_a_cuda_tensor_core_variant():
    from inferx_edge.errors import UsageError
    from inferx_edge.models import DEFAULT_MODEL
    from inferx_edge.tune import TuneOptions

    with pytest.raises(UsageError, match="CUDA target and --precision fp16, int8, mixed"):
        TuneOptions(model=DEFAULT_MODEL, target="x86-cpu", precision="int8", search="tiles")
    with pytest.raises(UsageError, match="CUDA target and --precision fp16, int8, mixed"):
        TuneOptions(model=DEFAULT_MODEL, target="h200", precision="fp32", search="tiles")
    assert TuneOptions(model=DEFAULT_MODEL, target="h200", precision="fp16", search="tiles").search == "tiles"
    # the earlier name of the search still works
    assert TuneOptions(model=DEFAULT_MODEL, target="h200", precision="int8", search="int8-tiles").search == "tiles"
    with pytest.raises(UsageError, match="valid: metaschedule, tiles, int8-tiles"):
        TuneOptions(model=DEFAULT_MODEL, target="h200", precision="int8", search="random")


def test_benchmark_configs_are_tile_texts_or_builds_pick():
    from benchmarks.gpu_conv_int8 import parse_config

    assert parse_config("2x4.2x4.k4.v16.async.mma") == replace(DEFAULT_TILE, pipeline="async")
    auto = parse_config("auto.async", (64 * 56 * 56, 144, 24), 132)  # K = 24: 32-deep stages, as build
    assert auto.pipeline == "async" and auto.k_frags == 2
    padded = parse_config("auto.a8.w16.async3", (64 * 56 * 56, 256, 64), 132)
    assert (padded.acc_pad, padded.weight_vector, padded.pipeline) == (8, 16, "async3")
    for bad in ("auto.fast", "auto.mma.wmma", "auto.async.async3", "2x4.2x4"):
        with pytest.raises(SystemExit):
            parse_config(bad)


def test_fp16_outputs_match_within_tolerance_int8_exactly():
    from inferx_edge.tune.tiles import FP16_MATCH, _same

    rng = np.random.default_rng(0)
    ref = rng.uniform(0, 300, (64, 64)).astype(np.float16)
    close = (ref.astype(np.float32) * (1 + rng.uniform(-1e-3, 1e-3, ref.shape))).astype(np.float16)
    assert _same([close], [ref])  # another accumulation order
    off = ref.copy()
    off[3, 5] += np.float16(FP16_MATCH * 2 * np.abs(ref).max())  # a missing or doubled term
    assert not _same([off], [ref])
    nan = ref.copy()
    nan[0, 0] = np.nan
    assert not _same([nan], [ref])
    q = rng.integers(-128, 128, (8, 8)).astype(np.int8)
    q2 = q.copy()
    q2[0, 0] ^= 1
    assert _same([q], [q.copy()]) and not _same([q2], [q])


def test_legacy_tile_file_is_read_and_replaced_by_the_next_save(tmp_path):
    from inferx_edge.records.tiles import FORMAT, LEGACY_TILES_FILE, TILES_FILE, has_tiles, load_tiles, save_tiles

    data = {"format": FORMAT, "groups": {"k": {"best": DEFAULT_TILE.text(), "extents": [1, 2, 3]}}}
    (tmp_path / LEGACY_TILES_FILE).write_text(json.dumps(data))
    assert has_tiles(tmp_path) and load_tiles(tmp_path) == data
    save_tiles(tmp_path, data)
    assert (tmp_path / TILES_FILE).exists() and not (tmp_path / LEGACY_TILES_FILE).exists()
    assert load_tiles(tmp_path) == data


def test_compile_workers_run_at_lower_priority_and_the_caller_can_keep_its_own():
    """Tile candidates compile in pool workers while the parent times others on the GPU; a worker
    lowers its priority once (the CUDA compiler it spawns inherits it) unless told not to."""
    import subprocess
    import sys

    code = (
        "import os\n"
        "from tvm import te\n"
        "from inferx_edge.tune import tiles\n"
        "a = te.placeholder((4,), 'float32', name='a')\n"
        "copy = te.create_prim_func([a, te.compute((4,), lambda i: a[i], name='b')])\n"  # no GEMM: no tile applies
        "start = os.nice(0)\n"
        "args = (copy, '2x4.2x4.k4.v16.mma', 'cuda', 'h200', None)\n"
        "assert tiles._compile_candidate(*args, False) is None and os.nice(0) == start\n"
        "assert tiles._compile_candidate(*args) is None and tiles._compile_candidate(*args) is None\n"
        "print(start, os.nice(0))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    from inferx_edge.tune.tiles import COMPILE_NICENESS

    start, after = (int(x) for x in out.stdout.split()[-2:])
    assert after == min(start + COMPILE_NICENESS, 19)  # once, however often it compiles
