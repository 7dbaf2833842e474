"""More aten ops TVM 0.27's torch.export translator does not know (special functions, scans, searches),
converted by the import from Relax operators: ``torch.erfinv``, ``lgamma``, ``digamma``,
``logcumsumexp``, ``signbit``, ``copysign``, ``searchsorted``, ``kthvalue``,
``F.pdist`` and ``F.rrelu`` in eval mode. Each has a case in ``tests/frontend/test_torch_math_ops.py``
against torch; float32 results are within a few ulp-scale relative error of torch's, not bitwise."""

from __future__ import annotations

import math

import numpy as np

from inferx_edge.frontend.torch_converters import _dtype, _operand
from inferx_edge.frontend.torch_extra_ops import cdist_values, shifted_along

#: Giles' single-precision erfinv ("Approximating the erfinv function", GPU Computing Gems, 2011):
#: p(w) for w = -log(1 - x^2) below 5 (in w - 2.5) and above (in sqrt(w) - 3), erfinv(x) ~ p x
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                   -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)  # fmt: skip
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)  # fmt: skip
#: shift of lgamma / digamma arguments before their asymptotic series
_SHIFT = 8


class _Ops:
    """Relax op helpers bound to one converter call (constants in the node's dtype, emitted values)."""

    def __init__(self, importer, dtype: str):
        from tvm import relax

        self.relax, self.op, self.bb, self.dtype = relax, relax.op, importer.block_builder, dtype

    def c(self, value):
        return self.relax.const(value, self.dtype)

    def emit(self, value):
        return self.bb.emit(value)

    def poly(self, coeffs, w):
        p = self.c(coeffs[0])
        for coef in coeffs[1:]:
            p = self.op.add(self.op.multiply(p, w), self.c(coef))
        return p


def _unary(build):
    def convert(node, importer):
        o = _Ops(importer, _dtype(node))
        return o.emit(build(o, _operand(importer, node.args[0], o.dtype)))

    return convert


def _erfinv(o, x):
    op = o.op
    w = o.emit(op.negative(op.log(op.multiply(op.subtract(o.c(1.0), x), op.add(o.c(1.0), x)))))
    central = o.poly(_ERFINV_CENTRAL, op.subtract(w, o.c(2.5)))
    tail = o.poly(_ERFINV_TAIL, op.subtract(op.sqrt(w), o.c(3.0)))
    return op.multiply(op.where(op.less(w, o.c(5.0)), central, tail), x)


def _shifted(o, x):
    """``(z, terms)``: ``z = x + _SHIFT`` for positive ``x`` and ``x, x + 1, .. x + _SHIFT - 1``."""
    terms = [o.op.add(x, o.c(float(i))) if i else x for i in range(_SHIFT)]
    return o.emit(o.op.add(x, o.c(float(_SHIFT)))), terms


def _lgamma_positive(o, x):
    # lgamma(x) = lgamma(x + 8) - log(x (x + 1) .. (x + 7)); Stirling's series at z = x + 8
    op = o.op
    z, terms = _shifted(o, x)
    inv2 = op.divide(o.c(1.0), op.multiply(z, z))
    series = op.divide(o.poly((1.0 / 1260, -1.0 / 360, 1.0 / 12), inv2), z)
    stirling = op.add(
        op.subtract(op.multiply(op.subtract(z, o.c(0.5)), op.log(z)), z), o.c(0.5 * math.log(2 * math.pi))
    )
    prod = terms[0]
    for t in terms[1:]:
        prod = op.multiply(prod, t)
    return op.subtract(op.add(stirling, series), op.log(op.abs(prod)))


def _pi_frac(o, x):
    """``pi (x - round(x))``: sin and tan of it equal those of ``pi x`` up to sign (sin) / exactly (tan),
    without the rounding of ``pi x`` for large ``x`` (``x - round(x)`` is exact)."""
    return o.op.multiply(o.c(math.pi), o.op.subtract(x, o.op.round(x)))


def _reflected(o, x):
    """``(small, y)``: where ``x < 0.5`` (the reflection formulas' side) and ``1 - x`` there, else ``x``."""
    small = o.emit(o.op.less(x, o.c(0.5)))
    return small, o.emit(o.op.where(small, o.op.subtract(o.c(1.0), x), x))


