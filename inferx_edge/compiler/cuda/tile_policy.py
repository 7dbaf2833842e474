"""Which tile a tensor-core GEMM gets by default (:func:`tile_for`) and which the tile search tries
(:func:`tile_candidates`): block counts against the GPU's SMs, padding limits, stage depths."""

from __future__ import annotations

from dataclasses import replace

from inferx_edge.compiler.cuda.analysis import sm_version
from inferx_edge.compiler.cuda.tile import (
    INT8_WIDE_TILES,
    NARROW_TILES,
    TILE_LADDER,
    TileConfig,
)

#: a tile may pad the output channels (J) up to this factor over J rounded up to 64 (to 16 below 64
#: channels): a 128-wide tile doubled the tensor-core work of 64-channel convolutions (ResNet-50's stem
#: and layer 1)
MAX_J_PADDING = 1.125

#: GPUs (SM versions) whose int8 GEMMs get 128-deep reduction stages by default wherever K >= 256 is a
#: multiple of 128, and three cp.async buffers where K >= 1024 and the input is not padded: the tile
#: survey on H100 (``scripts/tile_survey.py``) found a 128-deep tile fastest in 21 of 22 such groups
#: of ViT-B/16, ConvNeXt-T and ResNeXt-50 at batch 64 (:func:`tile_for`). These have
#: 164-228 KB of shared memory per SM (three 128-deep buffers of a 128 x 128 tile need 96 KB)
DEEP_STAGE_SMS = (80, 87, 90)


#: int8 GEMMs with K below this and at least :data:`SHALLOW_K_MIN_J` output channels take 64-row tiles
#: where the ladder gives the 128 x 128 default (with deep stages on): a block then runs only a few
#: reduction steps, and half the rows halve its accumulator tile. Measured per kernel group (H200
#: tile databases of ResNet-50 / MobileNetV2 at batch 64, scored with ``scripts/tile_survey.py
#: score``: the 8 groups it changes 546.6 -> 456.1 us of kernel time, 7 faster, one 3 % slower; the
#: H100 tile survey: ResNeXt-50's 200704 x 256 x 128 group fastest with exactly that tile, 1.42x the
#: default; ConvNeXt-T's K = 96 and 192 groups fastest with 64-row tiles too)
SHALLOW_K = 256
SHALLOW_K_MIN_J = 256


#: a 128 x 128 int8 tile whose thread blocks fill less than this share of their waves' SM slots
#: (blocks / (waves x SMs)) takes 64 x 128 where that fills them at least :data:`WAVE_FILL_GAIN` more
#: (see :func:`_fuller_waves`)
WAVE_FILL_MAX = 0.8
WAVE_FILL_GAIN = 0.1


def deep_stages_on(target) -> bool:
    """Whether the TVM ``target``'s GPU is one of :data:`DEEP_STAGE_SMS` (``deep_stages`` of :func:`tile_for`)."""
    return sm_version(target) in DEEP_STAGE_SMS


def _rows(c: TileConfig) -> int:
    return 16 * c.warps_i * c.frags_i


def _cols(c: TileConfig) -> int:
    return 16 * c.warps_j * c.frags_j


