"""Relax rewrite to real int8 compute: ``conv2d`` and ``matmul`` whose weight is a model parameter
become int8 x int8 -> int32 ops with float rescaling after.

For each such op with input activation ``x`` (calibrated threshold ``amax_x``) and weight ``W``
(per-output-channel scales ``s_w``)::

    xq = astype(clip(round(x * (1 / s_x)), -127, 127), int8)    s_x = amax_x / 127
    y  = astype(conv2d(xq, Wq, out_dtype=int32), float32) * (s_x * s_w)   # bias/ReLU follow unchanged

``Wq`` replaces ``W`` in the function signature as an int8 parameter (so artifacts store int8
weights). Legalized, the int8 ops load int8 and accumulate in int32 (checked in the tests).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from inferx_edge.frontend import ImportedModel
from inferx_edge.quantize.calibration import DEFAULT_METHOD, QMAX, make_observer, quantize_per_channel


@dataclass(frozen=True)
class QuantTarget:
    """One conv2d/matmul to quantize: the bound var of its result, its activation input, its weight
    parameter, and the output-channel axis of that weight."""

    name: str
    op: str
    x: object  # relax.Var
    weight: object  # relax.Var (function parameter)
    channel_axis: int
    key: str = ""  # stable, user-facing layer name: the weight's name (suffixed #k if a weight is shared)


def int8_weight_name(name: str) -> str:
    """The name of a weight's int8 parameter: ``name`` + ``_int8`` made a C identifier. Kernels that
    read it take the name for their argument, so ``2.weight`` (an ``nn.Sequential``'s third layer, as
    ONNX names it) gave CUDA source with an argument ``2_weight_int8_ptr``, which NVRTC rejects."""
    ident = re.sub(r"\W", "_", f"{name}_int8")
    return ident if not ident[0].isdigit() else f"w{ident}"


def _param_of(expr, bindings, params):
    """The function parameter behind a weight expression (directly, or through permute_dims)."""
    from tvm import relax

    if isinstance(expr, relax.Var) and expr in params:
        return expr, False
    value = bindings.get(expr)
    if isinstance(value, relax.Call) and value.op.name == "relax.permute_dims" and value.args[0] in params:
        return value.args[0], True
    return None, False


def with_main(mod, func):
    """``mod`` with ``main`` replaced by ``func``; the other functions (PrimFuncs the importer emitted,
    e.g. for ONNX Clip) stay, under the same global names the calls refer to."""
    import tvm

    new = tvm.IRModule(dict(mod.functions_items()))
    new[mod.get_global_var("main")] = func
    return new


def find_targets(func) -> list[QuantTarget]:
    from tvm import relax

    num_input = int(func.attrs["num_input"])
    params = set(func.params[num_input:])
    bindings = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    targets = []
    for var, value in bindings.items():
        if not isinstance(value, relax.Call) or not hasattr(value.op, "name"):
            continue
        # grouped (depthwise) convs stay float: int8 depthwise convs cost MobileNetV2 (real weights)
        # several points of top-1 agreement with the float model, and their int8 kernel was slower than
        # the float one (benchmarks/README.md, "INT8 and mixed precision")
        if (
            value.op.name == "relax.nn.conv2d"
            and str(value.attrs.kernel_layout) == "OIHW"
            and int(value.attrs.groups) == 1
        ):
            w, _ = _param_of(value.args[1], bindings, params)
            if w is not None:
                targets.append(QuantTarget(var.name, "conv2d", value.args[0], w, 0))
        elif value.op.name == "relax.matmul":
            w, transposed = _param_of(value.args[1], bindings, params)
            if w is not None and len(w.ty.shape) == 2:
                # matmul(x, W^T) with W [out, in] (ONNX Gemm, transB=1) or matmul(x, W) with W [in, out]
                targets.append(QuantTarget(var.name, "matmul", value.args[0], w, 0 if transposed else 1))
    seen: dict[str, int] = {}
    keyed = []
    for t in targets:
        n = seen.get(t.weight.name, 0)
        seen[t.weight.name] = n + 1
        keyed.append(QuantTarget(t.name, t.op, t.x, t.weight, t.channel_axis, t.weight.name + (f"#{n}" if n else "")))
    return keyed


def calibrate(
    imported: ImportedModel, targets: list[QuantTarget], batches, method: str = DEFAULT_METHOD
) -> dict[str, float]:
    """Run the FP32 model on ``batches`` (dicts of input arrays) and return ``amax`` per target's input."""
    import tvm
    from tvm import relax

    func = relax.transform.ToNonDataflow()(imported.mod)["main"]
    # ToNonDataflow keeps variable identity by name; look the activations up by name
    by_name = {b.var.name: b.var for block in func.body.blocks for b in block.bindings}
    by_name.update({p.name: p for p in func.params})
    outs = [by_name[t.x.name] for t in targets]
    probe = relax.Function(
        func.params,
        relax.SeqExpr(func.body.blocks, relax.Tuple(outs)),
        ret_ty=relax.TupleType([o.ty for o in outs]),
        attrs=func.attrs,
    )
    mod = relax.transform.Normalize()(with_main(imported.mod, probe))
    vm = relax.VirtualMachine(host_executable(mod), tvm.cpu())
    params = [tvm.runtime.tensor(p) for p in imported.params]
    observers = [make_observer(method) for _ in targets]
    names = [s.name for s in imported.inputs]
    for batch in batches:
        res = vm["main"](*[tvm.runtime.tensor(batch[n]) for n in names], *params)
        for obs, r in zip(observers, res):
            obs.update(r.numpy())
    return {t.key: obs.threshold() for t, obs in zip(targets, observers)}


