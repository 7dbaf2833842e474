"""NVRTC discovery on fake toolkit trees: a toolkit that cannot compile (torch's pip NVRTC without the
CCCL headers) is rejected with its reason, a complete one of the same version is chosen."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from inferx_edge.compiler.cuda import toolkit
from inferx_edge.errors import BuildError

_FAKE_NVRTC = r"""
#include <stdlib.h>
#include <string.h>
static const char* LOG = "%(log)s";
int nvrtcVersion(int* major, int* minor) { *major = %(major)d; *minor = %(minor)d; return 0; }
int nvrtcCreateProgram(void** p, const char* s, const char* n, int h, const char** a, const char** b) { *p = malloc(1); return 0; }
int nvrtcDestroyProgram(void** p) { free(*p); return 0; }
int nvrtcCompileProgram(void* p, int n, const char** opts) { return %(rc)d; }
int nvrtcGetProgramLogSize(void* p, size_t* n) { *n = strlen(LOG) + 1; return 0; }
int nvrtcGetProgramLog(void* p, char* out) { strcpy(out, LOG); return 0; }
int nvrtcGetPTXSize(void* p, size_t* n) { *n = 5; return 0; }
int nvrtcGetPTX(void* p, char* out) { strcpy(out, "ptx!"); return 0; }
const char* nvrtcGetErrorString(int rc) { return "fake"; }
"""


def _fake(root: Path, subdir: str, major: int, minor: int, complete: bool) -> Path:
    lib = root / "nvidia" / subdir / "lib" / f"libnvrtc.so.{major}"
    lib.parent.mkdir(parents=True)
    (root / "nvidia" / subdir / "include").mkdir()
    src = lib.with_suffix(".c")
    log = "" if complete else 'inferx_kernels.cu(1): catastrophic error: cannot open source file \\"cuda/std/cstdint\\"'
    src.write_text(_FAKE_NVRTC % {"major": major, "minor": minor, "rc": 0 if complete else 6, "log": log})
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


@pytest.fixture(autouse=True)
def _own_probe_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(toolkit, "_PROBE_CACHE", tmp_path / "probe.json")


def test_an_incomplete_toolkit_is_rejected_and_a_complete_one_chosen(tmp_path):
    site = tmp_path / "site-packages"
    torch_nvrtc = _fake(site, "cu13", 13, 0, complete=False)  # torch's NVRTC, no CCCL headers
    good = _fake(site, "cuda_nvrtc", 13, 0, complete=True)
    found = toolkit.discover_nvrtc(13, site_dirs=[site], cuda_dirs=[])
    assert [n.library for n in found.usable] == [good]
    assert [lib for lib, _ in found.rejected] == [str(torch_nvrtc)]
    assert "cuda/std/cstdint" in found.rejected[0][1]
    assert toolkit.find_nvrtc(13, site_dirs=[site], cuda_dirs=[]).library == good
    # the probe is cached: a second look compiles nothing (the cache says why the first was rejected)
    assert "cuda/std/cstdint" in (tmp_path / "probe.json").read_text()


def test_no_usable_toolkit_names_each_candidate_and_why(tmp_path):
    site = tmp_path / "site-packages"
    lib = _fake(site, "cu13", 13, 0, complete=False)
    with pytest.raises(BuildError) as err:
        toolkit.find_nvrtc(13, site_dirs=[site], cuda_dirs=[])
    msg = str(err.value)
    assert "no usable NVRTC for CUDA 13" in msg and str(lib) in msg and "cuda/std/cstdint" in msg
    assert "INFERX_CUDA_COMPILER=nvcc" in msg
