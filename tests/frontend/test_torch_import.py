"""torch.export programs (.pt2) through import, AOT build and the runtime, compared with torch."""

from __future__ import annotations

import numpy as np
import pytest

from inferx_edge.build import BuildOptions, build_artifact
from inferx_edge.errors import ModelError
from inferx_edge.frontend import import_model
from inferx_edge.runtime import Engine
from inferx_edge.targets import host_target_name

torch = pytest.importorskip("torch")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x, bias):
        y = torch.nn.functional.gelu(self.bn(self.conv(x)))
        pooled = y.mean(dim=(2, 3))
        return self.fc(pooled) + bias, torch.sigmoid(pooled)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():  # non-trivial running statistics, so BN is really exercised
        net.bn.running_mean.uniform_(-0.5, 0.5)
        net.bn.running_var.uniform_(0.5, 2.0)
    net.eval()
    batch = torch.export.Dim("batch", min=1, max=32)
    ep = torch.export.export(
        net, (torch.randn(2, 3, 12, 12), torch.randn(2, 4)), dynamic_shapes={"x": {0: batch}, "bias": {0: batch}}
    )
    path = tmp_path_factory.mktemp("torch") / "net.pt2"
    torch.export.save(ep, str(path))
    return path, net


def test_torch_export_matches_torch(exported, tmp_path):
    path, net = exported
    out = tmp_path / "net.ixa"
    build_artifact(
        BuildOptions(model=path, target=host_target_name(), output=out, input_shapes={"x": (5, 3, 12, 12)}),
        log=lambda *a: None,
    )
    rng = np.random.default_rng(0)
    with Engine(out) as engine:
        assert [s.shape for s in engine.variant.inputs] == [(5, 3, 12, 12), (5, 4)]
        assert engine.manifest.model["format"] == "torch.export"
        for _ in range(3):
            x = rng.standard_normal((5, 3, 12, 12)).astype(np.float32)
            b = rng.standard_normal((5, 4)).astype(np.float32)
            got = list(engine.run({"x": x, "bias": b}).values())
            with torch.no_grad():
                want = net(torch.from_numpy(x), torch.from_numpy(b))
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w.numpy(), atol=1e-4, rtol=0)


def test_corrupt_pt2(tmp_path):
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ModelError, match="not a loadable torch.export program"):
        import_model(bad)


class AnchorGrid(torch.nn.Module):
    """YOLO-style anchors: an integer arange plus a float offset (torch promotes to float)."""

    def forward(self, x):
        h, w = x.shape[2], x.shape[3]
        sy, sx = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) * 0.5 - 1, indexing="ij")
        return x + torch.stack((sx, sy)).unsqueeze(0)


def test_integer_operands_of_float_arithmetic_keep_their_fraction(tmp_path):
    """TVM's translator kept ``arange(h) + 0.5`` in int64 and dropped the 0.5 (YOLOv8n's boxes were off
    by half a stride through torch.export); the operand is now cast to the result's dtype first."""
    path = tmp_path / "anchors.pt2"
    torch.export.save(torch.export.export(AnchorGrid().eval(), (torch.zeros(1, 2, 5, 7),)), str(path))
    build_artifact(
        BuildOptions(model=path, target=host_target_name(), output=tmp_path / "a.ixa", tuning=False),
        log=lambda *a: None,
    )
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 7)).astype(np.float32)
    with torch.no_grad():
        ref = AnchorGrid()(torch.from_numpy(x)).numpy()
    with Engine(tmp_path / "a.ixa", trust=False) as engine:
        got = next(iter(engine.run(x).values()))
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)


