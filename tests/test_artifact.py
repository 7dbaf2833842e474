"""The artifact file: round trip, checksums, unsafe archives, schema, atomic writes."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from inferx_edge.errors import ArtifactError, ChecksumError, UsageError
from inferx_edge.package import SCHEMA_VERSION, open_artifact, read_manifest, write_artifact
from tests.conftest import cli


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _repack(path: Path, out: Path, members: dict[str, bytes], extra: list[tarfile.TarInfo] = ()) -> Path:
    with tarfile.open(out, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return out


def test_round_trip_manifest(default_artifact):
    m = read_manifest(default_artifact)
    assert m.schema_version == SCHEMA_VERSION
    assert m.model["name"] == "fmnist_cnn" and len(m.model["sha256"]) == 64
    assert m.target["name"] in ("x86-cpu", "arm64-cpu") and m.target["device"] == "cpu"
    assert m.tvm_version.startswith("0.27")
    v = m.variant()
    assert v.name == "fp32-b1" and v.batch == 1 and v.precision == "fp32"
    assert [s.describe() for s in v.inputs] == ["image: float32[1x1x28x28]"]
    assert [s.describe() for s in v.outputs] == ["logits: float32[1x10]"]
    assert set(m.files) == {v.library, v.weights}
    with open_artifact(default_artifact) as art:
        for name, meta in m.files.items():
            assert art.member(name).stat().st_size == meta["size"]
        root = art.root
    assert not root.exists()  # temporary extraction removed


def test_tampered_member_is_refused(default_artifact, tmp_path):
    members = _members(default_artifact)
    lib = next(n for n in members if n.endswith(".so"))
    data = bytearray(members[lib])
    data[len(data) // 2] ^= 0xFF
    members[lib] = bytes(data)
    bad = _repack(default_artifact, tmp_path / "tampered.ixa", members)
    with pytest.raises(ChecksumError, match=f"checksum mismatch for '{lib}'"):
        open_artifact(bad)
    r = cli("run", bad)
    assert r.returncode == 5 and "checksum mismatch" in r.stderr


def test_tampered_manifest_is_refused(default_artifact, tmp_path):
    members = _members(default_artifact)
    body = json.loads(members["manifest.json"])
    body["variants"][0]["inputs"][0]["shape"] = [8, 1, 28, 28]
    members["manifest.json"] = json.dumps(body).encode()
    with pytest.raises(ArtifactError, match="manifest checksum mismatch"):
        open_artifact(_repack(default_artifact, tmp_path / "m.ixa", members))


def test_extra_and_missing_members_are_refused(default_artifact, tmp_path):
    members = _members(default_artifact)
    with pytest.raises(ChecksumError, match=r"unlisted members \['lib/evil.so'\]"):
        open_artifact(_repack(default_artifact, tmp_path / "e.ixa", members | {"lib/evil.so": b"\x7fELF"}))
    weights = next(n for n in members if n.endswith(".npz"))
    del members[weights]
    with pytest.raises(ChecksumError, match="missing members"):
        open_artifact(_repack(default_artifact, tmp_path / "m.ixa", members))


@pytest.mark.parametrize("name", ["../escape.so", "/etc/evil", "lib/../../x", "..\\win"])
def test_unsafe_member_paths_are_refused(default_artifact, tmp_path, name):
    bad = _repack(default_artifact, tmp_path / "unsafe.ixa", _members(default_artifact) | {name: b"boom"})
    with pytest.raises(ArtifactError, match="unsafe member path"):
        open_artifact(bad, dest=tmp_path / "out")
    assert not (tmp_path / "escape.so").exists()
    with pytest.raises(ArtifactError, match="unsafe member path"):
        read_manifest(bad)


def test_links_are_refused(default_artifact, tmp_path):
    link = tarfile.TarInfo("lib/link.so")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    bad = _repack(default_artifact, tmp_path / "link.ixa", _members(default_artifact), extra=[link])
    with pytest.raises(ArtifactError, match="not a regular file"):
        open_artifact(bad)


def test_not_an_artifact(tmp_path):
    junk = tmp_path / "junk.ixa"
    junk.write_bytes(b"definitely not a tar" * 100)
    with pytest.raises(ArtifactError, match="not an inferx_edge artifact"):
        open_artifact(junk)
    with pytest.raises(UsageError, match="artifact not found"):
        open_artifact(tmp_path / "missing.ixa")


def test_truncated_artifact(default_artifact, tmp_path):
    cut = tmp_path / "cut.ixa"
    cut.write_bytes(default_artifact.read_bytes()[: default_artifact.stat().st_size // 2])
    with pytest.raises(ArtifactError):
        open_artifact(cut)


def test_future_schema_version_is_refused(default_artifact, tmp_path):
    m = read_manifest(default_artifact)
    future = dataclasses.replace(m, schema_version=SCHEMA_VERSION + 1)
    with open_artifact(default_artifact) as art:
        out = write_artifact(tmp_path / "future.ixa", future, {n: art.member(n) for n in m.files})
    assert out.schema_version == SCHEMA_VERSION + 1
    with pytest.raises(ArtifactError, match=f"schema version {SCHEMA_VERSION + 1} is not supported"):
        open_artifact(tmp_path / "future.ixa")


def test_failed_write_leaves_previous_artifact_intact(default_artifact, tmp_path):
    out = tmp_path / "keep.ixa"
    out.write_bytes(default_artifact.read_bytes())
    before = out.read_bytes()
    m = read_manifest(default_artifact)
    with pytest.raises(FileNotFoundError):
        write_artifact(out, m, {"lib/x.so": tmp_path / "does-not-exist.so"})
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["keep.ixa"]


def test_inspect_cli(default_artifact):
    r = cli("inspect", default_artifact)
    assert r.returncode == 0, r.stderr
    assert "verified" in r.stdout and "image: float32[1x1x28x28]" in r.stdout
    r = cli("inspect", default_artifact, "--json")
    assert json.loads(r.stdout)["default_variant"] == "fp32-b1"


def _main_ops(mod) -> list[str]:
    """The operator names ``mod``'s main calls, in order."""
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings if hasattr(b.value, "op")]


