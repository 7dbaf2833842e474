"""The float32 values int8 variants concatenate are written in fp16 and widened as the concat reads them."""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import rewrite_calls_in_context, use_counts
from inferx_edge.compiler.passes.fp16_depthwise import saturated_fp16


def fp16_concat_inputs(mod):
    """Every float32 value ``v`` (bound to a call in a dataflow block) whose every reader is a ``concat``
    is written as its fp16 copy (:func:`~.fp16_depthwise.saturated_fp16`); each of those concats joins
    the fp16 copies (and its other inputs, saturated to fp16 in its own kernel) and is widened to
    float32 after.

    A concat is a copy: its kernel (fused with what follows it, in int8 variants the BatchNorm, ReLU and
    int8 quantization of the next layer) reads each input once. A dense block concatenates every earlier
    layer's output again for each later layer (DenseNet-121: a 56x56 block's first map is read six
    times), so these reads are most of such a network's traffic; in fp16 they take 2 bytes an element
    instead of 4, and the producers (int8 convs' dequantizing epilogues, where the saturation fuses)
    write 2. fp16 keeps 11 significant bits, far finer than the 8 of the int8 layer that reads the
    concatenation; a value beyond fp16's range is saturated, never inf.

    Left as they are: a value with any other reader (it keeps its float32 copy for that reader, so the
    fp16 copy would be an extra write; a concat that reads it with others rounds it to fp16), values
    already widened from fp16 (read as they are), and the inputs of a concat the function returns (its
    result keeps full float32 precision).
    """
    import tvm
    from tvm import relax

    concat, astype = tvm.ir.Op.get("relax.concat"), tvm.ir.Op.get("relax.astype")
    uses = use_counts(mod)

    @relax.expr_functor.visitor
    class _ConcatInputs(relax.PyExprVisitor):
        def __init__(self):
            super().__init__()
            self.bindings, self.concat_reads, self.returned = {}, {}, set()

        def visit_var_binding_(self, binding):
            self.bindings[binding.var] = value = binding.value
            if isinstance(value, relax.Call) and value.op == concat and isinstance(value.args[0], relax.Tuple):
                for field in value.args[0].fields:
                    self.concat_reads[field] = self.concat_reads.get(field, 0) + 1
                    if not isinstance(binding.var, relax.DataflowVar):  # the block's output: returned
                        self.returned.add(field)

    def stored_fp16(v, found) -> bool:
        value = found.bindings.get(v)
        return (
            isinstance(v, relax.DataflowVar)
            and isinstance(value, relax.Call)
            and str(getattr(v.ty, "dtype", "")) == "float32"
            and found.concat_reads[v] == uses.get(v)
            and v not in found.returned
            # widened from fp16 already: the concat reads the fp16 value through it
            and not (value.op == astype and str(getattr(value.args[0].ty, "dtype", "")) == "float16")
        )

    chosen: set = set()
    for _gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            found = _ConcatInputs()
            found.visit_expr(func)
            chosen.update(v for v in found.concat_reads if stored_fp16(v, found))
    if not chosen:
        return mod
    fp16_copy: dict = {}  # v -> its fp16 copy in the rewritten module

    def copy_of(v, ctx):
        if v not in fp16_copy:
            fp16_copy[v] = ctx.builder.emit(saturated_fp16(ctx.rewritten(v)))
        return fp16_copy[v]

    def rewrite(call, ctx):
        if call.op != concat or not isinstance(ctx.given[0], relax.Tuple):
            return None
        given = ctx.given[0].fields
        if not any(isinstance(g, relax.Var) and g in chosen for g in given):
            return None
        # concatenated in fp16 and widened after: the widening fuses forward into the concat's kernel
        # (a copy widened per field could fuse back into a single-reader producer, which would then
        # write float32 again); a field with other readers is saturated here, in the concat's kernel
        fields = [
            copy_of(g, ctx) if isinstance(g, relax.Var) and g in chosen else saturated_fp16(f)
            for g, f in zip(given, call.args[0].fields, strict=True)
        ]
        joined = ctx.builder.emit(relax.op.concat(relax.Tuple(fields), axis=call.attrs.axis))
        return relax.op.astype(joined, "float32")

    return relax.transform.CanonicalizeBindings()(
        relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))
    )
