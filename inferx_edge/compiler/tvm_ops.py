"""Operator attributes TVM 0.27 lacks, set once per process before anything is scheduled."""

from __future__ import annotations


def vectorizable_nearbyint() -> None:
    """Let TVM vectorize ``nearbyint`` (what Relax ``round`` becomes: the rounding step of every int8
    quantize). It lacks the ``TVectorizable`` attribute that ``round``, ``floor`` and ``exp`` carry, so
    TVM scalarized every loop holding one: each CUDA int8 conv epilogue stored one byte at a time
    (ResNet-50's layer-1 residual convs took twice the time of the same conv writing int32). CUDA
    emits a vector call as one ``nearbyintf`` per lane, LLVM as ``llvm.nearbyint`` on the vector.
    Called by every path that schedules or builds kernels (build, tune and its builder workers), so
    a kernel compiles the same way whichever ran first in the process. Idempotent."""
    import tvm

    op = tvm.ir.Op.get("tirx.nearbyint")
    if not op.get_attr("TVectorizable"):
        op.set_attr("TVectorizable", True)


def _const(v, dtype: str, lanes: int):
    """A ``dtype`` constant, broadcast to ``lanes`` lanes for vector expressions."""
    from tvm import tirx

    k = tirx.const(v, dtype)
    return k if lanes == 1 else tirx.Broadcast(k, lanes)


_LOWERED: set[str] = set()


def _lower_on_llvm(op_name: str, f) -> None:
    """Register ``f`` as the LLVM lowering of ``op_name`` (ahead of TVM's own), once per process."""
    if op_name in _LOWERED:
        return
    from tvm import tirx

    tirx.op.register_intrin_lowering(op_name, target="llvm", f=f, level=99)
    _LOWERED.add(op_name)


#: above this ``expf`` overflows to inf; below this its result is a denormal (here: 0)
_EXP_HI, _EXP_LO = 88.72283935546875, -87.33654475


def _vector_exp_f32(call):
    """``exp(x)`` for float32 (scalar or vector) as Cephes' ``expf``: ``2^n * p(r)`` with
    ``n = round(x / ln 2)``, ``r = x - n ln 2`` (split in two constants) and a degree-7 polynomial; the
    power of two is applied as two halves built in the exponent bits (each a normal float). Every step
    is a vector instruction. Relative error under 4e-7 against float64 (LLVM's ``expf``: 2.6e-7); inf
    above ``expf``'s overflow point, NaN for NaN, and 0 where ``expf`` returns a denormal (below
    1.2e-38: denormal arithmetic is many times slower on x86, and a softmax's masked scores land there)."""
    import tvm
    from tvm import tirx

    x = call.args[0]
    dt = tvm.runtime.DataType(str(x.ty.dtype))
    if dt.type_code != tvm.runtime.DataType("float32").type_code or dt.bits not in (16, 32):
        # what TVM's own rule gives (this rule replaces it: returning the call unlowered fails codegen)
        return tirx.call_llvm_pure_intrin(str(x.ty.dtype), "llvm.exp", x)
    lanes = dt.lanes
    if dt.bits == 16:  # float16 through float32, in vector registers too
        f32 = "float32" if lanes == 1 else f"float32x{lanes}"
        return tirx.Cast(str(x.ty.dtype), _vector_exp_f32(tirx.call_intrin(f32, "tirx.exp", tirx.Cast(f32, x))))
    ints = "int32" if lanes == 1 else f"int32x{lanes}"

    def c(v, t="float32"):
        return _const(v, t, lanes)

    def pow2(m):  # 2^m for integral float m in [-126, 127]
        bits = tirx.shift_left(tirx.Cast(ints, m) + c(127, "int32"), c(23, "int32"))
        return tirx.reinterpret(str(x.ty.dtype), bits)

    xc = tirx.Max(tirx.Min(x, c(_EXP_HI)), c(_EXP_LO))
    n = tirx.floor(xc * c(1.44269504088896341) + c(0.5))
    r = xc - n * c(0.693359375) - n * c(-2.12194440e-4)
    p = c(1.9875691500e-4)
    for k in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = p * r + c(k)
    half = tirx.floor(n * c(0.5))
    y = (p * r * r + r + c(1.0)) * pow2(half) * pow2(n - half)
    y = tirx.Select(x > c(_EXP_HI), c(float("inf")), tirx.Select(x < c(_EXP_LO), c(0.0), y))
    return _keep_nan(x, y, lanes)


