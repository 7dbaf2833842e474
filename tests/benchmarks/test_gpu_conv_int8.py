"""The conv benchmark's tile configurations parse as tile texts (or mean build's own pick)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferx_edge.compiler.cuda import DEFAULT_TILE


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
