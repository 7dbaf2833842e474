"""Weight-only work (layout transposes, casts, pads) moved out of the model and run at build time."""

from __future__ import annotations

import numpy as np

#: weight transforms are done at build time unless they would grow the stored weights beyond this
#: factor of the model's own (e.g. a weight broadcast to an activation's shape)
MAX_BAKED_GROWTH = 2.0


def bake_weight_transforms(mod, params: list[np.ndarray] | None = None, log=None):
    """Move work that depends only on weights out of the model (Relax ``LiftTransformParams``): bias
    reshapes and layout transposes, fp16 casts, channel pads, transposed matmul weights. ``main`` then
    takes the transformed weights. With ``params`` (the model's weight arrays in ``main``'s order) the
    transforms run once here, on the build host's CPU, and their results are what the artifact stores:
    a device never runs them. (They were one small kernel each per inference: 4 of the embedded
    model's 11 on a CPU, 13 in MobileNetV2's int8 CUDA variant.)

    Returns ``(module, weight names, weight arrays or None)``; the module unchanged (and ``params`` as
    given) when nothing is lifted or the transformed weights would be over :data:`MAX_BAKED_GROWTH`
    times larger.
    """
    import tvm
    from tvm import relax

    main = mod["main"]
    num_input = int(main.attrs["num_input"])
    original = [p.name for p in main.params[num_input:]]
    lifted = relax.transform.LiftTransformParams()(_stop_at_growth(mod, num_input))
    if not any(gv.name_hint == "main_transform_params" for gv, _ in lifted.functions_items()):
        return mod, original, params
    transform = lifted["main_transform_params"]
    if not any(isinstance(b.value, relax.Call) for block in transform.body.blocks for b in block.bindings):
        return mod, original, params  # weights passed through, nothing computed (all stopped at growth)
    kept = tvm.IRModule({gv: f for gv, f in lifted.functions_items() if gv.name_hint != "main_transform_params"})
    new_main = kept["main"]
    baked = _unique([p.name for p in new_main.params[num_input:]])
    if params is None:
        return kept, baked, None
    before = sum(p.nbytes for p in params)
    planned = _static_nbytes(transform)
    if planned is not None and planned > MAX_BAKED_GROWTH * before + (1 << 20):  # checked before running it
        if log:
            log(f"      weight transforms kept in the model: their results ({planned >> 20} MiB) outgrow the weights")
        return mod, original, params
    tmod = tvm.IRModule({"main": transform.with_attr("global_symbol", "main")})
    for gv, f in kept.functions_items():
        if not isinstance(f, relax.Function):
            tmod[gv] = f
    # only the kernels the transforms call: the model's own may be device code (fused attention)
    tmod = relax.transform.DeadCodeElimination(["main"])(tmod)
    host = tvm.target.Target({"kind": "llvm"})
    with host:
        exe = relax.build(tmod, host)
    out = relax.VirtualMachine(exe, tvm.cpu())["main"](
        [tvm.runtime.tensor(np.asarray(p, order="C")) for p in params]
    )  # 0-d stays 0-d
    arrays = [o.numpy() for o in out]
    # the VM hands 0-d results back as shape (1,); the baked main declares each parameter's shape
    for i, (a, v) in enumerate(zip(arrays, new_main.params[num_input:], strict=True)):
        shape = getattr(v.ty, "shape", None)
        if shape is not None and all(isinstance(d, tvm.tirx.IntImm) for d in shape):
            want = tuple(int(d) for d in shape)
            if a.shape != want and a.size == int(np.prod(want)):
                arrays[i] = a.reshape(want)
    after = sum(a.nbytes for a in arrays)
    if after > MAX_BAKED_GROWTH * before + (1 << 20):
        if log:
            log(f"      weight transforms kept in the model: their results ({after >> 20} MiB) outgrow the weights")
        return mod, original, params
    return kept, baked, arrays


def _stop_at_growth(mod, num_input: int):
    """``mod`` with the weight-only calls whose result outgrows their operands (a window mask broadcast
    to the batch: Swin-T's 39 MB per stage at batch 64) kept out of the lifted transforms
    (``stop_lift_params`` on their operands): they stay in the model, as they would have without the
    bake, and the rest (weight transposes, casts) is still done at build time. Before, one such call
    sent every transform back into the model."""
    from tvm import relax

    from inferx_edge.compiler.passes._rewrite import rewrite_calls_in_context

    main = mod["main"]
    weights = set(main.params[num_input:])
    for block in main.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call):
                static = all(_weight_only(a, weights) for a in value.args)
            elif isinstance(value, relax.TupleGetItem):
                static = _weight_only(value.tuple_value, weights)
            else:
                static = _weight_only(value, weights)
            if static:
                weights.add(binding.var)

    def stop(call, ctx):
        if not all(_weight_only(a, weights) for a in ctx.given):
            return None
        operands = [a for a in call.args if isinstance(getattr(a, "ty", None), relax.TensorType)]
        sizes = [_tensor_nbytes(a) for a in operands]
        out = _tensor_nbytes(ctx.builder.normalize(call))
        if not operands or out is None or None in sizes or out <= MAX_BAKED_GROWTH * sum(sizes) + (1 << 20):
            return None
        args = [ctx.builder.emit(relax.op.builtin.stop_lift_params(a)) if a in operands else a for a in call.args]
        return relax.Call(call.op, args, call.attrs, call.ty_args)

    return rewrite_calls_in_context(mod, stop)


def _weight_only(expr, weights: set) -> bool:
    """Whether ``expr`` depends on nothing but weights and constants."""
    from tvm import relax

    if isinstance(expr, relax.Var):
        return expr in weights
    if isinstance(expr, relax.Tuple):
        return all(_weight_only(f, weights) for f in expr.fields)
    return not isinstance(expr, relax.Call | relax.TupleGetItem)  # constants, shapes, prim values


def _tensor_nbytes(expr) -> int | None:
    """The bytes of ``expr``'s tensor result with a static shape, else None."""
    return _type_nbytes(getattr(expr, "ty", None))


def _type_nbytes(ty) -> int | None:
    """The bytes of a tensor type with a static shape, else None."""
    import tvm

    dims = getattr(getattr(ty, "shape", None), "values", None)
    if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return None
    return int(np.prod([int(d) for d in dims], dtype=np.int64)) * tvm.DataType(str(ty.dtype)).bits // 8


def _static_nbytes(transform) -> int | None:
    """The bytes ``transform``'s results take, from its return type; None where a shape is not static."""
    ret = transform.ret_ty
    sizes = [_type_nbytes(ty) for ty in getattr(ret, "fields", [ret])]
    return None if None in sizes else sum(sizes)


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(n if not k else f"{n}#{k}")
    return out
