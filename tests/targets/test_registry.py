import json

import pytest

from inferx_edge.errors import UsageError
from inferx_edge.targets import TARGETS, get_target, host_target_name
from tests.helpers import cli

REQUIRED = [
    "jetson-agx-orin-64gb",
    "jetson-agx-orin-32gb",
    "jetson-orin-nx-16gb",
    "jetson-orin-nano-8gb",
    "a100",
    "h100",
    "h200",
    "x86-cpu",
    "arm64-cpu",
]


def test_registry_has_every_target():
    assert set(REQUIRED) <= set(TARGETS)
    assert get_target("jetson-orin") is TARGETS["jetson-agx-orin-64gb"]


@pytest.mark.parametrize(
    "name,arch",
    [
        ("jetson-orin", "sm_87"),
        ("jetson-orin-nano-8gb", "sm_87"),
        ("a100", "sm_80"),
        ("h100", "sm_90a"),
        ("h200", "sm_90a"),
    ],
)
def test_gpu_targets_carry_arch_and_host(name, arch):
    spec = get_target(name)
    assert spec.cuda_arch == arch and spec.tvm_target["arch"] == arch
    assert spec.tvm_target["host"]["mtriple"] == spec.host_triple


def test_jetson_targets_are_cross_compiled_a78_with_power_modes():
    for name in REQUIRED[:4]:
        spec = get_target(name)
        assert spec.host_triple == "aarch64-linux-gnu" and spec.cross_compiler == "aarch64-linux-gnu-g++"
        # TVM's own orin-nano tag says carmel (Xavier); Orin is Cortex-A78AE.
        assert spec.tvm_target["host"]["mcpu"] == "cortex-a78"
        assert spec.power_modes and spec.memory_gib and spec.device_cuda.startswith("12.")


def test_every_target_resolves_in_tvm():
    from inferx_edge.compiler.compile import resolve_tvm_target

    for spec in TARGETS.values():
        target = resolve_tvm_target(spec)
        kind = "cuda" if spec.is_cuda else "llvm"
        assert target.kind.name == kind
        host = target.host if spec.is_cuda else target
        assert str(host.attrs["mtriple"]) == spec.host_triple
        if not spec.is_cuda:  # a CPU target must name its microarchitecture, never the placeholder
            assert str(host.attrs["mcpu"]) not in ("", "<host>")


def test_unknown_target_suggests_the_closest():
    with pytest.raises(UsageError, match=r"unknown target 'jetson-orn': did you mean 'jetson-orin'\?.*valid:"):
        get_target("jetson-orn")
    with pytest.raises(UsageError, match="valid: .*h200"):
        get_target("tpu")


def test_host_target_is_a_cpu_target():
    assert get_target(host_target_name()).device == "cpu"


def test_targets_cli_table_and_json():
    r = cli("targets")
    assert r.returncode == 0, r.stderr
    for name in REQUIRED:
        assert name in r.stdout
    assert "0:MAXN" in r.stdout and "sm_87 (16 SMs)" in r.stdout and "sm_90a (132 SMs)" in r.stdout
    r = cli("targets", "--json")
    data = json.loads(r.stdout)
    assert data["jetson-agx-orin-64gb"]["aliases"] == ["jetson-orin", "agx-orin"]


def test_build_cli_unknown_target_exit_code():
    r = cli("build", "--target", "orin-agx")
    assert r.returncode == 2
    assert "unknown target 'orin-agx'" in r.stderr and "did you mean" in r.stderr