def _blocks(c: TileConfig, i: int, j: int, batch: int = 1) -> int:
    """Thread blocks of tile ``c`` on ``batch`` I x J outputs."""
    return batch * -(-i // _rows(c)) * -(-j // _cols(c))


def _pads_j_within_limit(c: TileConfig, j: int) -> bool:
    """Whether tile ``c`` pads J by at most :data:`MAX_J_PADDING` over J rounded up to 64 (to 16
    below 64)."""
    return -(-j // _cols(c)) * _cols(c) <= MAX_J_PADDING * (-(-j // 64) * 64 if j >= 64 else -(-j // 16) * 16)


def _fitting_tiles(j: int, ladder) -> list[TileConfig]:
    """The tiles of ``ladder`` (with :data:`NARROW_TILES` ahead of the default ladder below 64
    output channels) that pad J by at most :data:`MAX_J_PADDING`; all of them when none does."""
    if j < 64 and ladder is TILE_LADDER:
        ladder = NARROW_TILES + ladder
    return [c for c in ladder if _pads_j_within_limit(c, j)] or list(ladder)


def _stage_depth(cfg: TileConfig, k: int) -> TileConfig:
    """32-deep reduction stages for K <= 32 (a 64-deep stage would be mostly padding)."""
    return replace(cfg, k_frags=2) if k <= 32 and cfg.intrin == "mma" and cfg.k_frags > 2 else cfg


def _less_padding_depths(c: TileConfig, k: int, int8: bool) -> list[TileConfig]:
    """Tile ``c`` with the reduction stages (at least 32 and at most twice its own depth; int8 mma: a
    multiple of 32) that pad K least, where that is less than its own stages do: the deepest of them,
    and where that is a single stage also the deepest giving two or more (something to pipeline).
    Empty where no depth pads less. A grouped convolution's fp16 K = 9 taps x 16 channels = 144 pads
    64-deep stages to 192 (a third more math and shared-memory traffic; 48-deep stages fit it); an
    int8 K = 144 goes to 160 with 32-deep ones (so does RegNet-Y's K = 784, to 800)."""
    step = 2 if int8 and c.intrin == "mma" else 1
    padded = {f: -(-k // (16 * f)) * 16 * f for f in range(2, 2 * c.k_frags + 1) if f % step == 0}
    least = min(padded.values(), default=None)
    if least is None or least >= -(-k // (16 * c.k_frags)) * 16 * c.k_frags:
        return []
    ties = [f for f, p in padded.items() if p == least]
    out = [max(ties)]
    pipelined = [f for f in ties if least // (16 * f) >= 2]
    if pipelined and max(pipelined) != out[0]:
        out.append(max(pipelined))
    return [replace(c, k_frags=f) for f in out]


def _grouped_fp16_tile(cfg: TileConfig, k: int) -> TileConfig:
    """The default for the fp16 GEMMs of a grouped convolution (built with cp.async): 16-byte
    predicated activation loads (``p16``), the cp.async pipeline, plain accumulator tile and 4-byte
    weight loads, and the stage depth that pads K least (:func:`_less_padding_depths`; 48-deep stages
    for K = 9 taps x 16 channels = 144). Measured: ResNeXt-50's four fp16 grouped-GEMM groups at batch
    64 on H100 (``resnext50_32x4d_b64_s65_tiles`` record, every candidate timed) were fastest with exactly
    this tile in 4 of 4, 0.50-0.76x the time of the previous default (``.k4.a8.w16``, 4-byte
    predicated loads, synchronous); 48-deep stages beat 64-deep ones with the same loads by 8-11 %
    in each; ``.a8.w16`` on top was slower in 3 of 4 (up to 1.22x) and 1.00x in the fourth. With it
    as the default, the H200 tile search of RegNet-Y-800MF (``regnet_y_b64_s65_tiles``) kept it in 6
    of 8 such groups (``.a8.w16`` 1.3 and 3.5 % faster in the others); untuned end to end on one H200
    it took ResNeXt-50 from 22,850 to 25,438 img/s at batch 64 and RegNet-Y from 43,236 to 49,951
    (``zoo_gpu_default_grouped_*_s65``; batch 1: +8 and +9 %)."""
    cfg = replace(cfg, padded_vector=16, pipeline="async", acc_pad=0, weight_vector=4)
    shallower = _less_padding_depths(cfg, k, int8=False)
    return shallower[0] if shallower else cfg


def _wave_fill(c: TileConfig, i: int, j: int, batch: int, sm_count: int) -> float:
    """The share of the SM slots of all waves that ``c``'s thread blocks use (one block per SM per
    wave)."""
    n = _blocks(c, i, j, batch)
    return n / (-(-n // sm_count) * sm_count)


def _fuller_waves(cfg: TileConfig, i: int, j: int, batch: int, sm_count: int) -> bool:
    """Whether the 128 x 128 int8 tile ``cfg`` should take 64 instead of 128 rows: its blocks fill the
    waves of ``sm_count`` SMs less than :data:`WAVE_FILL_MAX` and the 64-row tile fills them at least
    :data:`WAVE_FILL_GAIN` better. RegNet-Y's 3136 x 784 GEMMs at batch 64 give 175 blocks of 128 x
    128 on 132 SMs (two waves, 66 % filled) and 343 of 64 x 128 (three, 87 %); ResNet-50's 12544 x
    256 ones 196 (74 %) and 392 (99 %). Scored on every recorded tile search (``scripts/tile_survey.py
    score tuning_logs/h200 benchmarks/results/*_s65_tiles.json --compare``, record
    ``tile_rule_wave_fill_s65``): it moves 14 groups, 11 faster and 3 slower (1.02-1.09x); kernel
    time 1,035 -> 689 us, geometric mean 0.83x. With today's kernels (the ResNet-50 database
    ``07fbab4388a8`` and RegNet-Y's ``regnet_y_b64_s65_tiles``) 10 of 11 are faster (0.63-0.96x), the
    eleventh 1.02x. Those searches timed no three-buffer tile; :func:`tile_for` leaves a 128 x 128
    tile that takes three cp.async buffers (K >= 1024, unpadded input) alone: the H100 tile survey
    (``tile_survey_h100``) found 128 rows fastest in 3 of ConvNeXt-T's 4 such groups, and end to end
    on one H100 (``zoo_gpu_wave_fill_{on,off}_{a,b}_s66``, untuned, batch 64) the rule applied to them
    too took ConvNeXt-T from 19,807 to 19,270 img/s (-2.7 %) while ResNet-50 went 29,490 -> 29,642
    (+0.5 %) and RegNet-Y-800MF 46,738 -> 47,358 (+1.3 %)."""
    fill = _wave_fill(cfg, i, j, batch, sm_count)
    half = replace(cfg, frags_i=cfg.frags_i // 2)
    return fill < WAVE_FILL_MAX and _wave_fill(half, i, j, batch, sm_count) >= fill + WAVE_FILL_GAIN


def _ladder_tile(extents, sm_count: int | None, ladder=TILE_LADDER, batch: int = 1) -> TileConfig:
    """The tile shape for ``batch`` GEMMs of (I, J, K) ``extents`` on a GPU with ``sm_count`` SMs.
    Among the tiles of ``ladder`` that pad J by at most :data:`MAX_J_PADDING`: the largest giving at
    least one thread block per SM (over the whole batch), else the one giving the most blocks; without
    an SM count, the largest."""
    i, j = extents[0], extents[1]
    k = extents[2] if len(extents) > 2 else 1 << 20

    def blocks(c: TileConfig) -> int:
        return _blocks(c, i, j, batch)

    fitting = _fitting_tiles(j, ladder)
    if not sm_count:
        return _stage_depth(fitting[0], k)
    for cfg in fitting:
        if blocks(cfg) >= sm_count:
            return _stage_depth(cfg, k)
    return _stage_depth(max(fitting, key=blocks), k)


def tile_for(
    extents,
    sm_count: int | None,
    ladder=TILE_LADDER,
    weights_along_k: bool = True,
    int8: bool = True,
    batch: int = 1,
    input_padded: bool = True,
    deep_stages: bool = False,
    async_copy: bool = False,
) -> TileConfig:
    """The tile a tensor-core GEMM of (I, J, K) ``extents`` gets without a tuning database: the shape
    of :func:`_ladder_tile`, with the padded shared accumulator tile and, where the weight runs along K
    (``weights_along_k``), 16-byte weight loads (``.a8.w16``). ``batch``: GEMMs per kernel (attention's
    batch x heads, a grouped convolution's groups), counted in the thread blocks: ViT-B/16's batch-64
    attention matmuls (768 GEMMs of 197 x 197) took 32 x 32 tiles when only one GEMM's blocks were
    counted.

    Stage depth and pipeline of ``int8`` GEMMs with K >= 256: 128-deep stages where the tile gives fewer
    thread blocks than ``sm_count``; with ``deep_stages`` (the GPU is one of :data:`DEEP_STAGE_SMS`) also
    wherever K is a multiple of 128, and then, where K >= 1024, the input is not padded
    (``input_padded``: a convolution's bounds-checked loads) and the build lowers pipelined copies to
    cp.async (``async_copy``), three cp.async buffers (``async3``).

    Decided from measurements of every candidate tile. ``.a8.w16``: 0.91x the time of the plain tile
    (geometric mean, 22 of 22 batch-64 groups of ``tuning_logs/h200/resnet50-07fbab4388a8`` faster,
    worst 0.98x). 128-deep stages under one block per SM: 0.73x (7 of 7 faster). Above one block per
    SM the older databases were mixed, but the tile search with today's kernels on H100
    (``tile_survey_h100`` record: ViT-B/16, ConvNeXt-T, ResNeXt-50 at batch 64) found a 128-deep
    tile fastest in 21 of 22 groups with K >= 256 (the default took 1.31x the best tile's time,
    geometric mean, up to 1.61x), three-buffer pipelines winning deep ones (ViT's 3072-deep fc2:
    1.54x), as on the 4096^3 GEMM
    (``gpu_int8_matmul_h200_tiles6``); end to end the zoo's int8 ViT-B/16 went from 0.89x to 1.21x
    torch.compile at batch 64 (``zoo_h100_deep_stages``). A K that is not a multiple of 128 (ResNet's
    576-deep 3x3 convolutions) keeps 64-deep stages: padding the last stage cost 1.5x there.

    fp16 GEMMs of a grouped convolution (several GEMMs per kernel, ``batch``, over a padded input)
    built with cp.async: :func:`_grouped_fp16_tile`.

    With ``deep_stages``, ``int8`` GEMMs shallower than :data:`SHALLOW_K` and at least
    :data:`SHALLOW_K_MIN_J` wide that the ladder gives the 128 x 128 tile take 64 x 128; so do those
    whose 128 x 128 blocks fill the SMs' waves poorly (:func:`_fuller_waves`) unless that tile runs
    three cp.async buffers."""
    cfg = _ladder_tile(extents, sm_count, ladder, batch)
    j, k = extents[1], extents[2] if len(extents) > 2 else 1 << 20

    def finish(cfg: TileConfig) -> TileConfig:
        cfg = replace(cfg, acc_pad=8, weight_vector=16 if weights_along_k else 4)
        if not int8 and batch > 1 and input_padded and async_copy:
            cfg = _grouped_fp16_tile(cfg, k)
        if int8 and sm_count and k >= 256 and cfg.k_frags == 4:
            if _blocks(cfg, extents[0], extents[1], batch) < sm_count or (deep_stages and k % 128 == 0):
                cfg = replace(cfg, k_frags=8)
            if deep_stages and async_copy and cfg.k_frags == 8 and k >= 1024 and not input_padded:
                cfg = replace(cfg, pipeline="async3")
        return cfg

    finished = finish(cfg)
    if int8 and cfg == _stage_depth(TILE_LADDER[0], k):  # 128 x 128: 64 rows where K is shallow or waves poor
        half = replace(cfg, frags_i=cfg.frags_i // 2)
        if deep_stages and k < SHALLOW_K and j >= SHALLOW_K_MIN_J:
            return finish(half)
        # not where the 128 x 128 tile runs three cp.async buffers (see _fuller_waves)
        if sm_count and finished.pipeline != "async3" and _fuller_waves(cfg, extents[0], j, batch, sm_count):
            return finish(half)
    return finished


def tile_candidates(
    extents,
    sm_count: int | None,
    input_padded: bool = True,
    ladder=TILE_LADDER,
    weights_along_k: bool = True,
    int8: bool = True,
    batch: int = 1,
    deep_stages: bool = False,
) -> list[TileConfig]:
    """The tiles a tile search measures for a GEMM of (I, J, K) ``extents``, the default
    (:func:`tile_for` as build calls it: ``deep_stages`` on GPUs of :data:`DEEP_STAGE_SMS`, cp.async
    lowering on) first: the tiles :func:`tile_for` chooses among that give at
    least a quarter of a block per SM and are at least a quarter of the default's area (or are the
    default), the two largest of them also with 128-deep reduction stages and, where their stage depth
    pads K, with the depths that pad it least (:func:`_less_padding_depths`); each synchronous and with
    the cp.async pipeline (with 128-deep stages and K >= 1024 also the three-buffer one), and where
    its activation loads are predicated (the convolution pads its input, ``input_padded``, or the
    tile does not divide I or K) with 4- and 16-byte loads; each also with the padded accumulator
    tile and 16-byte weight loads (:attr:`TileConfig.acc_pad` 8, :attr:`TileConfig.weight_vector` 16;
    4-byte ones where the weight does not run along K, ``weights_along_k``: see :func:`weights_along_k`).
    Large ``int8`` GEMMs also get the 8-warp tiles of :data:`INT8_WIDE_TILES` that give every SM a
    block and pad J by at most :data:`MAX_J_PADDING`, with the two- and three-buffer pipelines, the
    same load widths and accumulator/weight pairs, and three buffers with two fragment buffers."""
    i, j, k = extents[0], extents[1], extents[2]
    default = tile_for(
        extents, sm_count, ladder, weights_along_k, int8, batch,
        input_padded=input_padded, deep_stages=deep_stages, async_copy=True,
    )  # fmt: skip
    area = _rows(default) * _cols(default)
    tiles = [_stage_depth(c, k) for c in _fitting_tiles(j, ladder)]
    shape = _ladder_tile(extents, sm_count, ladder, batch)
    tiles = [c for c in tiles if c == shape or 4 * _rows(c) * _cols(c) >= area]
    if sm_count:
        tiles = [c for c in tiles if c == shape or 4 * _blocks(c, i, j, batch) >= sm_count]
    if k >= 256:
        tiles += [replace(c, k_frags=2 * c.k_frags) for c in tiles[:2]]
    tiles += [e for c in tiles[:2] for e in _less_padding_depths(c, k, int8) if e not in tiles]
    out = [default]
    for tile in tiles:
        predicated = input_padded or i % _rows(tile) or k % (16 * tile.k_frags)
        # three-buffer pipelines for the 128-deep stages (enough K to keep two stages in flight)
        for pipeline in ("", "async", "async3") if tile.k_frags >= 8 and k >= 1024 else ("", "async"):
            for width in (4, 16) if predicated else (4,):
                for acc_pad, weight_vector in ((0, 4), (8, 16 if weights_along_k else 4)):
                    cfg = replace(
                        tile, pipeline=pipeline, padded_vector=width, acc_pad=acc_pad, weight_vector=weight_vector
                    )
                    if cfg not in out:
                        out.append(cfg)
    if int8 and ladder is TILE_LADDER and k >= 1024:
        for tile in INT8_WIDE_TILES:
            if (sm_count and _blocks(tile, i, j, batch) < sm_count) or not _pads_j_within_limit(tile, j):
                continue
            predicated = input_padded or i % _rows(tile) or k % (16 * tile.k_frags)
            for width in (4, 16) if predicated else (4,):
                for pipeline, buffers in (("async", 1), ("async3", 1), ("async3", 2)):
                    pairs = (
                        ((0, 4), (8, 16 if weights_along_k else 4))
                        if buffers == 1
                        else ((8, 16 if weights_along_k else 4),)
                    )
                    for acc_pad, weight_vector in pairs:
                        out.append(
                            replace(
                                tile,
                                pipeline=pipeline,
                                padded_vector=width,
                                acc_pad=acc_pad,
                                weight_vector=weight_vector,
                                fragment_buffers=buffers,
                            )
                        )
    return out
