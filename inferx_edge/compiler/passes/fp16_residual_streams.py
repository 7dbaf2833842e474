"""A pre-norm transformer's residual stream carried in fp16 between blocks (int8/mixed CUDA variants).

In ViT-B/16 or Swin-T each residual add's float32 output is read by the next block's LayerNorm and by
the residual add at that block's end (a GEMM epilogue): written once and read twice per block in
float32. Here such a value is written fp16 (saturated to its range, in the producing kernel's
epilogue); the adds widen it to float32 as they load it (in the GEMM epilogue) and the LayerNorms run
on it in fp16 (statistics summed in float32): half the bytes on all three passes. Each add still sums in float32 and rounds once (11 significant
bits against the int8 layers' 8), as fp16 variants and torch.compile fp16 carry the stream; a value
beyond fp16's range reaches every reader as +-65504, never inf. A value the function returns keeps its
float32 copy for the return.
"""

from __future__ import annotations

from inferx_edge.compiler.passes._rewrite import bindings, op_name, readers, rewrite_calls_in_context, use_counts
from inferx_edge.compiler.passes.fp16_depthwise import saturated_fp16

#: who may read a stream: the next LayerNorm and the residual adds
_READERS = ("relax.nn.layer_norm", "relax.add")


def fp16_residual_streams(mod):
    """Every float32 dataflow value made by an ``add`` whose readers (two or more) are all LayerNorms
    (as their input) and adds is stored as a saturated fp16 copy: the adds read it widened
    (``astype(copy, float32)``, in their fused loads), the LayerNorms run on it in fp16 (statistics
    summed in float32) and widen their result. The copy's saturation is the value's only reader and
    fuses into its producer."""
    from tvm import relax

    uses, found_readers = use_counts(mod), readers(mod)

    def is_stream(v, value) -> bool:
        if not (
            isinstance(v, relax.DataflowVar)
            and op_name(value) == "relax.add"
            and str(getattr(v.ty, "dtype", "")) == "float32"
        ):
            return False
        found = [(op_name(r), i) for _, r, i in found_readers.get(v, [])]
        return (
            len(found) >= 2
            and len(found) == uses.get(v, 0)  # nothing else (a tuple, the return) reads it
            and all(name in _READERS and (name == "relax.add" or i == 0) for name, i in found)
            and any(name == "relax.nn.layer_norm" for name, _ in found)
        )

    streams = {b.var for b in bindings(mod) if is_stream(b.var, b.value)}
    if not streams:
        return mod
    fp16_copy: dict = {}

    def copy_of(g, a, ctx):
        if g not in fp16_copy:
            fp16_copy[g] = ctx.builder.emit(saturated_fp16(a))
        return fp16_copy[g]

    def rewrite(call, ctx):
        if not any(isinstance(g, relax.Var) and g in streams for g in ctx.given):
            return None
        if op_name(call) == "relax.nn.layer_norm":
            # the LayerNorm reads fp16 (statistics summed in float32) with fp16 scale and shift, and
            # widens its result, as fp16_depthwise's fp16_layer_norm_inputs does
            x, gamma, beta = call.args
            at = call.attrs
            y = relax.op.nn.layer_norm(
                copy_of(ctx.given[0], x, ctx), relax.op.astype(gamma, "float16"), relax.op.astype(beta, "float16"),
                at.axes, at.epsilon, at.center, at.scale,
            )  # fmt: skip
            return relax.op.astype(y, "float32")
        args = [
            relax.op.astype(copy_of(g, a, ctx), "float32") if isinstance(g, relax.Var) and g in streams else a
            for g, a in zip(ctx.given, call.args, strict=True)
        ]
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    return relax.transform.DeadCodeElimination()(rewrite_calls_in_context(mod, rewrite))
