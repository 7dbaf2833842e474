"""Relax parameter names the CUDA kernels can carry: no capital letters A-F.

TVM 0.27's ``mma.sync`` codegen fills its operands into the asm template by replacing the letters A-F
one after another, so a kernel buffer named like ONNX's ``onnx__Conv_566`` had its "C" replaced by the
accumulator's address (the CUDA did not compile). Kernel buffers take the names of the Relax
variables they were fused from, so the weights' parameters of each Relax function are renamed to
lower case before legalization (unique within the function). Structural hashes ignore names: tuning
databases keep matching. The schedule still renames through a TVMScript round trip whatever is left
(:func:`~inferx_edge.compiler.cuda.tensor_core._mma_safe_buffer_names`), which took 0.28 s per kernel:
37 s of a DenseNet-121 int8 build.
"""

from __future__ import annotations

import re

#: what the mma.sync asm template substitution breaks
UNSAFE = re.compile("[A-F]")


def safe_name(name: str, taken: set[str]) -> str:
    """``name`` in lower case, suffixed ``_1``, ``_2``... until not in ``taken`` (which it joins)."""
    new, n = name.lower(), 0
    while new in taken:
        n += 1
        new = f"{name.lower()}_{n}"
    taken.add(new)
    return new


def lowercase_kernel_names():
    """A module pass renaming the parameters of every Relax function whose name holds a capital A-F."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class _Rename(relax.PyExprMutator):
        pass

    @tvm.transform.module_pass(opt_level=0, name="LowercaseKernelNames")
    def _pass(mod, _ctx):
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function) or not any(UNSAFE.search(p.name) for p in func.params):
                continue
            taken = {p.name for p in func.params}
            mutator = _Rename(mod)
            params = []
            for p in func.params:
                if not UNSAFE.search(p.name):
                    params.append(p)
                    continue
                q = relax.Var(safe_name(p.name, taken), p.ty)
                mutator.set_var_remap(p, q)
                params.append(q)
            body = mutator.visit_expr(func.body)
            updates[gv] = relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs, func.span)
        for gv, func in updates.items():
            mod[gv] = func
        return mod

    return _pass