def _keep_nan(x, y, lanes: int):
    """``y``, or ``x`` where the float32 ``x`` is NaN: tested on its bits (LLVM's fast-math flags fold
    ``x != x`` to false, and min/max clamps turn NaN into a bound)."""
    from tvm import tirx

    ints = "int32" if lanes == 1 else f"int32x{lanes}"
    magnitude = tirx.bitwise_and(tirx.reinterpret(ints, x), _const(0x7FFFFFFF, "int32", lanes))
    return tirx.Select(magnitude > _const(0x7F800000, "int32", lanes), x, y)


def vectorized_cpu_exp() -> None:
    """CPU (LLVM) builds compute float32 ``exp`` in vector registers (:func:`_vector_exp_f32`): LLVM
    has no vector ``expf`` without a vector math library, so every sigmoid / SiLU / softmax / GELU-tanh
    lane was a scalar libm call. A SiLU over 112x112x96 took 6.9 ms on 2 Xeon cores, 1.3 ms now;
    EfficientNet-B0's SiLU convolutions ran at 8-68 GFLOPS against 110-155 for its plain ones.
    Process-wide and idempotent, like :func:`vectorizable_nearbyint`."""
    _lower_on_llvm("tirx.exp", _vector_exp_f32)


_ERF_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
              -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)  # fmt: skip
_ERF_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
             -1.42647390514189e-02)  # fmt: skip


def _vector_erf(call):
    """``erf(x)`` as Eigen's float rational approximation (odd degree-13 over even degree-8
    polynomial on x clamped to [-4, 4], where erf is +-1 to float precision): all vector
    instructions. fp16 and fp64 go through float32 (an fp64 erf is then float32-accurate, ~1e-7)."""
    import tvm
    from tvm import tirx

    x = call.args[0]
    dtype = str(x.ty.dtype)
    dt = tvm.runtime.DataType(dtype)
    if dt.type_code != tvm.runtime.DataType("float32").type_code:
        return call
    lanes = dt.lanes
    f32 = "float32" if lanes == 1 else f"float32x{lanes}"

    def c(v):
        return _const(v, "float32", lanes)

    xf_in = x if dt.bits == 32 else tirx.Cast(f32, x)
    xf = tirx.Max(tirx.Min(xf_in, c(4.0)), c(-4.0))
    x2 = xf * xf
    p = c(_ERF_ALPHA[0])
    for a in _ERF_ALPHA[1:]:
        p = p * x2 + c(a)
    q = c(_ERF_BETA[0])
    for b in _ERF_BETA[1:]:
        q = q * x2 + c(b)
    y = _keep_nan(xf_in, xf * p / q, lanes)
    return y if dt.bits == 32 else tirx.Cast(dtype, y)


def vectorized_cpu_erf() -> None:
    """CPU (LLVM) builds compute ``erf`` (exact GELU: ViT, BERT, ConvNeXt, Swin) in vector registers
    (:func:`_vector_erf`); ``erf`` lacked ``TVectorizable``, so every loop holding one stayed scalar
    with a libm ``erff`` call per element. CUDA emits a vector call as one ``erff`` per lane.
    Process-wide and idempotent."""
    import tvm

    op = tvm.ir.Op.get("tirx.erf")
    if not op.get_attr("TVectorizable"):
        op.set_attr("TVectorizable", True)
    _lower_on_llvm("tirx.erf", _vector_erf)


def tvm_op_fixes() -> None:
    """Every process-wide operator fix above, once: called by each path that schedules or builds."""
    vectorizable_nearbyint()
    vectorized_cpu_exp()
    vectorized_cpu_erf()