def host_executable(mod):
    """``mod`` compiled for this machine's CPU with the CPU default schedules (calibration and accuracy
    runs). A plain LLVM build is naive loops: ViT-B/16 took 35 s per image there (its calibration on 16
    images outran a 560 s build window) and 0.6 s with the schedules; NCHW convolutions, which the CPU
    rules do not claim, run as before."""
    from tvm import relax

    from inferx_edge.compiler.compile import resolve_tvm_target
    from inferx_edge.compiler.cpu.default_schedule import cpu_pipeline
    from inferx_edge.targets import get_target, host_target_name

    target = resolve_tvm_target(get_target(host_target_name()))
    return relax.build(mod, target, relax_pipeline=cpu_pipeline(target))


def int8_boundaries(func, targets: list[QuantTarget], scales: dict[str, float]):
    """Activations that cross layers in int8 (as TensorRT's int8 residual blocks do).

    An activation whose every conv2d/matmul reader is an int8 target with one scale is quantized once,
    where it is produced (so the quantize fuses into the producer's epilogue and the tensor is written
    as int8), and its other readers (residual adds, pools) read the dequantized int8 tensor: ResNet and
    MobileNetV2 blocks no longer write, re-read and re-quantize float activations between layers. The
    int8 path changes those readers' inputs by the quantization error, so accuracy is measured with it
    (``quantize`` / ``--max-accuracy-drop``). A ``max_pool2d`` output quantizes at the pool's input
    instead (the max of quantized values is the quantized max): the pool then reads and writes int8.

    Returns ``(shared, pooled)``: ``{activation name: (scale, has_float_readers)}`` and the same for
    max-pool outputs (their inputs are in ``shared``). Activations that are function inputs, graph
    outputs, or read by a layer kept in float are left as they are.
    """
    from tvm import relax

    bindings = {b.var.name: b for block in func.body.blocks for b in block.bindings}
    readers: dict[str, list] = {}
    for b in bindings.values():
        for v in relax.analysis.free_vars(b.value):
            readers.setdefault(v.name, []).append(b)
    outputs = {v.name for v in relax.analysis.free_vars(func.body.body)}
    candidates = {t.name for t in find_targets(func)}
    by_name = {t.name: t for t in targets}
    target_inputs = {t.x.name for t in targets}
    shared, pooled = {}, {}
    for x in target_inputs:
        if x not in bindings or x in outputs:
            continue
        reads = readers.get(x, [])
        layer_reads = [b for b in reads if b.var.name in candidates]
        if any(b.var.name not in by_name or by_name[b.var.name].x.name != x for b in layer_reads):
            continue  # read by a float layer (mixed precision) or as a weight
        s = {scales[b.var.name] for b in layer_reads}
        if len(s) != 1:
            continue
        s_x = s.pop()
        float_reads = len(reads) > len(layer_reads)
        value = bindings[x].value
        r = (
            value.args[0]
            if isinstance(value, relax.Call) and getattr(value.op, "name", "") == "relax.nn.max_pool2d"
            else None
        )
        if (
            r is not None
            and r.name in bindings
            and r.name not in outputs
            and len(readers.get(r.name, [])) == 1
            and r.name not in target_inputs
        ):
            shared[r.name] = (s_x, False)
            pooled[x] = (s_x, float_reads)
        else:
            shared[x] = (s_x, float_reads)
    return shared, pooled