class AttentionNet(torch.nn.Module):
    """A patch-embedding conv then ``nn.MultiheadAttention``: torch.export writes the attention with a
    negative-axis squeeze and its input projection as a matmul with a broadcast weight."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = torch.nn.Conv2d(3, 16, 4, stride=4)
        self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        t = self.patch(x).flatten(2).transpose(1, 2)
        return self.attn(t, t, t, need_weights=False)[0]


def test_multihead_attention_export_builds_in_nhwc_and_matches_torch(tmp_path):
    from tvm import relax

    torch.manual_seed(0)
    net = AttentionNet().eval()
    x = torch.randn(2, 3, 12, 12)
    path = tmp_path / "attn.pt2"
    torch.export.save(torch.export.export(net, (x,)), str(path))
    imported = import_model(path, {})
    ops = []
    relax.analysis.post_order_visit(
        imported.mod["main"], lambda e: ops.append(getattr(getattr(e, "op", None), "name", None))
    )
    # the in-projection's weight reaches its matmul unbroadcast (weight-only work stays weight-sized)
    assert "relax.matmul" in ops and ops.count("relax.broadcast_to") == 0
    out = tmp_path / "attn.ixa"
    build_artifact(BuildOptions(model=path, target=host_target_name(), output=out), log=lambda *a: None)
    with Engine(out) as engine, torch.no_grad():
        got = engine.run({"x": x.numpy()})
        want = net(x).numpy()
    (name,) = got
    np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5)


def _exported_built_and_run(tmp_path, net, x, dynamic_shapes=None, run=None):
    """``net`` exported with torch.export on ``x`` (``dynamic_shapes`` as torch takes them), built for
    this host with input ``x`` pinned to ``run``'s shape, run on ``run`` (default ``x``): (our outputs,
    torch's), in order."""
    run = x if run is None else run
    path = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(net, (x,), dynamic_shapes=dynamic_shapes), str(path))
    out = tmp_path / "net.ixa"
    options = BuildOptions(model=path, target=host_target_name(), output=out, input_shapes={"x": tuple(run.shape)})
    build_artifact(options, log=lambda *a: None)
    with Engine(out) as engine, torch.no_grad():
        got = list(engine.run({"x": run.numpy()}).values())
        want = net(run)
    return got, [t.numpy() for t in (want if isinstance(want, tuple) else (want,))]


class DecoderNet(torch.nn.Module):
    """A UNet decoder step: a strided conv down, transposed convs back up (kernel 2 and kernel 4 with
    padding, both stride 2), concatenated with a skip branch, GroupNorm + SiLU."""

    def __init__(self) -> None:
        super().__init__()
        self.down = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up2 = torch.nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.up4 = torch.nn.ConvTranspose2d(8, 8, 4, stride=2, padding=1)
        self.skip = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.GroupNorm(4, 24)

    def forward(self, x):
        d = self.down(x)
        y = torch.cat([self.up2(d), self.up4(d), self.skip(x)], 1)
        return torch.nn.functional.silu(self.norm(y))


def test_transposed_convolutions_export_builds_and_matches_torch(tmp_path):
    """torch.export writes ConvTranspose2d with an explicit out_dtype; the NHWC layout conversion then
    carried the channels-last input through it, a layout its legalization has no lowering for, and the
    build failed in VM codegen. Transposed convs stay NCHW between NHWC convolutions."""
    torch.manual_seed(0)
    (got,), (want,) = _exported_built_and_run(tmp_path, DecoderNet().eval(), torch.randn(2, 3, 16, 16))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


class LastStepNet(torch.nn.Module):
    """A GRU sequence classifier reading its last step, plus an index from the end of the feature axis."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(5, 8, batch_first=True)
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x):
        y, h = self.gru(x)
        return (
            self.fc(y[:, -1]) + h[-1, :, :3],
            x[..., -2],
            x[:, [-1, 0, -3]],
            x[torch.tensor([-1, 0]), torch.tensor([-2, 3])],
        )


def test_negative_indices_count_from_the_end(tmp_path):
    """``x[:, -1]`` (aten.select.int) and ``x[:, [-1, 0]]`` (aten.index.Tensor) with negative indices
    went to an unchecked gather as they were and read outside the tensor (a GRU classifier's logits
    ~1e20, no error); they match torch now."""
    torch.manual_seed(0)
    got, want = _exported_built_and_run(tmp_path, LastStepNet().eval(), torch.randn(2, 6, 5))
    assert len(got) == 4
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


class EmptyCache(torch.nn.Module):
    def forward(self, x):
        return torch.cat([torch.zeros(0), x], dim=-2) * 2, torch.cat((x, torch.zeros(0), x + 1), 1)


def test_concatenation_skips_empty_vectors_as_torch_does(tmp_path):
    """torch.cat ignores 1-D empty inputs whatever the others' rank (how transformers' GPT-2 starts its
    key / value cache); TVM's conversion refused the mixed ranks. They import and match torch."""
    got, want = _exported_built_and_run(tmp_path, EmptyCache(), torch.randn(2, 3, 4))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


class FromTheEnd(torch.nn.Module):
    def forward(self, x):
        return x[:, -1] * 2, x[:, [-1, 1]]


def test_negative_indices_over_a_dynamic_dimension(tmp_path):
    """The same over an axis whose size is pinned only at import (the wrap takes the dim's value)."""
    seq = {"x": {1: torch.export.Dim("seq", min=2, max=64)}}
    got, want = _exported_built_and_run(tmp_path, FromTheEnd(), torch.randn(2, 5, 3), seq, torch.randn(2, 7, 3))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


