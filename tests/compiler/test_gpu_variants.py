"""Whole-model GPU variants built for every GPU architecture (no GPU needed: device code is compiled here)."""

from __future__ import annotations

import numpy as np
import pytest

from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.models import DEFAULT_MODEL
from inferx_edge.package import open_artifact
from inferx_edge.package.elf import elf_machine, embedded_cuda_code
from tests.helpers import needs_cross, needs_nvrtc


@needs_nvrtc
@pytest.mark.parametrize(
    "target,sm,machine",
    [
        ("a100", "sm_80", "x86_64"),
        ("h200", "sm_90", "x86_64"),
        pytest.param("jetson-orin", "sm_87", "aarch64", marks=needs_cross),
    ],
)
def test_int8_variant_compiles_for_each_gpu_architecture(tmp_path, target, sm, machine):
    out = tmp_path / f"{target}.ixa"
    build_artifact(
        BuildOptions(model=DEFAULT_MODEL, target=target, output=out, precisions=("int8",), tuning=False),
        log=lambda *a: None,
    )
    with open_artifact(out) as art:
        v = art.manifest.variant("int8-b1")
        lib = art.member(v.library)
        assert elf_machine(lib) == machine and set(embedded_cuda_code(lib)["cubin"]) == {sm}
        assert v.extra["quantization"]["int8_mac_share"] == 1.0
        with np.load(art.member(v.weights)) as w:
            assert sum(w[k].dtype == np.int8 for k in w.files) == 4


@needs_nvrtc
@pytest.mark.parametrize(
    "target,sm",
    [("a100", "sm_80"), ("h200", "sm_90"), pytest.param("jetson-orin", "sm_87", marks=needs_cross)],
)
def test_fp16_variant_runs_its_convolutions_on_mma_for_each_gpu_architecture(tmp_path, monkeypatch, target, sm):
    dump = tmp_path / "cuda"
    monkeypatch.setenv("INFERX_DUMP_CUDA", str(dump))
    out = tmp_path / f"{target}.ixa"
    build_artifact(
        BuildOptions(model=DEFAULT_MODEL, target=target, output=out, precisions=("fp16",), tuning=False),
        log=lambda *a: None,
    )
    with open_artifact(out) as art:
        lib = art.member(art.manifest.variant("fp16-b1").library)
        assert set(embedded_cuda_code(lib)["cubin"]) == {sm}
    source = "".join(f.read_text() for f in dump.iterdir())
    assert "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16" in source and "ldmatrix" in source


@needs_nvrtc
def test_cuda_graph_is_on_by_default_and_can_be_turned_off(tmp_path):
    for graph in (True, False):
        out = tmp_path / f"g{graph}.ixa"
        build_artifact(
            BuildOptions(model=DEFAULT_MODEL, target="h200", output=out, tuning=False, cuda_graph=graph),
            log=lambda *a: None,
        )
        with open_artifact(out) as art:
            v = art.manifest.variants[0]
            assert v.extra.get("cuda_graph", False) is graph
            assert (b"vm.builtin.cuda_graph.run_or_capture" in art.member(v.library).read_bytes()) is graph