#: Name of the extra input of a :func:`quantize_imported` ``blend=True`` module: one float per target,
#: 1 = that layer computes in int8, 0 = it keeps float (per-layer sensitivity from a single compile).
MASK_INPUT = "inferx_int8_mask"


def quantize_imported(
    imported: ImportedModel,
    targets: list[QuantTarget],
    amax: dict[str, float],
    blend: bool = False,
    fixed_weights: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    kernel_layout: str = "OIHW",
    int8_between_layers: bool = True,
) -> ImportedModel:
    """Return a copy of ``imported`` whose ``targets`` compute in int8 and whose weights are int8.

    ``amax`` holds each target's activation threshold (by ``target.key``). ``fixed_weights`` gives
    already-quantized weights and their per-channel scales by key (a QDQ model's own); others are
    quantized here. With ``blend`` the module keeps its float weights and gets an extra input
    :data:`MASK_INPUT`: target ``i`` outputs ``float + mask[i] * (int8 - float)``, so one compiled
    module evaluates any mix of int8 and float layers (sensitivity analysis; never shipped).
    ``kernel_layout="OHWI"`` stores int8 conv weights output-channel first, input channels last (what
    NHWC implicit-GEMM convolutions read contiguously), so no weight is transposed at run time.
    ``int8_between_layers``: activations cross layers in int8 where :func:`int8_boundaries` allows
    (never with ``blend``).
    """
    if kernel_layout not in ("OIHW", "OHWI") or (blend and kernel_layout != "OIHW"):
        raise ValueError(f"kernel_layout must be OIHW or OHWI (OIHW with blend), got {kernel_layout}")
    import tvm
    from tvm import relax

    func = imported.mod["main"]
    num_input = int(func.attrs["num_input"])
    param_index = {p: i for i, p in enumerate(func.params[num_input:])}
    new_params = list(func.params)
    arrays = list(imported.params)
    fixed_weights = fixed_weights or {}
    info = {}
    for t in targets:
        i = param_index[t.weight]
        if t.weight in info:
            qvar, w_scales, wq = info[t.weight]
        else:
            if t.key in fixed_weights:
                wq, w_scales = fixed_weights[t.key]
            else:
                wq, w_scales = quantize_per_channel(arrays[i], axis=t.channel_axis)
            if t.op == "conv2d" and kernel_layout == "OHWI":
                wq = np.ascontiguousarray(wq.transpose(0, 2, 3, 1))
            if blend:
                qvar = relax.const(wq)
            else:
                arrays[i] = wq
                qvar = relax.Var(int8_weight_name(t.weight.name), relax.TensorType(list(wq.shape), "int8"))
                new_params[num_input + i] = qvar
            info[t.weight] = (qvar, w_scales, wq)
        s_x = amax[t.key] / QMAX if amax[t.key] > 0 else 1.0
        info[t.name] = (s_x, w_scales, qvar)

    by_var = {t.name: (k, t) for k, t in enumerate(targets)}
    mask = relax.Var(MASK_INPUT, relax.TensorType([len(targets)], "float32")) if blend else None
    shared, pooled = (
        ({}, {})
        if blend or not int8_between_layers
        else int8_boundaries(func, targets, {t.name: info[t.name][0] for t in targets})
    )
    quantized = {}  # activation name -> its int8 var, for shared activations
    at_use = {}  # (activation name, scale) -> int8 var, for the others (one quantize each)

    def quantize(x, s_x):
        # multiply by the reciprocal: a float division is a multi-instruction sequence on GPUs (IEEE
        # div.rn, no fast math), and a quantize runs in every int8 kernel's epilogue; x * (1/s) differs
        # from x / s by at most an ulp (a value on a rounding tie may land one step away)
        inv = relax.const(np.float32(1.0 / np.float64(s_x)))
        return relax.op.astype(relax.op.clip(relax.op.round(relax.op.multiply(x, inv)), -QMAX, QMAX), "int8")

    def dequantize(xq, s_x):
        return relax.op.multiply(relax.op.astype(xq, "float32"), relax.const(np.float32(s_x)))

    @relax.expr_functor.mutator
    class Int8Rewriter(relax.PyExprMutator):
        def visit_var_binding_(self, binding):
            name, bb = binding.var.name, self.builder_
            if name in pooled:  # max_pool2d(r) -> max_pool2d(quantize(r)): the same int8 values
                (s_x, float_reads), a, r = pooled[name], binding.value.attrs, binding.value.args[0].name
                xq = bb.emit(
                    relax.op.nn.max_pool2d(
                        quantized[r], a.pool_size, a.strides, a.padding, a.dilation, a.ceil_mode,
                        a.count_include_pad, a.layout, a.out_layout,
                    )
                )  # fmt: skip
                self._boundary(binding.var, xq, s_x if float_reads else None)
                return
            hit = by_var.get(name)
            if hit is None:
                super().visit_var_binding_(binding)
            else:
                self._int8_op(binding, *hit)
            if name in shared:
                s_x, float_uses = shared[name]
                xq = bb.emit(quantize(self.visit_expr(binding.var), s_x))
                self._boundary(binding.var, xq, s_x if float_uses else None)

        def _boundary(self, var, xq, s_x):
            """``var``'s int8 form is ``xq``; its float readers (if ``s_x``) read the dequantized ``xq``."""
            quantized[var.name] = xq
            if s_x is not None:
                self.set_var_remap(var, self.builder_.emit(dequantize(xq, s_x)))

        def _int8_op(self, binding, k, t):
            call = binding.value
            s_x, w_scales, wq = info[t.name]
            if blend:  # int8 weights are constants here; permute them as the float weight was
                w = wq if call.args[1].same_as(t.weight) else relax.op.permute_dims(wq)
            else:  # the weight parameter (or its permute_dims) now refers to the int8 parameter
                w = self.visit_expr(call.args[1])
            bb = self.builder_
            xq = quantized.get(t.x.name)
            if xq is None:
                key = (t.x.name, float(s_x))
                if key not in at_use:
                    at_use[key] = bb.emit(quantize(self.visit_expr(call.args[0]), s_x))
                xq = at_use[key]
            if t.op == "conv2d":
                a = call.attrs
                y32 = bb.emit(
                    relax.op.nn.conv2d(
                        xq,
                        w,
                        strides=a.strides,
                        padding=a.padding,
                        dilation=a.dilation,
                        groups=a.groups,
                        data_layout=a.data_layout,
                        kernel_layout=kernel_layout,
                        out_layout=a.out_layout,
                        out_dtype="int32",
                    )
                )
                scale = (s_x * w_scales).astype(np.float32).reshape(1, -1, 1, 1)
            else:
                y32 = bb.emit(relax.op.matmul(xq, w, out_dtype="int32"))
                scale = (s_x * w_scales).astype(np.float32)
            y = relax.op.multiply(relax.op.astype(y32, "float32"), relax.const(scale))
            if blend:
                f = bb.emit(self.visit_expr(call))
                m = relax.op.strided_slice(mask, axes=[0], begin=[k], end=[k + 1])
                y = relax.op.add(f, relax.op.multiply(m, relax.op.subtract(bb.emit(y), f)))
            # a graph output (not a dataflow var) must stay visible outside the dataflow block
            emit = bb.emit if isinstance(binding.var, relax.DataflowVar) else bb.emit_output
            self.set_var_remap(binding.var, emit(y))

    rewriter = Int8Rewriter()
    for old, new in zip(func.params, new_params):
        if old is not new:
            rewriter.set_var_remap(old, new)
    body = rewriter.visit_expr(func.body)
    attrs = func.attrs
    if blend:
        new_params = [*new_params[:num_input], mask, *new_params[num_input:]]
        attrs = tvm.ir.make_node("ir.DictAttrs", **{**dict(func.attrs), "num_input": num_input + 1})
    new_func = relax.Function(new_params, body, ret_ty=func.ret_ty, attrs=attrs)
    mod = relax.transform.Normalize()(with_main(imported.mod, new_func))
    from inferx_edge.frontend.imported import ImportedModel as IM

    return IM(
        imported.name,
        imported.format,
        imported.source,
        imported.sha256,
        mod,
        list(imported.param_names),
        arrays,
        imported.inputs,
        imported.outputs,
    )


def qdq_weights(imported: ImportedModel, targets) -> dict[str, tuple[np.ndarray, np.ndarray]] | None:
    """A QDQ model's own int8 weights and per-output-channel scales for ``targets`` (by key)."""
    if imported.qdq is None:
        return None
    fixed = {}
    for t in targets:
        if t.weight.name not in imported.qdq.weights:
            continue
        q, scale, axis = imported.qdq.weights[t.weight.name]
        channels = q.shape[t.channel_axis]
        if np.ndim(scale) == 0:
            fixed[t.key] = (q, np.full(channels, float(scale), np.float32))
        elif axis % q.ndim == t.channel_axis and len(scale) == channels:
            fixed[t.key] = (q, scale.astype(np.float32))
        # scales along another axis: requantized per output channel from the dequantized weight
    return fixed
