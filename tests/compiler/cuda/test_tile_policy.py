"""The default tile of each GEMM shape and the tile search candidates (pure logic, no compilation)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferx_edge.compiler.cuda import DEFAULT_TILE, TILE_LADDER, TileConfig, tile_candidates


def _shape(c):
    """A tile without its load widths, accumulator padding and stage depth."""
    return replace(c, acc_pad=0, weight_vector=4, k_frags=4)


def test_int8_tile_shrinks_until_every_sm_has_a_block():
    from inferx_edge.compiler.cuda import DEFAULT_TILE, TILE_LADDER, tile_for

    assert _shape(tile_for((64 * 56 * 56, 256, 576), 132)) == DEFAULT_TILE  # batch 64: the big tile
    assert _shape(tile_for((49, 512, 4608), None)) == DEFAULT_TILE  # no SM count: the big tile
    small = tile_for((49, 512, 4608), 132)  # batch-1 layer 4: 4 blocks with the big tile
    assert _shape(small) == TILE_LADDER[-1] and small.warps_i * small.frags_i * 16 == 32
    # batch-64 layer 4 (3136 x 512): 25 x 4 blocks of 128x128 < 132 SMs; 64x128 gives 49 x 4
    assert _shape(tile_for((3136, 512, 2048), 132)) == TILE_LADDER[1]


def test_default_tile_pads_the_accumulator_and_deepens_stages_under_one_wave():
    """The measured rule: .a8.w16 everywhere (4-byte weight loads where the weight does not run
    along K), 128-deep stages for int8 GEMMs with K >= 256 that give fewer blocks than SMs."""
    from inferx_edge.compiler.cuda import tile_for

    big = tile_for((64 * 56 * 56, 256, 576), 132)  # 196 x 2 blocks: a full wave
    assert (big.acc_pad, big.weight_vector, big.k_frags) == (8, 16, 4)
    small = tile_for((49, 512, 4608), 132)  # 2 x 16 blocks of 32x32
    assert (small.acc_pad, small.weight_vector, small.k_frags) == (8, 16, 8)
    assert tile_for((49, 512, 4608), 132, int8=False).k_frags == 4  # fp16 stages stay 64 deep
    assert tile_for((49, 512, 128), 132).k_frags == 4  # K < 256: nothing to deepen
    assert tile_for((49, 512, 4608), None).k_frags == 4  # no SM count: no wave to judge
    assert tile_for((64, 1000, 2048), 132, weights_along_k=False).weight_vector == 4
    assert tile_for((64 * 112 * 112, 16, 32), 132).k_frags == 2  # K <= 32: 32-deep stages


def test_deep_stages_and_three_buffers_on_gpus_with_room_for_them():
    """On DEEP_STAGE_SMS GPUs: 128-deep stages wherever K >= 256 is a multiple of 128 (not only under
    one wave), three cp.async buffers from K >= 1024 where the input is not padded and the build lowers
    copies to cp.async; elsewhere the rule is unchanged."""
    from inferx_edge.compiler.cuda import tile_for

    deep = {"deep_stages": True, "async_copy": True, "input_padded": False}
    fc1 = tile_for((12608, 3072, 768), 132, **deep)  # ViT-B/16 batch 64: 99 x 24 blocks
    assert (fc1.k_frags, fc1.pipeline) == (8, "")  # K < 1024: synchronous
    fc2 = tile_for((12608, 768, 3072), 132, **deep)
    assert (fc2.k_frags, fc2.pipeline) == (8, "async3")
    assert tile_for((12608, 768, 3072), 132, **{**deep, "input_padded": True}).pipeline == ""
    assert tile_for((12608, 768, 3072), 132, **{**deep, "async_copy": False}).pipeline == ""
    assert tile_for((12608, 768, 3072), 132, **{**deep, "int8": False}) == tile_for((12608, 768, 3072), 132, int8=False)
    assert tile_for((200704, 64, 576), 132, **deep).k_frags == 4  # 576 = 4.5 x 128: the last stage half padding
    assert tile_for((200704, 64, 128), 132, **deep).k_frags == 4  # K < 256
    assert tile_for((12608, 3072, 768), 132).k_frags == 4  # without deep_stages: a full wave keeps 64-deep stages
    assert tile_for((12608, 3072, 768), None, **deep).k_frags == 4  # no SM count: no rule beyond the shape


def test_shallow_wide_int8_gemms_take_64_row_tiles_on_deep_stage_gpus():
    """K < 256 with >= 256 output channels, where the ladder gives 128 x 128: 64 x 128 (a block runs a
    few reduction steps; half the accumulator tile). Narrower, deeper, smaller or fp16 GEMMs, and GPUs
    without deep stages, keep their tile."""
    from inferx_edge.compiler.cuda import tile_for

    def tile(c):
        return 16 * c.warps_i * c.frags_i, 16 * c.warps_j * c.frags_j

    deep = {"deep_stages": True, "async_copy": True}
    assert tile(tile_for((200704, 256, 128), 132, **deep)) == (64, 128)  # ResNeXt-50 stage 1, batch 64
    assert tile(tile_for((200704, 384, 96), 132, **deep)) == (64, 128)  # ConvNeXt-T's first MLP layer
    assert tile(tile_for((200704, 384, 16), 132, **deep)) == (64, 128)  # K <= 32: 32-deep stages as well
    assert tile_for((200704, 384, 16), 132, **deep).k_frags == 2
    assert tile(tile_for((200704, 256, 256), 132, **deep)) == (128, 128)  # K = 256: not shallow
    assert tile(tile_for((200704, 128, 64), 132, **deep)) == (128, 128)  # J < 256
    assert tile(tile_for((200704, 256, 128), 132)) == (128, 128)  # no deep stages
    assert tile(tile_for((200704, 256, 128), 132, int8=False, **deep)) == (128, 128)
    assert tile(tile_for((3136, 256, 64), 132, **deep)) == (64, 64)  # batch 1: the ladder's own pick


def test_int8_tile_does_not_double_64_output_channels():
    from inferx_edge.compiler.cuda import DEFAULT_TILE, tile_for

    def tile(c):
        return 16 * c.warps_i * c.frags_i, 16 * c.warps_j * c.frags_j

    assert tile(tile_for((64 * 56 * 56, 64, 576), 132)) == (128, 64)  # ResNet-50 layer 1, batch 64
    assert tile(tile_for((64 * 112 * 112, 64, 196), None)) == (128, 64)  # its stem
    assert tile(tile_for((64 * 14 * 14, 160, 960), 132)) == (128, 64)  # 160 -> 192, not 256
    assert _shape(tile_for((64 * 56 * 56, 96, 576), 132)) == DEFAULT_TILE  # 96 -> 128 either way
    assert _shape(tile_for((64 * 7 * 7, 576, 96), None)) == DEFAULT_TILE  # 640 for 576: within 1/8


def test_narrow_int8_gemms_get_narrow_tiles_and_shallow_stages():
    """MobileNetV2's 16-32-channel pointwise convolutions: tensor cores with 16- or 32-column tiles and
    32-deep stages for K <= 32, instead of CUDA cores."""
    from inferx_edge.compiler.cuda import tile_for

    def tile(c):
        return 16 * c.warps_i * c.frags_i, 16 * c.warps_j * c.frags_j, 16 * c.k_frags

    assert tile(tile_for((64 * 56 * 56, 24, 144), 132)) == (128, 32, 64)  # project 144 -> 24
    assert tile(tile_for((64 * 112 * 112, 16, 32), 132)) == (128, 16, 32)  # project 32 -> 16
    assert tile(tile_for((64 * 56 * 56, 144, 24), 132))[1:] == (64, 32)  # expand 24 -> 144
    assert tile(tile_for((64 * 14 * 14, 48, 576), 132))[1] == 16  # 48 = 3 x 16, not 64
    assert tile(tile_for((64 * 56 * 56, 64, 576), 132))[1] == 64  # 64 channels as before


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
    # nothing smaller than a quarter of the default tile on a large GEMM (64 x 128 here: 128 x 128
    # blocks would fill their waves 74 %)
    area = 16 * cands[0].warps_i * cands[0].frags_i * 16 * cands[0].warps_j * cands[0].frags_j
    assert area == 64 * 128
    assert all(16 * c.warps_i * c.frags_i * 16 * c.warps_j * c.frags_j >= area // 4 for c in cands)


def test_stage_depths_that_pad_k_least_are_candidates():
    """A grouped convolution's fp16 K = 9 x 16 = 144 pads 64-deep stages to 192: its candidates also
    have 48-deep ones (fp16 mma steps are 16 deep); 288 gets 96. int8 mma stages stay multiples of 32:
    K = 144 gets 32-deep ones (160); K = 96 gets both a single 96-deep stage and three 32-deep ones (a
    single stage has nothing to pipeline). A K the default depth divides gets no others."""
    grouped = tile_candidates((50176, 16, 144), 132, input_padded=True, int8=False, batch=16)
    assert grouped[0].k_frags == 3 and {c.k_frags for c in grouped} == {3, 4}  # the default: 48-deep
    exact = [c for c in grouped if c.k_frags == 3]
    assert {replace(c, k_frags=4) for c in exact} == {c for c in grouped if c.k_frags == 4}
    assert {c.k_frags for c in tile_candidates((3136, 32, 288), 132, int8=False, batch=16)} == {4, 6, 8}
    assert {c.k_frags for c in tile_candidates((50176, 256, 288), 132)} == {4, 6, 8}  # int8: 96 = 3 x 32
    assert {c.k_frags for c in tile_candidates((50176, 256, 144), 132)} == {2, 4}  # 160 = 5 x 32
    assert {c.k_frags for c in tile_candidates((200704, 128, 96), 132)} == {2, 4, 6}
    assert {c.k_frags for c in tile_candidates((200704, 64, 576), 132)} == {4, 8}


def test_grouped_convolution_fp16_gemms_default_to_wide_predicated_async_loads_and_least_padding():
    """A grouped convolution's fp16 GEMMs (several per kernel, padded input) built with cp.async
    default to 16-byte predicated loads, the cp.async pipeline, no accumulator padding, 4-byte weight
    loads and the stage depth padding K least; without cp.async, one GEMM per kernel, an unpadded
    input or int8 operands they keep the ladder's default."""
    from inferx_edge.compiler.cuda import tile_for

    on = {"int8": False, "input_padded": True, "deep_stages": True, "async_copy": True}
    assert tile_for((50176, 16, 144), 132, batch=32, **on).text() == "4x2.1x1.k3.v16.p16.async.mma"
    assert tile_for((3136, 32, 288), 132, batch=16, **on).k_frags == 6  # 96-deep stages: 288 unpadded
    assert tile_for((3136, 32, 256), 132, batch=16, **on).k_frags == 4  # 64 divides K: kept
    previous = tile_for((50176, 16, 144), 132, batch=32, **{**on, "async_copy": False})
    assert previous.text() == "4x2.1x1.k4.v16.a8.w16.mma"
    for other in ({"batch": 1}, {"batch": 32, "input_padded": False}, {"batch": 32, "int8": True}):
        tile = tile_for((50176, 16, 144), 132, **{**on, **other})
        assert tile.padded_vector == 4 and tile.pipeline == "" and tile.k_frags != 3, other