class Reductions(torch.nn.Module):
    def forward(self, x):
        return x.amax(-1), x.amin(dim=(1, 2), keepdim=True), x.prod(1), torch.logsumexp(x, -1)


def test_amax_amin_prod_and_logsumexp_import(tmp_path):
    """aten.amax / amin / prod (and logsumexp, which decomposes to amax) were 'Unsupported function
    types' for TVM's translator; they import and match torch."""
    got, want = _exported_built_and_run(tmp_path, Reductions(), torch.randn(2, 5, 3))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


class PlainGroupNorms(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.GroupNorm(2, 6, affine=False)

    def forward(self, x):
        return self.norm(x), torch.nn.functional.group_norm(x.flatten(2), 3)


def test_group_norms_without_affine_parameters_import(tmp_path):
    """GroupNorm without weight and bias failed inside TVM's translator (a null pointer); it imports
    with ones and zeros and matches torch, over 4-D and 3-D inputs."""
    got, want = _exported_built_and_run(tmp_path, PlainGroupNorms(), torch.randn(2, 6, 4, 5))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


class ExponentialUnits(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.selu(x), torch.nn.functional.elu(x, 0.5), torch.nn.functional.celu(x, 2.0)


def test_selu_keeps_its_scale(tmp_path):
    """torch.export writes SELU as aten.elu(x, alpha, scale); TVM's conversion dropped the scale (and
    input_scale): SELU came out 5 % low on positive inputs with no error. ELU and CELU are checked too."""
    got, want = _exported_built_and_run(tmp_path, ExponentialUnits(), torch.randn(2, 6, 5) * 2)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


class Resamplers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("grid", torch.rand(2, 4, 5, 2, generator=torch.Generator().manual_seed(0)) * 2.4 - 1.2)

    def forward(self, x):
        f = torch.nn.functional
        return (
            f.interpolate(x, size=(3, 2), mode="nearest"),
            f.interpolate(x, scale_factor=1.5, mode="nearest"),
            f.grid_sample(x, self.grid, align_corners=False),
            f.grid_sample(x, self.grid, mode="nearest", padding_mode="border", align_corners=True),
        )


def test_nearest_resizes_and_grid_samples_match_torch(tmp_path):
    """TVM's conversion resized "nearest" with half-pixel rounding (torch floors asymmetric
    coordinates: a 5 -> 3 downsample picked other pixels) and passed grid_sample torch's (N, H, W, 2)
    grid where Relax takes (N, 2, H, W) (wrong shape and values). Both silently; both match now."""
    got, want = _exported_built_and_run(tmp_path, Resamplers(), torch.randn(2, 3, 6, 6))
    assert [g.shape for g in got] == [w.shape for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


class IntegerArithmetic(torch.nn.Module):
    def forward(self, x):
        counts = (x > 0).sum(1)
        ints = (x * 10).long()
        return (
            (x * (x > 0)).sum(1) / counts.clamp(min=1),  # a masked mean
            (ints // 3).float(),
            (ints // -3).float(),
            torch.div(ints, 3, rounding_mode="trunc").float(),
            torch.div(x * 10, 3, rounding_mode="floor"),
            ints.clamp(max=3).float(),
        )


def test_integer_floor_division_and_one_sided_clamps_import(tmp_path):
    """``ints // 3`` and ``torch.div(x, 3, rounding_mode=...)`` failed to import (an int32 constant next
    to int64 / float32 tensors); ``counts.clamp(min=1)`` failed the build (an infinite bound cast to
    int64). They import and match torch, Python's floor semantics for negative operands included."""
    got, want = _exported_built_and_run(tmp_path, IntegerArithmetic(), torch.randn(2, 5, 3))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


class Patches(torch.nn.Module):
    def forward(self, x):
        rows, cols = torch.tensor([[0], [2]]), torch.tensor([1, -1, 2])
        return torch.nn.functional.unfold(x, 3, padding=1, stride=2), x[:, :, rows, cols]


def test_unfold_and_advanced_indexing_after_whole_axes(tmp_path):
    """``F.unfold`` decomposes to ``x[:, :, i, j]`` with index tensors of shapes (3, 3, 1, 1) and (3, 3);
    TVM's conversion failed on such indexing ("cannot broadcast index shapes"). It imports and matches
    torch, with the gathered dims where torch puts them and a negative index among them."""
    got, want = _exported_built_and_run(tmp_path, Patches(), torch.randn(2, 4, 6, 6))
    assert [g.shape for g in got] == [(2, 36, 9), (2, 4, 2, 3)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


class FractionalResizes(torch.nn.Module):
    def forward(self, x):
        f = torch.nn.functional
        return (
            f.interpolate(x, scale_factor=0.7, mode="nearest"),
            f.interpolate(x, scale_factor=(1.5, 1.3), mode="bilinear"),
            f.interpolate(x, scale_factor=2, mode="bilinear"),
        )


def test_resizes_by_scales_without_whole_sizes_match_torch(tmp_path):
    """With scale factors that give no whole output size (9 x 0.7), torch maps output pixels back with
    the scale itself; TVM's conversion used the ratio of the rounded sizes (nearest: other pixels,
    bilinear 41 % off, no error). Such resizes are gathers of torch's own source rows now."""
    got, want = _exported_built_and_run(tmp_path, FractionalResizes(), torch.randn(2, 3, 9, 10))
    assert [g.shape for g in got] == [(2, 3, 6, 7), (2, 3, 13, 13), (2, 3, 18, 20)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


class Statistics(torch.nn.Module):
    def forward(self, x):
        var, mean = torch.var_mean(x, dim=(2, 3), keepdim=True)
        std, mean1 = torch.std_mean(x, dim=1)
        unbiased = torch.var(x, dim=-1, correction=0)
        return var, mean, std, mean1, unbiased, torch.hypot(x, x * 0.5 - 1)


def test_var_mean_std_mean_and_hypot_import(tmp_path):
    """aten.var_mean (torch.var_mean, std_mean) and aten.hypot were 'Unsupported function types' for
    TVM's translator; they import and match torch (Bessel's correction by default, or as given)."""
    got, want = _exported_built_and_run(tmp_path, Statistics(), torch.randn(2, 3, 7, 5))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


class AdaptiveMax(torch.nn.Module):
    def forward(self, x):
        f = torch.nn.functional.adaptive_max_pool2d
        return f(x, (3, 2)), f(x, 1), f(x, (7, None)), f(x, (4, 5))


def test_adaptive_max_pools_take_torch_windows(tmp_path):
    """aten.adaptive_max_pool2d was unsupported; windows that do not divide the size overlap as
    torch's do (7 rows into 3: rows 0-2, 2-4, 4-6), whole ones and 1x1 pools too."""
    got, want = _exported_built_and_run(tmp_path, AdaptiveMax(), torch.randn(2, 3, 7, 5))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


class MaxWithIndices(torch.nn.Module):
    def forward(self, x):
        values, indices = torch.nn.functional.adaptive_max_pool2d(x, 2, return_indices=True)
        return values + indices.float()


def test_adaptive_max_pool_indices_are_refused_by_name(tmp_path):
    path = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(MaxWithIndices(), (torch.randn(1, 2, 4, 4),)), str(path))
    with pytest.raises(ModelError, match="adaptive_max_pool2d with return_indices=True"):
        import_model(path, {})


class ScatterAndDistances(torch.nn.Module):
    def forward(self, x):
        index = torch.tensor([[0, 1, 0], [4, 4, 2]])
        counts = torch.zeros(2, 5).scatter_add(1, index, x[:, :3])  # repeated indices accumulate
        partial = torch.ones(2, 5).scatter_add(1, index[:, :2], x)  # src wider than the index
        y = x.view(1, 2, 5)
        return counts, partial, torch.cdist(y, y * 2 + 1), torch.cdist(y, y - 1, p=1), torch.cdist(y, -y, p=3.0)


def test_scatter_add_and_cdist_import(tmp_path):
    """aten.scatter_add and aten._cdist_forward were 'Unsupported function types' for TVM's
    translator; they import and match torch (p = 1, 2 and 3 distances)."""
    got, want = _exported_built_and_run(tmp_path, ScatterAndDistances(), torch.randn(2, 5))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


class RunningExtremes(torch.nn.Module):
    def forward(self, x):
        ties = torch.round(x * 2)  # repeated values: torch reports the later index
        mx, imx = torch.cummax(ties, dim=1)
        mn, imn = torch.cummin(x, dim=-1)
        cols, icols = torch.cummax(x, dim=0)
        return mx, imx, mn, imn, cols, icols


def test_cummax_and_cummin_import_with_torch_indices(tmp_path):
    """aten.cummax / cummin were 'Unsupported function types' for TVM's translator; values and indices
    (the later one on ties) match torch along every axis, over lengths that are not powers of two."""
    got, want = _exported_built_and_run(tmp_path, RunningExtremes(), torch.randn(5, 11))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