def _lgamma(o, x):
    # reflection below 0.5: lgamma(x) = log(pi / |sin(pi x)|) - lgamma(1 - x)
    op = o.op
    small, y = _reflected(o, x)
    base = o.emit(_lgamma_positive(o, y))
    reflected = op.subtract(op.log(op.divide(o.c(math.pi), op.abs(op.sin(_pi_frac(o, x))))), base)
    return op.where(small, reflected, base)


def _digamma(o, x):
    # digamma(x) = digamma(x + 8) - sum 1 / (x + i); asymptotic series at z = x + 8;
    # below 0.5 reflection: digamma(x) = digamma(1 - x) - pi / tan(pi x)
    op = o.op
    small, y = _reflected(o, x)
    z, terms = _shifted(o, y)
    inv2 = op.divide(o.c(1.0), op.multiply(z, z))
    # log z - 1/(2z) - 1/(12z^2) + 1/(120z^4) - 1/(252z^6) + 1/(240z^8)
    bracket = o.poly((-1.0 / 240, 1.0 / 252, -1.0 / 120, 1.0 / 12), inv2)
    asym = op.subtract(op.subtract(op.log(z), op.divide(o.c(0.5), z)), op.multiply(inv2, bracket))
    recip = op.divide(o.c(1.0), terms[0])
    for t in terms[1:]:
        recip = op.add(recip, op.divide(o.c(1.0), t))
    base = o.emit(op.subtract(asym, recip))
    reflected = op.subtract(base, op.divide(o.c(math.pi), op.tan(_pi_frac(o, x))))
    return op.where(small, reflected, base)


def _negative_sign(o, x):
    """True where ``x`` is negative or -0.0 (NaNs: False)."""
    op = o.op
    return op.logical_or(
        op.less(x, o.c(0.0)), op.logical_and(op.equal(x, o.c(0.0)), op.less(op.divide(o.c(1.0), x), o.c(0.0)))
    )


def _signbit(node, importer):
    dtype = _dtype(node.args[0])
    o = _Ops(importer, dtype)
    return o.emit(_negative_sign(o, importer.env[node.args[0]]))


def _copysign(node, importer):
    """``aten.copysign(a, b)``: ``|a|`` with ``b``'s sign (-0.0 counts as negative)."""
    dtype = _dtype(node)
    o = _Ops(importer, dtype)
    a, b = (_operand(importer, arg, dtype) for arg in node.args[:2])
    magnitude = o.emit(o.op.abs(a))
    return o.emit(o.op.where(_negative_sign(o, b), o.op.negative(magnitude), magnitude))


def _logcumsumexp(node, importer):
    """``aten.logcumsumexp(x, dim)``: a log-step scan with ``logaddexp(a, b) = max + log1p(exp(-|a - b|))``
    (exact for any range of values, unlike ``log(cumsum(exp))``)."""
    x = importer.env[node.args[0]]
    dtype = _dtype(node)
    o = _Ops(importer, dtype)
    op = o.op
    shape = [int(d) for d in importer.shape_of(x)]
    dim = int(node.args[1]) % len(shape)
    length, step = shape[dim], 1
    while step < length:
        earlier = o.emit(shifted_along(x, dim, shape, step, -np.inf, dtype))
        hi = o.emit(op.maximum(x, earlier))
        gap = op.negative(op.abs(op.subtract(x, earlier)))
        summed = op.add(hi, op.log(op.add(o.c(1.0), op.exp(gap))))
        x = o.emit(op.where(op.equal(hi, o.c(-np.inf)), hi, summed))  # both -inf: stay -inf, not NaN
        step *= 2
    return x