def test_int8_gemms_whose_128_row_blocks_fill_the_waves_poorly_take_64_rows():
    """175 blocks of 128 x 128 on 132 SMs fill two waves 66 %; 343 of 64 x 128 fill three 87 %:
    the 64-row tile. Full waves, no SM count, fp16, too little gain, or a tile with three cp.async
    buffers keep 128 x 128."""
    from inferx_edge.compiler.cuda import tile_for

    deep = {"deep_stages": True, "async_copy": True, "input_padded": False}

    def rows(t):
        return 16 * t.warps_i * t.frags_i, 16 * t.warps_j * t.frags_j

    assert rows(tile_for((3136, 784, 784), 132, **deep)) == (64, 128)  # RegNet-Y, batch 64
    padded = {**deep, "input_padded": True}  # a 3x3 convolution's bounds-checked loads
    assert rows(tile_for((12544, 256, 2304), 132, **padded)) == (64, 128)  # ResNet-50 layer 3: 74 % -> 99 %
    assert tile_for((12544, 256, 2304), 132, **padded).k_frags == 8  # the stage rules still apply
    assert rows(tile_for((12608, 3072, 768), 132, **deep)) == (128, 128)  # 2,376 blocks: 18 full waves
    assert rows(tile_for((3136, 784, 784), None, **deep)) == (128, 128)
    assert rows(tile_for((3136, 784, 784), 132, int8=False, **deep)) == (128, 128)
    assert rows(tile_for((12544, 1024, 512), 132, **deep)) == (128, 128)  # 784 blocks: 99 %
    # 66 % -> 87 % on 132 SMs, but 175 blocks on 108 SMs fill 81 % and 343 fill 79 %: kept
    assert rows(tile_for((3136, 784, 784), 108, **deep)) == (128, 128)
    # ConvNeXt-T's 12544 x 384 x 1536 (294 blocks, 74 %): its 128 x 128 tile runs three cp.async
    # buffers, which the rule leaves alone; with a padded input (two buffers) or K < 1024 it moves
    convnext = tile_for((12544, 384, 1536), 132, **deep)
    assert rows(convnext) == (128, 128) and convnext.pipeline == "async3"
    assert rows(tile_for((12544, 384, 1536), 132, **padded)) == (64, 128)
    assert rows(tile_for((12544, 384, 768), 132, **deep)) == (64, 128)


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
