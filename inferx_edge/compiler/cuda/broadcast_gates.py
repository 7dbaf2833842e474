"""Keep a GEMM's result from being broadcast over a larger tensor inside the GEMM's own kernel.

A squeeze-excite block computes a gate per (image, channel) with 1x1 convolutions over pooled
channels, then multiplies the feature map by it. ``FuseOps`` puts that multiply (a broadcast) into
the excite convolution's kernel, so the kernel writes the whole feature map while its GEMM produces
one value per channel: no matmul schedule can tile it (dlight asserts), and the schedule that
accepts it recomputes the gate's dot product for every element of the map. EfficientNet-B0 at batch
64 spent about a fifth of its GPU time in such kernels at 0.3-0.5 TFLOPS.

:func:`split_broadcast_gates` runs between ``AnnotateTIROpPattern`` and ``FuseOps``: a broadcast call
that expands a value computed from a GEMM or convolution (through elementwise and broadcast ops) to
the full shape of another operand gets its own copy of the PrimFunc marked injective. ``FuseOps``
then ends the GEMM's kernel at the gate (one small kernel) and fuses the multiply with what follows
it (the next layer's quantization) into one memory-bound elementwise kernel.
"""

from __future__ import annotations

import math

#: TVM's operator patterns (``relay.op.OpPattern``). ``AnnotateTIROpPattern`` marks a broadcasting
#: multiply elementwise; injective keeps FuseOps from fusing it into a GEMM's kernel while it still
#: fuses with its consumers.
_ELEMWISE, _BROADCAST, _INJECTIVE, _OUT_EWISE_FUSABLE = 0, 1, 2, 4

#: how many elementwise/broadcast calls back from the gate to look for the GEMM that produced it
_MAX_CHAIN = 12


def _numel(ty) -> int | None:
    shape = getattr(ty, "shape", None)
    dims = getattr(shape, "values", None)
    if dims is None:
        return None
    try:
        return math.prod(int(d) for d in dims)
    except TypeError:  # symbolic
        return None


def _callee(value, call_tir):
    """The GlobalVar a ``call_tir`` value calls, else None."""
    from tvm import relax

    if isinstance(value, relax.Call) and value.op == call_tir:
        return value.args[0]
    return None


def _from_gemm(var, bindings: dict, patterns: dict, gemms: set, call_tir, depth: int = 0) -> bool:
    """Whether ``var`` is computed from a GEMM or convolution (a call of ``gemms``) through
    elementwise/broadcast calls."""
    from tvm import relax

    value = bindings.get(var)
    gv = _callee(value, call_tir)
    if gv is None or depth > _MAX_CHAIN:
        return False
    if gv in gemms:
        return True
    if patterns.get(gv) not in (_ELEMWISE, _BROADCAST):
        return False
    return any(
        isinstance(a, relax.Var) and _from_gemm(a, bindings, patterns, gemms, call_tir, depth + 1)
        for a in value.args[1].fields
    )


def gate_calls(mod) -> dict:
    """{bound Var: callee GlobalVar} for the ``call_tir`` bindings of broadcasts that expand a GEMM's
    result over a larger operand."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.cuda.analysis import is_contraction

    call_tir = tvm.ir.Op.get("relax.call_tir")
    patterns = {
        gv: int(f.attrs["op_pattern"])
        for gv, f in mod.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and "op_pattern" in f.attrs
    }
    # GEMMs and convolutions (a reduction pattern alone also covers means and other reductions)
    gemms = {gv for gv, p in patterns.items() if p == _OUT_EWISE_FUSABLE and is_contraction(mod[gv])}
    found = {}
    for _gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        bindings = {
            b.var: b.value for block in func.body.blocks for b in block.bindings if isinstance(b, relax.VarBinding)
        }
        for var, value in bindings.items():
            gv = _callee(value, call_tir)
            if gv is None or patterns.get(gv) not in (_ELEMWISE, _BROADCAST):  # TVM marks broadcasts elementwise
                continue
            out = _numel(var.ty)
            args = [a for a in value.args[1].fields if isinstance(a, relax.Var)]
            sizes = [_numel(a.ty) for a in args]
            if out is None or out not in sizes:
                continue
            if any(
                s is not None and s < out and _from_gemm(a, bindings, patterns, gemms, call_tir)
                for a, s in zip(args, sizes)
            ):
                found[var] = gv
    return found


def split_broadcast_gates():
    """A module pass: each broadcast call :func:`gate_calls` finds calls its own copy of the PrimFunc
    with ``op_pattern`` injective (the original stays as it was for its other callers)."""
    import tvm
    from tvm import relax

    from inferx_edge.compiler.relax_rewrite import mutate_functions

    call_tir = tvm.ir.Op.get("relax.call_tir")

    @tvm.transform.module_pass(opt_level=0, name="InferxSplitBroadcastGates")
    def _pass(mod, _ctx):
        gates = gate_calls(mod)
        if not gates:
            return mod
        copies = {}

        @relax.expr_functor.mutator
        class _Rewriter(relax.PyExprMutator):
            def visit_var_binding_(self, binding):
                value = binding.value
                if binding.var in gates and isinstance(value, relax.Call) and value.op == call_tir:
                    gv = value.args[0]
                    if gv not in copies:
                        func = self.builder_.get()[gv].with_attr("op_pattern", _INJECTIVE)
                        copies[gv] = self.builder_.add_func(func, f"{gv.name_hint}_gate")
                    value = relax.Call(value.op, [copies[gv], *value.args[1:]], value.attrs, value.ty_args)
                    binding = relax.VarBinding(binding.var, value)
                super().visit_var_binding_(binding)

        return mutate_functions(_Rewriter(mod))

    return _pass