def _searchsorted(node, importer):
    """``aten.searchsorted(sorted, values, *, out_int32, right, side, sorter)``: per value, how many of
    its row's sorted elements are ``<`` it (``<=`` with ``right``); ``sorter`` is refused."""
    from inferx_edge.errors import ModelError

    kw = node.kwargs
    if kw.get("sorter") is not None:
        raise ModelError("searchsorted with sorter=: not supported (sort the sequence first)")
    right = bool(kw.get("right", False)) or kw.get("side") == "right"
    seq, values = (importer.env[node.args[i]] for i in (0, 1))
    o = _Ops(importer, _dtype(node.args[1]))
    op = o.op
    seq_rank = len(importer.shape_of(seq))
    s = op.expand_dims(seq, -2) if seq_rank > 1 else op.reshape(seq, [1] * len(importer.shape_of(values)) + [-1])
    before = (op.less_equal if right else op.less)(s, op.expand_dims(values, -1))
    return o.emit(op.sum(op.astype(before, "int32" if kw.get("out_int32") else "int64"), axis=[-1]))


def _kthvalue(node, importer):
    """``aten.kthvalue(x, k, dim=-1, keepdim=False)``: ``(values, indices)`` of the k-th smallest."""
    x = importer.env[node.args[0]]
    k = int(node.args[1])
    shape = [int(d) for d in importer.shape_of(x)]
    dim = int(node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", -1)) % len(shape)
    keepdim = bool(node.args[3] if len(node.args) > 3 else node.kwargs.get("keepdim", False))
    o = _Ops(importer, _dtype(node.args[0]))
    op = o.op
    smallest = o.emit(op.topk(x, k, axis=dim, ret_type="both", largest=False, dtype="int64"))
    out = []
    for part in (o.relax.TupleGetItem(smallest, 0), o.relax.TupleGetItem(smallest, 1)):
        part = op.strided_slice(part, axes=[dim], begin=[k - 1], end=[k])
        out.append(o.emit(part if keepdim else op.squeeze(part, axis=[dim])))
    return o.emit(o.relax.Tuple(out))


def _pdist(node, importer):
    """``aten._pdist_forward(x [N, M], p)``: the p-norm distances of rows i < j, in row-major pair order
    (the cdist matrix's upper triangle)."""
    x = importer.env[node.args[0]]
    n = int(importer.shape_of(x)[0])
    o = _Ops(importer, _dtype(node))
    p = float(node.args[1]) if len(node.args) > 1 else 2.0
    full = o.emit(o.op.reshape(cdist_values(importer, x, x, p, o.dtype), [n * n]))
    pairs = np.array([i * n + j for i in range(n) for j in range(i + 1, n)], np.int64)
    return o.emit(o.op.take(full, o.relax.const(pairs, "int64"), axis=0))


def _rrelu_eval(node, importer):
    """``aten.rrelu_with_noise_functional(x, noise, lower, upper, training)`` in eval mode (what
    ``F.rrelu(training=False)`` and ``nn.RReLU`` in eval export to): a leaky ReLU with slope
    ``(lower + upper) / 2``; ``(out, noise)``. Training mode (a random slope per element) is refused."""
    from inferx_edge.errors import ModelError

    args = list(node.args) + [None] * 5
    lower = args[2] if args[2] is not None else node.kwargs.get("lower", 1.0 / 8)
    upper = args[3] if args[3] is not None else node.kwargs.get("upper", 1.0 / 3)
    training = args[4] if args[4] is not None else node.kwargs.get("training", False)
    if training:
        raise ModelError("rrelu in training mode (random slopes): export the model in eval mode")
    x, noise = importer.env[node.args[0]], importer.env[node.args[1]]
    o = _Ops(importer, _dtype(node.args[0]))
    out = o.emit(o.op.where(o.op.greater_equal(x, o.c(0.0)), x, o.op.multiply(x, o.c((lower + upper) / 2))))
    return o.emit(o.relax.Tuple([out, noise]))


#: aten op name (as TVM's translator keys them) -> converter
MATH_OPS = {
    "erfinv.default": _unary(_erfinv),
    "lgamma.default": _unary(_lgamma),
    "digamma.default": _unary(_digamma),
    "signbit.default": _signbit,
    "copysign.Tensor": _copysign,
    "copysign.Scalar": _copysign,
    "logcumsumexp.default": _logcumsumexp,
    "searchsorted.Tensor": _searchsorted,
    "kthvalue.default": _kthvalue,
    "_pdist_forward.default": _pdist,
    "rrelu_with_noise_functional.default": _rrelu_eval,
}
