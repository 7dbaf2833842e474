"""Cross-compiled artifacts for Jetson Orin, A100, H100/H200 and arm64, checked structurally.

Nothing here needs a GPU: the device code is compiled ahead of time on this host, and we read what the
libraries hold (ELF machine of the host code, SM version of each cubin, PTX target).
"""

from __future__ import annotations

import pytest

from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.errors import BuildError, TargetMismatchError
from inferx_edge.models import DEFAULT_MODEL
from inferx_edge.package import open_artifact
from inferx_edge.package.elf import elf_machine, embedded_cuda_code
from tests.helpers import needs_cross, needs_nvrtc


def _build(tmp_path, target, cuda_code="cubin"):
    out = tmp_path / f"{target}-{cuda_code}.ixa"
    build_artifact(
        BuildOptions(model=DEFAULT_MODEL, target=target, output=out, cuda_code=cuda_code), log=lambda *a: None
    )
    art = open_artifact(out)
    return art, art.member(art.manifest.variant().library)


@needs_cross
@needs_nvrtc
@pytest.mark.parametrize("target", ["jetson-orin", "jetson-orin-nano-8gb"])
def test_jetson_artifact_is_aarch64_with_sm87_cubins(tmp_path, target):
    art, lib = _build(tmp_path, target)
    with art:
        assert elf_machine(lib) == "aarch64"
        code = embedded_cuda_code(lib)
        assert code["cubin"] and set(code["cubin"]) == {"sm_87"}
        assert code["source"] == [] and code["ptx"] == []  # nothing left to compile on the device
        t = art.manifest.target
        assert t["host_triple"] == "aarch64-linux-gnu" and t["cuda_arch"] == "sm_87"
        assert t["cuda_toolkit"].startswith("NVRTC 12.")  # JetPack 6 ships CUDA 12.x
        assert t["min_driver_cuda"] == "12.0" and t["min_jetpack"] == "6.0"
        assert t["tvm_target"]["host"]["mcpu"] == "cortex-a78"


@needs_cross
@needs_nvrtc
def test_jetson_ptx_variant(tmp_path):
    art, lib = _build(tmp_path, "jetson-orin", "ptx")
    with art:
        code = embedded_cuda_code(lib)
        assert code["ptx"] and set(code["ptx"]) == {"sm_87"} and code["cubin"] == []
        assert art.manifest.target["cuda_code"] == "ptx"
        assert art.manifest.target["min_jetpack"] == "6.1"  # PTX written by NVRTC 12.6 needs a 12.6 driver


@needs_nvrtc
@pytest.mark.parametrize("target,sm", [("a100", "sm_80"), ("h100", "sm_90"), ("h200", "sm_90")])
def test_datacenter_artifacts_are_x86_with_cubins(tmp_path, target, sm):
    art, lib = _build(tmp_path, target)
    with art:
        assert elf_machine(lib) == "x86_64"
        code = embedded_cuda_code(lib)
        assert set(code["cubin"]) == {sm} and code["source"] == []


@needs_nvrtc
def test_sm90a_has_no_portable_ptx(tmp_path):
    with pytest.raises(BuildError, match="no portable PTX"):
        _build(tmp_path, "h200", "ptx")


@needs_cross
def test_arm64_cpu_artifact(arm64_artifact):
    with open_artifact(arm64_artifact) as art:
        lib = art.member(art.manifest.variant().library)
        assert elf_machine(lib) == "aarch64"
        assert embedded_cuda_code(lib) == {"cubin": [], "ptx": [], "source": []}


@needs_nvrtc
def test_cuda_artifact_refused_without_gpu(tmp_path):
    from inferx_edge.runtime import Engine

    art, _ = _build(tmp_path, "a100")
    art.close()
    with pytest.raises(TargetMismatchError, match="CUDA runtime cannot be loaded|no CUDA GPU 0 is visible"):
        Engine(art.path)