def test_weight_transforms_run_at_build_time_and_give_the_same_results():
    """Bias reshapes and the FC weight transpose leave the model: main takes their results."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.variant import VariantLayout, prepare_variant
    from inferx_edge.frontend import import_model
    from inferx_edge.models import DEFAULT_MODEL

    im = import_model(DEFAULT_MODEL, {"image": (2, 1, 28, 28)})
    plain = im.mod  # as imported: the transforms run inside main
    nchw = VariantLayout("fp32")
    prepared = prepare_variant(im, nchw, bake=True)
    baked, names, arrays = prepared.mod, prepared.weight_names, prepared.weight_arrays
    assert len(names) == len(arrays) and names != list(im.param_names)

    assert _main_ops(plain).count("relax.permute_dims") == 1 and _main_ops(plain).count("relax.reshape") == 4
    unbaked = prepare_variant(im, nchw)  # without bake: the same signature, no arrays
    assert (unbaked.weight_names, unbaked.weight_arrays) == (names, None)
    assert "relax.permute_dims" not in _main_ops(baked) and _main_ops(baked).count("relax.reshape") == 1  # the flatten
    x = np.random.default_rng(0).random((2, 1, 28, 28)).astype(np.float32)

    def run(mod, params):
        vm = relax.VirtualMachine(relax.build(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
        return vm["main"](tvm.runtime.tensor(x), *[tvm.runtime.tensor(p) for p in params]).numpy()

    np.testing.assert_allclose(run(baked, arrays), run(plain, im.params), rtol=1e-6, atol=1e-6)


def test_unit_transposes_become_reshapes_with_the_same_values():
    """A transpose that moves only axes of extent 1 is a reshape; one that reorders longer axes stays."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.passes import unit_transposes_to_reshapes

    bb = relax.BlockBuilder()
    a = relax.Var("a", relax.TensorType([2, 1, 5, 6], "float32"))  # one-channel NCHW -> NHWC
    b = relax.Var("b", relax.TensorType([2, 3, 1, 1], "float32"))  # pooled NCHW -> NHWC
    c = relax.Var("c", relax.TensorType([2, 3, 4, 1], "float32"))  # a real reorder
    with bb.function("main", [a, b, c], attrs={"num_input": 3}):
        with bb.dataflow():
            outs = [
                bb.emit(relax.op.permute_dims(a, [0, 2, 3, 1])),
                bb.emit(relax.op.permute_dims(b, [0, 2, 3, 1])),
                bb.emit(relax.op.permute_dims(c, [0, 2, 1, 3])),
                bb.emit(relax.op.permute_dims(a)),  # reversed: 6, 5, 1, 2 reorders
            ]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = bb.get()
    rewritten = unit_transposes_to_reshapes(mod)
    assert _main_ops(rewritten) == ["relax.reshape", "relax.reshape", "relax.permute_dims", "relax.permute_dims"]
    rng = np.random.default_rng(0)
    xs = [rng.random(s, dtype=np.float32) for s in ((2, 1, 5, 6), (2, 3, 1, 1), (2, 3, 4, 1))]
    vm = relax.VirtualMachine(relax.build(rewritten, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    got = vm["main"](*[tvm.runtime.tensor(x) for x in xs])
    want = [xs[0].transpose(0, 2, 3, 1), xs[1].transpose(0, 2, 3, 1), xs[2].transpose(0, 2, 1, 3), xs[0].T]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w)


def test_float_cpu_convs_run_nhwc_with_hwio_weights():
    """CPU float variants: NHWC/HWIO (vectorized along output channels); int8 CPU and fp32 CUDA stay
    NCHW. The embedded model then has no transpose on its activations: the one-channel input and the
    pooled result are reshaped, and its weights are stored HWIO."""
    from inferx_edge.compiler.variant import prepare_variant, variant_layout
    from inferx_edge.frontend import import_model
    from inferx_edge.models import DEFAULT_MODEL
    from inferx_edge.targets import get_target

    cpu, arm, gpu = get_target("x86-cpu"), get_target("arm64-cpu"), get_target("h200")
    assert [variant_layout(cpu, p).conv for p in ("fp32", "fp16", "int8", "mixed")] == ["NHWC", "NHWC", "NCHW", "NCHW"]
    assert variant_layout(arm, "fp32").conv == "NHWC"
    assert variant_layout(cpu, "fp32").kernel == variant_layout(arm, "fp32").kernel == "HWIO"
    assert (variant_layout(gpu, "fp32").conv, variant_layout(gpu, "int8").conv) == ("NCHW", "NHWC")
    assert (variant_layout(gpu, "fp16").kernel, variant_layout(gpu, "int8").quant_kernel) == ("OHWI", "OHWI")
    assert variant_layout(cpu, "int8").quant_kernel == "OIHW"
    im = import_model(DEFAULT_MODEL, {"image": (2, 1, 28, 28)})
    prepared = prepare_variant(im, variant_layout(cpu, "fp32"), bake=True)
    mod, arrays = prepared.mod, prepared.weight_arrays
    assert "relax.permute_dims" not in _main_ops(mod)
    kernels = sorted(a.shape for a in arrays if a.ndim == 4 and a.shape[0] != 1)  # not the (1, 1, 1, C) biases
    assert kernels == [(3, 3, 1, 24), (3, 3, 24, 48), (3, 3, 48, 64)]


def test_weight_transforms_that_would_grow_the_weights_stay_in_the_model():
    from tvm import relax

    from inferx_edge.compiler.passes import bake_weight_transforms

    n = 1 << 19  # a 1-element weight broadcast to 2 MiB
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, n], "float32"))
    w = relax.Var("w", relax.TensorType([1], "float32"))
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(x, relax.op.broadcast_to(w, [1, n])))
        bb.emit_func_output(out)
    mod = bb.get()
    params = [np.ones(1, np.float32)]
    same, names, arrays = bake_weight_transforms(mod, params)
    assert same is mod and names == ["w"] and arrays is params
