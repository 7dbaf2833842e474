"""aten ops TVM 0.27's torch.export translator rejected ("Unsupported function types"; heaviside's
decomposition: mixed dtypes in ``where``), converted by ``frontend/torch_math_ops.py`` (heaviside: the
import's integer-operand casts): each built for this host and
matched against torch on inputs that reach the awkward regions (tails, reflection, ties, -0.0)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from inferx_edge.errors import ModelError
from inferx_edge.frontend import import_model
from tests.frontend.test_torch_import import _exported_built_and_run


class Special(torch.nn.Module):
    def forward(self, x):
        u = torch.tanh(x) * 0.999999  # (-1, 1), reaching the erfinv tails
        g = x * 4  # both signs: lgamma / digamma reflection below 0.5
        return torch.erfinv(u), torch.lgamma(g), torch.digamma(g), torch.lgamma(g.abs() * 20 + 0.01)


def test_erfinv_lgamma_and_digamma_match_torch(tmp_path):
    """Special functions from their series: float32 within 2e-5 relative of torch (digamma near its
    poles compared where torch's value is below 1e3 in magnitude)."""
    x = torch.linspace(-2.9, 3.1, 301).reshape(7, 43)
    got, want = _exported_built_and_run(tmp_path, Special(), x)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        keep = np.abs(w) < 1e3
        np.testing.assert_allclose(g[keep], w[keep], rtol=2e-5, atol=2e-5, err_msg=f"output {i}")


class Signs(torch.nn.Module):
    def forward(self, x):
        return (
            torch.signbit(x).float(),
            torch.copysign(x.flip(0), x),
            torch.copysign(x, -1.5),
            torch.heaviside(x, torch.tensor(0.25)),
        )


def test_signbit_copysign_and_heaviside_match_torch_at_signed_zeros(tmp_path):
    x = torch.randn(6, 9)
    x[x.abs() < 0.3] = 0.0
    x[:3][x[:3] == 0] = -0.0  # the input carries -0.0 (an in-graph x * 0.0 is folded to +0.0)
    got, want = _exported_built_and_run(tmp_path, Signs(), x)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


class Scans(torch.nn.Module):
    def forward(self, x):
        wide = x * 60  # exp over- and underflows: log(cumsum(exp)) would not do
        edges = torch.linspace(-2, 2, 9)
        rows = torch.sort(x[:, :5], dim=1).values
        kv, ki = torch.kthvalue(x, 3, dim=1)
        kv0, _ = torch.kthvalue(x, 2, dim=0, keepdim=True)
        return (
            torch.logcumsumexp(wide, 1),
            torch.logcumsumexp(x, 0),
            torch.searchsorted(edges, x),
            torch.searchsorted(edges, torch.round(x), right=True),
            torch.searchsorted(rows, x[:, 5:]),
            kv,
            ki,
            kv0,
            torch.nn.functional.pdist(x),
            torch.nn.functional.pdist(x, p=1),
            torch.nn.functional.rrelu(x, training=False),
        )


def test_scans_searches_kthvalue_pdist_and_eval_rrelu_match_torch(tmp_path):
    got, want = _exported_built_and_run(tmp_path, Scans(), torch.randn(5, 11))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if np.issubdtype(w.dtype, np.integer):
            np.testing.assert_array_equal(g, w, err_msg=f"output {i}")
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"output {i}")


class TrainingRrelu(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.rrelu(x, training=True)


def test_rrelu_in_training_mode_is_refused_by_name(tmp_path):
    path = tmp_path / "net.pt2"
    try:
        torch.export.save(torch.export.export(TrainingRrelu(), (torch.randn(2, 3),)), str(path))
    except Exception as e:  # noqa: BLE001 - a torch that cannot export it leaves nothing to import
        pytest.skip(f"torch.export: {type(e).__name__}")
    with pytest.raises(ModelError, match="rrelu in training mode"):
        import_model(path, {})


class Folds(torch.nn.Module):
    def forward(self, x):
        cols = x.reshape(2, 18, 16)
        y = torch.zeros(2, 6, 3)
        idx = torch.tensor([0, 2, 2, 5])
        y[:, idx, :] += cols[:, :4, :3]  # repeated index 2: accumulates
        z = torch.zeros(6, 4).index_put((torch.tensor([1, 1, 3]),), cols[0, :3, :4], accumulate=True)
        w = torch.zeros(2, 6, 3)
        w[:, torch.tensor([4, 1]), :] = cols[:, :2, :3]  # no accumulate: whole axes on both sides
        return (
            w,
            torch.nn.functional.fold(cols, output_size=(6, 6), kernel_size=3),  # overlapping windows
            torch.nn.functional.fold(cols[:, :8], output_size=(5, 5), kernel_size=2, stride=1, padding=0)[:, :, :4],
            y,
            z,
        )


def test_fold_and_accumulating_index_puts_match_torch(tmp_path):
    """F.fold decomposes to index_put(accumulate) over [None, None, rows, cols]; TVM's converter put both
    whole axes on one broadcast axis and the result was silently wrong (6.9 off). Whole axes before and
    after the index tensors, repeated indices accumulating."""
    got, want = _exported_built_and_run(tmp_path, Folds(), torch.randn(2 * 18 * 16))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"output {i}")


class Windows(torch.nn.Module):
    def forward(self, x):
        f = torch.nn.functional
        return (
            f.interpolate(x, size=(3, 4), mode="bilinear", antialias=True),  # downscale both axes
            f.interpolate(x, size=(5, 11), mode="bilinear", antialias=True),  # down and up
            f.interpolate(x, size=(4, 3), mode="bicubic", antialias=True),
            f.interpolate(x, scale_factor=0.4, mode="bilinear", antialias=True),  # torch's scale, not sizes
            f.avg_pool2d(x, 2, divisor_override=3),
            f.avg_pool2d(x, 3, stride=2, padding=1, divisor_override=5),
            f.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),  # no override
            x.unfold(2, 3, 2),
            x.unfold(-1, 2, 3),
        )


def test_antialiased_resizes_divisor_overrides_and_tensor_unfold_match_torch(tmp_path):
    """TVM's translator ignored antialias (1.5 off) and divisor_override (0.33 off) without an error, and
    did not know Tensor.unfold."""
    got, want = _exported_built_and_run(tmp_path, Windows(), torch.randn(1, 2, 9, 8))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"output {i}")


class Close(torch.nn.Module):
    def forward(self, x):
        y = x + torch.where(x > 0, 1e-9, 1e-3)
        return torch.isclose(x, y).float(), torch.isclose(x, y, rtol=0, atol=1e-6).float(), ((x > 0) * (x < 1)).float()


def test_isclose_and_boolean_products_build(tmp_path):
    """torch.isclose decomposes to a product of two boolean masks, which TVM lowered to code that did not
    compile ("Check failed: ... kDLFloat"); boolean products and sums import as and / or."""
    got, want = _exported_built_and_run(tmp_path, Close(), torch.randn(4, 7))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


class Deconv3d(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.ConvTranspose3d(4, 3, 3, stride=2, padding=1, output_padding=1, groups=1)
        self.grouped = torch.nn.ConvTranspose3d(4, 4, 2, stride=(1, 2, 2), groups=2, bias=False, dilation=(2, 1, 1))

    def forward(self, x):
        return self.up(x), self.grouped(x)


def test_transposed_3d_convolutions_match_torch(tmp_path):
    """nn.ConvTranspose3d was refused by TVM's translator ("dimensionality: 5")."""
    got, want = _exported_built_and_run(tmp_path, Deconv3d().eval(), torch.randn(1, 4, 3, 4, 5))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
