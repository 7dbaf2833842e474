"""The Relax rewrites a variant goes through before TVM's pipeline, one pass per file, in one order.

:data:`PASSES` is that order. Each entry names the pass, when it applies (a predicate over the
variant's :class:`~inferx_edge.compiler.variant.VariantLayout`) and the function (``mod -> mod``).
``bake_weight_transforms`` runs after them (it also returns the weights) and tuning last
(:mod:`inferx_edge.compiler.tuning`); both are called by :func:`~inferx_edge.compiler.variant.prepare_variant`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from inferx_edge.compiler.passes.bake_weight_transforms import MAX_BAKED_GROWTH, bake_weight_transforms
from inferx_edge.compiler.passes.batch_norm_scale_shift import batch_norm_scale_shift
from inferx_edge.compiler.passes.clip_to_min_max import clip_to_min_max
from inferx_edge.compiler.passes.dead_conv_taps import dead_conv_taps
from inferx_edge.compiler.passes.fp16_activation_matmuls import fp16_activation_matmuls
from inferx_edge.compiler.passes.fp16_concat_inputs import fp16_concat_inputs
from inferx_edge.compiler.passes.fp16_data_movement import fp16_data_movement
from inferx_edge.compiler.passes.fp16_depthwise import FP16_MAX, fp16_depthwise
from inferx_edge.compiler.passes.fp16_matmul_weights_along_k import fp16_matmul_weights_along_k
from inferx_edge.compiler.passes.fp16_residual_streams import fp16_residual_streams
from inferx_edge.compiler.passes.fp16_shared_inputs import fp16_shared_inputs
from inferx_edge.compiler.passes.fused_attention import fused_attention
from inferx_edge.compiler.passes.grouped_conv_gemm import grouped_conv_gemm
from inferx_edge.compiler.passes.grouped_conv_hwio import grouped_conv_hwio
from inferx_edge.compiler.passes.hide_tir_calls import hide_tir_calls
from inferx_edge.compiler.passes.int8_matmul_weights_along_k import int8_matmul_weights_along_k
from inferx_edge.compiler.passes.nonnegative_axes import nonnegative_axes
from inferx_edge.compiler.passes.pad_int8_conv_channels import pad_int8_conv_channels
from inferx_edge.compiler.passes.pad_ragged_conv_outputs import PAD_TO, pad_ragged_conv_outputs
from inferx_edge.compiler.passes.sink_permutes import sink_permutes
from inferx_edge.compiler.passes.space_to_depth_int8_convs import space_to_depth_int8_convs
from inferx_edge.compiler.passes.stack_as_concat import stack_as_concat
from inferx_edge.compiler.passes.unit_transposes_to_reshapes import drop_identity_reshapes, unit_transposes_to_reshapes


def to_fp16(mod):
    """Relax ``ToMixedPrecision``: fp16 compute and accumulation; the signature stays fp32. Clips become
    ``minimum(maximum(...))`` first: ``ToMixedPrecision`` rejects ``clip``'s scalar bounds ("Expected
    TensorType, but got T.int64": MobileNetV3's hardswish/hardsigmoid did not build in fp16). It also
    rejects ``call_tir`` (a frontend's direct TE lowering: ONNX Pad, Tile, Einsum...): those are hidden
    from it (:func:`hide_tir_calls`) and stay float32, cast around."""
    from tvm import relax

    hidden, restore = hide_tir_calls(clip_to_min_max(mod))
    return restore(relax.transform.ToMixedPrecision(out_dtype="float16")(hidden))


def convert_layout(mod, layout: str, kernel_layout: str = "OHWI"):
    """Run every ``conv2d`` in ``layout`` with ``kernel_layout`` weights (inputs and outputs converted
    where the graph needs NCHW; transposed convolutions stay NCHW), with the clean-ups that make that cheap.

    ``clip`` has no layout rule in Relax: ConvertLayout wrapped every int8 quantize (and ReLU6) in a
    transpose pair, a standalone strided kernel after each convolution. Clips become
    ``minimum(maximum(x, lo), hi)`` first (:func:`clip_to_min_max`), which convert. In NHWC, int8
    convolutions with a channel count that is not a multiple of 4 (RGB stems) get their input and weight
    zero-padded to 4 channels (:func:`pad_int8_conv_channels`: one 4-byte load per pixel instead of a
    byte gather), and stride-2 ones over at most 4 (padded) channels run on a space-to-depth input
    (:func:`space_to_depth_int8_convs`). Negative ``squeeze``/``permute_dims`` axes are made
    non-negative first (:func:`nonnegative_axes`: TVM's layout rules for those two fail on them), and
    stacks become concatenations (:func:`stack_as_concat`: ``stack`` has no working layout rule).
    Transposes move below elementwise ops and cancel where they meet their inverse
    (:func:`sink_permutes`: a channels-last block inside an NCHW network), and last, transposes that
    only move axes of extent 1 become reshapes (:func:`unit_transposes_to_reshapes`) and reshapes
    that keep the shape go (:func:`drop_identity_reshapes`).
    """
    if layout == "NCHW":
        return mod
    from tvm import relax

    mod = stack_as_concat(nonnegative_axes(clip_to_min_max(mod)))
    # transposed convolutions stay NCHW / IOHW, the only layouts their legalization lowers: left to
    # itself ConvertLayout carried the NHWC input through them when the frontend set out_dtype
    # (torch.export), and the build failed in VM codegen on the unlowered op
    mod = relax.transform.ConvertLayout(
        {"relax.nn.conv2d": [layout, kernel_layout], "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]}
    )(mod)
    mod = relax.transform.DeadCodeElimination()(sink_permutes(mod))
    if layout == "NHWC":
        mod = space_to_depth_int8_convs(pad_int8_conv_channels(mod))
    return drop_identity_reshapes(unit_transposes_to_reshapes(mod))


@dataclass(frozen=True)
class Pass:
    """One step of :data:`PASSES`."""

    name: str
    applies: Callable[[Any], bool]  # VariantLayout -> bool
    run: Callable[[Any, Any], Any]  # (mod, VariantLayout) -> mod


#: The rewrites of :func:`~inferx_edge.compiler.variant.prepare_variant`, in order.
PASSES: tuple[Pass, ...] = (
    # every variant: convolution taps that only ever read padding dropped (large-rate dilated convs)
    Pass("dead_conv_taps", lambda v: True, lambda mod, v: dead_conv_taps(mod)),
    Pass("to_fp16", lambda v: v.precision == "fp16", lambda mod, v: to_fp16(mod)),
    Pass("convert_layout", lambda v: v.conv != "NCHW", lambda mod, v: convert_layout(mod, v.conv, v.kernel)),
    # every variant: inference BatchNorms left standalone (pre-activation) as x * a + b, a and b baked
    Pass("batch_norm_scale_shift", lambda v: True, lambda mod, v: batch_norm_scale_shift(mod)),
    # CUDA int8/mixed: dense layers read their int8 weights along K (16-byte tensor-core tile loads)
    Pass(
        "int8_matmul_weights_along_k",
        lambda v: v.quantized and v.conv == "NHWC" and v.kernel == "OHWI",
        lambda mod, v: int8_matmul_weights_along_k(mod),
    ),
    # CUDA fp16: dense layers read their fp16 weights along K, as int8 ones do
    Pass(
        "fp16_matmul_weights_along_k",
        lambda v: v.precision == "fp16" and v.conv == "NHWC" and v.kernel == "OHWI",
        lambda mod, v: fp16_matmul_weights_along_k(mod),
    ),
    # CUDA fp16/int8/mixed unless turned off (CudaOptions.fused_attention): softmax(Q K^T) V as one fused tensor-core kernel
    Pass("fused_attention", lambda v: v.attention == "fused", lambda mod, v: fused_attention(mod)),
    # CUDA int8/mixed: attention's other activation x activation matmuls on fp16 tensor cores
    Pass(
        "fp16_activation_matmuls",
        lambda v: v.quantized and v.conv == "NHWC" and v.kernel == "OHWI",
        lambda mod, v: fp16_activation_matmuls(mod),
    ),
    # CUDA fp16/int8/mixed: grouped convs as batched GEMMs on fp16 tensor cores
    Pass(
        "grouped_conv_gemm",
        lambda v: v.precision != "fp32" and v.conv == "NHWC" and v.kernel == "OHWI",
        lambda mod, v: grouped_conv_gemm(mod, saturate=v.quantized),
    ),
    # CUDA: the other grouped convs' weights contiguous along output channels for the window-reduction kernel
    Pass("grouped_conv_hwio", lambda v: v.conv == "NHWC" and v.kernel == "OHWI", lambda mod, v: grouped_conv_hwio(mod)),
    # CPU: float convs with output channels no vector width divides compute whole vectors
    Pass(
        "pad_ragged_conv_outputs",
        lambda v: v.conv == "NHWC" and v.kernel == "HWIO",
        lambda mod, v: pad_ragged_conv_outputs(mod),
    ),
    # CUDA int8/mixed: their float depthwise convs
    Pass("fp16_depthwise", lambda v: v.conv == "NHWC" and v.quantized, lambda mod, v: fp16_depthwise(mod)),
    # CUDA int8/mixed: a value those read in fp16 is read in fp16 by its other readers too (a residual stream)
    Pass("fp16_shared_inputs", lambda v: v.conv == "NHWC" and v.quantized, lambda mod, v: fp16_shared_inputs(mod)),
    # CUDA int8/mixed: a pre-norm transformer's residual stream (read by LayerNorms and adds only) stored in fp16
    Pass(
        "fp16_residual_streams",
        lambda v: v.conv == "NHWC" and v.quantized,
        lambda mod, v: fp16_residual_streams(mod),
    ),
    # CUDA int8/mixed: values read only by concats (dense blocks re-read every earlier map) stored in fp16
    Pass("fp16_concat_inputs", lambda v: v.conv == "NHWC" and v.quantized, lambda mod, v: fp16_concat_inputs(mod)),
    # CUDA int8/mixed: reshapes, transposes and slices of a value widened from fp16 move it in fp16 (a shuffle)
    Pass("fp16_data_movement", lambda v: v.conv == "NHWC" and v.quantized, lambda mod, v: fp16_data_movement(mod)),
)

__all__ = [
    "FP16_MAX",
    "MAX_BAKED_GROWTH",
    "PAD_TO",
    "PASSES",
    "Pass",
    "bake_weight_transforms",
    "batch_norm_scale_shift",
    "clip_to_min_max",
    "convert_layout",
    "dead_conv_taps",
    "drop_identity_reshapes",
    "fp16_activation_matmuls",
    "fp16_concat_inputs",
    "fp16_data_movement",
    "fp16_depthwise",
    "fp16_matmul_weights_along_k",
    "fp16_residual_streams",
    "fp16_shared_inputs",
    "fused_attention",
    "grouped_conv_gemm",
    "grouped_conv_hwio",
    "int8_matmul_weights_along_k",
    "pad_int8_conv_channels",
    "pad_ragged_conv_outputs",
    "sink_permutes",
    "space_to_depth_int8_convs",
    "to_fp16",
    "unit_transposes_to_reshapes",
]
