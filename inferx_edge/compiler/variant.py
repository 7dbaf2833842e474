"""A variant's shape before compilation: the layout policy per target x precision, and
:func:`prepare_variant`, the one function that turns an imported model into the Relax module a variant
compiles (build, tune, the kernel profiler and the benchmarks all call it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferx_edge.errors import BuildError, check_choice
from inferx_edge.targets import TargetSpec

#: Precisions ``build`` accepts. fp16: Relax ToMixedPrecision (fp16 compute and accumulation, the
#: signature stays fp32). int8: calibrated int8 x int8 -> int32 conv2d/matmul (inferx_edge.quantize).
#: mixed: int8 except the layers an accuracy budget keeps in fp32 (per-layer sensitivity).
PRECISIONS = ("fp32", "fp16", "int8", "mixed")
QUANTIZED = ("int8", "mixed")


@dataclass(frozen=True)
class VariantLayout:
    """How one variant's tensors are laid out, decided once per target x precision (:func:`variant_layout`).

    Attributes
    ----------
    precision : one of :data:`PRECISIONS`.
    conv : data layout convolutions run in (``NCHW`` or ``NHWC``).
    kernel : float conv weight layout when ``conv`` is NHWC (``OHWI`` or ``HWIO``).
    quant_kernel : how int8 conv weights are stored (``OHWI`` where convolutions run in NHWC, else ``OIHW``).
    attention : ``matmul`` (softmax between two matmul kernels) or ``fused`` (one kernel, CUDA
        fp16/int8/mixed with ``CudaOptions.fused_attention``).
    """

    precision: str
    conv: str = "NCHW"
    kernel: str = "OHWI"
    quant_kernel: str = "OIHW"
    attention: str = "matmul"

    def __post_init__(self) -> None:
        check_choice("precision", self.precision, PRECISIONS)
        check_choice("conv layout", self.conv, ("NCHW", "NHWC"))
        check_choice("kernel layout", self.kernel, ("OHWI", "HWIO"))
        check_choice("int8 kernel layout", self.quant_kernel, ("OHWI", "OIHW"))
        check_choice("attention", self.attention, ("matmul", "fused"))
        if self.attention == "fused" and (self.precision == "fp32" or self.conv != "NHWC"):
            raise ValueError("fused attention is for CUDA fp16/int8/mixed variants (NHWC)")

    @property
    def quantized(self) -> bool:
        return self.precision in QUANTIZED


def variant_layout(spec: TargetSpec, precision: str, cuda_options=None) -> VariantLayout:
    """The layouts a ``precision`` variant runs in on ``spec``.

    NHWC for fp16/int8/mixed on CUDA: dlight turns a convolution into an implicit GEMM whose operands
    are read along the reduction axis; in NCHW that axis (input channels) is strided by H*W, so each
    warp's loads are scattered. In NHWC, with OHWI weights, both operands are contiguous along it and
    the output is written contiguously. int8 weights are stored OHWI at build time; fp16's
    OIHW -> OHWI permute fuses with the fp32 -> fp16 weight cast the variant does anyway. fp32 on CUDA
    stays NCHW.

    NHWC for float variants on CPUs too, with HWIO weights: output channels are innermost in both the
    output and the weight, so MetaSchedule's tiles vectorize the multiply-adds along them with
    contiguous loads and stores (measured in ``benchmarks/results/cpu_latency_*``). int8/mixed CPU
    variants stay NCHW (not measured in NHWC).

    Attention runs fused on CUDA fp16/int8/mixed variants when ``cuda_options`` (default: from the
    environment) has ``fused_attention``.
    """
    if spec.is_cuda:
        from inferx_edge.compiler.cuda.device_compiler import CudaOptions

        conv = "NHWC" if precision != "fp32" else "NCHW"
        kernel = "OHWI"  # rows of the implicit GEMM's weight operand run along the reduction
        fused = precision != "fp32" and (cuda_options or CudaOptions.from_env()).fused_attention
    else:
        conv = "NCHW" if precision in QUANTIZED else "NHWC"
        kernel = "HWIO"  # output channels contiguous for vector loads
        fused = False
    attention = "fused" if fused else "matmul"
    return VariantLayout(precision, conv, kernel, "OHWI" if conv == "NHWC" else "OIHW", attention)


#: ``quantize(imported, int8_kernel_layout) -> (quantized ImportedModel, report)``: how a quantized
#: variant's int8 layers are made (the build stage passes :func:`inferx_edge.quantize.driver.apply_plan`
#: bound to a plan; the compiler does not import the quantizer)
Quantizer = Callable[[Any, str], tuple[Any, dict]]


@dataclass
class PreparedVariant:
    """What :func:`prepare_variant` returns.

    Attributes
    ----------
    mod : the Relax module to compile (tuned schedules applied when a database was given).
    layout : the variant's :class:`VariantLayout`.
    tuning : the tuning summary (database, kernels tuned, tiles, kernels), None without a database.
    weight_names : what ``main`` takes after the inputs.
    weight_arrays : their values after the build-time weight transforms (only with ``bake``; else None).
    quantization : the quantizer's report for int8/mixed variants, else None.
    model : the imported model the module was made from (the quantized one for int8/mixed).
    """

    mod: Any
    layout: VariantLayout
    tuning: dict | None
    weight_names: list[str]
    weight_arrays: list | None
    quantization: dict | None = None
    model: Any = None


def prepare_variant(
    imported,
    layout: VariantLayout,
    *,
    quantize: Quantizer | None = None,
    target=None,
    tuning_dir: Path | None = None,
    bake: bool = False,
    log=None,
    sm_count: int | None = None,
) -> PreparedVariant:
    """The Relax module a variant compiles: the int8 rewrite for int8/mixed (``quantize``), then the
    rewrites of :data:`~inferx_edge.compiler.passes.PASSES` for its layout, weight-only work moved to
    build time (:func:`~inferx_edge.compiler.passes.bake_weight_transforms`; arrays computed only with
    ``bake``), and tuned schedules from ``tuning_dir`` (needs ``target``; for CUDA also ``sm_count``,
    the target's SMs, so the tuned module is fused as the CUDA pipeline fuses an untuned one).
    """
    from inferx_edge.compiler.passes import PASSES, bake_weight_transforms
    from inferx_edge.compiler.tvm_ops import tvm_op_fixes

    report = None
    if layout.quantized:
        if quantize is None:
            raise BuildError(f"a {layout.precision} variant needs a quantization plan")
        imported, report = quantize(imported, layout.quant_kernel)
    tvm_op_fixes()
    mod = imported.mod
    for p in PASSES:
        if p.applies(layout):
            try:
                mod = p.run(mod, layout)
            except Exception as exc:  # noqa: BLE001 - e.g. a TVM layout rule dying with std::bad_alloc
                hint = ""
                if p.name == "convert_layout":
                    # TVM's per-op layout rules; the known failures (negative squeeze/permute axes) are
                    # rewritten first (passes/nonnegative_axes.py), an unknown one stops here by name
                    hint = "; the other frontend's graph of the same network (ONNX or torch.export) may convert"
                raise BuildError(
                    f"the {p.name} rewrite ({layout.conv}) failed on {imported.name}: {type(exc).__name__}: {exc}{hint}"
                ) from exc
    mod, names, arrays = bake_weight_transforms(mod, list(imported.params) if bake else None, log)
    tuned = None
    if tuning_dir is not None:
        from inferx_edge.compiler.tuning import apply_tuning

        mod, n_tuned, n_tiled, n_total = apply_tuning(mod, target, tuning_dir, sm_count)
        tuned = {"database": str(tuning_dir), "kernels_tuned": n_tuned, "tiles": n_tiled, "kernels": n_total}
    return PreparedVariant(mod, layout, tuned, names, arrays, report, imported)
